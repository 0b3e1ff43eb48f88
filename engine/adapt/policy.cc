#include "engine/adapt/policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <optional>
#include <string>
#include <vector>

namespace orpheus::engine::adapt {
namespace {

// Rule thresholds (README, "Adaptive consistency").
constexpr double kGoodputMargin = 0.05;  // a candidate C must beat the current one by more
constexpr double kWaitShare = 0.2;       // waits above this share of compute + comm + wait dominate
constexpr double kDivergenceGrowth = 1.5;  // divergence grew by half or more
constexpr double kSlackShare = 0.5;      // comm below this part of the target share is slack

int64_t effectiveSelect(int64_t select, int64_t batch) { return select <= 0 || select >= batch ? batch : select; }
// C = B is no selection at all: stored as 0, as --select 0 means.
int64_t storedSelect(int64_t select, int64_t batch) { return select >= batch ? 0 : select; }

// The knob rules 0, 1 and 3 move: r under --sv-rank, else C (effective: B for all).
int64_t level(const Knobs& k, int64_t batch) { return k.rank > 0 ? k.rank : effectiveSelect(k.select, batch); }
const Range& levelRange(const Knobs& k, const Bounds& b) { return k.rank > 0 ? b.rank : b.select; }
Knobs withLevel(Knobs k, int64_t value, int64_t batch) {
  if (k.rank > 0) {
    k.rank = value;
  } else {
    k.select = storedSelect(value, batch);
  }
  return k;
}
// Whether `value` of the level sends everything (C = B; never for a rank).
bool sendsAll(const Knobs& k, int64_t value, int64_t batch) { return k.rank == 0 && value >= batch; }

bool fits(const ByteModel& m, const Bounds& b, const Knobs& k) {
  return b.maxBytesPerClock <= 0.0 || m.perClock(k) <= b.maxBytesPerClock;
}

std::string bytesText(double bytes) {
  if (bytes >= 1e6) return fmt::format("{:.2f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

Decision made(const Knobs& k, const ByteModel& m, std::string rule, std::string reason) {
  return {k, std::move(rule), std::move(reason), m.perClock(k)};
}

// Knobs inside the bounds; C in the stored form.
Knobs clamped(Knobs k, const Bounds& b, int64_t batch) {
  k.select = storedSelect(b.select.clamp(effectiveSelect(k.select, batch)), batch);
  k.fanout = b.fanout.clamp(k.fanout);
  k.staleness = b.staleness.clamp(k.staleness);
  k.averageEvery = b.averageEvery.clamp(k.averageEvery);
  if (k.rank > 0) k.rank = b.rank.clamp(k.rank);
  return k;
}

// Rule 0: bf16 values where allowed (half the bytes at the same C), then the
// largest C (r) that fits, then fewer peers, then rarer averaging.
std::optional<Decision> fitBudget(const Knobs& current, const Bounds& b, const ByteModel& m) {
  if (fits(m, b, current)) return std::nullopt;
  const double before = m.perClock(current);
  Knobs k = current;
  while (!fits(m, b, k)) {
    const int64_t c = level(k, m.batch);
    if (b.bf16 && !k.bf16) {
      k.bf16 = true;
    } else if (c > levelRange(k, b).min) {
      k = withLevel(k, c - 1, m.batch);
    } else if (k.fanout > b.fanout.min) {
      k.fanout -= 1;
      k = withLevel(k, levelRange(k, b).max, m.batch);  // the largest C (r) again, at the smaller Q
    } else if (k.averageEvery > 0 && k.averageEvery < b.averageEvery.max) {
      k.averageEvery = std::min(b.averageEvery.max, 2 * k.averageEvery);
    } else {
      return made(k, m, "budget",
                  fmt::format("predicted {} per clock exceeds the budget {} even at {}: every knob is at its bound",
                              bytesText(m.perClock(k)), bytesText(b.maxBytesPerClock), toString(k)));
    }
  }
  return made(k, m, "budget",
              fmt::format("predicted {} per clock > budget {}: {} -> {} ({})", bytesText(before),
                          bytesText(b.maxBytesPerClock), toString(current), toString(k), bytesText(m.perClock(k))));
}

// One step of one knob, kept only when it moves and fits the budget.
std::optional<Knobs> step(const Knobs& current, const Bounds& b, const ByteModel& m, Knobs next) {
  next = clamped(next, b, m.batch);
  if (next == current || !fits(m, b, next)) return std::nullopt;
  return next;
}

// One candidate C (r) of the goodput rule: its predicted error and seconds per clock.
struct Candidate {
  int64_t value = 0;  // C (effective: B for all) or r
  double error = 0.0;
  double seconds = 0.0;
  double goodput() const { return (1.0 - error) / std::max(seconds, 1e-9); }
  std::string text(const Knobs& k, int64_t batch) const {
    const std::string name = k.rank > 0 ? "r" : "C";
    const std::string v = sendsAll(k, value, batch) ? std::string("all") : std::to_string(value);
    return fmt::format("{}={} {:.2f}/{:.0f}ms", name, v, 1.0 - error, 1e3 * seconds);
  }
};

// Rule 1. Progress per clock is 1 - e(c), the share of the update the c sent SVGs
// rebuild (under --sv-rank: the share rank r sends now rather than later); seconds
// per clock are the measured clock with its selection and exposed comm scaled to c
// (selection by c, comm by the bytes of a batch of c; --sv-rank's compression is
// taken as fixed), the rest (forward/backward, rebuild, waits, barriers) taken as it
// is. e(2C) is not measured: it is extrapolated as e(C) times the ratio e(C)/e(C/2)
// of the last halving, but never below half of e(C), and interpolated linearly when
// the bounds stop short of 2C; e = 0 when the candidate is all B. (From r = 1, whose
// halving is to nothing sent, the ratio's square root.)
// `held` gets the comparison when C stays.
std::optional<Knobs> goodput(const Knobs& current, const Window& w, const Bounds& b, const ByteModel& m,
                             std::string& held, std::string& why) {
  for (const double e : w.errors) {
    if (e < 0.0) return std::nullopt;  // not measured (uniform selection, dense sync, no SV clock)
  }
  const int64_t batch = m.batch;
  const bool rank = current.rank > 0;
  const int64_t c = level(current, batch);
  const std::array<int64_t, 3> counts = errorCounts(current, b, batch);
  const double clock =
      w.clockSeconds > 0.0 ? w.clockSeconds : w.computeSeconds + w.commSeconds + w.waitSeconds;
  const bool selecting = !rank && c < batch;
  const double select = selecting ? w.selectSeconds : 0.0;
  const double fixed = std::max(0.0, clock - w.commSeconds - select);
  // Selection seconds per SVG: measured at C, or, with all sent, the probe's (an upper bound).
  const double perColumn = rank ? 0.0
                           : selecting ? w.selectSeconds / static_cast<double>(c)
                                       : w.measureSeconds / static_cast<double>(std::max<int64_t>(1, counts[1]));
  const auto candidate = [&](int64_t k, double error) {
    const bool all = sendsAll(current, k, batch);
    const double selectingK = all ? 0.0 : perColumn * static_cast<double>(k);
    const double comm = w.commSeconds * m.svBytes(withLevel(current, k, batch)) / m.svBytes(current);
    return Candidate{k, all ? 0.0 : error, fixed + selectingK + comm};
  };
  const double errorC = sendsAll(current, c, batch) ? 0.0 : w.errors[2];
  const Candidate now = candidate(c, errorC);
  std::vector<Candidate> others;
  if (counts[0] < c) others.push_back(candidate(counts[0], w.errors[0]));
  const int64_t up = levelRange(current, b).clamp(rank ? 2 * c : std::min(2 * c, batch));
  if (up > c) {
    double error = 0.0;
    if (!sendsAll(current, up, batch)) {
      double ratio = w.errors[1] > 0.0 ? errorC / w.errors[1] : 0.0;
      // At r = 1 the last "halving" is to nothing sent (e(0) = 1), a steeper fall than
      // any later doubling gives: take its square root, or r would swing 1, 2, 1, ...
      if (rank && counts[1] == 0) ratio = std::sqrt(ratio);
      const double doubled = errorC * std::clamp(ratio, 0.5, 1.0);
      error = errorC + (doubled - errorC) * static_cast<double>(up - c) / static_cast<double>(c);
    }
    if (fits(m, b, withLevel(current, up, batch))) others.push_back(candidate(up, error));
  }
  const Candidate* best = &now;
  for (const Candidate& k : others) {
    if (k.goodput() > best->goodput()) best = &k;
  }
  if (best != &now && best->goodput() > (1.0 + kGoodputMargin) * now.goodput()) {
    why = fmt::format("goodput {} > {}", best->text(current, batch), now.text(current, batch));
    return step(current, b, m, withLevel(current, best->value, batch));
  }
  std::string rest;
  for (const Candidate& k : others) rest += (rest.empty() ? "" : ", ") + k.text(current, batch);
  held = fmt::format("goodput holds {}{}", now.text(current, batch), rest.empty() ? "" : " (" + rest + ")");
  return std::nullopt;
}

}  // namespace

std::string toString(const Knobs& k) {
  return fmt::format("C={} Q={} s={} R={}{}{}", k.select == 0 ? std::string("all") : std::to_string(k.select),
                     k.fanout, k.staleness, k.averageEvery, k.bf16 ? " bf16" : "",
                     k.rank > 0 ? fmt::format(" r={}", k.rank) : std::string());
}

std::array<int64_t, 3> errorCounts(const Knobs& current, const Bounds& b, int64_t batch) {
  const int64_t c = level(current, batch);
  return {std::min(c, levelRange(current, b).clamp(std::max<int64_t>(1, c / 2))), c / 2, c};
}

double ByteModel::batchBytes(int64_t select, bool bf16) const {
  const double column = perColumnBytes + perColumnValues * (bf16 ? 2.0 : 4.0);
  if (select <= 0 || select >= batch) return fixedBytes + static_cast<double>(batch) * column;
  const auto c = static_cast<double>(select);
  return fixedBytes + c * column + c * c * perColumnSquared;
}

double ByteModel::svBytes(const Knobs& k) const {
  return batchBytes(k.rank > 0 ? k.rank + 1 : k.select, k.bf16);
}

double ByteModel::perClock(const Knobs& k) const {
  const double sv = static_cast<double>(k.fanout) * svBytes(k) * scale;
  return sv + (k.averageEvery > 0 ? averageBytes / static_cast<double>(k.averageEvery) : 0.0);
}

ByteModel byteModelFor(const std::vector<std::pair<int64_t, int64_t>>& shapes, int64_t batch) {
  // sv_batch.h: a 64-byte header, 32 bytes per matrix, then per column an f32
  // coefficient and, per matrix, its U and V columns; a selection adds an n x n
  // core and n bias coefficients per matrix. Every parameter counts as a matrix,
  // so this bounds dense batches from above. U and V are counted in values, the
  // rest in f32 bytes.
  constexpr double kFloat = 4.0;
  ByteModel m;
  m.batch = batch;
  m.fixedBytes = 64.0 + 32.0 * static_cast<double>(shapes.size());
  m.perColumnBytes = kFloat;
  double params = 0.0;
  for (const auto& [rows, cols] : shapes) {
    m.perColumnBytes += kFloat;
    m.perColumnValues += static_cast<double>(rows + cols);
    m.perColumnSquared += kFloat;
    params += static_cast<double>(rows * cols);
  }
  // An allreduce sends about twice the replica; the measurement replaces this.
  m.averageBytes = 2.0 * kFloat * params;
  return m;
}

ByteModel corrected(const ByteModel& model, const Knobs& current, const Window& w) {
  ByteModel m = model;
  const double predicted = static_cast<double>(current.fanout) * model.svBytes(current);
  if (predicted > 0.0 && w.svBytes > predicted) m.scale = w.svBytes / predicted;
  if (w.averageBytes > 0.0) m.averageBytes = w.averageBytes;
  return m;
}

Decision initialKnobs(const Knobs& start, const Bounds& b, const ByteModel& m, bool ssp) {
  Knobs k = clamped(start, b, m.batch);
  if (!ssp) k.staleness = start.staleness;
  if (auto fitted = fitBudget(k, b, m)) {
    if (!(k == start)) fitted->reason = fmt::format("{} outside the --adapt-* bounds, then {}", toString(start), fitted->reason);
    return *fitted;
  }
  if (!(k == start)) {
    return made(k, m, "start", fmt::format("{} lies outside the --adapt-* bounds: {}", toString(start), toString(k)));
  }
  return made(k, m, "start", fmt::format("{} within the bounds and the budget", toString(k)));
}

Decision decide(const Knobs& current, const Window& w, const Bounds& b, const ByteModel& model, bool ssp) {
  const ByteModel m = corrected(model, current, w);
  if (auto fitted = fitBudget(current, b, m)) return *fitted;

  const int64_t c = level(current, m.batch);
  const double compute = std::max(w.computeSeconds, 1e-9);
  const double share = w.commSeconds / compute;
  const double measured = w.computeSeconds + w.commSeconds + w.waitSeconds;
  const auto moved = [&](const char* rule, const std::string& why, const Knobs& next) {
    return made(next, m, rule, fmt::format("{}: {} -> {}", why, toString(current), toString(next)));
  };
  const auto change = [&](auto edit) {
    Knobs next = current;
    edit(next);
    return step(current, b, m, next);
  };
  std::string held;     // a rule that fired but could move nothing
  std::string goodputs; // the goodput comparison, when C stays

  // 1. C where progress per second is highest.
  {
    std::string why;
    if (auto k = goodput(current, w, b, m, goodputs, why)) return moved("goodput", why, *k);
  }
  // 2. Waits dominate: let workers run further ahead, else wait on fewer peers.
  if (w.waitSeconds > kWaitShare * measured && w.waitSeconds > 0.0) {
    const std::string why =
        fmt::format("waits {:.0f}% of compute+comm+wait", 100.0 * w.waitSeconds / std::max(measured, 1e-9));
    if (ssp) {
      if (auto k = change([](Knobs& n) { ++n.staleness; })) return moved("waits", why + ", raise s", *k);
    }
    if (auto k = change([](Knobs& n) { --n.fanout; })) return moved("waits", why + ", fewer peers", *k);
    held = why;
  }
  // 3. Replicas drift apart between averagings: average sooner, or send more.
  if (held.empty() && w.divergence >= 0.0 && w.previousDivergence > 0.0 &&
      w.divergence >= kDivergenceGrowth * w.previousDivergence) {
    const std::string why =
        fmt::format("divergence at averaging {:.3g} -> {:.3g}", w.previousDivergence, w.divergence);
    if (current.averageEvery > 0) {
      if (auto k = change([](Knobs& n) { n.averageEvery = std::max<int64_t>(1, n.averageEvery / 2); })) {
        return moved("diverge", why, *k);
      }
    }
    if (auto k = change([&](Knobs& n) { n = withLevel(n, 2 * c, m.batch); })) return moved("diverge", why, *k);
    held = why;
  }
  // 4. Slack: comm well under its share buys consistency: more peers, then averaging sooner.
  if (held.empty() && share < kSlackShare * b.commShare) {
    const std::string why = fmt::format("comm {:.2f} of compute < {:.2f}", share, kSlackShare * b.commShare);
    if (auto k = change([](Knobs& n) { ++n.fanout; })) return moved("slack", why, *k);
    if (current.averageEvery > 0) {
      if (auto k = change([](Knobs& n) { n.averageEvery = std::max<int64_t>(1, n.averageEvery / 2); })) {
        return moved("slack", why, *k);
      }
    }
    held = why;
  }
  const std::string tail = goodputs.empty() ? "" : "; " + goodputs;
  if (!held.empty()) return made(current, m, "keep", held + ", but its knobs are at their bounds or the budget" + tail);
  return made(current, m, "keep",
              fmt::format("comm {:.2f} of compute, waits {:.0f}% of compute+comm+wait{}", share,
                          100.0 * w.waitSeconds / std::max(measured, 1e-9), tail));
}

}  // namespace orpheus::engine::adapt
