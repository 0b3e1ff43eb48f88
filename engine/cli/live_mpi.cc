#include "engine/cli/live_mpi.h"

#include "comm/mpi/mpi_requests.h"
#include "comm/mpi/mpi_transport.h"

#include <fmt/format.h>

namespace orpheus::engine {

MpiLiveGroup::MpiLiveGroup(MPI_Comm comm) {
  ORPHEUS_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  ORPHEUS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

MpiLiveGroup::~MpiLiveGroup() {
  // A request abandoned by a timeout may still be completed by a late peer: into
  // these buffers, on this communicator. Neither is given back.
  if (abandoned_) {
    new std::vector<double>(std::move(send_));
    new std::vector<double>(std::move(result_));
    return;
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiLiveGroup::beginMax(std::span<const double> values) {
  send_.assign(values.begin(), values.end());
  result_.assign(values.size(), 0.0);
  ORPHEUS_MPI_CHECK(MPI_Iallreduce(send_.data(), result_.data(), static_cast<int>(send_.size()), MPI_DOUBLE, MPI_MAX,
                                   comm_, &request_));
}

std::vector<double> MpiLiveGroup::finishMax(std::chrono::milliseconds timeout) {
  try {
    comm::mpi::waitFor(request_, timeout, [&] {
      return fmt::format("the membership agreement did not complete within {} s", timeout.count() / 1000.0);
    });
  } catch (...) {
    abandoned_ = true;
    throw;
  }
  request_ = MPI_REQUEST_NULL;
  return result_;
}

std::unique_ptr<comm::Transport> MpiLiveGroup::split(bool stays, std::chrono::milliseconds timeout) {
  // MPI has no nonblocking split: it comes right after an agreement every rank of
  // the group completed, so every rank is already here.
  int rank = 0;
  ORPHEUS_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  MPI_Comm next = MPI_COMM_NULL;
  ORPHEUS_MPI_CHECK(MPI_Comm_split(comm_, stays ? 0 : MPI_UNDEFINED, rank, &next));
  MPI_Comm_free(&comm_);
  if (!stays) return nullptr;
  comm_ = next;
  ORPHEUS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  auto transport = std::make_unique<comm::mpi::MpiTransport>(comm_);
  transport->setTimeout(timeout);
  return transport;
}

}  // namespace orpheus::engine
