// The transport interface the engine talks to. Modeled after c10d: one virtual per
// collective, each with a deadline; what a backend cannot do throws, never a silent
// no-op.
//
// Contract for every call:
//  - Collective: every rank calls it, in the same order, with the same clock.
//  - Blocking: returns when this rank's part is complete, or throws TimeoutError
//    naming the operation, the clock and the peers still missing once `timeout`
//    has passed.
//  - Not thread-safe: one thread per transport object drives it.
// Traffic counters record what this rank hands to the network for training data
// (SV batches, gradients); control traffic (metrics, error agreement) is not counted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace orpheus::comm {

struct TrafficCounters {
  uint64_t bytesSent = 0;
  uint64_t messages = 0;
};

// Every rank's contribution to an allgather, concatenated in rank order.
struct Gathered {
  std::vector<std::byte> data;
  std::vector<size_t> offsets;  // size() + 1 entries

  size_t count() const { return offsets.empty() ? 0 : offsets.size() - 1; }
  std::span<const std::byte> part(size_t rank) const {
    return {data.data() + offsets[rank], offsets[rank + 1] - offsets[rank]};
  }
};

// Point-to-point messages travel on a channel: training data (counted as traffic)
// or control (metrics, coordination; not counted).
enum class Channel : int { kData = 1, kControl = 2 };

struct Message {
  int peer = -1;  // the sender
  std::vector<std::byte> bytes;
};

using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // Full broadcast of variable-size records: sizes first, then the payloads.
  virtual Gathered allgatherv(std::span<const std::byte> local, uint64_t clock) = 0;
  // Training data: in-place sum over ranks (the library's allreduce).
  virtual void allreduceSum(std::span<float> data, uint64_t clock) = 0;
  // In-place sum over ranks that every rank gets bitwise identical (replica averaging).
  virtual void allreduceSumIdentical(std::span<float> data, uint64_t clock) = 0;
  // Replica rotation: sends `data` to rank+1 and replaces it with rank-1's (mod P).
  virtual void shiftRing(std::span<float> data, uint64_t clock) = 0;
  // Control: in-place sum / max / min over ranks; not counted as traffic.
  virtual void controlSum(std::span<double> data) = 0;
  virtual void controlMax(std::span<double> data) = 0;
  virtual void controlMin(std::span<double> data) = 0;

  // Point-to-point, nonblocking and not collective. The transport keeps `bytes`
  // alive until the send completes. Messages from one sender on one channel arrive
  // in the order they were sent.
  virtual void sendAsync(int peer, Channel channel, SharedBytes bytes) = 0;
  // A message that has arrived on `channel` from any peer, or nothing; never blocks.
  virtual std::optional<Message> tryReceive(Channel channel) = 0;
  // Waits until every send posted so far has completed (TimeoutError after timeout()).
  virtual void flushSends() = 0;

  // Ends the whole job at once (all ranks) with the given exit code. Used when one
  // rank hits an error the others cannot know about.
  [[noreturn]] virtual void abortJob(int exitCode) = 0;

  const TrafficCounters& counters() const { return counters_; }
  void setTimeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 protected:
  TrafficCounters counters_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

}  // namespace orpheus::comm
