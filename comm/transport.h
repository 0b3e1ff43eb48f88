// The data plane the engine talks to: collectives and point-to-point messages of
// training data (SV batches, gradients, replicas). Modeled after c10d and gloo:
// the public calls are non-virtual and do what every backend shares (argument
// checks, chunking, traffic counting, refusing use after a timeout); a backend
// implements the protected do...() calls. What a backend cannot do throws, never
// a silent no-op. Agreement, metrics and aborting live on the control plane
// (comm/control.h), reached through control(); buffer registration in comm/buffer.h.
//
// Contract for every data-plane call:
//  - Collective (allgatherv, allreduceSum, allreduceSumIdentical, shiftRing): every
//    rank calls it, in the same order, with the same clock and the same length.
//  - Blocking: returns when this rank's part is complete, or throws TimeoutError
//    once timeout() of this process's running time has passed (comm/stall.h:
//    time it was stopped does not count), naming the operation and the clock.
//  - Who held a collective up: an MPI collective does not say which rank is late,
//    so after a collective times out the base runs comm::findStalled on the
//    control plane (each rank that timed out tells its peers and listens a short
//    grace, min(timeout/4, 1 s)) and throws comm::StallError: the backend's
//    message, then "; stalled or gone: rank S" naming the peers it did not hear
//    from ("; every peer timed out too" when it heard all), with reports() true on
//    the lowest rank that timed out only, so a job prints one line. No message is
//    sent while collectives complete. flushSends names its peers itself and is
//    not diagnosed.
//  - After a TimeoutError the data plane is unusable: every later data-plane call
//    throws Error, and a late peer may still write into the buffers of the call
//    that timed out. The control plane stays usable, so ranks can agree to end.
//  - Not thread-safe: one thread per transport object drives it.
//
// Traffic counters record the logical traffic this rank hands to the network for
// training data; they are counted here, once, by the formulas of comm::traffic
// below, so every backend reports the same numbers for the same calls, whatever
// algorithm it really runs. Control-plane traffic is not counted.
#pragma once

#include "comm/buffer.h"
#include "comm/control.h"
#include "comm/message.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace orpheus::comm {

struct TrafficCounters {
  uint64_t bytesSent = 0;
  uint64_t messages = 0;

  TrafficCounters& operator+=(const TrafficCounters& o) {
    bytesSent += o.bytesSent;
    messages += o.messages;
    return *this;
  }
  bool operator==(const TrafficCounters&) const = default;
};

// Every rank's contribution to an allgather, concatenated in rank order.
struct Gathered {
  std::vector<std::byte> data;
  std::vector<size_t> offsets;  // size() + 1 entries
  // Seconds this rank waited for the last rank to join the call, where the backend
  // can tell it from the transfer (MPI: the exchange of record sizes); else 0.
  double waitSeconds = 0.0;

  size_t count() const { return offsets.empty() ? 0 : offsets.size() - 1; }
  std::span<const std::byte> part(size_t rank) const {
    return {data.data() + offsets[rank], offsets[rank + 1] - offsets[rank]};
  }
};

// Collectives on float spans run in chunks of at most this many floats (64 MiB):
// a backend's extra memory stays bounded, and the chunk is the unit traffic is
// counted in. One constant for every backend, so their counts agree.
inline constexpr size_t kChunkFloats = size_t{1} << 24;

// The counting formulas: the logical traffic of one call on one rank of `ranks`.
// With one rank nothing is sent. Float collectives are counted per chunk of
// kChunkFloats (n floats in the chunk, integer arithmetic per chunk):
namespace traffic {
// allgatherv: the local record to each of the P-1 peers, one message each.
TrafficCounters allgatherv(uint64_t localBytes, int ranks);
// allreduceSum: the bandwidth-optimal ring, 2(P-1)/P·4n bytes in 2(P-1) messages.
TrafficCounters allreduceSum(size_t floats, int ranks);
// allreduceSumIdentical: reduce-scatter + allgather of blocks of b = ceil(n/P)
// floats, 2(P-1)·4b bytes in 2(P-1) messages.
TrafficCounters allreduceSumIdentical(size_t floats, int ranks);
// shiftRing: 4n bytes to the right neighbour, one message.
TrafficCounters shiftRing(size_t floats, int ranks);
// sendAsync: the message itself.
TrafficCounters send(uint64_t bytes);
}  // namespace traffic

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // The control plane of the same job and ranks.
  virtual ControlPlane& control() = 0;

  // Full broadcast of variable-size records: sizes first, then the payloads.
  Gathered allgatherv(std::span<const std::byte> local, uint64_t clock);
  // allgatherv of the concatenation of `local`'s pieces, sent from where they lie
  // where the backend can (MPI: one derived datatype over their addresses). The
  // pieces need to live only for the call. Counted as allgatherv of that many bytes.
  Gathered allgatherv(const Pieces& local, uint64_t clock);
  // Training data: in-place sum over ranks (the library's allreduce).
  void allreduceSum(std::span<float> data, uint64_t clock);
  // allreduceSum, nonblocking: begun now, complete after finishAllreduces(). Each
  // runs exactly the reduction allreduceSum runs on the same span, so the sums are
  // the same bit for bit. Collective like allreduceSum (every rank begins the same
  // lengths in the same order); `data` must stay alive and untouched until
  // finished. progressAllreduces() lets begun reductions advance without blocking
  // (a backend without nonblocking collectives completes each as it is begun).
  void beginAllreduceSum(std::span<float> data, uint64_t clock);
  void progressAllreduces();
  void finishAllreduces();
  // In-place sum over ranks that every rank gets bitwise identical (replica averaging).
  void allreduceSumIdentical(std::span<float> data, uint64_t clock);
  // Replica rotation: sends `data` to rank+1 and replaces it with rank-1's (mod P).
  void shiftRing(std::span<float> data, uint64_t clock);

  // Point-to-point training data, nonblocking and not collective. The transport
  // keeps `bytes` alive until the send completes. Messages from one sender arrive
  // in the order they were sent.
  void sendAsync(int peer, SharedBytes bytes);
  // sendAsync of the concatenation of the pieces, sent from where they lie where the
  // backend can; the transport keeps `pieces` (and so its owner) until the send
  // completes. The receiver gets one message, as from sendAsync of those bytes.
  void sendAsync(int peer, SharedPieces pieces);
  // A data message that has arrived from any peer, or nothing; never blocks.
  std::optional<Message> tryReceive();
  // tryReceive that, where the backend can wait without holding other ranks up,
  // waits up to `wait` for a message when none is there (a loopback rank under a
  // run gate sleeps outside the gate until a peer posts); other backends answer at
  // once, as tryReceive does.
  std::optional<Message> receiveWithin(std::chrono::microseconds wait);
  // Waits until every data send posted so far has completed (TimeoutError after timeout()).
  void flushSends();

  // See comm/buffer.h.
  RegisteredBuffer registerBuffer(std::span<std::byte> bytes, MemoryKind kind);
  // True when the data plane can send from and receive into device memory itself
  // (an MPI library that says, at run time, that it is CUDA-aware); otherwise SVs
  // on a device cross host memory ("staged").
  bool deviceMemoryAware() const { return doDeviceMemoryAware(); }

  const TrafficCounters& counters() const { return counters_; }
  // Sets the deadline of the data plane and of control().
  void setTimeout(std::chrono::milliseconds t);
  std::chrono::milliseconds timeout() const { return timeout_; }

 protected:
  // The backend's part. The base has checked the arguments and the transport's
  // health and counts the traffic after a call returns. Float collectives are
  // called only with more than one rank, once per chunk of at most kChunkFloats.
  virtual Gathered doAllgatherv(std::span<const std::byte> local, uint64_t clock) = 0;
  virtual void doAllreduceSum(std::span<float> chunk, uint64_t clock) = 0;
  virtual void doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) = 0;
  // Nonblocking allreduceSum: by default the blocking one, at once.
  virtual void doBeginAllreduceSum(std::span<float> chunk, uint64_t clock) { doAllreduceSum(chunk, clock); }
  virtual void doProgressAllreduces() {}
  virtual void doFinishAllreduces() {}
  virtual void doShiftRing(std::span<float> chunk, uint64_t clock) = 0;
  virtual void doSendAsync(int peer, SharedBytes bytes) = 0;
  // Scatter/gather: by default the pieces joined into one buffer for doSendAsync
  // and doAllgatherv (a decorator that forwards those sees the same bytes).
  virtual void doSendPiecesAsync(int peer, SharedPieces pieces);
  virtual Gathered doAllgathervPieces(const Pieces& local, uint64_t clock);
  virtual std::optional<Message> doTryReceive() = 0;
  virtual std::optional<Message> doReceiveWithin(std::chrono::microseconds wait) {
    (void)wait;
    return doTryReceive();
  }
  virtual void doFlushSends() = 0;
  // Host memory, and device memory where doDeviceMemoryAware(): no state (null).
  // Any other kind: InputError naming the transport.
  virtual std::unique_ptr<BufferRegistration> doRegisterBuffer(std::span<std::byte> bytes, MemoryKind kind);
  virtual bool doDeviceMemoryAware() const { return false; }

 private:
  // Runs one backend call; a TimeoutError it throws makes the data plane unusable.
  // A collective's (`clock` given) becomes a StallError after findStalled.
  template <typename Fn>
  auto guarded(std::optional<uint64_t> clock, Fn&& fn) -> decltype(fn());
  template <typename Fn>
  void forEachChunk(std::span<float> data, Fn&& fn);
  void checkUsable(const char* call) const;

  TrafficCounters counters_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
  std::optional<uint64_t> pendingClock_;  // the clock of begun, unfinished allreduces
  std::string failed_;  // the timeout that made the data plane unusable; empty while usable
};

}  // namespace orpheus::comm
