#include "tests/comm/conformance.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "comm/stall.h"
#include "engine/base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

namespace orpheus::comm::testing {
namespace {

using namespace std::chrono_literals;

// Throws, naming the rank, unless `ok`.
template <typename... Args>
void expect(bool ok, const Transport& t, fmt::format_string<Args...> what, Args&&... args) {
  if (!ok) throw std::runtime_error(fmt::format("rank {}: ", t.rank()) + fmt::format(what, std::forward<Args>(args)...));
}

uint64_t peers(const Transport& t) { return static_cast<uint64_t>(t.size() - 1); }

// The formulas comm/transport.h documents, written out again (one chunk: n < kChunkFloats).
TrafficCounters expectedAllreduce(size_t n, int ranks) {
  const auto p = static_cast<uint64_t>(ranks);
  if (p == 1 || n == 0) return {};
  return {2 * 4 * n * (p - 1) / p, 2 * (p - 1)};
}
TrafficCounters expectedIdentical(size_t n, int ranks) {
  const auto p = static_cast<uint64_t>(ranks);
  if (p == 1 || n == 0) return {};
  return {2 * 4 * ((n + p - 1) / p) * (p - 1), 2 * (p - 1)};
}

TrafficCounters since(const Transport& t, const TrafficCounters& before) {
  return {t.counters().bytesSent - before.bytesSent, t.counters().messages - before.messages};
}

void expectCounted(const Transport& t, const TrafficCounters& got, const TrafficCounters& want, const char* call) {
  expect(got == want, t, "{} counted {} bytes in {} messages, expected {} bytes in {} messages", call, got.bytesSent,
         got.messages, want.bytesSent, want.messages);
}

// Every rank waits here until all have arrived (control plane).
void barrier(Transport& t) {
  double one = 1.0;
  t.control().sum({&one, 1});
}

void allgathervCase(Transport& t) {
  const int p = t.size();
  const auto sizeOf = [](int rank, uint64_t clock) -> size_t {
    if (clock == 3) return 0;                // everyone empty
    if (clock == 4 && rank == 0) return 0;   // one empty among others
    return static_cast<size_t>(rank * 37 + static_cast<int>(clock) * 11) % 50 + (clock == 5 ? 70000 : 0);
  };
  const auto byteOf = [](int rank, uint64_t clock, size_t i) {
    return static_cast<std::byte>((static_cast<size_t>(rank) * 31 + i + clock) & 0xff);
  };
  const TrafficCounters before = t.counters();
  TrafficCounters want;
  for (uint64_t clock = 1; clock <= 6; ++clock) {
    std::vector<std::byte> mine(sizeOf(t.rank(), clock));
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = byteOf(t.rank(), clock, i);
    const Gathered all = t.allgatherv(mine, clock);
    expect(all.count() == static_cast<size_t>(p), t, "allgatherv at clock {} returned {} records", clock, all.count());
    for (int r = 0; r < p; ++r) {
      const auto part = all.part(static_cast<size_t>(r));
      expect(part.size() == sizeOf(r, clock), t, "clock {}: rank {}'s record has {} bytes, expected {}", clock, r,
             part.size(), sizeOf(r, clock));
      for (size_t i = 0; i < part.size(); ++i)
        expect(part[i] == byteOf(r, clock, i), t, "clock {}: rank {}'s byte {} differs", clock, r, i);
    }
    want += {mine.size() * peers(t), peers(t)};
  }
  expectCounted(t, since(t, before), want, "allgatherv");
}

void allreduceSumCase(Transport& t) {
  const int p = t.size();
  uint64_t clock = 10;
  for (size_t n : {size_t{0}, size_t{1}, size_t{1001}}) {
    // Integers and halves: every order of summation gives the exact result.
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(t.rank()) + 0.5f * static_cast<float>(i);
    const TrafficCounters before = t.counters();
    t.allreduceSum(v, ++clock);
    expectCounted(t, since(t, before), expectedAllreduce(n, p), "allreduceSum");
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(p * (p - 1) / 2) + 0.5f * static_cast<float>(i) * static_cast<float>(p);
      expect(v[i] == want, t, "allreduceSum of {} floats: element {} is {}, expected {}", n, i, v[i], want);
    }
  }
}

void allreduceSumIdenticalCase(Transport& t) {
  const int p = t.size();
  uint64_t clock = 20;
  for (size_t n : {size_t{3}, size_t{10007}}) {
    // Values whose float sum depends on the order: only one place may sum them.
    std::vector<float> v(n);
    std::vector<double> want(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      v[i] = 1.0f / static_cast<float>(i + 1 + 7 * static_cast<size_t>(t.rank()));
      for (int r = 0; r < p; ++r) want[i] += 1.0f / static_cast<float>(i + 1 + 7 * static_cast<size_t>(r));
    }
    const TrafficCounters before = t.counters();
    t.allreduceSumIdentical(v, ++clock);
    expectCounted(t, since(t, before), expectedIdentical(n, p), "allreduceSumIdentical");
    for (size_t i = 0; i < n; ++i)
      expect(std::abs(v[i] - want[i]) <= 1e-5 * want[i], t, "sum element {} is {}, expected {}", i, v[i], want[i]);
    const auto* raw = reinterpret_cast<const std::byte*>(v.data());
    const Gathered all = t.allgatherv(std::span<const std::byte>(raw, n * sizeof(float)), ++clock);
    for (int r = 0; r < p; ++r) {
      const auto theirs = all.part(static_cast<size_t>(r));
      expect(theirs.size() == n * sizeof(float) && std::memcmp(theirs.data(), raw, theirs.size()) == 0, t,
             "the sum of {} floats on rank {} is not bitwise the same as here", n, r);
    }
  }
}

void shiftRingCase(Transport& t) {
  const int p = t.size();
  const int left = (t.rank() + p - 1) % p;
  for (size_t n : {size_t{1}, size_t{3001}}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(t.rank() * 10000 + static_cast<int>(i));
    const TrafficCounters before = t.counters();
    t.shiftRing(v, 30 + n);
    const TrafficCounters want = p == 1 ? TrafficCounters{} : TrafficCounters{4 * n, 1};
    expectCounted(t, since(t, before), want, "shiftRing");
    for (size_t i = 0; i < n; ++i) {
      expect(v[i] == static_cast<float>(left * 10000 + static_cast<int>(i)), t,
             "after the shift element {} is {}, expected rank {}'s", i, v[i], left);
    }
  }
}

// Message layout: sequence number (4 bytes), sender (4 bytes), then filler.
SharedBytes numbered(int sender, uint32_t seq, size_t size) {
  auto bytes = std::make_shared<std::vector<std::byte>>(size, std::byte{0x5a});
  const auto from = static_cast<uint32_t>(sender);
  std::memcpy(bytes->data(), &seq, 4);
  std::memcpy(bytes->data() + 4, &from, 4);
  return bytes;
}

void pointToPointCase(Transport& t) {
  const int p = t.size();
  constexpr uint32_t kPerPeer = 20;
  const auto sizeOf = [](uint32_t seq) { return size_t{8} + (seq * 13) % 100; };
  const TrafficCounters before = t.counters();
  TrafficCounters want;
  // Interleaved on both planes, to every peer.
  for (uint32_t seq = 0; seq < kPerPeer; ++seq) {
    for (int peer = 0; peer < p; ++peer) {
      if (peer == t.rank()) continue;
      t.sendAsync(peer, numbered(t.rank(), seq, sizeOf(seq)));
      want += {sizeOf(seq), 1};
      t.control().send(peer, numbered(t.rank(), 1000 + seq, 8));
    }
  }
  std::map<int, uint32_t> nextData;
  std::map<int, uint32_t> nextControl;
  const size_t expected = static_cast<size_t>(p - 1) * kPerPeer;
  size_t gotData = 0;
  size_t gotControl = 0;
  const auto check = [&](const Message& m, std::map<int, uint32_t>& next, uint32_t base, const char* plane) {
    uint32_t seq = 0;
    uint32_t from = 0;
    expect(m.bytes.size() >= 8, t, "{} message of {} bytes", plane, m.bytes.size());
    std::memcpy(&seq, m.bytes.data(), 4);
    std::memcpy(&from, m.bytes.data() + 4, 4);
    expect(static_cast<int>(from) == m.peer, t, "{} message says it is from rank {} but came from {}", plane, from,
           m.peer);
    expect(seq == base + next[m.peer], t, "{} message {} from rank {} arrived where {} was due", plane, seq, m.peer,
           base + next[m.peer]);
    if (base == 0) expect(m.bytes.size() == sizeOf(seq), t, "data message {} has {} bytes", seq, m.bytes.size());
    ++next[m.peer];
  };
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (gotData < expected || gotControl < expected) {
    bool any = false;
    if (auto m = t.tryReceive()) {
      check(*m, nextData, 0, "data");
      ++gotData;
      any = true;
    }
    if (auto m = t.control().tryReceive()) {
      check(*m, nextControl, 1000, "control");
      ++gotControl;
      any = true;
    }
    expect(std::chrono::steady_clock::now() < deadline, t, "received {} data and {} control messages of {} each",
           gotData, gotControl, expected);
    if (!any) std::this_thread::sleep_for(100us);
  }
  t.flushSends();
  t.control().flush();
  expectCounted(t, since(t, before), want, "sendAsync (control sends are not counted)");
  expect(!t.tryReceive() && !t.control().tryReceive(), t, "a message too many arrived");
  barrier(t);
}

// A message as pieces in separate allocations (an empty one among them), as an
// SV batch goes out: its header, then the arrays where they lie.
Pieces piecesOf(int sender, uint64_t seq, size_t size) {
  const auto byteOf = [&](size_t i) {
    return static_cast<std::byte>((static_cast<size_t>(sender) * 7 + i + seq) & 0xff);
  };
  auto parts = std::make_shared<std::vector<std::vector<std::byte>>>();
  const size_t head = std::min<size_t>(size, 5);
  const size_t middle = std::max(head, std::min(size, size / 2 + 5));
  const size_t cuts[] = {0, head, head, middle, size};
  for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
    std::vector<std::byte>& part = parts->emplace_back();
    for (size_t i = cuts[k]; i < cuts[k + 1]; ++i) part.push_back(byteOf(i));
  }
  Pieces out;
  for (const auto& part : *parts) out.pieces.emplace_back(part.data(), part.size());
  out.owner = parts;
  return out;
}

void piecesCase(Transport& t) {
  const int p = t.size();
  const auto sizeOf = [](int rank, uint64_t clock) {
    return static_cast<size_t>(rank * 29 + static_cast<int>(clock) * 7) % 60 + (clock == 22 ? 90000 : 0);
  };
  const TrafficCounters before = t.counters();
  TrafficCounters want;
  for (uint64_t clock = 20; clock <= 22; ++clock) {
    const Pieces mine = piecesOf(t.rank(), clock, sizeOf(t.rank(), clock));
    const std::vector<std::byte> whole = mine.joined();
    expect(whole.size() == mine.size(), t, "pieces of {} bytes joined to {}", mine.size(), whole.size());
    const Gathered all = t.allgatherv(mine, clock);
    for (int r = 0; r < p; ++r) {
      const auto part = all.part(static_cast<size_t>(r));
      const std::vector<std::byte> theirs = piecesOf(r, clock, sizeOf(r, clock)).joined();
      expect(std::equal(part.begin(), part.end(), theirs.begin(), theirs.end()), t,
             "clock {}: rank {}'s gathered pieces differ from their concatenation", clock, r);
    }
    want += {whole.size() * peers(t), peers(t)};
    // Point to point: one message per peer, the concatenation of the pieces.
    for (int peer = 0; peer < p; ++peer) {
      if (peer == t.rank()) continue;
      t.sendAsync(peer, std::make_shared<const Pieces>(piecesOf(t.rank(), clock + peer, sizeOf(t.rank(), clock))));
      want += {whole.size(), 1};
    }
    size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (got < static_cast<size_t>(p - 1)) {
      if (auto m = t.tryReceive()) {
        const std::vector<std::byte> theirs =
            piecesOf(m->peer, clock + static_cast<uint64_t>(t.rank()), sizeOf(m->peer, clock)).joined();
        expect(m->bytes == theirs, t, "clock {}: the pieces rank {} sent arrived as {} other bytes", clock, m->peer,
               m->bytes.size());
        ++got;
        continue;
      }
      expect(std::chrono::steady_clock::now() < deadline, t, "clock {}: {} of {} messages of pieces arrived", clock,
             got, p - 1);
      std::this_thread::sleep_for(100us);
    }
    t.flushSends();
    barrier(t);
  }
  expectCounted(t, since(t, before), want, "allgatherv and sendAsync of pieces");
}

void controlCase(Transport& t) {
  const int p = t.size();
  const TrafficCounters before = t.counters();
  std::vector<double> v = {static_cast<double>(t.rank()), -static_cast<double>(t.rank()), 1.5};
  std::vector<double> s = v;
  t.control().sum(s);
  expect(s[0] == p * (p - 1) / 2.0 && s[1] == -p * (p - 1) / 2.0 && s[2] == 1.5 * p, t, "control sum gave {} {} {}",
         s[0], s[1], s[2]);
  std::vector<double> hi = v;
  t.control().max(hi);
  expect(hi[0] == p - 1 && hi[1] == 0 && hi[2] == 1.5, t, "control max gave {} {} {}", hi[0], hi[1], hi[2]);
  std::vector<double> lo = v;
  t.control().min(lo);
  expect(lo[0] == 0 && lo[1] == -(p - 1) && lo[2] == 1.5, t, "control min gave {} {} {}", lo[0], lo[1], lo[2]);
  std::vector<double> none;
  t.control().sum(none);
  expectCounted(t, since(t, before), {}, "the control plane");
}

void countersCase(Transport& t) {
  const int p = t.size();
  const TrafficCounters before = t.counters();
  trafficSequence(t);
  const uint64_t local = 100 + static_cast<uint64_t>(t.rank());
  TrafficCounters want{local * peers(t), peers(t)};
  want += expectedAllreduce(1001, p);
  want += expectedIdentical(1001, p);
  if (p > 1) want += {4 * 1001, 1};
  if (p > 1) want += {77, 1};
  expectCounted(t, since(t, before), want, "the traffic sequence");
  // Counted identically on every rank where the formulas say so.
  std::vector<double> mine = {static_cast<double>(since(t, before).messages)};
  std::vector<double> lo = mine;
  t.control().min(lo);
  expect(lo[0] == mine[0], t, "ranks counted different message totals ({} here, {} elsewhere)", mine[0], lo[0]);
}

void lateRankCase(Transport& t, const ConformanceTraits& traits) {
  const int p = t.size();
  if (p == 1) return;  // nobody to wait for
  const int late = p - 1;
  constexpr auto kShort = 300ms;
  const uint64_t clock = 7;
  // Never freed: after a timeout a late peer may still write into the buffer (see comm/transport.h).
  auto* data = new std::vector<float>(64, 1.0f);
#if defined(__SANITIZE_ADDRESS__)
  __lsan_ignore_object(data);  // left allocated on purpose, not a leak
#endif
  if (t.rank() == late) {
    t.setTimeout(60s);
    std::this_thread::sleep_for(4 * kShort);
    t.allreduceSum(*data, clock);  // the others' deposits or requests are still there: it completes
  } else {
    t.setTimeout(kShort);
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    bool stallError = false;
    bool reports = false;
    try {
      t.allreduceSum(*data, clock);
    } catch (const StallError& e) {
      message = e.what();
      stallError = true;
      reports = e.reports();
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    // Every rank reaches the barrier below even when a check fails, so a failure
    // here does not leave the late rank waiting.
    std::string problem;
    const auto check = [&](bool ok, std::string what) {
      if (!ok && problem.empty()) problem = std::move(what);
    };
    check(!message.empty(), fmt::format("allreduceSum returned although rank {} had not called it", late));
    check(waited >= kShort, "the timeout came before the deadline");
    check(message.find("allreduce") != std::string::npos && message.find("clock 7") != std::string::npos,
          fmt::format("the timeout does not name the operation and clock: {}", message));
    if (traits.namesLatePeerInCollectives) {
      // The late rank is the one named stalled; the others, which timed out too, are not.
      const std::string want = fmt::format("stalled or gone: rank {}", late);
      check(message.size() >= want.size() && message.compare(message.size() - want.size(), want.size(), want) == 0,
            fmt::format("the timeout does not end naming the late rank {} alone: {}", late, message));
    }
    check(stallError, fmt::format("a collective's timeout is not a StallError: {}", message));
    // Rank 0 timed out, and no rank is lower: it reports for the job.
    check(t.rank() != 0 || reports, "rank 0 timed out but does not report");
    // The data plane is done for; the control plane still works.
    std::string refused;
    try {
      t.allreduceSum(*data, clock + 1);
    } catch (const TimeoutError&) {
      refused = "a second timeout";
    } catch (const Error& e) {
      refused = e.what();
    }
    check(refused.find("unusable") != std::string::npos,
          fmt::format("a call after the timeout was not refused: '{}'", refused));
    t.setTimeout(60s);
    barrier(t);
    expect(problem.empty(), t, "{}", problem);
    return;
  }
  barrier(t);
}

void registerBufferCase(Transport& t) {
  std::vector<std::byte> host(4096);
  {
    const RegisteredBuffer handle = t.registerBuffer(host, MemoryKind::kHost);
    expect(handle.bytes().data() == host.data() && handle.bytes().size() == host.size() &&
               handle.kind() == MemoryKind::kHost,
           t, "the host registration does not name the buffer it was given");
  }
  std::string refused;
  try {
    static_cast<void>(t.registerBuffer(host, MemoryKind::kDevice));
  } catch (const InputError& e) {
    refused = e.what();
  }
  // A transport that says it takes device memory registers it (an MPI library that
  // is CUDA-aware at run time); any other refuses it by name.
  if (t.deviceMemoryAware()) {
    expect(refused.empty(), t, "a device-memory-aware transport refused a device buffer: '{}'", refused);
    return;
  }
  const std::string want = fmt::format("transport {} does not support device buffers", t.name());
  expect(refused.find(want) != std::string::npos, t, "registering device memory gave '{}', expected '{}'", refused,
         want);
}

}  // namespace

void trafficSequence(Transport& t) {
  const int p = t.size();
  std::vector<std::byte> record(100 + static_cast<size_t>(t.rank()), std::byte{1});
  static_cast<void>(t.allgatherv(record, 1));
  std::vector<float> v(1001, 1.0f);
  t.allreduceSum(v, 2);
  t.allreduceSumIdentical(v, 3);
  t.shiftRing(v, 4);
  if (p > 1) {
    t.sendAsync((t.rank() + 1) % p, std::make_shared<std::vector<std::byte>>(77));
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!t.tryReceive()) {
      expect(std::chrono::steady_clock::now() < deadline, t, "the message from the left neighbour never came");
      std::this_thread::sleep_for(100us);
    }
    t.flushSends();
  }
}

std::vector<ConformanceCase> conformanceCases(const ConformanceTraits& traits) {
  return {
      {"allgatherv delivers records of varied sizes, empty ones included", allgathervCase},
      {"allreduceSum sums over ranks", allreduceSumCase},
      {"allreduceSumIdentical is bitwise the same on every rank", allreduceSumIdenticalCase},
      {"shiftRing hands every rank its left neighbour's data", shiftRingCase},
      {"point-to-point messages keep their order per sender and plane", pointToPointCase},
      {"pieces go out as one message, their concatenation", piecesCase},
      {"control sum, max and min agree and are not counted", controlCase},
      {"byte counters follow the documented formulas", countersCase},
      {"a rank that does not come ends the others' wait with a TimeoutError",
       [traits](Transport& t) { lateRankCase(t, traits); }},
      {"host buffers register, device buffers are refused", registerBufferCase},
  };
}

}  // namespace orpheus::comm::testing
