// Multicast schedules and link-failure injection: who sends its SV batch to whom at
// each clock (paper, section 3.2.2).
//
// Every answer is a pure function of (config, clock, rank): peer choices draw from
// CounterRng(seed, kMulticast, clock, sender) and broken links from
// CounterRng(seed, kLinks, clock, 0). Any rank can therefore compute the whole
// communication graph of any clock without talking to anyone, and a receiver knows
// exactly which senders to expect. No MPI, no threads, no caches: a schedule is
// immutable after construction and safe to share between threads.
//
// Cost per call: receivers() O(P) for broadcast, O(Q) for fixed and ring, O(Q^2)
// for random (more where broken links are skipped), plus O(K log K) for the K
// broken links of the clock (zero when no links are dropped); senders() and
// graph() cost P times that. Meant for P up to a few thousand.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::comm {

enum class MulticastKind {
  kAll,     // every other rank: Q = P-1 (broadcast)
  kRandom,  // Q distinct peers drawn afresh each clock
  kFixed,   // the same Q peers every clock: r -> r+1, ..., r+Q (mod P)
  kRing,    // round-robin: a window of Q offsets that advances by Q each clock
};

// "all", "random", "fixed", "ring"; anything else throws InputError naming the
// valid kinds.
MulticastKind parseMulticast(const std::string& name);
// The inverse of parseMulticast.
std::string multicastName(MulticastKind kind);

struct ScheduleConfig {
  MulticastKind kind = MulticastKind::kAll;
  int ranks = 1;     // P
  int fanout = 1;    // Q; ignored by kAll
  uint64_t seed = 0;  // the job seed
  // Fraction F of the P(P-1) directed links broken at each clock, in [0, 1).
  double dropLinks = 0.0;
};

class MulticastSchedule {
 public:
  // Validates the config, throwing InputError with a message that names the flag:
  //  - ranks >= 1;
  //  - kRandom, kFixed, kRing: 1 <= fanout <= P-1 (kAll ignores fanout, Q = P-1).
  //    A single rank (P = 1) has no peers at all: any fanout >= 1 is accepted and
  //    every kind yields no receivers, so a one-rank run of a multi-rank command
  //    line works;
  //  - 0 <= dropLinks < 1.
  explicit MulticastSchedule(const ScheduleConfig& config);

  MulticastKind kind() const { return kind_; }
  int ranks() const { return ranks_; }
  // The effective Q: P-1 for kAll, 0 when P = 1, otherwise the configured fanout.
  int fanout() const { return fanout_; }
  uint64_t seed() const { return seed_; }
  double dropLinks() const { return dropLinks_; }
  // Directed links broken at every clock: round(F * P(P-1)).
  uint64_t brokenLinksPerClock() const { return brokenPerClock_; }

  // Ranks that receive sender's batch at this clock, after link failures: sorted,
  // distinct, never the sender.
  //  - kRandom: the first Q peers of a Fisher-Yates shuffle of the P-1 others drawn
  //    from the sender's stream; a peer behind a broken link is replaced by the next
  //    one of the same shuffle, so the sender reaches min(Q, reachable peers). Peers
  //    whose links are intact are the same ones chosen without failures.
  //  - kAll, kFixed, kRing: a message over a broken link is lost; no substitute.
  std::vector<int> receivers(uint64_t clock, int sender) const;
  // Ranks whose batches this receiver gets at this clock, sorted: the exact inverse
  // of receivers().
  std::vector<int> senders(uint64_t clock, int receiver) const;
  // receivers(clock, s) for every sender s, indexed by s; computes the clock's
  // broken links once.
  std::vector<std::vector<int>> graph(uint64_t clock) const;

  // Whether the directed link from -> to is broken at this clock (from != to). Each
  // call redraws the clock's broken set; to test many links, take brokenLinks() once.
  bool linkBroken(uint64_t clock, int from, int to) const;
  // The directed links broken at this clock as (from, to), sorted; the same on
  // every rank. Exactly brokenLinksPerClock() of them.
  std::vector<std::pair<int, int>> brokenLinks(uint64_t clock) const;

  // One line for logs, e.g.
  // "random multicast, Q=3 of P=8, 10% of links broken per clock (6 of 56)".
  std::string describe() const;

 private:
  // Broken links of a clock as sorted indices of directed pairs (see pairIndex).
  std::vector<uint64_t> brokenSet(uint64_t clock) const;
  std::vector<int> receiversGiven(uint64_t clock, int sender,
                                  const std::vector<uint64_t>& broken) const;
  uint64_t pairIndex(int from, int to) const;

  MulticastKind kind_;
  int ranks_;
  int fanout_;
  uint64_t seed_;
  double dropLinks_;
  uint64_t brokenPerClock_;
};

}  // namespace orpheus::comm
