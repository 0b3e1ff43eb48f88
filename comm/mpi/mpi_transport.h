// Transport over MPI. Collectives are issued nonblocking (MPI_Iallgatherv,
// MPI_Iallreduce) and polled against the transport's deadline, so no wait is
// unbounded. Byte counts follow the algorithms' logical traffic per rank:
// allgatherv sends the local record to each of the P-1 peers; a sum-allreduce of
// N bytes counts 2 (P-1)/P N bytes in 2 (P-1) messages (the bandwidth-optimal ring
// schedule); the identical-result sum runs as reduce-scatter + allgather of blocks
// of ceil(N/P) and counts those; a ring shift sends N bytes.
#pragma once

#include "comm/transport.h"

#include <mpi.h>

#include <vector>

namespace orpheus::comm::mpi {

class MpiTransport final : public Transport {
 public:
  // Uses (does not own) `comm`; MPI must be initialised and outlive the transport.
  explicit MpiTransport(MPI_Comm comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  Gathered allgatherv(std::span<const std::byte> local, uint64_t clock) override;
  void allreduceSum(std::span<float> data, uint64_t clock) override;
  void allreduceSumIdentical(std::span<float> data, uint64_t clock) override;
  void shiftRing(std::span<float> data, uint64_t clock) override;
  void controlSum(std::span<double> data) override;
  void controlMax(std::span<double> data) override;
  void controlMin(std::span<double> data) override;
  void sendAsync(int peer, Channel channel, SharedBytes bytes) override;
  std::optional<Message> tryReceive(Channel channel) override;
  void flushSends() override;
  [[noreturn]] void abortJob(int exitCode) override;
  ~MpiTransport() override;

 private:
  struct PendingSend {
    MPI_Request request;
    SharedBytes bytes;
  };
  // Completes finished sends and releases their buffers.
  void reapSends();
  // Polls `request` until done or the deadline passes (TimeoutError naming `what` and `clock`).
  void wait(MPI_Request& request, const char* what, uint64_t clock);
  void controlReduce(std::span<double> data, MPI_Op op);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<PendingSend> sends_;
  std::vector<float> allreduceSend_;  // the send side of allreduceSum (not in place: see there)
};

}  // namespace orpheus::comm::mpi
