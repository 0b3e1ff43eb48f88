// A training job from configuration to saved model: loads every rank's shards,
// agrees on the data's shape across ranks, builds the model, runs the worker and
// writes the outputs. Also the single-process evaluation of a saved model.
#pragma once

#include "comm/live_group.h"
#include "comm/transport.h"
#include "engine/config.h"
#include "engine/failures.h"
#include "engine/memory_check.h"
#include "ops/model.h"

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace orpheus::engine {

using comm::LiveGroup;  // comm/live_group.h

// Runs `config` on this rank (collective). Returns 0 on success, also on a rank
// that left the running job (engine/membership/live.h: `live` null, never); throws JobFailed
// after a reported failure.
int runTrain(const TrainConfig& config, comm::Transport& transport, LiveGroup* live = nullptr);
// A rank that `live`'s grow() spawned: joins the running job as the new membership
// epoch after `clock` and trains to its end (collective with the job's ranks).
int joinTrain(const TrainConfig& config, comm::Transport& transport, LiveGroup& live, uint64_t clock);

struct EvalConfig {
  std::string params;
  std::string model = "mlr";
  std::string test;
  data::Format format = data::Format::kAuto;
  int64_t features = -1;
};

// Evaluates a saved model on a test file in this process; prints one JSON line.
int runEval(const EvalConfig& config);

}  // namespace orpheus::engine
