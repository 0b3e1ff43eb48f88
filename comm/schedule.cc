#include "comm/schedule.h"

#include "engine/base/error.h"
#include "engine/base/rng.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

namespace orpheus::comm {
namespace {

constexpr const char* kValidKinds = "all, random, fixed, ring";

}  // namespace

MulticastKind parseMulticast(const std::string& name) {
  if (name == "all") return MulticastKind::kAll;
  if (name == "random") return MulticastKind::kRandom;
  if (name == "fixed") return MulticastKind::kFixed;
  if (name == "ring") return MulticastKind::kRing;
  throw InputError(fmt::format("--multicast '{}' is not a multicast kind; valid kinds: {}", name,
                               kValidKinds));
}

std::string multicastName(MulticastKind kind) {
  switch (kind) {
    case MulticastKind::kAll:
      return "all";
    case MulticastKind::kRandom:
      return "random";
    case MulticastKind::kFixed:
      return "fixed";
    case MulticastKind::kRing:
      return "ring";
  }
  throw Error(fmt::format("unknown MulticastKind {}", static_cast<int>(kind)));
}

MulticastSchedule::MulticastSchedule(const ScheduleConfig& config)
    : kind_(config.kind),
      ranks_(config.ranks),
      fanout_(0),
      seed_(config.seed),
      dropLinks_(config.dropLinks),
      brokenPerClock_(0) {
  ORPHEUS_CHECK_INPUT(ranks_ >= 1, "a multicast schedule needs at least 1 rank, got {}", ranks_);
  if (kind_ == MulticastKind::kAll) {
    fanout_ = ranks_ - 1;
  } else {
    const std::string kind = multicastName(kind_);
    ORPHEUS_CHECK_INPUT(config.fanout >= 1, "--fanout {} must be at least 1 for --multicast {}",
                        config.fanout, kind);
    ORPHEUS_CHECK_INPUT(ranks_ == 1 || config.fanout <= ranks_ - 1,
                        "--fanout {} needs at most P-1 = {} peers (--multicast {} with P = {} ranks)",
                        config.fanout, ranks_ - 1, kind, ranks_);
    fanout_ = ranks_ == 1 ? 0 : config.fanout;
  }
  // The negated form also refuses NaN.
  ORPHEUS_CHECK_INPUT(dropLinks_ >= 0.0 && dropLinks_ < 1.0,
                      "--drop-links {} must be a fraction in [0, 1)", dropLinks_);
  const uint64_t pairs = static_cast<uint64_t>(ranks_) * static_cast<uint64_t>(ranks_ - 1);
  brokenPerClock_ = static_cast<uint64_t>(std::llround(dropLinks_ * static_cast<double>(pairs)));
  brokenPerClock_ = std::min(brokenPerClock_, pairs);
}

// Directed pairs (from, to), from != to, numbered 0 .. P(P-1)-1 in (from, to) order.
uint64_t MulticastSchedule::pairIndex(int from, int to) const {
  const uint64_t column = static_cast<uint64_t>(to < from ? to : to - 1);
  return static_cast<uint64_t>(from) * static_cast<uint64_t>(ranks_ - 1) + column;
}

std::vector<uint64_t> MulticastSchedule::brokenSet(uint64_t clock) const {
  std::vector<uint64_t> broken;
  if (brokenPerClock_ == 0) return broken;
  // Partial Fisher-Yates over all P(P-1) pairs, storing only the displaced slots, so
  // the cost follows the number of broken links rather than P^2.
  const uint64_t pairs = static_cast<uint64_t>(ranks_) * static_cast<uint64_t>(ranks_ - 1);
  CounterRng rng(seed_, RngPurpose::kLinks, clock, 0);
  std::unordered_map<uint64_t, uint64_t> displaced;
  const auto at = [&](uint64_t i) {
    const auto it = displaced.find(i);
    return it == displaced.end() ? i : it->second;
  };
  broken.reserve(brokenPerClock_);
  for (uint64_t i = 0; i < brokenPerClock_; ++i) {
    const uint64_t j = i + rng.uniformInt(pairs - i);
    const uint64_t picked = at(j);
    displaced[j] = at(i);
    broken.push_back(picked);
  }
  std::sort(broken.begin(), broken.end());
  return broken;
}

std::vector<int> MulticastSchedule::receiversGiven(uint64_t clock, int sender,
                                                   const std::vector<uint64_t>& broken) const {
  const auto intact = [&](int to) {
    return broken.empty() || !std::binary_search(broken.begin(), broken.end(), pairIndex(sender, to));
  };
  const int p = ranks_;
  const int q = fanout_;
  std::vector<int> out;
  if (p == 1) return out;
  out.reserve(static_cast<size_t>(q));

  switch (kind_) {
    case MulticastKind::kAll:
      for (int to = 0; to < p; ++to)
        if (to != sender && intact(to)) out.push_back(to);
      break;
    case MulticastKind::kFixed:
      for (int d = 1; d <= q; ++d) {
        const int to = (sender + d) % p;
        if (intact(to)) out.push_back(to);
      }
      break;
    case MulticastKind::kRing: {
      // Offsets 1 + ((t*Q + j) mod (P-1)), j < Q: Q distinct non-zero offsets, so never
      // the sender; consecutive clocks take consecutive windows, so any ceil((P-1)/Q)
      // clocks in a row cover every peer, and each offset adds one sender to every
      // receiver (in-degree exactly Q).
      const uint64_t others = static_cast<uint64_t>(p - 1);
      const uint64_t start = (clock % others) * static_cast<uint64_t>(q);
      for (int j = 0; j < q; ++j) {
        const uint64_t offset = 1 + (start + static_cast<uint64_t>(j)) % others;
        const int to = static_cast<int>((static_cast<uint64_t>(sender) + offset) % static_cast<uint64_t>(p));
        if (intact(to)) out.push_back(to);
      }
      break;
    }
    case MulticastKind::kRandom: {
      // Lazy Fisher-Yates over the P-1 other ranks: slot i is fixed by the i-th draw, so
      // the first Q intact peers are taken in stream order, and with no broken links the
      // receivers are exactly the first Q slots. Slot k holds rank k (k < sender) or
      // k + 1 until a swap moves it; only the moved slots are kept, so a call costs
      // O(Q^2) rather than O(P) (senders() asks P of them).
      std::vector<std::pair<uint64_t, int>> moved;
      const auto slot = [&](uint64_t k) {
        for (const auto& [at, rank] : moved)
          if (at == k) return rank;
        return static_cast<int>(k) < sender ? static_cast<int>(k) : static_cast<int>(k) + 1;
      };
      const auto put = [&](uint64_t k, int rank) {
        for (auto& [at, held] : moved)
          if (at == k) {
            held = rank;
            return;
          }
        moved.emplace_back(k, rank);
      };
      CounterRng rng(seed_, RngPurpose::kMulticast, clock, static_cast<uint64_t>(sender));
      const auto n = static_cast<uint64_t>(p - 1);
      for (uint64_t i = 0; i < n && out.size() < static_cast<size_t>(q); ++i) {
        const uint64_t j = i + rng.uniformInt(n - i);
        const int first = slot(i);
        const int drawn = slot(j);
        put(i, drawn);
        put(j, first);
        if (intact(drawn)) out.push_back(drawn);
      }
      break;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> MulticastSchedule::receivers(uint64_t clock, int sender) const {
  ORPHEUS_ENFORCE(sender >= 0 && sender < ranks_, "sender {} out of range for P = {}", sender, ranks_);
  return receiversGiven(clock, sender, brokenSet(clock));
}

std::vector<std::vector<int>> MulticastSchedule::graph(uint64_t clock) const {
  const std::vector<uint64_t> broken = brokenSet(clock);
  std::vector<std::vector<int>> out(static_cast<size_t>(ranks_));
  for (int s = 0; s < ranks_; ++s) out[static_cast<size_t>(s)] = receiversGiven(clock, s, broken);
  return out;
}

std::vector<int> MulticastSchedule::senders(uint64_t clock, int receiver) const {
  ORPHEUS_ENFORCE(receiver >= 0 && receiver < ranks_, "receiver {} out of range for P = {}", receiver,
                  ranks_);
  const std::vector<uint64_t> broken = brokenSet(clock);
  std::vector<int> out;
  for (int s = 0; s < ranks_; ++s) {
    if (s == receiver) continue;
    const std::vector<int> to = receiversGiven(clock, s, broken);
    if (std::binary_search(to.begin(), to.end(), receiver)) out.push_back(s);
  }
  return out;
}

bool MulticastSchedule::linkBroken(uint64_t clock, int from, int to) const {
  ORPHEUS_ENFORCE(from >= 0 && from < ranks_ && to >= 0 && to < ranks_ && from != to,
                  "link {} -> {} is not a link between two ranks of P = {}", from, to, ranks_);
  if (brokenPerClock_ == 0) return false;
  const std::vector<uint64_t> broken = brokenSet(clock);
  return std::binary_search(broken.begin(), broken.end(), pairIndex(from, to));
}

std::vector<std::pair<int, int>> MulticastSchedule::brokenLinks(uint64_t clock) const {
  std::vector<std::pair<int, int>> out;
  const uint64_t others = static_cast<uint64_t>(ranks_ - 1);
  for (const uint64_t index : brokenSet(clock)) {
    const int from = static_cast<int>(index / others);
    const int column = static_cast<int>(index % others);
    out.emplace_back(from, column < from ? column : column + 1);
  }
  return out;
}

std::string MulticastSchedule::describe() const {
  std::string head;
  if (kind_ == MulticastKind::kAll) {
    head = fmt::format("all-to-all broadcast, Q=P-1={} of P={}", fanout_, ranks_);
  } else {
    const char* name = kind_ == MulticastKind::kRandom ? "random"
                       : kind_ == MulticastKind::kFixed ? "fixed"
                                                        : "round-robin (ring)";
    head = fmt::format("{} multicast, Q={} of P={}", name, fanout_, ranks_);
  }
  if (dropLinks_ == 0.0) return head + ", no links broken";
  const uint64_t pairs = static_cast<uint64_t>(ranks_) * static_cast<uint64_t>(ranks_ - 1);
  return fmt::format("{}, {:g}% of links broken per clock ({} of {})", head, dropLinks_ * 100.0,
                     brokenPerClock_, pairs);
}

}  // namespace orpheus::comm
