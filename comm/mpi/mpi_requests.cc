#include "comm/mpi/mpi_requests.h"

#include "comm/stall.h"
#include "engine/base/error.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

namespace orpheus::comm::mpi {

void checkMpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(len))));
}

namespace {
std::atomic<bool> busyPolling{false};
}  // namespace

void pollBusily(bool busy) { busyPolling.store(busy, std::memory_order_relaxed); }

bool coreForEachRank(MPI_Comm comm) {
  int rank = 0;
  ORPHEUS_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm host = MPI_COMM_NULL;
  ORPHEUS_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host));
  int ranks = 0;
  ORPHEUS_MPI_CHECK(MPI_Comm_size(host, &ranks));
  ORPHEUS_MPI_CHECK(MPI_Comm_free(&host));
  return static_cast<unsigned>(ranks) <= std::max(1u, std::thread::hardware_concurrency());
}

void waitFor(MPI_Request& request, std::chrono::milliseconds timeout, const std::function<std::string()>& describe) {
  Deadline deadline(timeout);
  const bool busy = busyPolling.load(std::memory_order_relaxed);
  int done = 0;
  // Spin briefly for latency (busily: throughout), then back off so ranks that share
  // the cores leave them to those still computing.
  for (int spins = 0;; ++spins) {
    ORPHEUS_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if ((spins & 63) == 63 && deadline.passed()) throw TimeoutError(describe());
    if (busy || spins < 64) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::optional<Message> receiveAny(MPI_Comm comm, int tag) {
  int flag = 0;
  MPI_Message handle;
  MPI_Status status;
  ORPHEUS_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, tag, comm, &flag, &handle, &status));
  if (!flag) return std::nullopt;
  int count = 0;
  ORPHEUS_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
  Message m;
  m.peer = status.MPI_SOURCE;
  m.bytes.resize(static_cast<size_t>(count));
  ORPHEUS_MPI_CHECK(MPI_Mrecv(m.bytes.data(), count, MPI_BYTE, &handle, MPI_STATUS_IGNORE));
  return m;
}

PiecesType::PiecesType(const Pieces& pieces) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  size_t total = 0;
  for (const auto& p : pieces.pieces) {
    if (p.empty()) continue;
    total += p.size();
    ORPHEUS_ENFORCE(total <= INT32_MAX, "a message of more than {} bytes exceeds MPI's count limit", total);
    MPI_Aint address = 0;
    ORPHEUS_MPI_CHECK(MPI_Get_address(p.data(), &address));
    lengths.push_back(static_cast<int>(p.size()));
    addresses.push_back(address);
  }
  ORPHEUS_MPI_CHECK(MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), addresses.data(),
                                             MPI_BYTE, &type_));
  ORPHEUS_MPI_CHECK(MPI_Type_commit(&type_));
}

PiecesType::~PiecesType() { release(); }

void PiecesType::release() {
  if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
}

SendQueue::~SendQueue() {
  for (auto& s : pending_) {
    MPI_Cancel(&s.request);
    MPI_Request_free(&s.request);
  }
}

void SendQueue::post(int peer, SharedBytes bytes) {
  ORPHEUS_ENFORCE(bytes->size() <= INT32_MAX, "a message of {} bytes exceeds MPI's count limit", bytes->size());
  reap();
  Pending s{MPI_REQUEST_NULL, peer, std::move(bytes), nullptr};
  ORPHEUS_MPI_CHECK(
      MPI_Isend(s.bytes->data(), static_cast<int>(s.bytes->size()), MPI_BYTE, peer, tag_, comm_, &s.request));
  pending_.push_back(std::move(s));
}

void SendQueue::post(int peer, SharedPieces pieces) {
  const PiecesType type(*pieces);
  reap();
  Pending s{MPI_REQUEST_NULL, peer, nullptr, std::move(pieces)};
  ORPHEUS_MPI_CHECK(MPI_Isend(MPI_BOTTOM, 1, type.get(), peer, tag_, comm_, &s.request));
  pending_.push_back(std::move(s));
}

void SendQueue::reap() {
  size_t kept = 0;
  for (auto& s : pending_) {
    int done = 0;
    ORPHEUS_MPI_CHECK(MPI_Test(&s.request, &done, MPI_STATUS_IGNORE));
    if (!done) pending_[kept++] = std::move(s);
  }
  pending_.resize(kept);
}

void SendQueue::flush(std::chrono::milliseconds timeout, int rank, const char* what) {
  Deadline deadline(timeout);
  for (;;) {
    reap();
    if (pending_.empty()) return;
    if (deadline.passed()) {
      std::set<int> peers;
      for (const auto& s : pending_) peers.insert(s.peer);
      throw TimeoutError(fmt::format("rank {}: {}: {} sends to rank(s) {} did not complete within {} s (the peer is "
                                     "stalled or gone)",
                                     rank, what, pending_.size(), fmt::join(peers, ", "), timeout.count() / 1000.0));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace orpheus::comm::mpi
