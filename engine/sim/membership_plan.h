// `orpheus simulate --sim-membership "50:-100,120:+40"`: membership changes of the
// simulated job at clock boundaries, planned in advance. After clock 50 the 100
// highest-numbered ranks leave; after clock 120, 40 new ranks join (ranked after
// the others). Each change is the live job's (engine/membership/live.h): every rank
// ends clock C, every replica of the new epoch is the average of the old replicas
// at C (in memory: the simulator keeps no log), the data is recut for the new
// number of ranks, and the job goes on from clock C+1 on the same virtual clock.
#pragma once

#include "engine/membership/live.h"
#include "engine/worker/membership_check.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::engine::sim {

// One planned change: after `clock`, `change` ranks join (> 0) or leave (< 0).
struct MembershipStep {
  uint64_t clock = 0;
  int change = 0;
};

struct MembershipPlan {
  std::vector<MembershipStep> steps;

  bool empty() const { return steps.empty(); }
  // The step after `clock`, or null.
  const MembershipStep* at(uint64_t clock) const;
  // The ranks of each epoch: initial, then after each step.
  std::vector<int> sizes(int initial) const;
  // "1000 → 900 at clock 50 → 940 at clock 120", the steps up to clock `through`.
  std::string describe(int initial, uint64_t through) const;
};

// "CLOCK:-N,CLOCK:+N,...": InputError naming --sim-membership on anything else
// (an empty list, a missing sign, a count of 0, a clock that is not a whole number).
MembershipPlan parseMembershipPlan(const std::string& text);
// The plan against the job (InputError naming --sim-membership): each clock in
// 1..clocks-1 (a change after the last clock would change nothing), the clocks in
// increasing order, at least one rank in every epoch.
void validateMembershipPlan(const MembershipPlan& plan, int ranks, int64_t clocks);

// The change of `step` on a group of `size` ranks: the highest-numbered ranks
// leave (never rank 0, which writes the outputs), or new ranks join.
Change changeOf(const MembershipStep& step, int size);

// The worker's question at each clock, answered from the plan: every rank knows it.
class PlannedChanges final : public MembershipCheck {
 public:
  explicit PlannedChanges(const MembershipPlan& plan) : plan_(plan) {}
  bool changesAfter(uint64_t clock) override { return plan_.at(clock) != nullptr; }

 private:
  const MembershipPlan& plan_;
};

}  // namespace orpheus::engine::sim
