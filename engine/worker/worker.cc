#include "engine/worker/worker.h"
#include "engine/worker/device_replica.h"

#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "engine/data/sampler.h"
#include "engine/worker/overlap.h"
#include "engine/worker/part_options.h"
#include "engine/failures.h"
#include "engine/membership/live.h"
#include "engine/metrics/progress.h"
#include "engine/worker/select.h"
#include "ops/rebuild.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

namespace orpheus::engine {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::chrono::milliseconds timeoutOf(const TrainConfig& config) {
  return std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000));
}

}  // namespace

// A clock whose batches every rank gets, applied in the same clock, is a broadcast
// under BSP whatever the schedule is called: random, fixed or ring multicast with
// Q = P - 1, or SSP with staleness 0. It goes through the allgather, which moves the
// same bytes in one collective call (no rank stalls a transfer while it computes).
// Knobs change only at a barrier where every batch sent so far is applied, so a job
// may move between the two paths there.
bool sendsPointToPoint(const TrainConfig& config, const comm::MulticastSchedule& schedule, const adapt::Knobs& knobs) {
  if (config.sync != SyncMode::kSv) return false;
  const bool everyPeer = schedule.fanout() == schedule.ranks() - 1;
  const bool inClock = config.consistency == Consistency::kBsp || knobs.staleness == 0;
  return !everyPeer || !inClock || config.dropLinks > 0.0;
}

namespace {

// Whether a rank of this job carries state beyond its replica (Worker::rankState).
bool carriesState(const TrainConfig& config, const ops::Model& model) {
  return model.carriesState() || (config.sync == SyncMode::kSv && config.svRank > 0);
}

}  // namespace

Worker::Worker(const TrainConfig& config, const ops::Model& model, ops::Backend& backend,
               comm::Transport& transport, const data::Dataset& train, const data::Dataset* test)
    : config_(config),
      model_(model),
      transport_(transport),
      train_(train),
      test_(test),
      replica_(model.initParams(config.seed)),
      replicaId_(transport.rank()),
      schedule_(scheduleConfig(config, transport.size())),
      adapt_(controllerOptions(config, train.steps), transport, model.paramShapes(), schedule_.fanout()),
      knobs_(adapt_.initial().knobs),
      log_(makeClockLog(config, transport, replicaId_, knobs_, model,
                        carriesState(config, model) ? [this] { return rankState(); } : std::function<ParamSet()>())),
      inbox_(consistencyOptions(config), schedule_, transport, model.paramShapes(), log_->keepsRecords()),
      coordinator_(coordinatorOptions(config), transport, knobs_),
      recovery_(recoveryOptions(config), model, transport),
      // Every update is a mean over the examples a replica hears about in a clock: its
      // own B and the B of each of the Q peers that send to it (Q = P - 1 for broadcast
      // and dense sync), so --lr means the same step whatever the fanout.
      heard_(static_cast<double>(config.batch) * (schedule_.fanout() + 1)),
      updater_(optimizerSettings(config), model, backend),
      transfer_(backend, config.transfer),
      feed_(balanceOptions(config), transport, train),
      broadcast_(transport, model.paramShapes(), *log_),
      multicast_(config.consistency, schedule_, transport, inbox_, updater_, replica_, *log_) {
  // Used on the clocks that go through the broadcast.
  if (const OverlapOptions overlap = overlapOptions(config); OverlappedExchange::serves(overlap, model)) {
    overlapped_ = std::make_unique<OverlappedExchange>(overlap, model, transport, *log_);
  }
  if (config.sync == SyncMode::kPowerSgd) {
    powerSgd_.emplace(backend, config.svRank, config.seed);
  } else if (config.svRank > 0) {
    lowRank_.emplace(backend, config.svRank, config.seed + static_cast<uint64_t>(transport_.rank()), config.svDtype);
  }
  applyKnobs(knobs_);
  coordinator_.startFrom(replica_);  // W0 is the same on every rank (the seed's)
  if (deviceResidency(config, model, backend).empty()) {
    updater_.reside(replica_, config.transfer == TransferMode::kStaged);
  }
}

// The model's device state goes before the backend it came from (the job's, which outlives the worker).
Worker::~Worker() { model_.releaseDevice(); }

std::string deviceResidency(const TrainConfig& config, const ops::Model& model, const ops::Backend& backend) {
  if (std::string why = residencyRefusal(model, backend); !why.empty()) return why;
  if (!config.resident) return "--resident off";
  return "";
}

void Worker::applyKnobs(const adapt::Knobs& knobs) {
  knobs_ = knobs;
  comm::ScheduleConfig sc = scheduleConfig(config_, transport_.size());
  // One rank has no peer to draw (its schedule's fanout is 0): the knob moves nothing.
  if (sc.kind != comm::MulticastKind::kAll && sc.ranks > 1) sc.fanout = static_cast<int>(knobs.fanout);
  schedule_ = comm::MulticastSchedule(sc);
  heard_ = static_cast<double>(config_.batch) * (schedule_.fanout() + 1);
  if (lowRank_) {
    lowRank_->setDtype(knobs.bf16 ? SvDtype::kBf16 : SvDtype::kF32);
    if (knobs.rank > 0) lowRank_->setRank(knobs.rank);
  }
  pointToPoint_ = sendsPointToPoint(config_, schedule_, knobs_);
  // Every clock up to here is complete; later ones may have been judged complete
  // under the old schedule (no sender for this rank): judge them again.
  inbox_.resumeAt(clock_);
}

void Worker::adaptAfter(uint64_t clock, const ClockStats& stats, uint64_t coordinationBytes, const Coordination& done,
                        double clockSeconds) {
  const std::shared_ptr<const SvBatch> measured = std::exchange(measuredBatch_, nullptr);
  if (!adapt_.enabled()) return;
  adapt::ClockSample sample;
  sample.clockSeconds = clockSeconds;
  sample.selectSeconds = stats.selectSeconds;
  // After the clock's own timing was taken, so that measuring shows in none of it.
  if (measured != nullptr) adapt_.measure(clock, *measured, knobs_, sample);
  // Under --sv-rank the clock's own power iteration measured e(r): nothing to redo.
  if (lowRank_ && adapt_.measuresAt(clock)) {
    const std::array<int64_t, 3> counts = adapt_.errorCountsFor(knobs_);
    adapt_.measured(lowRank_->errorsAt(counts), 0.0, sample);
  }
  sample.computeSeconds = stats.computeSeconds;
  sample.commSeconds = stats.commSeconds;
  sample.waitSeconds = stats.waitSeconds;
  sample.svBytes = static_cast<double>(stats.bytesSent);
  sample.coordinationBytes = static_cast<double>(coordinationBytes);
  sample.averaged = done.averaged;
  sample.divergence = done.divergenceMax;
  adapt_.observe(clock, sample);
  if (!adapt_.decidesAfter(clock)) return;
  // coordinate() made this clock a barrier: nothing newer is under way anywhere.
  const adapt::Decision decision = adapt_.decide(clock, knobs_);
  if (decision.knobs == knobs_) return;
  const auto record = adapt::encodeKnobs(decision.knobs);
  log_->knobs(clock, record);
  applyKnobs(decision.knobs);
}

SvBatchHeader Worker::header(uint64_t clock) const {
  SvBatchHeader h;
  h.sender = static_cast<uint32_t>(transport_.rank());
  h.replica = static_cast<uint32_t>(replicaId_);
  h.clock = clock;
  h.epoch = epoch_;
  h.jobId = config_.seed;
  return h;
}

std::string divergenceHint(const TrainConfig& config, uint64_t clock) {
  const std::string decay = config.weightDecay > 0.0 ? fmt::format(" or --weight-decay {}", config.weightDecay) : "";
  if (clock <= 1) {
    return fmt::format("at the first clock: check the model's init and loss, e.g. a log of a value that may be <= 0; "
                       "then lower --lr{}", decay);
  }
  return fmt::format("lower --lr{}", decay);
}

Diverged::Diverged(uint64_t clock, int rank, const std::string& hint)
    : InputError(fmt::format("training diverged at clock {} on rank {}: the loss is not finite ({})", clock, rank,
                             hint)),
      clock_(clock),
      hint_(hint) {}

ClockStats Worker::runClock(uint64_t clock, const data::Batch& batch) {
  NullMetricsSink none;
  return runClock(clock, batch, none);
}

ClockStats Worker::runClock(uint64_t clock, const data::Batch& batch, MetricsSink& metrics) {
  ClockStats stats;
  notePhase(ClockPhase::kStarted, clock);
  const comm::TrafficCounters before = transport_.counters();
  if (const int64_t delayMs = injectedDelayMs(feed_.options(), transport_.rank(), batch.size()); delayMs > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
  }
  if (pointToPoint_) {
    multicast_.takeIn(clock, metrics);
    // SSP: start clock t only once every batch addressed here from clocks <= t-s-1 is in.
    const auto staleness = static_cast<uint64_t>(knobs_.staleness);
    if (config_.consistency == Consistency::kSsp && clock > staleness + 1) {
      stats.waitSeconds += multicast_.waitComplete(clock - staleness - 1, clock, clock, metrics);
    }
    const uint64_t complete = std::min(inbox_.completeThrough(), clock - 1);
    stats.clockGap = static_cast<int64_t>(clock - 1) - static_cast<int64_t>(complete);
  }
  if (config_.sync == SyncMode::kSv) {
    svClock(clock, view(batch), stats, metrics);
  } else {
    denseClock(clock, view(batch), stats);
  }
  if (!std::isfinite(stats.loss)) {
    throw Diverged(clock, transport_.rank(), divergenceHint(config_, clock));
  }
  stats.bytesSent = transport_.counters().bytesSent - before.bytesSent;
  stats.messages = transport_.counters().messages - before.messages;
  clock_ = clock;
  return stats;
}

// Algorithm 1: one clock of --sync sv. The exchange (engine/worker/exchange.h) is how
// S and T travel under this clock's knobs: broadcast, overlapped or multicast.
void Worker::svClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats, MetricsSink& metrics) {
  const auto start = Clock::now();
  ClockExchange& exchange = exchangeNow();
  // S: compute_svg(W, x) for each x of the minibatch.
  const std::shared_ptr<SvBatch> local = computeSvgs(clock, examples, exchange, start, stats);
  if (local == nullptr) return;  // the loss is not finite: runClock reports it
  if (adapt_.measuresAt(clock) && !lowRank_) measuredBatch_ = local;
  // The C SVGs of S worth sending (all of S when selection is off).
  std::optional<SvBatch> selected = selectToSend(clock, *local, stats);
  const std::shared_ptr<SvBatch> sent = selected ? std::make_shared<SvBatch>(std::move(*selected)) : local;
  // bf16 (--sv-dtype, or --adapt-bf16 under a budget): what is sent is rounded first, so receivers get exactly what
  // it holds (S itself when it is all sent: then this replica applies it rounded too).
  if (knobs_.bf16 && sent->dtype != SvDtype::kBf16) {
    roundToBf16(*sent);
    if (sent == local) updater_.keepLocalOnDevice({});  // S rounded: no longer the device's values
  }
  // Send S to this clock's receivers.
  exchange.send(clock, sent, stats);
  stats.computeSeconds = secondsSince(start) - exchange.sendSeconds();
  notePhase(ClockPhase::kExchange, clock);
  // Receive T, the SVG sets addressed here (rebuilt as they arrive where the exchange overlaps).
  const auto apply = [&](std::span<const SvBatchView* const> group) { updater_.applyGroup(clock, group, replica_); };
  // With --sv-rank this replica applies what it sends, not S.
  ClockGroup group = exchange.receive(clock, lowRank_ ? sent : local, apply, stats, metrics);
  notePhase(ClockPhase::kRebuild, clock);
  // W += compute_update(s) for each s in S ∪ T, rebuilt together.
  rebuild(clock, group, stats);
  // The batches applied, to the checkpoint log.
  log_->appendGroup(clock, std::move(group.records));
}

ClockExchange& Worker::exchangeNow() {
  if (pointToPoint_) return multicast_;
  if (overlapped_) return *overlapped_;
  return broadcast_;
}

// The backward pass's batch, scaled; its sites handed to the exchange as they
// become final where it streams. Null when the loss is not finite.
std::shared_ptr<SvBatch> Worker::computeSvgs(uint64_t clock, const ops::ExampleBatch& examples,
                                             ClockExchange& exchange, Clock::time_point start, ClockStats& stats) {
  const float scale = updater_.coefficientScale(clock, heard_);
  // Shared: the sends and the checkpoint log keep the batch as it is once applied.
  auto local = std::make_shared<SvBatch>();
  exchange.begin(clock, header(clock), scale, start, local);
  const bool selects = knobs_.select > 0 && knobs_.select < examples.size();
  if (updater_.resident()) {
    // The pass runs where the replica lives; its sites come to the host as
    // --transfer says, and a streaming exchange gets each as soon as it is there.
    // --sv-rank reads U and V on the device, and so does the rebuild of a job of
    // one rank that neither selects, rounds nor logs its SVs (no one else reads
    // them): only what they cannot read there crosses.
    const bool streams = exchange.streams(selects);
    const bool alone = transport_.size() == 1 && !selects && !streams && !knobs_.bf16 && !config_.adapt &&
                       !config_.ckptSv;
    transfer_.computeSvg(
        model_, updater_.deviceParams(replica_), examples, &stats.loss, *local,
        [&](size_t i) {
          if (streams && std::isfinite(stats.loss)) exchange.siteReady(i, local->matrices[i]);
        },
        !lowRank_ && !alone);
    if (lowRank_) {
      rankOperands_ = landUnkept(*local);
    } else if (alone) {
      landUnkept(*local);
    }
  } else if (exchange.streams(selects)) {
    bool finite = true;
    // The batch the backward pass builds is moved in here, arrays and all: the
    // sites sent from inside the pass keep it alive until their sends complete.
    *local = model_.computeSvgStreamed(replica_, examples, &stats.loss, [&](size_t site, const SvMatrix& m) {
      // Nothing leaves a rank whose loss is not finite.
      finite = finite && std::isfinite(stats.loss);
      if (finite) exchange.siteReady(site, m);
    });
  } else {
    *local = model_.computeSvg(replica_, examples, &stats.loss);
  }
  if (!std::isfinite(stats.loss)) return nullptr;
  ops::scaleCoefficients(*local, scale);
  local->header = header(clock);
  if (updater_.resident()) keepOnDevice(*local);
  return local;
}

// The local batch's U and V stay where the pass made them for this clock's rebuild:
// only the other batches' cross to the device (the replica applies all of S, also
// when selection sends fewer).
void Worker::keepOnDevice(const SvBatch& local) { updater_.keepLocalOnDevice(localOnDevice(local)); }

// The device pass's U and V of `local`, each named by its host U; none when the
// pass's sites are not the batch's matrices one for one.
std::vector<ops::DeviceSvs> Worker::localOnDevice(const SvBatch& local) const {
  std::vector<ops::DeviceSvs> svs = model_.lastDeviceSvs();
  if (svs.size() != local.matrices.size()) svs.clear();
  for (size_t i = 0; i < svs.size(); ++i) svs[i].hostU = local.matrices[i].u.data();
  return svs;
}

// Resident, when the transfer left every matrix's arrays unset (--sv-rank, or one
// rank alone): the batch's U and V where the backward pass left them, for the power
// iteration and the rebuild to read there. A matrix they would read on the host is
// copied to the batch now instead: one not kept on the device whole, or (the
// rebuild weighs those columns on the host) with a core or coefficients that differ.
std::vector<ops::DeviceSvs> Worker::landUnkept(SvBatch& local) {
  std::vector<ops::DeviceSvs> svs = model_.lastDeviceSvs();
  if (svs.size() != local.matrices.size()) svs.clear();
  const bool uniform = ops::oneCoefficient(local.coeffs.data(), local.coeffs.size());
  for (size_t i = 0; i < local.matrices.size(); ++i) {
    const SvMatrix& m = local.matrices[i];
    const bool kept = !svs.empty() && svs[i].u != nullptr && (m.sparseV || svs[i].vDense != nullptr);
    if (!kept || !uniform || m.core.size() > 0) transfer_.land(i, local.matrices[i]);
  }
  return svs;
}

// What leaves this rank: the C SVGs selection keeps, all of S (none returned) when
// selection is off, or with --sv-rank S at rank R, which this replica applies too.
std::optional<SvBatch> Worker::selectToSend(uint64_t clock, const SvBatch& local, ClockStats& stats) {
  const auto t = Clock::now();
  std::optional<SvBatch> sent;
  if (lowRank_) {
    sent = lowRank_->compress(local, rankOperands_);
    rankOperands_.clear();
    // Error feedback accumulates what was not sent: a run that diverges (or a resumed
    // residual out of range) overflows it before the loss shows it.
    for (const SvMatrix& m : sent->matrices) {
      ORPHEUS_CHECK_INPUT(m.u.allFinite() && m.vDense.allFinite(),
                          "training diverged at clock {} on rank {}: --sv-rank's error-feedback residual of "
                          "parameter {} is no longer finite (lower --lr)",
                          clock, transport_.rank(), m.paramId);
    }
    stats.rankError = lowRank_->lastError();
  } else {
    // jmcss-gram forms its Gram matrices on the job's backend, from U and V where
    // a resident pass left them.
    std::vector<ops::DeviceSvs> svs;
    GramSource source{&backend(), {}, &gramOperand_, &grams_};
    if (config_.selectMethod == SelectionMethod::kJmcssGram && updater_.resident()) {
      svs = localOnDevice(local);
      source.onDevice = svs;
    }
    sent = selectForPeers(local, knobs_.select, config_.selectMethod, config_.seed, clock, transport_.rank(), source);
  }
  if (sent) stats.selectSeconds = secondsSince(t);
  return sent;
}

void Worker::rebuild(uint64_t clock, const ClockGroup& group, ClockStats& stats) {
  const auto t = Clock::now();
  std::vector<const SvBatchView*> batches;
  batches.reserve(group.batches.size());
  for (const SvBatchView& b : group.batches) batches.push_back(&b);
  // Under BSP this group is all the clock applies: its step is taken with it. Under
  // SSP batches of this local clock may still come (the coordinator's barrier,
  // the final drain); the step waits for them (ReplicaUpdater).
  if (config_.consistency != Consistency::kSsp) {
    updater_.applyLastGroup(clock, batches, replica_);
  } else if (!batches.empty()) {
    updater_.applyGroup(clock, batches, replica_);
  }
  updater_.keepLocalOnDevice({});  // the next device pass overwrites them
  stats.updateSeconds += secondsSince(t);
}

// The clock's summed gradient is in: the exchange and rebuild phases end, and its step is taken.
template <class Gradient>
void Worker::stepDense(uint64_t clock, Gradient& gradient, ClockStats& stats) {
  notePhase(ClockPhase::kExchange, clock);
  notePhase(ClockPhase::kRebuild, clock);
  const auto t = Clock::now();
  updater_.applyDense(clock, gradient, updater_.coefficientScale(clock, heard_), replica_);
  stats.updateSeconds = secondsSince(t);
}

void Worker::denseClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats) {
  if (updater_.resident() && powerSgd_) {
    // The gradient, E and the factors' products stay on the device; the factors
    // cross to the host for their all-reduces.
    auto t = Clock::now();
    residentDenseGradient(examples, stats, false);
    stats.computeSeconds = secondsSince(t);
    t = Clock::now();
    powerSgd_->reduce(deviceGradient_, transport_, clock);
    stats.commSeconds = secondsSince(t);
    stats.exchangeSeconds = stats.commSeconds;
    stepDense(clock, deviceGradient_, stats);
    return;
  }
  if (updater_.resident()) {
    if (transport_.size() > 1) {
      residentDenseExchange(clock, examples, stats);
      return;
    }
    // One rank: nothing to all-reduce, so the gradient stays where it was computed.
    const auto t = Clock::now();
    residentDenseGradient(examples, stats, false);
    stats.computeSeconds = secondsSince(t);
    stepDense(clock, deviceGradient_, stats);
    return;
  }
  if (config_.overlap && !model_.svSites().empty()) {
    // Each layer's all-reduce begun as soon as its gradient exists (engine/worker/exchange.h).
    const auto start = Clock::now();
    OverlapTimes times;
    double exposed = 0.0;
    ParamSet grad =
        overlappedDenseGradient(model_, replica_, examples, &stats.loss, transport_, clock, start, times, exposed,
                                updater_.backend(), gradientBuffers_);
    stats.commSeconds = exposed + times.sendSeconds;
    stats.computeSeconds = secondsSince(start) - stats.commSeconds;
    stats.exchangeSeconds = std::max(0.0, times.lastArrival - std::max(0.0, times.firstSend));
    stats.firstSendAt = times.firstSend;
    stats.backwardEndAt = times.backwardEnd;
    stepDense(clock, grad, stats);
    return;
  }
  auto t = Clock::now();
  ParamSet grad = updater_.resident() ? residentDenseGradient(examples, stats)
                                      : model_.denseGradient(replica_, examples, &stats.loss, updater_.backend(),
                                                             gradientBuffers_);
  stats.computeSeconds = secondsSince(t);
  notePhase(ClockPhase::kExchange, clock);

  t = Clock::now();
  if (powerSgd_) {
    powerSgd_->reduce(grad, transport_, clock);
  } else {
    for (auto& p : grad.params) transport_.allreduceSum({p.value.data(), static_cast<size_t>(p.value.size())}, clock);
  }
  stats.commSeconds = secondsSince(t);
  stats.exchangeSeconds = stats.commSeconds;
  notePhase(ClockPhase::kRebuild, clock);

  t = Clock::now();
  updater_.applyDense(clock, grad, updater_.coefficientScale(clock, heard_), replica_);
  stats.updateSeconds = secondsSince(t);
}

// --sync dense, resident: the gradient computed where the replica lives, each
// parameter's copied to page-locked host memory on the copy queue and all-reduced
// there, the sums copied back on the copy queue for the step. With --overlap, last parameter first
// (as the backward pass finishes them), each all-reduce begun as its copy lands
// while the later ones are still on their way; without, in parameter order, each
// all-reduce complete before the next (the host path's order).
void Worker::residentDenseExchange(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats) {
  const auto start = Clock::now();
  ops::Backend& backend = updater_.backend();
  const bool overlap = config_.overlap;
  residentDenseGradient(examples, stats, false);
  stats.backwardEndAt = overlap ? secondsSince(start) : -1.0;
  const size_t n = deviceGradient_.size();
  size_t bytes = 0;
  for (const ops::Tensor& g : deviceGradient_) bytes += static_cast<size_t>(g.size()) * sizeof(float);
  gradientStaging_.begin(backend, bytes);
  std::vector<size_t> offset;
  for (const ops::Tensor& g : deviceGradient_) offset.push_back(gradientStaging_.reserveFloats(g.size()));
  const auto param = [&](size_t i) { return overlap ? n - 1 - i : i; };  // the i-th handed to the network
  std::vector<ops::Event> landedOnHost(n);
  for (size_t i = 0; i < n; ++i) {
    landedOnHost[param(i)] = gradientStaging_.down(deviceGradient_[param(i)], offset[param(i)]);
  }
  const auto floatsOf = [&](size_t k) {
    return std::span<float>(gradientStaging_.floats(offset[k]), static_cast<size_t>(deviceGradient_[k].size()));
  };
  double sendSeconds = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const size_t k = param(i);
    backend.wait(landedOnHost[k]);
    const auto t = Clock::now();
    if (overlap) {
      if (stats.firstSendAt < 0) stats.firstSendAt = secondsSince(start);
      transport_.beginAllreduceSum(floatsOf(k), clock);
      transport_.progressAllreduces();
    } else {
      transport_.allreduceSum(floatsOf(k), clock);
    }
    sendSeconds += secondsSince(t);
  }
  const auto t = Clock::now();
  if (overlap) transport_.finishAllreduces();
  const double lastArrival = secondsSince(start);
  stats.commSeconds = secondsSince(t) + sendSeconds;
  stats.computeSeconds = secondsSince(start) - stats.commSeconds;
  stats.exchangeSeconds = overlap ? std::max(0.0, lastArrival - std::max(0.0, stats.firstSendAt)) : stats.commSeconds;
  // The sums go back from where they lie, on the copy queue: the step waits for
  // them on the device, the host does not.
  const auto back = Clock::now();
  ops::Event landed;
  for (size_t k = 0; k < deviceGradient_.size(); ++k) {
    landed = gradientStaging_.up(offset[k], deviceGradient_[k]);
  }
  backend.waitOnDevice(landed);
  stats.commSeconds += secondsSince(back);
  stepDense(clock, deviceGradient_, stats);
}

// The dense gradient computed where the replica lives (deviceGradient_), and copied
// to the host for the all-reduce (the host collective) unless `toHost` is false.
ParamSet Worker::residentDenseGradient(const ops::ExampleBatch& examples, ClockStats& stats, bool toHost) {
  ops::Backend& backend = updater_.backend();
  if (deviceGradient_.empty()) {
    for (const Param& p : replica_.params) deviceGradient_.push_back(backend.allocate(p.value.rows(), p.value.cols()));
  }
  model_.denseGradientOnDevice(updater_.deviceParams(replica_), examples, &stats.loss, backend, deviceGradient_);
  if (!toHost) return {};
  ParamSet grad = model_.zeroParams();
  for (size_t i = 0; i < grad.size(); ++i) {
    ops::Tensor host = ops::Tensor::host(grad[i].data(), grad[i].rows(), grad[i].cols());
    backend.copy(deviceGradient_[i], host);
  }
  return grad;
}

void Worker::drain(uint64_t lastClock) {
  NullMetricsSink none;
  drain(lastClock, none);
}

void Worker::drain(uint64_t lastClock, MetricsSink& metrics) {
  if (pointToPoint_) {
    multicast_.waitComplete(lastClock, lastClock, clock_ + 1, metrics);
    transport_.flushSends();
  }
  if (overlapped_) transport_.flushSends();
  // Nothing more of `lastClock` can come: its optimizer step.
  updater_.finishClock(replica_);
}

Worker::Coordination Worker::coordinate(uint64_t clock) {
  NullMetricsSink none;
  return coordinate(clock, none);
}

Worker::Coordination Worker::coordinate(uint64_t clock, MetricsSink& metrics) {
  Coordination done;
  if (!coordinator_.barrierAfter(clock) && !adapt_.decidesAfter(clock)) return done;
  // A consistent cut: every batch of every clock <= `clock` is applied everywhere.
  // Nobody has sent anything newer, since every rank stops here after `clock`.
  if (pointToPoint_) multicast_.waitComplete(clock, clock, clock_ + 1, metrics);
  // Every group of this clock is in: its optimizer step, before the state moves.
  updater_.finishClock(replica_);
  Optimizer& optimizer = updater_.optimizer();
  if (coordinator_.averagesAfter(clock)) {
    updater_.toHost(replica_);  // averaged on the host, around the collective
    done = coordinator_.average(replica_, optimizer, clock);
    updater_.hostChanged();
    // Every replica is the average: a snapshot point, with the optimizer state.
    if (optimizer.hasState() || coordinator_.outerStep().active()) {
      log_->averaged(clock, snapshotOfReplica());
    } else {
      log_->averaged(clock, replica_);
    }
  }
  if (coordinator_.rotatesAfter(clock)) {
    // The log moves with the replica: the next holder continues it.
    log_->handOff(clock);
    updater_.toHost(replica_);
    coordinator_.rotate(replica_, optimizer, replicaId_, clock);
    updater_.hostChanged();
    log_->takeOver(clock, replicaId_);
    done.rotated = true;
  }
  return done;
}

const ParamSet& Worker::run(MetricsWriter& metrics) {
  const bool leader = transport_.rank() == 0;
  ProgressLine progress(leader ? config_.progress : "off", static_cast<uint64_t>(config_.clocks));
  // A resumed job continues at clock_ + 1.
  MetricsAggregator aggregator(transport_.size(), metrics, progress, model_.hasAccuracy(), clock_ + 1,
                               static_cast<uint64_t>(config_.clocks));
  if (model_.reportsPerplexity()) aggregator.reportPerplexity();
  MetricsCollector collector(transport_, aggregator);
  MetricsReporter reporter(transport_);
  MetricsSink& sink = leader ? static_cast<MetricsSink&>(collector) : reporter;
  adapt_.reportTo(leader ? &aggregator : nullptr);
  feed_.reportTo(leader ? &aggregator : nullptr);
  feed_.recordTo(log_.get());
  try {
    const ParamSet& replica = runClocks(metrics, sink, aggregator);
    progress.finish();
    return replica;
  } catch (const JobFailed&) {
    // Every rank stops here together, the problem reported once: finish the traffic
    // already under way so the processes end cleanly, and write no more checkpoint.
    try {
      drain(clock_);
    } catch (const std::exception&) {
      // Stopping anyway.
    }
    log_->abandon();
    throw;
  }
}

const ParamSet& Worker::runClocks(MetricsWriter& metrics, MetricsSink& sink, const MetricsAggregator& aggregator) {
  const uint64_t first = clock_ + 1;
  feed_.start(first);  // where the resumed job left the sampler (and the chunks)
  // The starting point, so a run's progress can be read as a ratio.
  const EvalResult initialEval = test_ != nullptr ? evaluate() : EvalResult{};

  Tally tally;
  tally.trainSeconds = trainSeconds_;  // the earlier membership epochs' (continueRun)
  tally.last = static_cast<uint64_t>(config_.clocks);
  for (uint64_t clock = first; clock <= static_cast<uint64_t>(config_.clocks); ++clock) {
    if (runLoopClock(clock, sink, tally)) break;
  }

  // Every batch addressed here applied, every send and metrics record delivered.
  lastClock_ = tally.last;
  reachedTarget_ = tally.reachedTarget;
  drain(tally.last, sink);
  log_->flush();
  sink.finish(timeoutOf(config_));
  trainSeconds_ = tally.trainSeconds;
  if (totals_.firstClock == 0) totals_.firstClock = first;
  totals_.trainSeconds = tally.trainSeconds;
  totals_.bytesSent += aggregator.totalBytes();
  totals_.messages += aggregator.totalMessages();
  totals_.launches += aggregator.totalLaunches();
  totals_.failures += aggregator.totalFailures();
  totals_.lostClocks += aggregator.totalLostClocks();
  totals_.maxGap = std::max(totals_.maxGap, aggregator.maxGap());
  totals_.bestAccuracy = std::max(totals_.bestAccuracy, aggregator.bestAccuracy());
  if (tally.membershipChanges) {
    // The next epoch's ranks continue from here (engine/job/job.cc): nothing more on this group.
    changesAfter_ = tally.last;
    updater_.toHost(replica_);
    return replica_;
  }
  updater_.toHost(replica_);
  if (test_ != nullptr) lastEval_ = evaluate();
  if (transport_.rank() == 0) writeSummary(metrics, tally, initialEval);
  return replica_;
}

// One clock of run(): the clock itself, the coordinator's barrier, the checkpoint
// and failure injection, then this rank's record. True when the job stops here
// (--target-accuracy reached) or its membership changes here (engine/membership/live.h).
bool Worker::runLoopClock(uint64_t clock, MetricsSink& sink, Tally& tally) {
  noteClock(clock);  // for the line a termination by the launcher prints
  const auto start = Clock::now();
  const double ckptWaitBefore = log_->waitSeconds();
  const double ckptCpuBefore = log_->writerCpuSeconds();
  const ops::Backend::Transfers transfersBefore = updater_.backend().transfers();
  const uint64_t launchesBefore = updater_.backend().launches();
  const TransferMark transferBefore = transferMark();
  const std::unique_ptr<data::Batch> owned = takeBatch(clock);
  const data::Batch& batch = *owned;
  const double dataWaitSeconds = secondsSince(start);
  const ClockStats stats = runClock(clock, batch, sink);
  const uint64_t bytesBefore = transport_.counters().bytesSent;
  const Coordination coordination = coordinate(clock, sink);
  const uint64_t coordinationBytes = transport_.counters().bytesSent - bytesBefore;  // averaging, rotation
  // The job's last clock is a cut, as a barrier is: what SSP still has on its way
  // here is applied before the clock's record, so that record (its evaluation, its
  // digest) is of the replica the job ends with, the one 'orpheus restore' rebuilds.
  if (clock == static_cast<uint64_t>(config_.clocks)) drain(clock, sink);
  adaptAfter(clock, stats, coordinationBytes, coordination, secondsSince(start));
  // --balance: this clock's busy time and, every --balance-every clocks, chunk moves.
  const int64_t delayMs = injectedDelayMs(feed_.options(), transport_.rank(), batch.size());
  feed_.afterClock(clock, stats.computeSeconds + static_cast<double>(delayMs) / 1000.0);
  const Recovery::Failure failure = afterClock(clock);
  const double clockSeconds = secondsSince(start);
  tally.trainSeconds += clockSeconds;
  notePhase(ClockPhase::kEnded, clock);

  ClockAround around;
  around.trainSeconds = tally.trainSeconds;
  around.clockSeconds = clockSeconds;
  around.coordinationBytes = coordinationBytes;
  around.ckptWaitSeconds = log_->waitSeconds() - ckptWaitBefore;
  around.ckptCpuSeconds = log_->writerCpuSeconds() - ckptCpuBefore;
  around.failed = failure.failed;
  around.lostClocks = failure.lostClocks;
  around.deviceInBytes = updater_.backend().transfers().toDevice - transfersBefore.toDevice;
  around.deviceOutBytes = updater_.backend().transfers().toHost - transfersBefore.toHost;
  around.launches = updater_.backend().launches() - launchesBefore;
  around.blockingCopies = updater_.backend().transfers().blocking - transfersBefore.blocking;
  around.dataWaitSeconds = dataWaitSeconds;
  noteTransfer(transferBefore, around);
  around.deviceDataWaitSeconds = model_.takeDeviceDataWait();
  around.leader = transport_.rank() == 0;
  around.replica = replicaId_;
  around.averaged = coordination.averaged;
  around.rotated = coordination.rotated;
  around.divergenceMax = coordination.divergenceMax;
  around.divergenceMean = coordination.divergenceMean;
  if (config_.paramDigests && around.leader) {
    updater_.toHost(replica_);
    // Under SSP the clock's step may wait for batches still to come: the digest is of
    // the replica as that step leaves it, the clock 'orpheus restore' rebuilds.
    around.paramDigest = paramDigest(updater_.pending() ? updater_.peek(replica_) : replica_);
  }
  ClockRecord r = clockRecord(clock, stats, around);
  const bool reachedTarget = evaluateAt(clock, r);
  if (reachedTarget) {
    tally.last = clock;
    tally.reachedTarget = true;
    sink.endAt(clock);
  }
  if (observer_ != nullptr) observer_->reported(r);
  sink.report(r);
  if (reachedTarget) return true;
  // Live elasticity: the ranks agree whether the membership changes at this boundary.
  if (membership_ != nullptr && clock < static_cast<uint64_t>(config_.clocks) && membership_->changesAfter(clock)) {
    tally.last = clock;
    tally.membershipChanges = true;
    sink.endAt(clock);
    return true;
  }
  return false;
}

// After the barrier: the log's end of clock, a matrix checkpoint, a failure.
Recovery::Failure Worker::afterClock(uint64_t clock) {
  log_->endClock(clock);
  recovery_.checkpoint(clock, replica_, updater_, replicaId_);
  return recovery_.maybeFail(clock, replica_, updater_, replicaId_, *log_);
}

void Worker::writeSummary(MetricsWriter& metrics, const Tally& tally, const EvalResult& initialEval) const {
  RunSummary run;
  run.lastClock = tally.last;
  run.reachedTarget = tally.reachedTarget;
  run.trainSeconds = tally.trainSeconds;
  run.totals = totals_;  // the whole run's, over its membership epochs
  run.ranks = transport_.size();
  run.fanout = schedule_.fanout();
  run.device = updater_.backend().describe();
  if (updater_.resident()) run.device += " (resident)";
  run.replica = replicaId_;
  run.knobs = knobs_;
  run.evaluated = test_ != nullptr;
  run.initialTestLoss = initialEval.loss;
  run.testLoss = lastEval_.loss;
  run.testAccuracy = lastEval_.accuracy;
  if (isQuasiNewton(updater_.optimizer().settings().kind)) run.quasiNewtonSkips = updater_.optimizer().skips();
  metrics.write(summaryLine(metricsOptions(config_), model_, run));
}

}  // namespace orpheus::engine
