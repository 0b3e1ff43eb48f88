// One symmetric worker: a data shard, a parameter replica, and the clock loop of
// the paper's Algorithm 1 with its communication co-designs: SV selection,
// multicast to a schedule's peers, and BSP or SSP consistency. Around the clock,
// each concern has a room of its own: engine/consistency (which batches have
// arrived), engine/coordinator (averaging, rotation), engine/recovery (the
// checkpoint log, failures) and engine/metrics (the per-clock records).
#pragma once

#include "comm/schedule.h"
#include "comm/transport.h"
#include "engine/adapt/controller.h"
#include "engine/coordinator/balance.h"
#include "engine/config.h"
#include "engine/worker/consistency.h"
#include "engine/coordinator/coordinator.h"
#include "engine/data/dataset.h"
#include "engine/worker/exchange.h"
#include "engine/worker/low_rank.h"
#include "engine/worker/power_sgd.h"
#include "engine/metrics/metrics.h"
#include "engine/worker/optimizer.h"
#include "engine/recovery/recovery.h"
#include "engine/worker/membership_check.h"
#include "engine/worker/sv_transfer.h"
#include "ops/model.h"
#include "ops/staging.h"

#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace orpheus::engine {

class OverlappedExchange;

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t examples = 0;
};

// This rank's loss is not finite at `clock` (runClock). Peers may find theirs the
// same at that clock, since their replicas share its steps: the job says it once
// (engine/job/job.cc).
// What to change when the loss is not finite at `clock`: from the first clock, the
// model (its init or loss) before the learning rate; a weight decay is named too.
std::string divergenceHint(const TrainConfig& config, uint64_t clock);

class Diverged : public InputError {
 public:
  // `hint`: what to change (divergenceHint).
  Diverged(uint64_t clock, int rank, const std::string& hint);
  uint64_t clock() const { return clock_; }
  const std::string& hint() const { return hint_; }

 private:
  uint64_t clock_;
  std::string hint_;
};

// Where a clock's phases begin, for an observer of the loop (the simulator,
// engine/sim): compute (SVs or gradient, selection), the exchange with peers (up to
// the last batch this clock waits for), then the rebuild, the coordinator and the
// checkpoint; kEnded comes before the clock's evaluation.
enum class ClockPhase { kStarted, kExchange, kRebuild, kEnded };

// Told, on the worker's thread, as each clock passes a phase, and the record each
// clock of run() reports. Must not call back into the worker.
class ClockObserver {
 public:
  virtual ~ClockObserver() = default;
  virtual void phase(ClockPhase phase, uint64_t clock) = 0;
  virtual void reported(const ClockRecord& record) = 0;
};

// Why this job's replica cannot live on its device (--device), or "" when it does
// (engine/worker/device_replica.h): the model has no device form, the optimizer
// or the exchange runs on the host, or the device is the host.
std::string deviceResidency(const TrainConfig& config, const ops::Model& model, const ops::Backend& backend);

class Worker {
 public:
  // All references must outlive the worker. `test` may be null (no evaluation).
  // `backend` is the job's (ops/backends.h, --device): the rebuild and the dense
  // gradient run on it. The worker is the composition root of its parts: each gets
  // its own options, made from `config` (engine/worker/part_options.h).
  Worker(const TrainConfig& config, const ops::Model& model, ops::Backend& backend, comm::Transport& transport,
         const data::Dataset& train, const data::Dataset* test);
  ~Worker();

  // Runs config.clocks clocks, writing metrics on rank 0, and returns the replica
  // once every batch addressed to this rank has been applied. A checkpoint that
  // cannot be written stops every rank with JobFailed, reported by one rank.
  const ParamSet& run(MetricsWriter& metrics);

  // One clock on the given minibatch; public so tests can drive clocks directly.
  // `metrics` collects the other ranks' records while this rank waits on peers.
  ClockStats runClock(uint64_t clock, const data::Batch& batch, MetricsSink& metrics);
  ClockStats runClock(uint64_t clock, const data::Batch& batch);
  // Waits for and applies every batch still addressed to this rank up to `lastClock`,
  // and completes this rank's sends (point-to-point modes), then takes the last
  // clock's optimizer step if it is still pending (SSP).
  void drain(uint64_t lastClock, MetricsSink& metrics);
  void drain(uint64_t lastClock);

  // The coordinator's barrier after `clock` (collective; every rank calls it after
  // every clock): drains every batch of clocks <= clock, then averages replicas
  // every R clocks and rotates them every S clocks. Returns what it did.
  using Coordination = engine::Coordination;
  Coordination coordinate(uint64_t clock, MetricsSink& metrics);
  Coordination coordinate(uint64_t clock);
  // Periodic centralized synchronization: every replica becomes the average (collective).
  Coordination averageReplicas(uint64_t clock) {
    updater_.settle(replica_);
    const Coordination done = coordinator_.average(replica_, updater_.optimizer(), clock);
    updater_.hostChanged();
    return done;
  }
  // Replica rotation: this rank's replica goes to rank+1, rank-1's comes here (collective).
  void rotateReplica(uint64_t clock) {
    updater_.settle(replica_);
    coordinator_.rotate(replica_, updater_.optimizer(), replicaId_, clock);
    updater_.hostChanged();
  }
  // The id of the replica this rank holds (its rank at the start; rotation moves it).
  int replicaId() const { return replicaId_; }
  // The replica for the caller to change (tests): current, and taken back by the device.
  ParamSet& mutableReplica() {
    updater_.toHost(replica_);
    updater_.hostChanged();
    return replica_;
  }
  // Resume: continue from `clock` with `replica` (id `id`) and its optimizer state
  // (Optimizer::exportState()) restored from a checkpoint.
  void resumeFrom(uint64_t clock, ParamSet replica, const ParamSet& optimizerState, int id);
  // After resumeFrom, with --outer-lr: the outer step's anchor and momentum from the
  // snapshot of the last averaging (engine/recovery/checkpoint.h, Restored::outer);
  // empty: none was taken yet, W0 and zero stand.
  void resumeOuterStep(ParamSet anchor, ParamSet momentum);
  // Elastic resume (engine/membership/elastic.h): resumeFrom, then the log marks the membership
  // change at `clock` and writes this rank's part of its snapshot unless `snapshot` is
  // false (collective).
  void rejoinAt(uint64_t clock, ParamSet replica, const ParamSet& optimizerState, int id, bool snapshot);
  // What this rank carries from clock to clock beyond its replica, its optimizer
  // state and the log: a sequence model's recurrent states (ops::Model::carriedState)
  // and --sv-rank's error feedback (LowRankSender::state). The log writes it where a
  // segment ends, so a resume continues bitwise (engine/job/job_resume.cc).
  bool carriesRankState() const { return model_.carriesState() || lowRank_.has_value(); }
  ParamSet rankState() const;
  void restoreRankState(const ParamSet& state);
  // The membership epoch this rank's batches carry in their headers.
  void setEpoch(uint32_t epoch) { epoch_ = epoch; }
  // The optimizer of the replica this rank holds (its state travels with it).
  const Optimizer& optimizer() const { return updater_.optimizer(); }
  ops::Backend& backend() const { return updater_.backend(); }
  // Seconds the compute thread waited for the checkpoint writer, in all.
  double checkpointWaitSeconds() const { return log_->waitSeconds(); }
  int64_t failures() const { return recovery_.failures(); }
  // Clocks of updates the failures made this rank's replicas lose, in all.
  uint64_t lostClocks() const { return recovery_.lostClocks(); }

  // Loss and accuracy over every rank's test shard, each with its own replica (collective).
  EvalResult evaluate();
  // This rank's replica on this rank's test shard.
  ops::EvalSums evaluateLocal();

  const ParamSet& replica() const { return replica_; }
  uint64_t clock() const { return clock_; }
  const EvalResult& lastEval() const { return lastEval_; }
  double trainSeconds() const { return trainSeconds_; }
  // The last clock run: config.clocks, or the clock that reached --target-accuracy.
  uint64_t lastClock() const { return lastClock_; }
  // Whether the run ended at --target-accuracy.
  bool reachedTarget() const { return reachedTarget_; }
  // True when this clock's batches travel point to point (sendsPointToPoint).
  bool pointToPoint() const { return pointToPoint_; }
  // The knobs in force (--adapt changes them at decision barriers).
  const adapt::Knobs& knobs() const { return knobs_; }
  // Resume: the knobs the job had set by the clock it resumes from (adapt::knobsAt).
  void resumeKnobs(const adapt::Knobs& knobs) { applyKnobs(knobs); }
  // Tells `observer` (null: nobody) the phases of every clock from now on; it must
  // outlive the worker's clocks.
  void observeClocks(ClockObserver* observer) { observer_ = observer; }
  // Live elasticity (engine/membership/live.h; the simulator's planned changes): after each
  // clock but the last, the loop asks `watch` (null: nobody) whether the membership
  // changes there; it must outlive run().
  void watchMembership(MembershipCheck* watch) { membership_ = watch; }
  // The clock after which the membership changes: run() returned there with every
  // batch applied and the log durable, without the final evaluation and summary
  // (0: it ran to the end).
  uint64_t changesAfter() const { return changesAfter_; }
  using RunTotals = engine::RunTotals;
  void continueRun(const RunTotals& earlier) {
    totals_ = earlier;
    trainSeconds_ = earlier.trainSeconds;
  }
  // After run() returned at a membership change: the totals through this epoch.
  const RunTotals& runTotals() const { return totals_; }

 private:
  // What one clock of the loop in run() adds up to, beyond ClockStats.
  struct Tally {
    double trainSeconds = 0.0;
    uint64_t last = 0;
    bool reachedTarget = false;
    bool membershipChanges = false;
  };

  // run(): the loop, one clock of it with its barrier, checkpoint and record, and the end.
  const ParamSet& runClocks(MetricsWriter& metrics, MetricsSink& sink, const MetricsAggregator& aggregator);
  bool runLoopClock(uint64_t clock, MetricsSink& sink, Tally& tally);
  Recovery::Failure afterClock(uint64_t clock);
  // What crossed between the device and the host for the SVs since `before`, into `around`.
  struct TransferMark {
    SvTransfer::Totals transfer;
    uint64_t rebuildToDevice = 0;
  };
  TransferMark transferMark() const { return {transfer_.totals(), updater_.rebuildToDeviceBytes()}; }
  void noteTransfer(const TransferMark& before, ClockAround& around) const;
  // This clock's minibatch: fetched in the clock before with the data queue, else
  // now. With the data queue the next clock's is fetched too and handed to the
  // model to copy to the device while this clock computes.
  std::unique_ptr<data::Batch> takeBatch(uint64_t clock);
  bool queuesData(uint64_t clock) const;
  bool evaluateAt(uint64_t clock, ClockRecord& record);
  void writeSummary(MetricsWriter& metrics, const Tally& tally, const EvalResult& initialEval) const;

  // --sync sv, Algorithm 1: compute_svg, select, send S, receive T, compute_update(S ∪ T), log.
  void svClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats, MetricsSink& metrics);
  // The way S and T travel under the knobs in force (engine/worker/exchange.h).
  ClockExchange& exchangeNow();
  std::shared_ptr<SvBatch> computeSvgs(uint64_t clock, const ops::ExampleBatch& examples, ClockExchange& exchange,
                                       std::chrono::steady_clock::time_point start, ClockStats& stats);
  std::optional<SvBatch> selectToSend(uint64_t clock, const SvBatch& local, ClockStats& stats);
  std::vector<ops::DeviceSvs> landUnkept(SvBatch& local);
  std::vector<ops::DeviceSvs> localOnDevice(const SvBatch& local) const;
  void keepOnDevice(const SvBatch& local);
  void rebuild(uint64_t clock, const ClockGroup& group, ClockStats& stats);
  // --sync dense: gradient, allreduce, step (the data-parallel baseline); --sync
  // powersgd: the same with the gradient all-reduced through PowerSGD's factors.
  void denseClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats);
  ParamSet residentDenseGradient(const ops::ExampleBatch& examples, ClockStats& stats, bool toHost = true);
  void residentDenseExchange(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats);
  template <class Gradient>
  void stepDense(uint64_t clock, Gradient& gradient, ClockStats& stats);

  // --adapt: this clock's measurements to the controller and, at a decision
  // barrier, the knobs it announces (logged, then in force from the next clock).
  void adaptAfter(uint64_t clock, const ClockStats& stats, uint64_t coordinationBytes, const Coordination& done,
                  double clockSeconds);
  void applyKnobs(const adapt::Knobs& knobs);

  SvBatchHeader header(uint64_t clock) const;
  // What a snapshot of the replica holds at an averaging (ckpt/snapshot.h): the
  // parameters, the optimizer state, and with --outer-lr the outer momentum.
  ParamSet snapshotOfReplica() const;
  void notePhase(ClockPhase phase, uint64_t clock) {
    if (observer_ != nullptr) observer_->phase(phase, clock);
  }

  const TrainConfig& config_;
  const ops::Model& model_;
  comm::Transport& transport_;
  const data::Dataset& train_;
  const data::Dataset* test_;
  ParamSet replica_;
  int replicaId_ = 0;
  uint32_t epoch_ = 0;
  uint64_t clock_ = 0;
  bool pointToPoint_ = true;  // set from the knobs by applyKnobs
  comm::MulticastSchedule schedule_;
  // C, Q, s and R as they are now: read here, never from config_ (engine/adapt/knobs.h).
  adapt::Controller adapt_;
  adapt::Knobs knobs_;
  // This rank's whole batch of a clock the controller measures (measuresAt), kept
  // from the clock to adaptAfter.
  std::shared_ptr<const SvBatch> measuredBatch_;
  std::unique_ptr<ClockLog> log_;  // the incremental SV checkpoint, or a log that does nothing
  Inbox inbox_;
  Coordinator coordinator_;
  Recovery recovery_;
  // Examples a replica hears of per clock, B (Q + 1): updates are means over them.
  double heard_ = 0.0;
  // The optimizer and its state, and the pending clock's gradient (engine/worker/optimizer.h).
  ReplicaUpdater updater_;
  SvTransfer transfer_;  // resident: how the clock's SVs come to the host (--transfer)
  ops::RebuildBuffers gradientBuffers_;  // --sync dense: the gradient's products, reused every clock
  std::vector<ops::Tensor> deviceGradient_;  // --sync dense, resident: the gradient on the device
  ops::Staging gradientStaging_;  // --sync dense --overlap, resident: the gradient on its way to the all-reduce
  EvalResult lastEval_;
  double trainSeconds_ = 0.0;
  RunTotals totals_;  // the earlier epochs' (continueRun), then through this one
  uint64_t lastClock_ = 0;
  bool reachedTarget_ = false;
  ClockObserver* observer_ = nullptr;
  MembershipCheck* membership_ = nullptr;
  uint64_t changesAfter_ = 0;
  DataFeed feed_;  // the minibatches: the shard, or with --balance the chunks this rank owns
  std::unique_ptr<data::Batch> aheadBatch_;  // the data queue: the next clock's minibatch, on its way to the device
  // The ways a clock's batches travel (exchangeNow): the overlapped one only with --overlap.
  BroadcastExchange broadcast_;
  MulticastExchange multicast_;
  std::unique_ptr<OverlappedExchange> overlapped_;
  std::optional<LowRankSender> lowRank_;  // --sv-rank: the batch at rank R, and what is left to send
  std::vector<ops::DeviceSvs> rankOperands_;  // --sv-rank, resident: this clock's U and V on the device
  ops::Tensor gramOperand_, grams_;           // --select-method jmcss-gram: its device buffers
  std::optional<PowerSgdReducer> powerSgd_;  // --sync powersgd: the factors' state and this rank's residual
};

ops::ExampleBatch view(const data::Batch& batch);

// Whether a clock under these knobs sends its batch point to point (Inbox, SSP
// arrival order) or through the broadcast collective: point to point unless every
// rank gets every batch within the clock (Q = P - 1, BSP or staleness 0, no broken
// links). --sync dense: never.
bool sendsPointToPoint(const TrainConfig& config, const comm::MulticastSchedule& schedule, const adapt::Knobs& knobs);

// Loss and accuracy sums of `params` over all of `test`, evaluated in chunks.
ops::EvalSums evaluateOn(const ops::Model& model, const ParamSet& params, const data::Dataset& test);

}  // namespace orpheus::engine
