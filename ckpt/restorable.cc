#include "ckpt/restorable.h"

#include "ckpt/segment.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace orpheus::ckpt {
namespace {

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

std::string startName(uint64_t from) {
  return from == 0 ? std::string("W0") : fmt::format("the snapshot of clock {}", from);
}

std::string rangeName(uint64_t first, uint64_t last) {
  return first == last ? fmt::format("{}", first) : fmt::format("{}..{}", first, last);
}

const UnusableSnapshot* findUnusable(const std::vector<UnusableSnapshot>& unusable, uint64_t clock) {
  const auto it =
      std::find_if(unusable.begin(), unusable.end(), [&](const UnusableSnapshot& u) { return u.clock == clock; });
  return it == unusable.end() ? nullptr : &*it;
}

std::string snapshotTrouble(const std::vector<UnusableSnapshot>& unusable, uint64_t clock) {
  const UnusableSnapshot* u = findUnusable(unusable, clock);
  return u ? fmt::format("the snapshot of clock {} is unusable: {}", clock, u->problem)
           : fmt::format("no snapshot of clock {} was kept", clock);
}

// Appends first..last to `pieces` from `from`, less the clocks failures lost (a
// snapshot's own clock stays: the replay does not read the log for it).
void addPiece(std::vector<RestorableRange>* pieces, uint64_t first, uint64_t last, uint64_t from,
              const std::vector<LostClocks>& lost) {
  uint64_t next = first;
  for (const LostClocks& l : lost) {
    if (l.last < next || l.first > last) continue;
    if (l.first > next) pieces->push_back({next, l.first - 1, from});
    if (from > 0 && from >= l.first && from <= l.last && from >= next) pieces->push_back({from, from, from});
    next = std::max(next, l.last + 1);
    if (next > last || next == 0) return;
  }
  if (next <= last) pieces->push_back({next, last, from});
}

class ReplicaAnalysis {
 public:
  ReplicaAnalysis(const ReplicaInventory& inv, const std::vector<uint64_t>& snapshots,
                  const std::vector<UnusableSnapshot>& unusable, const Inventory* whole)
      : inv_(inv), unusable_(unusable), whole_(whole) {
    out_.replica = inv.replica;
    out_.starts.push_back(0);
    out_.starts.insert(out_.starts.end(), snapshots.begin(), snapshots.end());
    out_.unusableSnapshots = unusable;
  }

  ReplicaRestorability run() {
    findLostAndMissing();
    for (size_t i = 0; i < out_.starts.size(); ++i) {
      const uint64_t limit = i + 1 < out_.starts.size() ? out_.starts[i + 1] - 1 : kNoLimit;
      replayFrom(out_.starts[i], limit);
    }
    return std::move(out_);
  }

 private:
  void findLostAndMissing() {
    uint64_t covered = 0;
    for (const SegmentInfo& s : inv_.segments) {
      if (s.firstClock > covered + 1) out_.missing.push_back({covered + 1, s.firstClock - 1});
      covered = std::max(covered, s.lastClock);
      for (const LogEntry& e : s.events) {
        if (e.kind == EventKind::kReset && e.logEnd + 1 < e.clock) {
          out_.lost.push_back({e.logEnd + 1, e.clock - 1, e.clock, e.resetTo});
        }
      }
    }
    std::sort(out_.lost.begin(), out_.lost.end(),
              [](const LostClocks& a, const LostClocks& b) { return a.first < b.first; });
  }

  // The clocks the replay from `from` reaches before the next start (limit + 1).
  void replayFrom(uint64_t from, uint64_t limit) {
    uint64_t reached = from;
    uint64_t stopAt = 0;
    std::string why;
    bool firstNeeded = true;
    for (const SegmentInfo& s : inv_.segments) {
      if (reached >= limit || stopAt > 0) break;
      if (s.lastClock <= from) continue;  // before the start: not needed
      const bool chained = firstNeeded && from > 0 ? s.firstClock <= from + 1
                                                   : continuesChain(reached, !firstNeeded, s.firstClock);
      if (!chained) {
        stopAt = reached + 1;
        why = fmt::format("no segment holds clocks {} (missing)", rangeName(reached + 1, s.firstClock - 1));
        break;
      }
      firstNeeded = false;
      if (!s.intact) {
        stopAt = reached + 1;
        why = fmt::format("log segment '{}' is damaged ({})", s.path, s.problem);
        break;
      }
      for (const LogEntry& e : s.events) {
        if (e.clock <= from) continue;
        if (e.clock > limit) break;
        if (e.kind == EventKind::kAveraged) {
          stopAt = e.clock;
          why = fmt::format("the replicas were averaged at clock {} and {}", e.clock, snapshotTrouble(unusable_, e.clock));
          break;
        }
        if (e.kind != EventKind::kReset) continue;
        const uint64_t here = std::max(from, e.logEnd);
        if (e.resetTo > here) {
          stopAt = e.clock;
          why = fmt::format("a failure at clock {} reset the replica to clock {}, and {}", e.clock, e.resetTo,
                            snapshotTrouble(unusable_, e.resetTo));
          break;
        }
        if (e.resetTo < here && !out_.covers(e.resetTo)) {
          stopAt = e.clock;
          why = fmt::format("a failure at clock {} reset the replica to clock {}, which is not restorable", e.clock,
                            e.resetTo);
          break;
        }
      }
      if (whole_ != nullptr) {
        // The first batch applied by reference that cannot be read, if it comes first.
        for (const BatchUse& u : s.uses) {
          if (u.at <= from) continue;
          if (u.at > limit || (stopAt > 0 && u.at >= stopAt)) break;
          std::string trouble = whole_->batchTrouble(u.replica, u.clock);
          if (!trouble.empty()) {
            stopAt = u.at;
            why = fmt::format("clock {} applied a batch from another replica: {}", u.at, trouble);
            break;
          }
        }
      }
      if (stopAt == 0) reached = std::max(reached, s.lastClock);
    }
    uint64_t end = stopAt > 0 ? stopAt - 1 : reached;
    end = std::min(end, limit);
    const uint64_t begin = from == 0 ? 1 : from;
    if (end >= begin) addPiece(&out_.pieces, begin, end, from, out_.lost);
    if (stopAt > 0 && stopAt <= limit) out_.stops.push_back({from, stopAt, std::move(why)});
  }

  const ReplicaInventory& inv_;
  const std::vector<UnusableSnapshot>& unusable_;
  const Inventory* whole_;  // null: references are not checked
  ReplicaRestorability out_;
};

}  // namespace

bool ReplicaRestorability::covers(uint64_t clock) const {
  return std::any_of(pieces.begin(), pieces.end(),
                     [&](const RestorableRange& p) { return p.first <= clock && clock <= p.last; });
}

uint64_t ReplicaRestorability::latest() const { return pieces.empty() ? 0 : pieces.back().last; }

uint64_t ReplicaRestorability::startFor(uint64_t clock) const {
  for (const RestorableRange& p : pieces) {
    if (p.first <= clock && clock <= p.last) return p.from;
  }
  return 0;
}

std::vector<ClockRange> ReplicaRestorability::ranges() const {
  std::vector<ClockRange> out;
  for (const RestorableRange& p : pieces) {
    if (!out.empty() && out.back().last + 1 == p.first) {
      out.back().last = p.last;
    } else {
      out.push_back({p.first, p.last});
    }
  }
  return out;
}

std::string ReplicaRestorability::describe() const {
  std::string out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const bool joined = i > 0 && pieces[i - 1].last + 1 == pieces[i].first;
    if (joined) continue;
    size_t j = i;
    while (j + 1 < pieces.size() && pieces[j].last + 1 == pieces[j + 1].first) ++j;
    if (!out.empty()) out += ", ";
    out += rangeName(pieces[i].first, pieces[j].last);
    if (pieces[i].from > 0) out += fmt::format(" (via snapshot {})", pieces[i].from);
  }
  return out.empty() ? std::string("none") : out;
}

std::string ReplicaRestorability::whyNot(uint64_t clock) const {
  if (clock == 0) return "clock 0 is W0, the state before the first clock";
  if (covers(clock)) return "";
  for (const LostClocks& l : lost) {
    if (l.first <= clock && clock <= l.last) {
      return fmt::format("clock {} of replica {} is lost: a failure at clock {} reset the replica to clock {} before "
                         "its log reached clock {}",
                         clock, replica, l.failedAt, l.resetTo, clock);
    }
  }
  uint64_t from = 0;
  for (uint64_t s : starts) {
    if (s <= clock) from = s;
  }
  for (const ReplayStop& s : stops) {
    if (s.from == from && s.at <= clock) {
      std::string why = fmt::format("the replay of replica {} from {} stops at clock {}: {}", replica,
                                    startName(from), s.at, s.why);
      // A snapshot that would have been a later start, named unless it already is.
      for (const UnusableSnapshot& u : unusableSnapshots) {
        const std::string name = fmt::format("the snapshot of clock {} is unusable", u.clock);
        if (u.clock > from && u.clock <= clock && why.find(name) == std::string::npos) {
          why += fmt::format("; {} too: {}", name, u.problem);
        }
      }
      return why;
    }
  }
  return fmt::format("clock {} is past the log of replica {} (latest: {})", clock, replica, latest());
}

void ReplicaRestorability::startAt(uint64_t first) {
  if (first == 0) return;
  std::erase_if(pieces, [&](const RestorableRange& p) { return p.last < first; });
  for (RestorableRange& p : pieces) p.first = std::max(p.first, first);
  std::erase_if(missing, [&](const ClockRange& m) { return m.last < first; });
  for (ClockRange& m : missing) m.first = std::max(m.first, first);
}

const ReplicaRestorability* Restorability::replica(int id) const {
  const auto it = std::find_if(replicas.begin(), replicas.end(),
                               [&](const ReplicaRestorability& r) { return r.replica == id; });
  return it == replicas.end() ? nullptr : &*it;
}

Restorability findRestorable(const Inventory& inventory) {
  Restorability out;
  out.snapshots = inventory.snapshots;
  for (const ReplicaInventory& r : inventory.replicas) {
    out.replicas.push_back(
        ReplicaAnalysis(r, inventory.snapshots, inventory.damagedSnapshots, inventory.complete ? &inventory : nullptr)
            .run());
  }
  return out;
}

ReplicaRestorability findRestorable(const Inventory& inventory, int replica) {
  const auto it = std::find_if(inventory.replicas.begin(), inventory.replicas.end(),
                               [&](const ReplicaInventory& r) { return r.replica == replica; });
  ReplicaInventory none;
  none.replica = replica;
  const ReplicaInventory& r = it == inventory.replicas.end() ? none : *it;
  return ReplicaAnalysis(r, inventory.snapshots, inventory.damagedSnapshots, inventory.complete ? &inventory : nullptr)
      .run();
}

}  // namespace orpheus::ckpt
