#include "comm/mpi/mpi_control.h"

#include "comm/stall.h"
#include "engine/base/error.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

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
  // Reduced in a buffer of its own: if the wait times out, a late peer may still
  // complete the operation into it, so it is then left allocated, never reused.
  auto* buffer = new std::vector<double>(values.begin(), values.end());
  MPI_Request req;
  ORPHEUS_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, buffer->data(), static_cast<int>(buffer->size()), MPI_DOUBLE, op, comm_, &req));
  try {
    waitFor(req, timeout(), [&] {
      return fmt::format("rank {}: {} did not complete within {} s", rank_, what, timeout().count() / 1000.0);
    });
  } catch (const TimeoutError& e) {
    // As for a data-plane collective: find out which peers never came, and who
    // reports for the job (comm/stall.h). The clock is not known here.
    const StallVerdict v = findStalled(*this, rank_, size_, 0);
    throw StallError(e.what() + stallSuffix(v), v.reports);
  }
  std::copy(buffer->begin(), buffer->end(), values.begin());
  delete buffer;
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
  // A job of one process has no peer to stop: MPI_Abort would only add its banner
  // under the one line already printed.
  int size = 0;
  MPI_Comm_size(comm_, &size);
  if (size == 1) std::_Exit(exitCode);
  MPI_Abort(comm_, exitCode);
  std::_Exit(exitCode);
}

}  // namespace orpheus::comm::mpi
