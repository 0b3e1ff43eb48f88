#include "comm/mpi/mpi_transport.h"

#include "engine/base/error.h"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <chrono>

namespace orpheus::comm::mpi {
namespace {
constexpr int kDataTag = 1;
constexpr int kRingTag = 3;
// Open MPI's run-time answer (its mpi-ext.h declares the query whether or not the
// library it was built against was CUDA-aware; the library loaded now decides).
bool queryCudaAware() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}
}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm) : control_(comm) {
  ORPHEUS_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  ORPHEUS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ORPHEUS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // Errors come back as return codes so they become exceptions with context.
  ORPHEUS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  sends_.emplace(comm_, kDataTag);
  cudaAware_ = queryCudaAware();
  pollBusily(coreForEachRank(comm_));
}

MpiTransport::~MpiTransport() {
  sends_.reset();
  if (abandoned_ || !reduces_.empty()) {
    // A late peer may still complete an abandoned request: into this memory, on
    // this communicator. Neither is given back.
    static_cast<void>(scratch_.release());
    for (auto& r : reduces_) static_cast<void>(r.release());
    return;
  }
  MPI_Comm_free(&comm_);
}

void MpiTransport::wait(MPI_Request& request, const char* what, uint64_t clock, int peer) {
  try {
    waitFor(request, timeout(), [&] {
      // A collective does not say which rank is late: the base finds out (comm/stall.h).
      const std::string who = peer >= 0 ? fmt::format(" (rank {} is stalled or gone)", peer) : "";
      return fmt::format("rank {}: {} at clock {} did not complete within {} s{}", rank_, what, clock,
                         timeout().count() / 1000.0, who);
    });
  } catch (const TimeoutError&) {
    abandoned_ = true;
    throw;
  }
}

Gathered MpiTransport::doAllgatherv(std::span<const std::byte> local, uint64_t clock) {
  ORPHEUS_ENFORCE(local.size() <= INT32_MAX, "record of rank {} has {} bytes (limit 2 GiB)", rank_, local.size());
  return gatherRecords(local.data(), static_cast<int>(local.size()), MPI_BYTE, local.size(), clock);
}

Gathered MpiTransport::doAllgathervPieces(const Pieces& local, uint64_t clock) {
  PiecesType type(local);
  Gathered out = gatherRecords(MPI_BOTTOM, 1, type.get(), local.size(), clock);
  return out;
}

Gathered MpiTransport::gatherRecords(const void* buffer, int count, MPI_Datatype type, size_t bytes, uint64_t clock) {
  Scratch& s = *scratch_;
  const auto p = static_cast<size_t>(size_);
  s.localSize = static_cast<long long>(bytes);
  s.sizes.assign(p, 0);
  MPI_Request req;
  // A few bytes from each rank: this takes as long as the last rank takes to come.
  const auto joined = std::chrono::steady_clock::now();
  ORPHEUS_MPI_CHECK(MPI_Iallgather(&s.localSize, 1, MPI_LONG_LONG, s.sizes.data(), 1, MPI_LONG_LONG, comm_, &req));
  wait(req, "allgatherv of SV batches (record sizes)", clock);

  Gathered out;
  out.waitSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - joined).count();
  out.offsets.assign(p + 1, 0);
  s.counts.resize(p);
  s.displs.resize(p);
  for (size_t r = 0; r < p; ++r) {
    ORPHEUS_ENFORCE(s.sizes[r] >= 0 && s.sizes[r] <= INT32_MAX, "record of rank {} has {} bytes (limit 2 GiB)", r,
                    s.sizes[r]);
    out.offsets[r + 1] = out.offsets[r] + static_cast<size_t>(s.sizes[r]);
    s.counts[r] = static_cast<int>(s.sizes[r]);
  }
  ORPHEUS_ENFORCE(out.offsets.back() <= INT32_MAX, "records of clock {} total {} bytes (limit 2 GiB)", clock,
                  out.offsets.back());
  for (size_t r = 0; r < p; ++r) s.displs[r] = static_cast<int>(out.offsets[r]);
  s.records.resize(out.offsets.back());
  ORPHEUS_MPI_CHECK(MPI_Iallgatherv(buffer, count, type, s.records.data(), s.counts.data(), s.displs.data(), MPI_BYTE,
                                    comm_, &req));
  wait(req, "allgatherv of SV batches", clock);
  out.data = std::move(s.records);
  s.records = {};
  return out;
}

void MpiTransport::doAllreduceSum(std::span<float> chunk, uint64_t clock) {
  // A separate send buffer, not MPI_IN_PLACE: Open MPI's nonblocking allreduce
  // (libnbc) falls back to a binomial tree for in-place calls, which moves every
  // byte log2(P) times through the root; with two buffers it uses a ring, which
  // sends 2(P-1)/P of the data per rank (3-4x faster for large matrices over TCP).
  auto& send = scratch_->a;
  send.assign(chunk.begin(), chunk.end());
  MPI_Request req;
  ORPHEUS_MPI_CHECK(MPI_Iallreduce(send.data(), chunk.data(), static_cast<int>(chunk.size()), MPI_FLOAT, MPI_SUM,
                                   comm_, &req));
  wait(req, "allreduce of gradients", clock);
}

// The same MPI_Iallreduce as doAllreduceSum (separate send buffer), left running.
void MpiTransport::doBeginAllreduceSum(std::span<float> chunk, uint64_t clock) {
  auto pending = std::make_unique<PendingReduce>();
  pending->send.assign(chunk.begin(), chunk.end());
  pending->clock = clock;
  ORPHEUS_MPI_CHECK(MPI_Iallreduce(pending->send.data(), chunk.data(), static_cast<int>(chunk.size()), MPI_FLOAT,
                                   MPI_SUM, comm_, &pending->request));
  reduces_.push_back(std::move(pending));
}

void MpiTransport::doProgressAllreduces() {
  for (auto& r : reduces_) {
    if (r->request == MPI_REQUEST_NULL) continue;
    int done = 0;
    ORPHEUS_MPI_CHECK(MPI_Test(&r->request, &done, MPI_STATUS_IGNORE));
  }
}

void MpiTransport::doFinishAllreduces() {
  for (auto& r : reduces_) {
    if (r->request != MPI_REQUEST_NULL) wait(r->request, "allreduce of gradients", r->clock);
  }
  reduces_.clear();
}

void MpiTransport::doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) {
  // Reduce-scatter then allgather: every element is summed in one place, so every
  // rank ends with bitwise the same result (a plain allreduce does not promise that).
  const auto p = static_cast<size_t>(size_);
  const size_t n = chunk.size();
  const size_t block = (n + p - 1) / p;
  auto& all = scratch_->a;
  auto& mine = scratch_->b;
  all.assign(block * p, 0.0f);
  std::copy(chunk.begin(), chunk.end(), all.begin());
  mine.resize(block);
  MPI_Request req;
  ORPHEUS_MPI_CHECK(MPI_Ireduce_scatter_block(all.data(), mine.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                                              comm_, &req));
  wait(req, "reduce-scatter of parameters", clock);
  ORPHEUS_MPI_CHECK(MPI_Iallgather(mine.data(), static_cast<int>(block), MPI_FLOAT, all.data(),
                                   static_cast<int>(block), MPI_FLOAT, comm_, &req));
  wait(req, "allgather of parameters", clock);
  std::copy(all.begin(), all.begin() + static_cast<long>(n), chunk.begin());
}

void MpiTransport::doShiftRing(std::span<float> chunk, uint64_t clock) {
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  auto& outgoing = scratch_->a;
  outgoing.assign(chunk.begin(), chunk.end());
  const int n = static_cast<int>(chunk.size());
  MPI_Request reqs[2];
  ORPHEUS_MPI_CHECK(MPI_Irecv(chunk.data(), n, MPI_FLOAT, left, kRingTag, comm_, &reqs[0]));
  ORPHEUS_MPI_CHECK(MPI_Isend(outgoing.data(), n, MPI_FLOAT, right, kRingTag, comm_, &reqs[1]));
  wait(reqs[0], "replica rotation (receive)", clock, left);
  wait(reqs[1], "replica rotation (send)", clock, right);
}

void MpiTransport::doSendAsync(int peer, SharedBytes bytes) { sends_->post(peer, std::move(bytes)); }

void MpiTransport::doSendPiecesAsync(int peer, SharedPieces pieces) { sends_->post(peer, std::move(pieces)); }

std::optional<Message> MpiTransport::doTryReceive() {
  sends_->reap();
  return receiveAny(comm_, kDataTag);
}

void MpiTransport::doFlushSends() { sends_->flush(timeout(), rank_, "data sends"); }

}  // namespace orpheus::comm::mpi
