#include "comm/mpi/mpi_live_group.h"

#include "comm/mpi/mpi_requests.h"
#include "comm/mpi/mpi_transport.h"

#include "engine/base/error.h"

#include <fmt/format.h>

#include <filesystem>

namespace orpheus::comm::mpi {

MpiLiveGroup::MpiLiveGroup(MPI_Comm comm, std::vector<std::string> argv) : argv_(std::move(argv)) {
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
    waitFor(request_, timeout, [&] {
      return fmt::format("the membership agreement did not complete within {} s", timeout.count() / 1000.0);
    });
  } catch (...) {
    abandoned_ = true;
    throw;
  }
  request_ = MPI_REQUEST_NULL;
  return result_;
}

std::unique_ptr<Transport> MpiLiveGroup::split(bool stays, std::chrono::milliseconds timeout) {
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
  auto transport = std::make_unique<MpiTransport>(comm_);
  transport->setTimeout(timeout);
  return transport;
}

std::unique_ptr<Transport> MpiLiveGroup::grow(int ranks, uint64_t clock, std::chrono::milliseconds timeout) {
  // argv without the program, then the join marker; a joined process's own marker is dropped.
  std::vector<std::string> args;
  for (size_t i = 1; i < argv_.size(); ++i) {
    if (argv_[i] == kLiveJoinFlag) {
      ++i;
      continue;
    }
    args.push_back(argv_[i]);
  }
  args.push_back(kLiveJoinFlag);
  args.push_back(std::to_string(clock));
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::vector<int> errors(static_cast<size_t>(ranks), MPI_SUCCESS);
  MPI_Comm children = MPI_COMM_NULL;
  // Blocking: MPI has no nonblocking spawn; every rank is here after the agreement.
  // The launcher starts it: name this program by its real path, not /proc/self/exe.
  std::error_code ec;
  std::string program = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) program = argv_.front();
  ORPHEUS_MPI_CHECK(MPI_Comm_spawn(program.c_str(), cargs.data(), ranks, MPI_INFO_NULL, 0, comm_, &children,
                                   errors.data()));
  MPI_Comm merged = MPI_COMM_NULL;
  ORPHEUS_MPI_CHECK(MPI_Intercomm_merge(children, 0, &merged));
  MPI_Comm_free(&children);
  MPI_Comm_free(&comm_);
  comm_ = merged;
  ORPHEUS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  auto transport = std::make_unique<MpiTransport>(comm_);
  transport->setTimeout(timeout);
  return transport;
}

std::unique_ptr<MpiLiveGroup> MpiLiveGroup::join(std::vector<std::string> argv, std::chrono::milliseconds timeout) {
  MPI_Comm parent = MPI_COMM_NULL;
  ORPHEUS_MPI_CHECK(MPI_Comm_get_parent(&parent));
  if (parent == MPI_COMM_NULL) throw InputError(fmt::format("{} is for processes a running job spawns", kLiveJoinFlag));
  // The same calls, in the same order, as the parents' grow() after their spawn.
  std::unique_ptr<MpiLiveGroup> group(new MpiLiveGroup(std::move(argv)));
  ORPHEUS_MPI_CHECK(MPI_Intercomm_merge(parent, 1, &group->comm_));
  ORPHEUS_MPI_CHECK(MPI_Comm_set_errhandler(group->comm_, MPI_ERRORS_RETURN));
  group->joined_ = std::make_unique<MpiTransport>(group->comm_);
  group->joined_->setTimeout(timeout);
  return group;
}

}  // namespace orpheus::comm::mpi
