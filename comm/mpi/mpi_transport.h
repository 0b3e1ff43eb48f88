// Transport over MPI. Collectives are issued nonblocking (MPI_Iallgatherv,
// MPI_Iallreduce, ...) and polled against the transport's deadline, so no wait
// is unbounded. The data plane and the control plane each run on their own
// duplicate of the given communicator. Traffic is counted by the base
// (comm/transport.h), whatever Open MPI's algorithms really send.
//
// Timeouts: MPI cannot cancel a collective, so after a TimeoutError the request
// stays active and a late peer can still complete it. The scratch memory and the
// communicator such a request may touch are never freed; the caller's span may
// still be written.
// A collective's timeout names the operation and the clock; MPI does not say
// which rank is late, the base finds that out (comm/stall.h). The ring shift and
// sends name the peer they wait on.
#pragma once

#include "comm/mpi/mpi_control.h"
#include "comm/mpi/mpi_requests.h"
#include "comm/transport.h"

#include <mpi.h>

#include <memory>
#include <vector>

namespace orpheus::comm::mpi {

class MpiTransport final : public Transport {
 public:
  // Duplicates `comm` for each plane (collective over `comm`). MPI must be
  // initialised before and finalised only after the transport is destroyed.
  explicit MpiTransport(MPI_Comm comm);
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  ControlPlane& control() override { return control_; }

 protected:
  Gathered doAllgatherv(std::span<const std::byte> local, uint64_t clock) override;
  void doAllreduceSum(std::span<float> chunk, uint64_t clock) override;
  void doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) override;
  void doBeginAllreduceSum(std::span<float> chunk, uint64_t clock) override;
  void doProgressAllreduces() override;
  void doFinishAllreduces() override;
  void doShiftRing(std::span<float> chunk, uint64_t clock) override;
  void doSendAsync(int peer, SharedBytes bytes) override;
  void doSendPiecesAsync(int peer, SharedPieces pieces) override;
  Gathered doAllgathervPieces(const Pieces& local, uint64_t clock) override;
  std::optional<Message> doTryReceive() override;
  void doFlushSends() override;
  // What the library says at run time (MPIX_Query_cuda_support), asked once.
  bool doDeviceMemoryAware() const override { return cudaAware_; }

 private:
  // Memory a pending request reads or writes, kept here (not on the stack) so
  // a request abandoned by a timeout never touches freed memory.
  struct Scratch {
    long long localSize = 0;
    std::vector<long long> sizes;
    std::vector<int> counts;
    std::vector<int> displs;
    std::vector<std::byte> records;
    std::vector<float> a;
    std::vector<float> b;
  };
  // A begun allreduce: its request and send buffer (kept until done, like Scratch).
  struct PendingReduce {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<float> send;
    uint64_t clock = 0;
  };
  // Polls `request` until done; TimeoutError naming `what`, `clock` and `peer` (-1: unknown).
  void wait(MPI_Request& request, const char* what, uint64_t clock, int peer = -1);
  // allgatherv of `bytes` bytes laid out at `buffer` as `count` of `type`.
  Gathered gatherRecords(const void* buffer, int count, MPI_Datatype type, size_t bytes, uint64_t clock);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool cudaAware_ = false;
  MpiControlPlane control_;
  std::optional<SendQueue> sends_;
  std::unique_ptr<Scratch> scratch_ = std::make_unique<Scratch>();
  std::vector<std::unique_ptr<PendingReduce>> reduces_;
  bool abandoned_ = false;  // a request timed out and may still be active
};

}  // namespace orpheus::comm::mpi
