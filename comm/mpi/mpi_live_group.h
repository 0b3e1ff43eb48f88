// The live group over MPI (comm/live_group.h): the agreement is an
// MPI_Iallreduce (MPI_MAX) on a communicator of its own, so it never matches the
// transport's traffic; the next group is MPI_Comm_split of it, or, to grow,
// MPI_Comm_spawn of this program merged with it (MPI_Intercomm_merge).
//
// Open MPI 4's MPI_Finalize waits for every process of the job (a PMIx fence), so a
// rank that left frees its replica, data and buffers at once, but its process ends
// only when the job does: the release latency (notice -> freed) is what the job
// reports, the exit latency is the job's remaining time.
#pragma once

#include "comm/live_group.h"

#include <mpi.h>

#include <string>
#include <vector>

namespace orpheus::comm::mpi {

class MpiLiveGroup final : public LiveGroup {
 public:
  // Spans `comm`'s ranks (collective over it); `argv`: this process's, for grow().
  MpiLiveGroup(MPI_Comm comm, std::vector<std::string> argv);
  // A process grow() spawned: joins its parents' group (collective with their
  // grow()); the group's transport, ranked after the parents, is joined().
  static std::unique_ptr<MpiLiveGroup> join(std::vector<std::string> argv, std::chrono::milliseconds timeout);
  std::unique_ptr<Transport> joined() { return std::move(joined_); }
  ~MpiLiveGroup() override;

  void beginMax(std::span<const double> values) override;
  bool pending() const override { return request_ != MPI_REQUEST_NULL; }
  std::vector<double> finishMax(std::chrono::milliseconds timeout) override;
  std::unique_ptr<Transport> split(bool stays, std::chrono::milliseconds timeout) override;
  std::unique_ptr<Transport> grow(int ranks, uint64_t clock, std::chrono::milliseconds timeout) override;

 private:
  explicit MpiLiveGroup(std::vector<std::string> argv) : argv_(std::move(argv)) {}

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<double> send_;
  std::vector<double> result_;
  bool abandoned_ = false;  // a request timed out and may still be active
  std::vector<std::string> argv_;
  std::unique_ptr<Transport> joined_;
};

}  // namespace orpheus::comm::mpi
