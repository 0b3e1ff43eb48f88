// The adaptive-consistency controller (--adapt, after the thesis in
// papers/003, chapter 4): beside each worker, it adds up what every clock
// measured; every --adapt-every K clocks the ranks pool their windows in one
// control collective, rank 0 applies the policy (engine/adapt/policy.h) and
// announces the knobs, and every rank switches at the same clock boundary.
//
// A decision is taken at a barrier (Coordinator::barrierAfter includes the
// decision clocks): every batch of the clocks before it is applied everywhere, so
// the new C, Q, s and R govern only clocks no rank has started. Each decision is a
// metrics line ("decision": true, with its rule and reason) and, with --ckpt sv, a
// kKnobs entry in every replica's log, which --resume reads back (knobsAt).
// Timing is what it is on the machine; what stays bitwise is the replay of the
// decisions taken.
#pragma once

#include "comm/schedule.h"
#include "comm/transport.h"
#include "engine/adapt/policy.h"
#include "engine/base/sv_batch.h"
#include "engine/sync_modes.h"

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::engine {
class MetricsAggregator;
}  // namespace orpheus::engine

namespace orpheus::engine::adapt {

// What the controller reads of the job (engine/worker/part_options.h makes it from
// the flags): --adapt's own settings and the job the knobs start from.
struct ControllerOptions {
  bool enabled = false;  // --adapt
  int64_t every = 50;    // --adapt-every K
  // --adapt-select, --adapt-fanout, --adapt-staleness, --adapt-average-every as
  // [min, max]; {-1, -1}: the default of boundsFor.
  std::pair<int64_t, int64_t> selectRange{-1, -1};
  std::pair<int64_t, int64_t> fanoutRange{-1, -1};
  std::pair<int64_t, int64_t> stalenessRange{-1, -1};
  std::pair<int64_t, int64_t> averageEveryRange{-1, -1};
  std::pair<int64_t, int64_t> rankRange{-1, -1};  // --adapt-rank, under --sv-rank
  double maxBytesPerClock = 0.0;  // 0: no budget
  bool bf16 = false;              // --adapt-bf16: the budget rule may send U and V as bf16
  double commShare = 0.5;
  std::string trace;              // --adapt-trace: timing from a recorded metrics file
  // The job: its clocks, B, seed, the flags' C, s and R, the schedule's kind and the
  // consistency model; the errors e(c) are measured only under JMCSS selection.
  int64_t clocks = 1000;
  int64_t batch = 100;
  uint64_t seed = 1;
  int64_t select = 0;
  int64_t staleness = 0;
  int64_t averageEvery = 0;
  bool startBf16 = false;  // --sv-dtype bf16
  int64_t rank = 0;        // --sv-rank R: the knob is r, not C
  comm::MulticastKind multicast = comm::MulticastKind::kAll;
  Consistency consistency = Consistency::kBsp;
  bool jmcss = true;
};

// What one clock measured on this rank, as the controller needs it.
struct ClockSample {
  double computeSeconds = 0.0;
  double commSeconds = 0.0;
  double waitSeconds = 0.0;
  double svBytes = 0.0;            // SV traffic of the clock
  double coordinationBytes = 0.0;  // averaging and rotation at its barrier
  bool averaged = false;
  double divergence = 0.0;         // at that averaging (max over replicas)
  double clockSeconds = 0.0;       // wall time of the clock, its barrier included
  double selectSeconds = 0.0;      // SV selection, a part of computeSeconds
  // On the clocks measuresAt() names (else -1): e(c) at errorCounts(knobs), from the
  // clock's own batch (Controller::measure), and what measuring took.
  std::array<double, 3> errors{-1.0, -1.0, -1.0};
  double measureSeconds = 0.0;
};

// Timing recorded by an earlier run (its metrics lines): compute, comm, wait,
// clock and selection seconds by clock. --adapt-trace replays it in place of the clocks' own timing,
// so decisions become a function of the trace and the job (tests, what-if runs).
class Trace {
 public:
  // A trace is read whole on every rank: a metrics file of up to 64 MiB (some
  // 100,000 clocks of 4 ranks).
  static constexpr uintmax_t kMaxTraceBytes = uintmax_t{64} << 20;
  struct Timing {
    double computeSeconds = 0.0;
    double commSeconds = 0.0;
    double waitSeconds = 0.0;
    double clockSeconds = 0.0;   // 0 where the line has none
    double selectSeconds = 0.0;
  };
  // The per-clock lines of a metrics file (others are skipped); InputError when
  // it cannot be read or holds no clock line.
  static Trace read(const std::string& path);
  // Parses metrics lines from text (one JSON object a line).
  static Trace parse(const std::string& text, const std::string& source);
  // The line of the newest recorded clock <= `clock` (the first line before it).
  const Timing& at(uint64_t clock) const;
  size_t size() const { return byClock_.size(); }
  uint64_t lastClock() const { return byClock_.rbegin()->first; }

 private:
  std::map<uint64_t, Timing> byClock_;
};

// The bounds --adapt-* and the job's shape give (defaults filled in).
Bounds boundsFor(const ControllerOptions& options, int ranks, int startFanout);

// The knobs a job starts with, from its flags (Q as the schedule resolves it).
Knobs startKnobs(const ControllerOptions& options, int startFanout);

class Controller {
 public:
  // `shapes`: the model's parameter shapes; `startFanout`: Q as the schedule
  // resolved it. The references must outlive the controller.
  Controller(const ControllerOptions& options, comm::Transport& transport,
             const std::vector<std::pair<int64_t, int64_t>>& shapes, int startFanout);

  // Throws InputError naming --max-bytes-per-clock when no setting within the
  // bounds meets the budget (a promise the job cannot keep). The constructor
  // checks it too; a job checks it first on all ranks together, so it is said once.
  static void checkBudget(const ControllerOptions& options, int ranks,
                          const std::vector<std::pair<int64_t, int64_t>>& shapes, int startFanout);
  // The knobs a fresh job starts from: the flags', moved inside the bounds and the
  // budget (rule "start", or "budget"); what initial() holds, without a transport.
  static Decision start(const ControllerOptions& options, int ranks,
                        const std::vector<std::pair<int64_t, int64_t>>& shapes, int startFanout);

  bool enabled() const { return options_.enabled; }
  // The knobs to start from: the flags, inside the bounds and the budget.
  const Decision& initial() const { return initial_; }
  // Whether the ranks decide after `clock` (never after the last clock).
  bool decidesAfter(uint64_t clock) const;

  // Whether the clock's errors e(c) are measured: the last clock of each window
  // (the one before a decision), under JMCSS selection or --sv-rank. One clock a
  // window keeps the cost small (a JMCSS draw of C or B/2 SVGs and the Gram
  // matrices; under --sv-rank the sender's own power iteration says e(r)).
  bool measuresAt(uint64_t clock) const;
  // The counts e() is wanted at under `current` (policy.h, errorCounts).
  std::array<int64_t, 3> errorCountsFor(const Knobs& current) const;
  // sample.errors and sample.measureSeconds from errors measured elsewhere (the
  // --sv-rank sender's, LowRankSender::errorsAt(errorCountsFor(knobs))).
  void measured(const std::vector<double>& errors, double seconds, ClockSample& sample) const;
  // sample.errors and sample.measureSeconds from `local`, this rank's whole batch of
  // `clock`, under `current` (engine/worker/select.h, selectionErrors: nothing else changes).
  void measure(uint64_t clock, const SvBatch& local, const Knobs& current, ClockSample& sample) const;
  // Adds this rank's clock to the window. With --adapt-trace, the timing comes from
  // the trace (measuring's cost counts as 0); the errors are the job's own.
  void observe(uint64_t clock, const ClockSample& sample);
  // The decision after `clock` under `current` (collective: every rank calls it
  // when decidesAfter(clock)); the same knobs on every rank, the reason on rank 0.
  // Starts the next window.
  Decision decide(uint64_t clock, const Knobs& current);
  // Rank 0: decision lines go to the metrics, each after its clock's line.
  void reportTo(MetricsAggregator* aggregator) { aggregator_ = aggregator; }

 private:
  Window pooled();

  ControllerOptions options_;
  comm::Transport& transport_;
  Bounds bounds_;
  ByteModel bytes_;
  Decision initial_;
  std::optional<Trace> trace_;
  MetricsAggregator* aggregator_ = nullptr;
  // The window so far: sums over its clocks on this rank.
  int64_t clocks_ = 0;
  uint64_t lastClock_ = 0;
  double compute_ = 0.0, comm_ = 0.0, wait_ = 0.0, svBytes_ = 0.0, averageBytes_ = 0.0;
  double clock_ = 0.0, select_ = 0.0;
  std::array<double, 3> errorSums_{};  // over the measured clocks
  double measured_ = 0.0, measureSeconds_ = 0.0;
  int64_t averagings_ = 0;
  double firstDivergence_ = -1.0, lastDivergence_ = -1.0;
};

// The knobs in force after `clock` in replica `replica`'s log under `dir`: its
// newest kKnobs entry at or before `clock`, or none (the flags' knobs hold).
std::optional<Knobs> knobsAt(const std::string& dir, int replica, uint64_t clock);

}  // namespace orpheus::engine::adapt
