// The control plane over MPI, on a communicator of its own so control messages
// and reductions never match the data plane's (see comm/control.h).
#pragma once

#include "comm/control.h"
#include "comm/mpi/mpi_requests.h"

#include <mpi.h>

namespace orpheus::comm::mpi {

class MpiControlPlane final : public ControlPlane {
 public:
  // Duplicates `comm` (collective over it); frees the duplicate when destroyed.
  explicit MpiControlPlane(MPI_Comm comm);
  ~MpiControlPlane() override;

  void sum(std::span<double> values) override;
  void max(std::span<double> values) override;
  void min(std::span<double> values) override;
  void send(int peer, SharedBytes bytes) override;
  std::optional<Message> tryReceive() override;
  void flush() override;
  void sendNote(int peer, uint64_t value) override;
  std::optional<Note> tryReceiveNote() override;
  [[noreturn]] void abortJob(int exitCode) override;

 private:
  void reduce(std::span<double> values, MPI_Op op, const char* what);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::optional<SendQueue> sends_;
  std::optional<SendQueue> notes_;
};

}  // namespace orpheus::comm::mpi
