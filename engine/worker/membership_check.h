// Whether the membership of a running job changes at a clock boundary: the
// worker's loop asks after each clock but the last (Worker::watchMembership). The
// live job's agreement is one (engine/membership/live.h, MembershipWatch); the
// simulator's planned changes another (engine/sim/membership_plan.h).
#pragma once

#include <cstdint>

namespace orpheus::engine {

class MembershipCheck {
 public:
  virtual ~MembershipCheck() = default;
  // True when the membership changes after `clock`, the same answer on every rank.
  virtual bool changesAfter(uint64_t clock) = 0;
};

}  // namespace orpheus::engine
