#include "engine/config.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/coordinator/outer_step.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace orpheus::engine {
namespace {

template <typename E>
const std::string& nameIn(const NamedValues<E>& table, E value) {
  const auto it = std::find_if(table.begin(), table.end(), [&](const auto& entry) { return entry.second == value; });
  ORPHEUS_ENFORCE(it != table.end(), "enum value {} has no name", static_cast<int>(value));
  return it->first;
}

}  // namespace

const NamedValues<SyncMode>& syncModeNames() {
  static const NamedValues<SyncMode> table{
      {"sv", SyncMode::kSv}, {"dense", SyncMode::kDense}, {"powersgd", SyncMode::kPowerSgd}};
  return table;
}

const NamedValues<Consistency>& consistencyNames() {
  static const NamedValues<Consistency> table{{"bsp", Consistency::kBsp}, {"ssp", Consistency::kSsp}};
  return table;
}

const NamedValues<comm::MulticastKind>& multicastNames() {
  static const NamedValues<comm::MulticastKind> table = [] {
    NamedValues<comm::MulticastKind> t;
    for (const auto kind : {comm::MulticastKind::kAll, comm::MulticastKind::kRandom, comm::MulticastKind::kFixed,
                            comm::MulticastKind::kRing}) {
      t.emplace_back(comm::multicastName(kind), kind);
    }
    return t;
  }();
  return table;
}

const NamedValues<SvDtype>& svDtypeNames() {
  static const NamedValues<SvDtype> table{{svDtypeName(SvDtype::kF32), SvDtype::kF32},
                                          {svDtypeName(SvDtype::kBf16), SvDtype::kBf16}};
  return table;
}

const NamedValues<TransferMode>& transferModeNames() {
  static const NamedValues<TransferMode> table{{"staged", TransferMode::kStaged}, {"sync", TransferMode::kSync}};
  return table;
}

const NamedValues<SelectionMethod>& selectionMethodNames() {
  static const NamedValues<SelectionMethod> table = [] {
    NamedValues<SelectionMethod> t;
    for (const auto method : {SelectionMethod::kJmcss, SelectionMethod::kJmcssGram, SelectionMethod::kUniform}) t.emplace_back(toString(method), method);
    return t;
  }();
  return table;
}

const NamedValues<ops::Model::SvgUnit>& svgUnitNames() {
  static const NamedValues<ops::Model::SvgUnit> table{{"example", ops::Model::SvgUnit::kExample},
                                                      {"step", ops::Model::SvgUnit::kStep}};
  return table;
}

const NamedValues<OptimizerKind>& optimizerNames() {
  static const NamedValues<OptimizerKind> table{{"sgd", OptimizerKind::kSgd},
                                                {"momentum", OptimizerKind::kMomentum},
                                                {"nesterov", OptimizerKind::kNesterov},
                                                {"adagrad", OptimizerKind::kAdagrad},
                                                {"adam", OptimizerKind::kAdam},
                                                {"bfgs", OptimizerKind::kBfgs},
                                                {"dfp", OptimizerKind::kDfp}};
  return table;
}

const NamedValues<LrScheduleKind>& lrScheduleNames() {
  static const NamedValues<LrScheduleKind> table{
      {"constant", LrScheduleKind::kConstant}, {"step", LrScheduleKind::kStep}, {"cosine", LrScheduleKind::kCosine}};
  return table;
}

std::string toString(SyncMode mode) { return nameIn(syncModeNames(), mode); }
std::string toString(OptimizerKind kind) { return nameIn(optimizerNames(), kind); }
std::string toString(LrScheduleKind kind) { return nameIn(lrScheduleNames(), kind); }

OptimizerSettings optimizerSettings(const TrainConfig& c) {
  OptimizerSettings s;
  s.kind = c.optimizer;
  s.lr = c.lr > 0.0 ? c.lr : defaultLearningRate(c.optimizer);
  s.momentum = c.momentum >= 0.0 ? c.momentum : 0.9;
  s.beta1 = c.beta1 >= 0.0 ? c.beta1 : 0.9;
  s.beta2 = c.beta2 >= 0.0 ? c.beta2 : 0.999;
  s.eps = c.eps > 0.0 ? c.eps : (c.optimizer == OptimizerKind::kAdagrad ? 1e-10 : 1e-8);
  s.weightDecay = c.weightDecay;
  s.schedule = c.lrSchedule;
  s.warmup = c.warmup;
  s.stepEvery = c.lrStepEvery;
  s.gamma = c.lrGamma > 0.0 ? c.lrGamma : 0.1;
  s.clocks = c.clocks;
  s.outerMomentumInSnapshots = OuterStepOptions{c.outerLr, c.outerMomentum}.active();
  return s;
}
std::string toString(Consistency c) { return nameIn(consistencyNames(), c); }

comm::ScheduleConfig scheduleConfig(const TrainConfig& c, int ranks) {
  comm::ScheduleConfig sc;
  sc.kind = c.multicast;
  sc.ranks = ranks;
  sc.fanout = c.multicast == comm::MulticastKind::kAll ? std::max(ranks - 1, 1) : std::max(c.fanout, 1);
  sc.seed = c.seed;
  sc.dropLinks = c.dropLinks;
  return sc;
}

namespace {

// Optimizer and schedule flags: ranges, and flags that would do nothing.
void validateOptimizer(const TrainConfig& c) {
  const OptimizerKind k = c.optimizer;
  const std::string name = toString(k);
  const bool usesMomentum = k == OptimizerKind::kMomentum || k == OptimizerKind::kNesterov;
  ORPHEUS_CHECK_INPUT(c.lr >= 0.0 && std::isfinite(c.lr), "--lr {} must be a number > 0", c.lr);
  ORPHEUS_CHECK_INPUT(c.momentum < 0.0 || usesMomentum,
                      "--momentum applies to --optimizer momentum or nesterov, not {}", name);
  // The optimizers step in float: a value that rounds to 1 there is 1.
  const auto belowOne = [](double v) { return static_cast<float>(v) < 1.0f; };
  const auto roundsTo = [&](double v) { return v < 1.0 && !belowOne(v) ? " (it rounds to 1 in float)" : ""; };
  ORPHEUS_CHECK_INPUT(belowOne(c.momentum), "--momentum {} must be in [0, 1){}", c.momentum, roundsTo(c.momentum));
  ORPHEUS_CHECK_INPUT(k != OptimizerKind::kNesterov || c.momentum != 0.0,
                      "--optimizer nesterov needs --momentum > 0 (0 is plain sgd)");
  ORPHEUS_CHECK_INPUT((c.beta1 < 0.0 && c.beta2 < 0.0) || k == OptimizerKind::kAdam,
                      "--beta1 and --beta2 apply to --optimizer adam, not {}", name);
  ORPHEUS_CHECK_INPUT(belowOne(c.beta1), "--beta1 {} must be in [0, 1){}", c.beta1, roundsTo(c.beta1));
  ORPHEUS_CHECK_INPUT(belowOne(c.beta2), "--beta2 {} must be in [0, 1){}", c.beta2, roundsTo(c.beta2));
  ORPHEUS_CHECK_INPUT(c.eps < 0.0 || k == OptimizerKind::kAdam || k == OptimizerKind::kAdagrad,
                      "--eps applies to --optimizer adam or adagrad, not {}", name);
  ORPHEUS_CHECK_INPUT(c.eps < 0.0 || (c.eps > 0.0 && std::isfinite(c.eps)), "--eps {} must be a number > 0", c.eps);
  ORPHEUS_CHECK_INPUT(c.weightDecay >= 0.0 && std::isfinite(c.weightDecay), "--weight-decay {} must be >= 0",
                      c.weightDecay);
  const bool step = c.lrSchedule == LrScheduleKind::kStep;
  ORPHEUS_CHECK_INPUT(!step || c.lrStepEvery >= 1, "--lr-schedule step needs --lr-step-every N >= 1");
  ORPHEUS_CHECK_INPUT(step || (c.lrStepEvery == 0 && c.lrGamma < 0.0),
                      "--lr-step-every and --lr-gamma apply to --lr-schedule step, not {}", toString(c.lrSchedule));
  ORPHEUS_CHECK_INPUT(c.lrGamma < 0.0 || (c.lrGamma > 0.0 && c.lrGamma <= 1.0), "--lr-gamma {} must be in (0, 1]",
                      c.lrGamma);
  ORPHEUS_CHECK_INPUT(c.warmup >= 0, "--warmup {} must be >= 0", c.warmup);
  ORPHEUS_CHECK_INPUT(c.warmup < c.clocks || c.warmup == 0,
                      "--warmup {} must be shorter than --clocks {}: the learning rate would never reach --lr",
                      c.warmup, c.clocks);
}

void checkRange(const std::pair<int64_t, int64_t>& r, const char* flag, int64_t low, int64_t high) {
  if (r.first < 0) return;
  // An upper end of no practical size (the int64 guards) is not shown: MIN <= MAX says it.
  ORPHEUS_CHECK_INPUT(r.first <= r.second && r.first >= low && r.second <= high,
                      "{} {}:{} must be MIN:MAX with {} <= MIN <= MAX{}", flag, r.first, r.second, low,
                      high >= kMaxSize ? std::string() : fmt::format(" <= {}", high));
}

// --adapt and its bounds: each applies only where its knob can move.
void validateAdapt(const TrainConfig& c, int ranks) {
  const bool any = c.adaptEvery != 50 || c.adaptSelect.first >= 0 || c.adaptFanout.first >= 0 ||
                   c.adaptStaleness.first >= 0 || c.adaptAverageEvery.first >= 0 || c.maxBytesPerClock > 0.0 ||
                   c.adaptCommShare != 0.5 || !c.adaptTrace.empty() || c.adaptBf16 || c.adaptRank.first >= 0;
  ORPHEUS_CHECK_INPUT(c.adapt || !any,
                      "--adapt-every, --adapt-select, --adapt-rank, --adapt-fanout, --adapt-staleness, "
                      "--adapt-average-every, --adapt-comm-share, --adapt-trace, --adapt-bf16 and "
                      "--max-bytes-per-clock apply to --adapt");
  if (!c.adapt) return;
  ORPHEUS_CHECK_INPUT(c.sync == SyncMode::kSv, "--adapt sets the SV co-designs' knobs: it needs --sync sv");
  ORPHEUS_CHECK_INPUT(c.adaptEvery >= 1, "--adapt-every {} must be >= 1", c.adaptEvery);
  // A share of compute: past 100, no exposed communication would ever count as too much.
  ORPHEUS_CHECK_INPUT(c.adaptCommShare > 0.0 && c.adaptCommShare <= 100.0,
                      "--adapt-comm-share {} must be > 0 and at most 100 (a share of the compute time)",
                      c.adaptCommShare);
  ORPHEUS_CHECK_INPUT(c.maxBytesPerClock >= 0.0 && std::isfinite(c.maxBytesPerClock),
                      "--max-bytes-per-clock {} must be >= 0", c.maxBytesPerClock);
  ORPHEUS_CHECK_INPUT(!c.adaptBf16 || c.maxBytesPerClock > 0.0,
                      "--adapt-bf16 lets the controller meet --max-bytes-per-clock with bf16 SVs: give the budget");
  ORPHEUS_CHECK_INPUT(!c.adaptBf16 || !c.overlap,
                      "--adapt-bf16 rounds a clock's batch before it is sent: it takes no --overlap");
  // Under --select-unit step C counts (example, step) pairs: bounded by B*T once the
  // data's steps are known (engine/job/job_data.cc configureModel).
  checkRange(c.adaptSelect, "--adapt-select", 1,
             c.selectUnit == ops::Model::SvgUnit::kStep ? std::numeric_limits<int32_t>::max() : c.batch);
  ORPHEUS_CHECK_INPUT(c.adaptSelect.first < 0 || c.svRank == 0,
                      "--adapt-select bounds C, which --sv-rank replaces: bound its rank with --adapt-rank MIN:MAX");
  ORPHEUS_CHECK_INPUT(c.adaptRank.first < 0 || c.svRank > 0,
                      "--adapt-rank bounds the rank of --sv-rank R: give --sv-rank");
  if (c.svRank > 0) {
    const int64_t most = c.selectUnit == ops::Model::SvgUnit::kStep ? std::numeric_limits<int32_t>::max() : c.batch - 2;
    checkRange(c.adaptRank, "--adapt-rank", 1, std::max<int64_t>(1, most));
    ORPHEUS_CHECK_INPUT(c.adaptRank.first < 0 || (c.svRank >= c.adaptRank.first && c.svRank <= c.adaptRank.second),
                        "--sv-rank {} is the rank to start from: it must lie in --adapt-rank {}:{}", c.svRank,
                        c.adaptRank.first, c.adaptRank.second);
  }
  ORPHEUS_CHECK_INPUT(c.adaptFanout.first < 0 || c.multicast != comm::MulticastKind::kAll,
                      "--adapt-fanout applies to --multicast random, fixed or ring");
  checkRange(c.adaptFanout, "--adapt-fanout", 1, std::max(ranks - 1, 1));
  ORPHEUS_CHECK_INPUT(c.adaptStaleness.first < 0 || c.consistency == Consistency::kSsp,
                      "--adapt-staleness applies to --consistency ssp");
  checkRange(c.adaptStaleness, "--adapt-staleness", 0, 1000000);
  ORPHEUS_CHECK_INPUT(c.adaptAverageEvery.first < 0 || c.averageEvery > 0,
                      "--adapt-average-every needs --average-every R (the period to start from)");
  checkRange(c.adaptAverageEvery, "--adapt-average-every", 1, std::numeric_limits<int64_t>::max() / 4);
}

// --outer-lr and --outer-momentum: DiLoCo's outer step at the averaging barrier.
void validateOuterStep(const TrainConfig& c) {
  ORPHEUS_CHECK_INPUT(c.outerLr >= 0.0 && std::isfinite(c.outerLr), "--outer-lr {} must be a number >= 0",
                      c.outerLr);
  ORPHEUS_CHECK_INPUT(c.outerMomentum >= 0.0 && c.outerMomentum < 1.0, "--outer-momentum {} must be in [0, 1)",
                      c.outerMomentum);
  if (c.outerLr == 0.0 && c.outerMomentum == 0.0) return;
  ORPHEUS_CHECK_INPUT(c.outerLr > 0.0, "--outer-momentum needs --outer-lr L > 0 (the outer step it accelerates)");
  ORPHEUS_CHECK_INPUT(c.averageEvery > 0,
                      "--outer-lr and --outer-momentum step at the averaging barrier: they need --average-every R");
}

// --balance and its knobs; the data format's part (token streams) is checked where
// the data is read.
void validateBalance(const TrainConfig& c) {
  ORPHEUS_CHECK_INPUT(c.chunkRows >= 1, "--chunk-rows {} must be >= 1", c.chunkRows);
  ORPHEUS_CHECK_INPUT(c.balanceEvery >= 1, "--balance-every {} must be >= 1", c.balanceEvery);
  ORPHEUS_CHECK_INPUT(c.balance || (c.balanceEvery == 20 && c.chunkRows == 256),
                      "--balance-every and --chunk-rows apply to --balance");
  if (!c.balance) return;
  ORPHEUS_CHECK_INPUT(c.consistency == Consistency::kBsp,
                      "--balance sizes every rank's minibatch within one BSP clock: it needs --consistency bsp");
  ORPHEUS_CHECK_INPUT(!c.elastic,
                      "--balance keeps chunk ownership for the ranks the job started on: it cannot --resume --elastic");
}

// --sync powersgd: replicas kept equal by one all-reduced update a clock (BSP), with
// error feedback no checkpoint holds.
void validatePowerSgd(const TrainConfig& c) {
  ORPHEUS_CHECK_INPUT(c.svRank >= 1, "--sync powersgd needs --sv-rank R >= 1, the rank of its factors");
  ORPHEUS_CHECK_INPUT(c.select == 0 && c.multicast == comm::MulticastKind::kAll &&
                          c.consistency == Consistency::kBsp && c.dropLinks == 0.0 && !c.overlap,
                      "--sync powersgd all-reduces its factors every clock (BSP): it takes no --select, --multicast, "
                      "--consistency ssp, --drop-links or --overlap");
  ORPHEUS_CHECK_INPUT(!c.ckptSv && !c.ckptMatrix && !c.resume,
                      "--sync powersgd keeps each rank's error feedback in no checkpoint: it takes no --ckpt or "
                      "--resume");
}

}  // namespace

int64_t svgsPerClock(const TrainConfig& c, int64_t steps) {
  return c.selectUnit == ops::Model::SvgUnit::kStep ? c.batch * std::max<int64_t>(steps, 1) : c.batch;
}

void validate(const TrainConfig& c, int ranks) {
  validateOptimizer(c);
  // With --select-unit step a batch has B * T SVGs; T is the model's, known later.
  ORPHEUS_CHECK_INPUT(c.select >= 0 && (c.select <= c.batch || c.selectUnit == ops::Model::SvgUnit::kStep),
                      "--select {} must be between 1 and the batch size --batch {} (0 sends every SVG)", c.select,
                      c.batch);
  if (c.multicast != comm::MulticastKind::kAll) {
    ORPHEUS_CHECK_INPUT(c.fanout >= 1, "--multicast {} needs --fanout Q >= 1", comm::multicastName(c.multicast));
  }
  // A flag that would do nothing in this mode is a mistake worth a line, not silence.
  ORPHEUS_CHECK_INPUT(c.fanout == 0 || c.multicast != comm::MulticastKind::kAll,
                      "--fanout {} applies to --multicast random, fixed or ring; --multicast all sends to every peer",
                      c.fanout);
  ORPHEUS_CHECK_INPUT(c.staleness == 0 || c.consistency == Consistency::kSsp,
                      "--staleness {} applies to --consistency ssp; under bsp no worker runs ahead", c.staleness);
  ORPHEUS_CHECK_INPUT(c.delayRank < ranks, "--inject-delay {}:{} names rank {}, but the job has ranks 0..{}",
                      c.delayRank, c.delayMs, c.delayRank, ranks - 1);
  ORPHEUS_CHECK_INPUT(c.fanout >= 0 && (ranks == 1 || c.fanout <= ranks - 1),
                      "--fanout {} needs at most P-1 = {} peers (P = {} ranks)", c.fanout, ranks - 1, ranks);
  ORPHEUS_CHECK_INPUT(c.targetAccuracy >= 0.0 && c.targetAccuracy <= 1.0, "--target-accuracy {} must be in [0, 1]",
                      c.targetAccuracy);
  ORPHEUS_CHECK_INPUT(c.targetAccuracy == 0.0 || (!c.test.empty() && c.evalEvery > 0),
                      "--target-accuracy needs --test and --eval-every N > 0");
  ORPHEUS_CHECK_INPUT(c.staleness >= 0, "--staleness {} must be >= 0", c.staleness);
  ORPHEUS_CHECK_INPUT(c.dropLinks >= 0.0 && c.dropLinks < 1.0, "--drop-links {} must be in [0, 1)", c.dropLinks);
  ORPHEUS_CHECK_INPUT(c.failProb >= 0.0 && c.failProb < 1.0, "--fail-prob {} must be in [0, 1)", c.failProb);
  ORPHEUS_CHECK_INPUT(c.failProb == 0.0 || c.ckptSv || c.ckptMatrix,
                      "--fail-prob needs a checkpoint to recover from (--ckpt sv or --ckpt matrix with --ckpt-dir)");
  ORPHEUS_CHECK_INPUT(!(c.resume && c.ckptMatrix),
                      "--resume continues an SV log (--ckpt sv): a --ckpt matrix checkpoint cannot be resumed");
  ORPHEUS_CHECK_INPUT(!(c.resume && c.ckptNone),
                      "--ckpt none and --resume contradict each other: --resume continues the SV log in --ckpt-dir");
  ORPHEUS_CHECK_INPUT(!(c.ckptSv && c.ckptMatrix), "--ckpt takes one of sv, matrix");
  ORPHEUS_CHECK_INPUT(!c.ckptMatrix || !c.ckptDir.empty(), "--ckpt matrix needs --ckpt-dir DIR");
  ORPHEUS_CHECK_INPUT(c.ckptSv || (c.ckptFormat == 3 && !c.ckptWriterIdle && c.snapshotEvery == 1),
                      "--ckpt-format, --ckpt-writer-idle and --snapshot-every shape the SV log: they need --ckpt sv");
  ORPHEUS_CHECK_INPUT(c.ckptMatrix || c.ckptEvery == 100, "--ckpt-every {} applies to --ckpt matrix", c.ckptEvery);
  ORPHEUS_CHECK_INPUT(c.snapshotEvery == 1 || c.averageEvery > 0,
                      "--snapshot-every {} counts averaging barriers: it needs --average-every R", c.snapshotEvery);
  // A failed replica comes back at the clock its log on disk reaches, which a replay
  // reaches only through averagings that kept a snapshot: after a barrier without one
  // the recovery would fail mid-run.
  ORPHEUS_CHECK_INPUT(c.failProb == 0.0 || c.snapshotEvery == 1,
                      "--fail-prob recovers a replica to the clock its log reaches, which needs a snapshot at every "
                      "averaging barrier, and --snapshot-every {} keeps one at one barrier in {} (give --snapshot-every 1)",
                      c.snapshotEvery, c.snapshotEvery);
  // A checkpoint directory with nothing to write to it would leave the job without one, unsaid.
  ORPHEUS_CHECK_INPUT(c.ckptDir.empty() || c.ckptSv || c.ckptMatrix || c.resume,
                      "--ckpt-dir '{}' is written with --ckpt sv or --ckpt matrix, and read with --resume: without "
                      "one of them the job keeps no checkpoint",
                      c.ckptDir);
  ORPHEUS_CHECK_INPUT(!c.overwrite || c.ckptSv || c.ckptMatrix,
                      "--overwrite replaces the job in --ckpt-dir: it needs --ckpt sv or --ckpt matrix");
  validateAdapt(c, ranks);
  validateOuterStep(c);
  validateBalance(c);
  if (c.svRank > 0 && c.sync != SyncMode::kPowerSgd) {
    ORPHEUS_CHECK_INPUT(c.sync == SyncMode::kSv && !c.overlap,
                        "--sv-rank compresses a clock's whole batch after the backward pass: it needs --sync sv "
                        "and no --overlap");
    ORPHEUS_CHECK_INPUT(c.select == 0,
                        "--sv-rank sends each matrix's whole update at rank R with error feedback: it replaces "
                        "--select (give one of them)");
    // That R + 1 SVGs are fewer than a clock's columns is checked against the model
    // (engine/job/job_data.cc configureModel): a sequence model's are B*T.
  }
  if (c.svDtype != SvDtype::kF32) {
    ORPHEUS_CHECK_INPUT(c.sync == SyncMode::kSv && !c.overlap,
                        "--sv-dtype {} rounds a clock's batch before it is sent: it needs --sync sv and no --overlap",
                        svDtypeName(c.svDtype));
  }
  if (isQuasiNewton(c.optimizer)) {
    ORPHEUS_CHECK_INPUT(c.select == 0 && c.multicast == comm::MulticastKind::kAll &&
                            c.consistency == Consistency::kBsp && c.dropLinks == 0.0 && !c.adapt,
                        "--optimizer {} needs the same curvature pair (s, y) on every replica, so every replica must "
                        "rebuild the same gradient: it takes no --select, --multicast, --consistency ssp, --drop-links "
                        "or --adapt",
                        toString(c.optimizer));
  }
  if (c.sync == SyncMode::kDense) {
    ORPHEUS_CHECK_INPUT(c.select == 0 && c.multicast == comm::MulticastKind::kAll && c.consistency == Consistency::kBsp &&
                            c.dropLinks == 0.0,
                        "--sync dense allreduces whole gradients: it takes no --select, --multicast, --consistency "
                        "ssp or --drop-links");
  }
  if (c.sync == SyncMode::kPowerSgd) validatePowerSgd(c);
}

}  // namespace orpheus::engine
