#include "comm/mpi/mpi_control.h"

#include "engine/base/error.h"

#include <cstdlib>
#include <cstring>

namespace orpheus::comm::mpi {
namespace {
constexpr int kControlTag = 2;
constexpr int kNoteTag = 4;
}  // namespace

MpiControlPlane::MpiControlPlane(MPI_Comm comm) {
  ORPHEUS_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  ORPHEUS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ORPHEUS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // Errors come back as return codes so they become exceptions with context.
  ORPHEUS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  sends_.emplace(comm_, kControlTag);
  notes_.emplace(comm_, kNoteTag);
}

MpiControlPlane::~MpiControlPlane() {
  sends_.reset();
  notes_.reset();
  MPI_Comm_free(&comm_);
}

void MpiControlPlane::reduce(std::span<double> values, MPI_Op op, const char* what) {
  MPI_Request req;
  ORPHEUS_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, op, comm_, &req));
  waitFor(req, timeout(), [&] {
    return fmt::format("rank {}: {} did not complete within {} s (a peer is stalled or gone; an MPI collective does "
                       "not say which)",
                       rank_, what, timeout().count() / 1000.0);
  });
}

void MpiControlPlane::sum(std::span<double> values) { reduce(values, MPI_SUM, "control sum"); }
void MpiControlPlane::max(std::span<double> values) { reduce(values, MPI_MAX, "control max"); }
void MpiControlPlane::min(std::span<double> values) { reduce(values, MPI_MIN, "control min"); }

void MpiControlPlane::send(int peer, SharedBytes bytes) {
  ORPHEUS_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "rank {} cannot send to rank {}", rank_, peer);
  sends_->post(peer, std::move(bytes));
}

std::optional<Message> MpiControlPlane::tryReceive() {
  sends_->reap();
  return receiveAny(comm_, kControlTag);
}

void MpiControlPlane::flush() { sends_->flush(timeout(), rank_, "control channel"); }

void MpiControlPlane::sendNote(int peer, uint64_t value) {
  ORPHEUS_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "rank {} cannot send to rank {}", rank_, peer);
  auto bytes = std::make_shared<std::vector<std::byte>>(sizeof value);
  std::memcpy(bytes->data(), &value, sizeof value);
  notes_->post(peer, std::move(bytes));
}

std::optional<Note> MpiControlPlane::tryReceiveNote() {
  notes_->reap();
  auto m = receiveAny(comm_, kNoteTag);
  if (!m) return std::nullopt;
  ORPHEUS_ENFORCE(m->bytes.size() == sizeof(uint64_t), "a note from rank {} has {} bytes", m->peer, m->bytes.size());
  Note note{m->peer, 0};
  std::memcpy(&note.value, m->bytes.data(), sizeof note.value);
  return note;
}

void MpiControlPlane::abortJob(int exitCode) {
  MPI_Abort(comm_, exitCode);
  std::_Exit(exitCode);
}

}  // namespace orpheus::comm::mpi
