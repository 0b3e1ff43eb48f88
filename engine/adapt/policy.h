// The adaptive-consistency policy (--adapt): from what a window of clocks
// measured, the knobs for the next window, and one line saying why.
//
// Pure and deterministic: the same window, knobs, bounds and byte model give the
// same decision on any machine. Nothing here reads a clock or a file; the
// controller (engine/adapt/controller.h) gathers the window and announces the
// decision. The rules are written out in engine/adapt/README.md:
//   0. budget   predicted bytes per rank per clock above --max-bytes-per-clock:
//               send U and V as bf16 (--adapt-bf16), then lower C (r under
//               --sv-rank), then Q, then R-averaging traffic, until it fits;
//   1. goodput  C moves to the candidate of {C/2, C, 2C} with the most progress per
//               second, (1 - e(c)) / t(c), when it beats C's by more than 5%:
//               e(c) is the measured relative error of the update c SVGs rebuild,
//               t(c) the clock's measured time with its selection and exposed comm
//               scaled to c. Under --sv-rank the same rule moves r: e(r) is the
//               share of the clock's update (with what earlier clocks carried)
//               that rank r leaves for later clocks;
//   2. waits    waits above a fifth of compute + comm + wait: raise s (SSP), else
//               lower Q;
//   3. diverge  replica divergence at averaging grew by half or more: halve R,
//               else double C (r);
//   4. slack    comm below half of --adapt-comm-share of compute: raise Q, else
//               halve R (each only within the budget);
//   5. keep.
// One rule fires per decision, and it moves one knob one step, so a run's
// decisions read as a sequence of small, named steps.
#pragma once

#include "engine/adapt/knobs.h"

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::engine::adapt {

// Inclusive [min, max] per knob, resolved (AdaptBounds::resolve); a knob whose
// min equals its max does not move.
struct Range {
  int64_t min = 0;
  int64_t max = 0;
  int64_t clamp(int64_t v) const { return v < min ? min : v > max ? max : v; }
};

struct Bounds {
  Range select;        // C in [1, B]; B itself stands for "all"
  Range fanout;        // Q in [1, P-1]
  Range staleness;     // s; fixed at its start value unless SSP
  Range averageEvery;  // R; fixed at 0 when averaging is off
  Range rank;          // r under --sv-rank (then C is fixed at B); {0, 0} without
  bool bf16 = false;   // the budget rule may switch U and V to bf16 (--adapt-bf16)
  double maxBytesPerClock = 0.0;  // per rank; 0 = no budget
  double commShare = 0.5;         // slack: exposed comm below half this share of compute
};

// What the knobs cost in bytes sent per rank per clock, from the model's shapes
// (an upper bound for dense SV batches) and corrected by what was measured.
struct ByteModel {
  int64_t batch = 0;             // B
  double fixedBytes = 0.0;       // per SV batch: header and matrix table
  double perColumnBytes = 0.0;   // per selected column: coefficients (f32 always)
  double perColumnValues = 0.0;  // per selected column: U and V values (f32 or bf16)
  double perColumnSquared = 0.0; // per C^2: the least-squares core of a selection
  double averageBytes = 0.0;     // per averaging, per rank
  double scale = 1.0;            // measured / predicted, when measurement says more

  // Bytes of one SV batch of C columns (0: all B, no core), its values in bf16 or f32.
  double batchBytes(int64_t select, bool bf16 = false) const;
  // Bytes of one SV batch under `knobs`: C columns, or r + 1 with a core under --sv-rank.
  double svBytes(const Knobs& knobs) const;
  // Predicted bytes per rank per clock: Q batches, plus averaging amortized over R.
  double perClock(const Knobs& knobs) const;
};

// The model for parameter matrices of `shapes` (rows, cols) and B = `batch`.
ByteModel byteModelFor(const std::vector<std::pair<int64_t, int64_t>>& shapes, int64_t batch);

// Means per clock and per rank over the window's clocks, except where it says.
struct Window {
  int64_t clocks = 0;
  double computeSeconds = 0.0;
  double commSeconds = 0.0;  // exposed: encode, send, receive, decode
  double waitSeconds = 0.0;
  double svBytes = 0.0;      // max over ranks of SV bytes sent per clock
  double averageBytes = 0.0; // max over ranks of bytes one averaging sent (0: none in the window)
  double divergence = -1.0;          // at the last averaging in the window (-1: none)
  double previousDivergence = -1.0;  // at the averaging before it (-1: none)
  double clockSeconds = 0.0;   // wall time of a clock (0: taken as compute + comm + wait)
  double selectSeconds = 0.0;  // SV selection, a part of computeSeconds
  // e(c): the relative error of the update when c of the B SVGs are sent
  // (engine/worker/select.h, selectionErrors), at the counts errorCounts() names; means over
  // the measured clocks of every rank, -1 where none was measured.
  std::array<double, 3> errors{-1.0, -1.0, -1.0};
  double measureSeconds = 0.0;  // what measuring the errors took, per measured clock
};

// Where the goodput rule needs e(c) under `current`: {the lower candidate (C/2 within
// the bounds), C/2 (0 for C = 1: e(0) = 1), C (B when all are sent: e(B) = 0)};
// under --sv-rank the same of r.
std::array<int64_t, 3> errorCounts(const Knobs& current, const Bounds& bounds, int64_t batch);

struct Decision {
  Knobs knobs;
  std::string rule;    // budget, goodput, waits, diverge, slack, keep
  std::string reason;  // one line: the measurement and the step
  double predictedBytes = 0.0;  // per rank per clock, for the new knobs
};

// The knobs to start with: `start` inside the bounds and the budget (no
// measurement yet, so only rule 0).
Decision initialKnobs(const Knobs& start, const Bounds& bounds, const ByteModel& bytes, bool ssp);

// The decision after `window` under `current`.
Decision decide(const Knobs& current, const Window& window, const Bounds& bounds, const ByteModel& bytes, bool ssp);

// The model corrected by a window's measurement under `current` (never below the
// shape prediction).
ByteModel corrected(const ByteModel& model, const Knobs& current, const Window& window);

}  // namespace orpheus::engine::adapt
