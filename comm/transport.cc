#include "comm/transport.h"

#include "comm/stall.h"
#include "engine/base/error.h"

#include <algorithm>

namespace orpheus::comm {

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kDevice: return "device";
  }
  return "unknown";
}

namespace traffic {
namespace {

// Sums `perChunk` over the chunks a span of `floats` is cut into.
template <typename PerChunk>
TrafficCounters chunked(size_t floats, PerChunk perChunk) {
  TrafficCounters total;
  const size_t full = floats / kChunkFloats;
  if (full > 0) {
    const TrafficCounters one = perChunk(static_cast<uint64_t>(kChunkFloats));
    total.bytesSent += one.bytesSent * full;
    total.messages += one.messages * full;
  }
  if (const size_t rest = floats % kChunkFloats; rest > 0) total += perChunk(static_cast<uint64_t>(rest));
  return total;
}

}  // namespace

TrafficCounters allgatherv(uint64_t localBytes, int ranks) {
  const auto peers = static_cast<uint64_t>(ranks - 1);
  return {localBytes * peers, peers};
}

TrafficCounters allreduceSum(size_t floats, int ranks) {
  if (ranks <= 1) return {};
  const auto p = static_cast<uint64_t>(ranks);
  return chunked(floats, [p](uint64_t n) { return TrafficCounters{2 * n * sizeof(float) * (p - 1) / p, 2 * (p - 1)}; });
}

TrafficCounters allreduceSumIdentical(size_t floats, int ranks) {
  if (ranks <= 1) return {};
  const auto p = static_cast<uint64_t>(ranks);
  return chunked(floats, [p](uint64_t n) {
    const uint64_t block = (n + p - 1) / p;
    return TrafficCounters{2 * block * sizeof(float) * (p - 1), 2 * (p - 1)};
  });
}

TrafficCounters shiftRing(size_t floats, int ranks) {
  if (ranks <= 1) return {};
  return chunked(floats, [](uint64_t n) { return TrafficCounters{n * sizeof(float), 1}; });
}

TrafficCounters send(uint64_t bytes) { return {bytes, 1}; }

}  // namespace traffic

template <typename Fn>
auto Transport::guarded(std::optional<uint64_t> clock, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const TimeoutError& e) {
    failed_ = e.what();
    if (!clock || size() == 1) throw;
    // A collective: find out which peers never came, and who reports.
    const StallVerdict v = findStalled(control(), rank(), size(), *clock);
    throw StallError(e.what() + stallSuffix(v), v.reports);
  }
}

template <typename Fn>
void Transport::forEachChunk(std::span<float> data, Fn&& fn) {
  for (size_t offset = 0; offset < data.size(); offset += kChunkFloats) {
    fn(data.subspan(offset, std::min(kChunkFloats, data.size() - offset)));
  }
}

void Transport::checkUsable(const char* call) const {
  if (!failed_.empty()) {
    throw Error(fmt::format("rank {}: {} on transport {} after an earlier timeout left it unusable ({})", rank(),
                            call, name(), failed_));
  }
}

Gathered Transport::allgatherv(std::span<const std::byte> local, uint64_t clock) {
  checkUsable("allgatherv");
  Gathered out = guarded(clock, [&] { return doAllgatherv(local, clock); });
  counters_ += traffic::allgatherv(local.size(), size());
  return out;
}

Gathered Transport::allgatherv(const Pieces& local, uint64_t clock) {
  checkUsable("allgatherv");
  const size_t n = local.size();
  Gathered out = guarded(clock, [&] { return doAllgathervPieces(local, clock); });
  counters_ += traffic::allgatherv(n, size());
  return out;
}

Gathered Transport::doAllgathervPieces(const Pieces& local, uint64_t clock) {
  const std::vector<std::byte> joined = local.joined();
  return doAllgatherv(joined, clock);
}

void Transport::allreduceSum(std::span<float> data, uint64_t clock) {
  checkUsable("allreduceSum");
  if (size() == 1) return;
  forEachChunk(data, [&](std::span<float> chunk) {
    guarded(clock, [&] { doAllreduceSum(chunk, clock); });
    counters_ += traffic::allreduceSum(chunk.size(), size());
  });
}

void Transport::beginAllreduceSum(std::span<float> data, uint64_t clock) {
  checkUsable("beginAllreduceSum");
  if (size() == 1) return;
  pendingClock_ = clock;
  forEachChunk(data, [&](std::span<float> chunk) {
    guarded(clock, [&] { doBeginAllreduceSum(chunk, clock); });
    counters_ += traffic::allreduceSum(chunk.size(), size());
  });
}

void Transport::progressAllreduces() {
  if (!pendingClock_) return;
  checkUsable("progressAllreduces");
  guarded(pendingClock_, [&] { doProgressAllreduces(); });
}

void Transport::finishAllreduces() {
  if (!pendingClock_) return;
  checkUsable("finishAllreduces");
  const uint64_t clock = *pendingClock_;
  pendingClock_.reset();
  guarded(clock, [&] { doFinishAllreduces(); });
}

void Transport::allreduceSumIdentical(std::span<float> data, uint64_t clock) {
  checkUsable("allreduceSumIdentical");
  if (size() == 1) return;
  forEachChunk(data, [&](std::span<float> chunk) {
    guarded(clock, [&] { doAllreduceSumIdentical(chunk, clock); });
    counters_ += traffic::allreduceSumIdentical(chunk.size(), size());
  });
}

void Transport::shiftRing(std::span<float> data, uint64_t clock) {
  checkUsable("shiftRing");
  if (size() == 1) return;
  forEachChunk(data, [&](std::span<float> chunk) {
    guarded(clock, [&] { doShiftRing(chunk, clock); });
    counters_ += traffic::shiftRing(chunk.size(), size());
  });
}

void Transport::sendAsync(int peer, SharedBytes bytes) {
  checkUsable("sendAsync");
  ORPHEUS_ENFORCE(peer >= 0 && peer < size() && peer != rank(), "rank {} cannot send to rank {}", rank(), peer);
  ORPHEUS_ENFORCE(bytes != nullptr, "rank {}: sendAsync to rank {} without a message", rank(), peer);
  const uint64_t n = bytes->size();
  doSendAsync(peer, std::move(bytes));
  counters_ += traffic::send(n);
}

void Transport::sendAsync(int peer, SharedPieces pieces) {
  checkUsable("sendAsync");
  ORPHEUS_ENFORCE(peer >= 0 && peer < size() && peer != rank(), "rank {} cannot send to rank {}", rank(), peer);
  ORPHEUS_ENFORCE(pieces != nullptr, "rank {}: sendAsync to rank {} without a message", rank(), peer);
  const uint64_t n = pieces->size();
  doSendPiecesAsync(peer, std::move(pieces));
  counters_ += traffic::send(n);
}

void Transport::doSendPiecesAsync(int peer, SharedPieces pieces) {
  doSendAsync(peer, std::make_shared<const std::vector<std::byte>>(pieces->joined()));
}

std::optional<Message> Transport::tryReceive() {
  checkUsable("tryReceive");
  return doTryReceive();
}

std::optional<Message> Transport::receiveWithin(std::chrono::microseconds wait) {
  checkUsable("receiveWithin");
  return doReceiveWithin(wait);
}

void Transport::flushSends() {
  checkUsable("flushSends");
  guarded(std::nullopt, [&] { doFlushSends(); });
}

RegisteredBuffer Transport::registerBuffer(std::span<std::byte> bytes, MemoryKind kind) {
  auto backend = doRegisterBuffer(bytes, kind);
  return RegisteredBuffer(bytes, kind, std::move(backend));
}

std::unique_ptr<BufferRegistration> Transport::doRegisterBuffer(std::span<std::byte> /*bytes*/, MemoryKind kind) {
  if (kind == MemoryKind::kHost || (kind == MemoryKind::kDevice && doDeviceMemoryAware())) return nullptr;
  throw InputError(fmt::format("transport {} does not support {} buffers", name(), memoryKindName(kind)));
}

void Transport::setTimeout(std::chrono::milliseconds t) {
  timeout_ = t;
  control().setTimeout(t);
}

}  // namespace orpheus::comm
