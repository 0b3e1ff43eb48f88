// Each part the worker builds takes its own options struct, declared in the part's
// header, not the whole TrainConfig (as c10d's per-backend options). Here, and only
// here, a job's TrainConfig becomes those structs: a flag a part reads is one line
// below. The worker, the job and the simulator, which hold the TrainConfig, call these.
#pragma once

#include "engine/adapt/controller.h"
#include "engine/config.h"
#include "engine/coordinator/balance.h"
#include "engine/coordinator/coordinator.h"
#include "engine/metrics/metrics.h"
#include "engine/worker/consistency.h"
#include "engine/worker/overlap.h"

namespace orpheus::engine {

CoordinatorOptions coordinatorOptions(const TrainConfig& config);
BalanceOptions balanceOptions(const TrainConfig& config);
// `steps`: the training data's steps per segment (0 for rows); under --select-unit
// step a clock's SVGs, what C counts, are B * steps.
adapt::ControllerOptions controllerOptions(const TrainConfig& config, int64_t steps);
MetricsOptions metricsOptions(const TrainConfig& config);
ConsistencyOptions consistencyOptions(const TrainConfig& config);
OverlapOptions overlapOptions(const TrainConfig& config);

}  // namespace orpheus::engine
