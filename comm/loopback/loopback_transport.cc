#include "comm/loopback/loopback_transport.h"

#include <cstring>

namespace orpheus::comm::loopback {

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank), control_(hub_, rank) {
  ORPHEUS_ENFORCE(rank >= 0 && rank < hub_->size(), "rank {} outside a loopback job of {} ranks", rank, hub_->size());
}

namespace {

Gathered concatenated(const Deposits& all) {
  Gathered out;
  out.offsets.push_back(0);
  for (const auto& part : *all) out.offsets.push_back(out.offsets.back() + part.size());
  out.data.reserve(out.offsets.back());
  for (const auto& part : *all) out.data.insert(out.data.end(), part.begin(), part.end());
  return out;
}

}  // namespace

Gathered LoopbackTransport::doAllgatherv(std::span<const std::byte> local, uint64_t clock) {
  return concatenated(
      hub_->dataRounds().exchange(rank_, {local.begin(), local.end()}, timeout(), "allgatherv of SV batches", clock));
}

Gathered LoopbackTransport::doAllgathervPieces(const Pieces& local, uint64_t clock) {
  return concatenated(hub_->dataRounds().exchange(rank_, local.joined(), timeout(), "allgatherv of SV batches", clock));
}

void LoopbackTransport::doAllreduceSum(std::span<float> chunk, uint64_t clock) {
  reduceInRankOrder(hub_->dataRounds(), rank_, chunk, [](float a, float b) { return a + b; }, timeout(),
                    "allreduce of gradients", clock);
}

void LoopbackTransport::doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) {
  // Every rank reduces in rank order: bitwise identical already.
  reduceInRankOrder(hub_->dataRounds(), rank_, chunk, [](float a, float b) { return a + b; }, timeout(),
                    "sum of replicas", clock);
}

void LoopbackTransport::doShiftRing(std::span<float> chunk, uint64_t clock) {
  const int p = size();
  const int left = (rank_ + p - 1) % p;
  const auto* raw = reinterpret_cast<const std::byte*>(chunk.data());
  const Deposits all =
      hub_->dataRounds().exchange(rank_, {raw, raw + chunk.size_bytes()}, timeout(), "replica rotation", clock);
  const auto& fromLeft = (*all)[static_cast<size_t>(left)];
  ORPHEUS_ENFORCE(fromLeft.size() == chunk.size_bytes(), "replica rotation: rank {} sent {} bytes, expected {}", left,
                  fromLeft.size(), chunk.size_bytes());
  std::memcpy(chunk.data(), fromLeft.data(), fromLeft.size());
}

void LoopbackTransport::doSendAsync(int peer, SharedBytes bytes) {
  hub_->dataMail().post(peer, Message{rank_, *bytes});
}

void LoopbackTransport::doSendPiecesAsync(int peer, SharedPieces pieces) {
  hub_->dataMail().post(peer, Message{rank_, pieces->joined()});
}

std::optional<Message> LoopbackTransport::doTryReceive() { return hub_->dataMail().take(rank_); }

}  // namespace orpheus::comm::loopback
