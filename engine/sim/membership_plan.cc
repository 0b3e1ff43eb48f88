#include "engine/sim/membership_plan.h"

#include "engine/base/error.h"

#include <fmt/format.h>

#include <charconv>

namespace orpheus::engine::sim {
namespace {

constexpr const char* kFlag = "--sim-membership";
constexpr int64_t kMaxChange = 100000;  // --ranks' own bound

// A whole number in [min, max], all of `text`.
bool wholeIn(const std::string& text, int64_t min, int64_t max, int64_t& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty() && out >= min && out <= max;
}

MembershipStep parseStep(const std::string& item) {
  const auto colon = item.find(':');
  ORPHEUS_CHECK_INPUT(colon != std::string::npos,
                      "{}: expected CLOCK:-N (N ranks leave after CLOCK) or CLOCK:+N (N join), got '{}'", kFlag, item);
  const std::string clock = item.substr(0, colon);
  const std::string count = item.substr(colon + 1);
  int64_t c = 0;
  ORPHEUS_CHECK_INPUT(wholeIn(clock, 1, INT64_MAX, c), "{}: the clock of '{}' must be a whole number >= 1", kFlag,
                      item);
  int64_t n = 0;
  ORPHEUS_CHECK_INPUT(count.size() >= 2 && (count[0] == '-' || count[0] == '+') &&
                          wholeIn(count.substr(1), 1, kMaxChange, n),
                      "{}: the change of '{}' must be -N (N ranks leave) or +N (N join), N in 1..{}", kFlag, item,
                      kMaxChange);
  return {static_cast<uint64_t>(c), static_cast<int>(count[0] == '-' ? -n : n)};
}

}  // namespace

const MembershipStep* MembershipPlan::at(uint64_t clock) const {
  for (const MembershipStep& s : steps) {
    if (s.clock == clock) return &s;
  }
  return nullptr;
}

std::vector<int> MembershipPlan::sizes(int initial) const {
  std::vector<int> out{initial};
  for (const MembershipStep& s : steps) out.push_back(out.back() + s.change);
  return out;
}

std::string MembershipPlan::describe(int initial, uint64_t through) const {
  std::string out = fmt::format("{}", initial);
  int size = initial;
  for (const MembershipStep& s : steps) {
    if (s.clock > through) break;
    size += s.change;
    out += fmt::format(" → {} at clock {}", size, s.clock);
  }
  return out;
}

MembershipPlan parseMembershipPlan(const std::string& text) {
  MembershipPlan plan;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    plan.steps.push_back(parseStep(text.substr(begin, comma - begin)));
    begin = comma + 1;
  }
  return plan;
}

void validateMembershipPlan(const MembershipPlan& plan, int ranks, int64_t clocks) {
  int size = ranks;
  uint64_t previous = 0;
  for (const MembershipStep& s : plan.steps) {
    ORPHEUS_CHECK_INPUT(static_cast<int64_t>(s.clock) < clocks,
                        "{}: clock {} must be before the job's last clock (1..{} with --clocks {})", kFlag, s.clock,
                        clocks - 1, clocks);
    ORPHEUS_CHECK_INPUT(s.clock != previous, "{}: clock {} is given twice: give one change per clock (the sum)", kFlag,
                        s.clock);
    ORPHEUS_CHECK_INPUT(s.clock > previous, "{}: clock {} comes after clock {}: give the changes in increasing order",
                        kFlag, s.clock, previous);
    ORPHEUS_CHECK_INPUT(size + s.change >= 1, "{}: {} ranks cannot leave after clock {}: only {} are left (rank 0 stays)",
                        kFlag, -s.change, s.clock, size);
    ORPHEUS_CHECK_INPUT(size + s.change <= kMaxChange, "{}: {} ranks after clock {}: at most {}", kFlag,
                        size + s.change, s.clock, kMaxChange);
    size += s.change;
    previous = s.clock;
  }
}

Change changeOf(const MembershipStep& step, int size) {
  Change change;
  change.noticeAt.assign(static_cast<size_t>(size), 0.0);
  if (step.change > 0) {
    change.joining = step.change;
    return change;
  }
  for (int r = size + step.change; r < size; ++r) {
    change.leaving.push_back(r);
    change.noticeAt[static_cast<size_t>(r)] = 1.0;  // planned, not told: any time marks the rank
  }
  return change;
}

}  // namespace orpheus::engine::sim
