// One symmetric worker: a data shard, a parameter replica, and the clock loop of
// the paper's Algorithm 1.
#pragma once

#include "comm/transport.h"
#include "engine/config.h"
#include "engine/data/dataset.h"
#include "engine/metrics.h"
#include "ops/model.h"

#include <chrono>
#include <vector>

namespace orpheus::engine {

// What one clock measured on this rank.
struct ClockStats {
  double loss = 0.0;
  double computeSeconds = 0.0;   // forward/backward and SV identification
  double commSeconds = 0.0;      // encode, exchange, decode (or gradient allreduce)
  double updateSeconds = 0.0;    // rebuild / apply
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

  // Runs config.clocks clocks, writing metrics on rank 0, and returns the replica.
  const ParamSet& run(MetricsWriter& metrics);

  // One clock on the given minibatch; public so tests can drive clocks directly.
  ClockStats runClock(uint64_t clock, const data::Batch& batch);

  // Loss and accuracy over every rank's test shard (collective).
  EvalResult evaluate();

  const ParamSet& replica() const { return replica_; }
  uint64_t clock() const { return clock_; }
  // After run(): the last evaluation and the training time (evaluation excluded).
  const EvalResult& lastEval() const { return lastEval_; }
  double trainSeconds() const { return trainSeconds_; }

 private:
  // --sync sv: compute_svg, send S, receive T, compute_update(S ∪ T).
  void svClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats);
  // --sync dense: gradient, allreduce, step (the data-parallel baseline).
  void denseClock(uint64_t clock, const ops::ExampleBatch& examples, ClockStats& stats);
  std::vector<SvBatch> decodeRemote(const comm::Gathered& all, uint64_t clock) const;

  const TrainConfig& config_;
  const ops::Model& model_;
  comm::Transport& transport_;
  const data::Dataset& train_;
  const data::Dataset* test_;
  ParamSet replica_;
  uint64_t clock_ = 0;
  // Every update is a mean over the global minibatch: W -= lr / (B P) * sum of per-example gradients.
  float stepScale_;
  std::vector<std::byte> encoded_;  // reused send buffer
  EvalResult lastEval_;
  double trainSeconds_ = 0.0;
};

ops::ExampleBatch view(const data::Batch& batch);

}  // namespace orpheus::engine
