#include "comm/loopback/loopback_transport.h"

#include "engine/base/error.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace orpheus::comm::loopback {

LoopbackHub::LoopbackHub(int size) : size_(size), slots_(static_cast<size_t>(size)) {
  ORPHEUS_ENFORCE(size >= 1, "a loopback job needs at least one rank, got {}", size);
}

std::shared_ptr<const std::vector<std::vector<std::byte>>> LoopbackHub::exchange(int rank, std::vector<std::byte> bytes,
                                                                                  std::chrono::milliseconds timeout,
                                                                                  const char* what, uint64_t clock) {
  std::unique_lock lock(mu_);
  slots_[static_cast<size_t>(rank)] = std::move(bytes);
  const uint64_t myRound = round_;
  if (++arrived_ == size_) {
    published_ = std::make_shared<const std::vector<std::vector<std::byte>>>(std::move(slots_));
    slots_.assign(static_cast<size_t>(size_), {});
    arrived_ = 0;
    ++round_;
    cv_.notify_all();
    return published_;
  }
  if (!cv_.wait_for(lock, timeout, [&] { return round_ != myRound; })) {
    throw TimeoutError(fmt::format("rank {}: {} at clock {} did not complete within {} s ({} of {} ranks arrived)",
                                   rank, what, clock, timeout.count() / 1000.0, arrived_, size_));
  }
  // Rounds are strictly sequential per rank, so the published round is ours.
  return published_;
}

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

Gathered LoopbackTransport::allgatherv(std::span<const std::byte> local, uint64_t clock) {
  auto all = hub_->exchange(rank_, {local.begin(), local.end()}, timeout_, "allgatherv of SV batches", clock);
  Gathered out;
  out.offsets.push_back(0);
  for (const auto& part : *all) out.offsets.push_back(out.offsets.back() + part.size());
  out.data.reserve(out.offsets.back());
  for (const auto& part : *all) out.data.insert(out.data.end(), part.begin(), part.end());
  const auto peers = static_cast<uint64_t>(size() - 1);
  counters_.bytesSent += local.size() * peers;
  counters_.messages += peers;
  return out;
}

template <typename T, typename Op>
void LoopbackTransport::reduce(std::span<T> data, Op op, const char* what, uint64_t clock) {
  std::vector<std::byte> bytes(data.size_bytes());
  std::memcpy(bytes.data(), data.data(), data.size_bytes());
  auto all = hub_->exchange(rank_, std::move(bytes), timeout_, what, clock);
  // Every rank reduces in rank order, so all ranks get bitwise identical results.
  std::vector<T> acc(data.size());
  for (size_t r = 0; r < all->size(); ++r) {
    const auto& part = (*all)[r];
    ORPHEUS_ENFORCE(part.size() == data.size_bytes(), "{}: rank {} contributed {} bytes, expected {}", what, r,
                    part.size(), data.size_bytes());
    const T* values = reinterpret_cast<const T*>(part.data());
    for (size_t i = 0; i < data.size(); ++i) acc[i] = r == 0 ? values[i] : op(acc[i], values[i]);
  }
  std::copy(acc.begin(), acc.end(), data.begin());
}

void LoopbackTransport::allreduceSum(std::span<float> data, uint64_t clock) {
  reduce(data, [](float a, float b) { return a + b; }, "allreduce of gradients", clock);
  const auto p = static_cast<uint64_t>(size());
  if (p > 1) {
    counters_.bytesSent += 2 * data.size() * sizeof(float) * (p - 1) / p;
    counters_.messages += 2 * (p - 1);
  }
}

void LoopbackTransport::allreduceSumIdentical(std::span<float> data, uint64_t clock) {
  // Every rank reduces in rank order already; counted as the MPI transport's
  // reduce-scatter + allgather of blocks of ceil(N/P).
  reduce(data, [](float a, float b) { return a + b; }, "sum of replicas", clock);
  const auto p = static_cast<uint64_t>(size());
  if (p > 1) {
    const uint64_t block = (data.size() + p - 1) / p * sizeof(float);
    counters_.bytesSent += 2 * block * (p - 1);
    counters_.messages += 2 * (p - 1);
  }
}

void LoopbackTransport::shiftRing(std::span<float> data, uint64_t clock) {
  const int p = size();
  if (p == 1) return;
  std::vector<std::byte> bytes(data.size_bytes());
  std::memcpy(bytes.data(), data.data(), data.size_bytes());
  auto all = hub_->exchange(rank_, std::move(bytes), timeout_, "replica rotation", clock);
  const auto& left = (*all)[static_cast<size_t>((rank_ + p - 1) % p)];
  ORPHEUS_ENFORCE(left.size() == data.size_bytes(), "replica rotation: rank {} sent {} bytes, expected {}",
                  (rank_ + p - 1) % p, left.size(), data.size_bytes());
  std::memcpy(data.data(), left.data(), left.size());
  counters_.bytesSent += data.size_bytes();
  counters_.messages += 1;
}

void LoopbackTransport::controlSum(std::span<double> data) {
  reduce(data, [](double a, double b) { return a + b; }, "control allreduce", 0);
}
void LoopbackTransport::controlMax(std::span<double> data) {
  reduce(data, [](double a, double b) { return std::max(a, b); }, "control allreduce", 0);
}
void LoopbackTransport::controlMin(std::span<double> data) {
  reduce(data, [](double a, double b) { return std::min(a, b); }, "control allreduce", 0);
}

void LoopbackHub::post(int to, Channel channel, Message m) {
  std::lock_guard lock(mailMu_);
  mail_[{to, static_cast<int>(channel)}].push_back(std::move(m));
}

std::optional<Message> LoopbackHub::take(int rank, Channel channel) {
  std::lock_guard lock(mailMu_);
  auto& box = mail_[{rank, static_cast<int>(channel)}];
  if (box.empty()) return std::nullopt;
  Message m = std::move(box.front());
  box.pop_front();
  return m;
}

void LoopbackTransport::sendAsync(int peer, Channel channel, SharedBytes bytes) {
  ORPHEUS_ENFORCE(peer >= 0 && peer < size() && peer != rank_, "rank {} cannot send to rank {}", rank_, peer);
  if (channel == Channel::kData) {
    counters_.bytesSent += bytes->size();
    counters_.messages += 1;
  }
  hub_->post(peer, channel, Message{rank_, *bytes});
}

std::optional<Message> LoopbackTransport::tryReceive(Channel channel) { return hub_->take(rank_, channel); }

void LoopbackTransport::abortJob(int exitCode) { std::_Exit(exitCode); }

}  // namespace orpheus::comm::loopback
