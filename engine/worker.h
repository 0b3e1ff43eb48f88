// One symmetric worker: a data shard, a parameter replica, and the clock loop of
// the paper's Algorithm 1 with its communication co-designs: SV selection,
// multicast to a schedule's peers, and BSP or SSP consistency.
#pragma once

#include "ckpt/sv_log.h"
#include "comm/schedule.h"
#include "comm/transport.h"
#include "engine/config.h"
#include "engine/data/dataset.h"
#include "engine/metrics.h"
#include "ops/model.h"

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <vector>

namespace orpheus::engine {

// What one clock measured on this rank.
struct ClockStats {
  double loss = 0.0;
  double computeSeconds = 0.0;  // forward/backward, SV identification and selection
  double commSeconds = 0.0;     // encode, send, receive, decode (or gradient allreduce)
  double updateSeconds = 0.0;   // rebuild / apply
  double waitSeconds = 0.0;     // blocked on peers (BSP barrier or SSP staleness bound)
  double selectSeconds = 0.0;
  int64_t clockGap = 0;         // this clock minus the newest clock whose batches have all arrived, minus 1
  uint64_t bytesSent = 0;
  uint64_t messages = 0;
};

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t examples = 0;
};

class Worker {
 public:
  // All references must outlive the worker. `test` may be null (no evaluation).
  Worker(const TrainConfig& config, const ops::Model& model, comm::Transport& transport, const data::Dataset& train,
         const data::Dataset* test);

  // Runs config.clocks clocks, writing metrics on rank 0, and returns the replica
  // once every batch addressed to this rank has been applied. A checkpoint that
  // cannot be written stops every rank with JobFailed, reported by one rank.
  const ParamSet& run(MetricsWriter& metrics);

  // One clock on the given minibatch; public so tests can drive clocks directly.
  ClockStats runClock(uint64_t clock, const data::Batch& batch);
  // Waits for and applies every batch still addressed to this rank up to `lastClock`,
  // and completes this rank's sends (point-to-point modes; a no-op otherwise).
  void drain(uint64_t lastClock);

  // The coordinator's barrier after `clock` (collective; every rank calls it after
  // every clock): drains every batch of clocks <= clock, then averages replicas
  // every R clocks and rotates them every S clocks. Returns what it did.
  struct Coordination {
    bool averaged = false;
    bool rotated = false;
    double divergenceMax = 0.0;   // max over replicas of ||W_r - mean|| / ||mean||, before averaging
    double divergenceMean = 0.0;
  };
  Coordination coordinate(uint64_t clock);
  // Periodic centralized synchronization: every replica becomes the average (collective).
  Coordination averageReplicas(uint64_t clock);
  // Replica rotation: this rank's replica goes to rank+1, rank-1's comes here (collective).
  void rotateReplica(uint64_t clock);
  // The id of the replica this rank holds (its rank at the start; rotation moves it).
  int replicaId() const { return replicaId_; }
  ParamSet& mutableReplica() { return replica_; }
  // Resume: continue from `clock` with `replica` (id `id`) restored from a checkpoint.
  void resumeFrom(uint64_t clock, ParamSet replica, int id);
  // Seconds the compute thread waited for the checkpoint writer, and bytes it wrote.
  double checkpointWaitSeconds() const { return log_ ? log_->waitSeconds() + handOffSeconds_ : 0.0; }
  int64_t failures() const { return failures_; }
  // Clocks of updates the failures made this rank's replicas lose, in all.
  uint64_t lostClocks() const { return lostClocks_; }

  // Loss and accuracy over every rank's test shard, each with its own replica (collective).
  EvalResult evaluate();
  // This rank's replica on this rank's test shard.
  ops::EvalSums evaluateLocal() const;

  const ParamSet& replica() const { return replica_; }
  uint64_t clock() const { return clock_; }
  const EvalResult& lastEval() const { return lastEval_; }
  double trainSeconds() const { return trainSeconds_; }
  // The last clock run: config.clocks, or the clock that reached --target-accuracy.
  uint64_t lastClock() const { return lastClock_; }
  // True when batches travel point to point (multicast, SSP, link failures).
  bool pointToPoint() const { return pointToPoint_; }

 private:
  const ParamSet& runClocks(MetricsWriter& metrics);
  // --sync sv: compute_svg, select, send S, receive T, compute_update(S ∪ T).
  void svClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats);
  void svBroadcastClock(uint64_t clock, const std::shared_ptr<SvBatch>& local, ClockStats& stats);
  void svMulticastClock(uint64_t clock, const std::shared_ptr<SvBatch>& local, ClockStats& stats);
  // --sync dense: gradient, allreduce, step (the data-parallel baseline).
  void denseClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats);
  std::vector<SvBatch> decodeRemote(const comm::Gathered& all, uint64_t clock) const;

  // Point-to-point bookkeeping: receive what has arrived; under SSP apply it at once.
  void pump();
  void accept(comm::Message message);
  // Clocks whose every expected batch has arrived (and, under SSP, been applied).
  uint64_t completeThrough() const { return completeThrough_; }
  void advanceComplete();
  // Blocks (pumping) until completeThrough() >= clock; TimeoutError naming the missing peers.
  void waitComplete(uint64_t clock, ClockStats& stats);
  std::vector<int> missingSenders(uint64_t clock) const;

  SvBatchHeader header(uint64_t clock) const;

  const TrainConfig& config_;
  const ops::Model& model_;
  comm::Transport& transport_;
  const data::Dataset& train_;
  const data::Dataset* test_;
  ParamSet replica_;
  uint64_t clock_ = 0;
  // W -= lr / (B (Q + 1)) * sum of per-example gradients (see the constructor).
  float stepScale_;
  std::vector<std::byte> encoded_;  // reused send buffer (broadcast path)
  bool pointToPoint_;
  comm::MulticastSchedule schedule_;
  std::vector<std::pair<int64_t, int64_t>> shapes_;
  // Batches received and not yet applied (BSP), by clock then sender.
  struct Received {
    SvBatch batch;
    ckpt::SharedBytes bytes;  // kept for the checkpoint log, or null
  };
  std::map<uint64_t, std::map<int, Received>> pending_;
  std::map<uint64_t, std::set<int>> arrived_;  // senders heard from, by clock
  uint64_t completeThrough_ = 0;
  uint64_t sentThrough_ = 0;  // the newest clock this rank has sent
  EvalResult lastEval_;
  double trainSeconds_ = 0.0;
  uint64_t lastClock_ = 0;
  int replicaId_ = 0;
  std::function<void()> idle_;  // run() on rank 0: collects metrics while waiting
  // The incremental SV checkpoint: every group of batches applied to the replica.
  std::unique_ptr<ckpt::SvLogWriter> log_;
  uint64_t current_ = 0;  // the local clock being worked on
  int64_t averagings_ = 0;
  void logGroup(std::vector<ckpt::Record> records);
  // Failure injection and recovery (--fail-prob): returns whether this rank failed
  // at the end of `clock`, and sets `lost` to the clocks of updates its replica lost.
  bool maybeFail(uint64_t clock, uint64_t* lost);
  void writeMatrixCheckpoint(uint64_t clock);
  ParamSet matrixCheckpoint_;          // --ckpt matrix: the last one written (what recovery restores)
  uint64_t matrixCheckpointClock_ = 0;
  uint64_t lastSnapshot_ = 0;          // --ckpt sv: the newest snapshot known complete on disk
  double handOffSeconds_ = 0.0;        // --ckpt sv: waiting for the log at rotations
  int64_t failures_ = 0;
  uint64_t lostClocks_ = 0;
};

ops::ExampleBatch view(const data::Batch& batch);

}  // namespace orpheus::engine
