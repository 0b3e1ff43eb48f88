#include "engine/worker/part_options.h"

namespace orpheus::engine {

CoordinatorOptions coordinatorOptions(const TrainConfig& config) {
  CoordinatorOptions o;
  o.rotateEvery = config.rotateEvery;
  o.outer.lr = config.outerLr;
  o.outer.momentum = config.outerMomentum;
  return o;
}

BalanceOptions balanceOptions(const TrainConfig& config) {
  BalanceOptions o;
  o.batch = config.batch;
  o.seed = config.seed;
  o.clocks = config.clocks;
  o.timeoutSeconds = config.timeoutSeconds;
  o.balance = config.balance;
  o.balanceEvery = config.balanceEvery;
  o.chunkRows = config.chunkRows;
  if (config.ckptSv) o.chunkLogDir = config.ckptDir;
  o.delayRank = config.delayRank;
  o.delayMs = config.delayMs;
  return o;
}

adapt::ControllerOptions controllerOptions(const TrainConfig& config, int64_t steps) {
  adapt::ControllerOptions o;
  o.enabled = config.adapt;
  o.every = config.adaptEvery;
  o.selectRange = config.adaptSelect;
  o.fanoutRange = config.adaptFanout;
  o.stalenessRange = config.adaptStaleness;
  o.averageEveryRange = config.adaptAverageEvery;
  o.rankRange = config.adaptRank;
  o.maxBytesPerClock = config.maxBytesPerClock;
  o.bf16 = config.adaptBf16;
  o.startBf16 = config.svDtype == SvDtype::kBf16;
  o.commShare = config.adaptCommShare;
  o.trace = config.adaptTrace;
  o.clocks = config.clocks;
  o.batch = svgsPerClock(config, steps);
  o.seed = config.seed;
  o.select = config.select;
  o.rank = config.sync == SyncMode::kSv ? config.svRank : 0;
  o.staleness = config.staleness;
  o.averageEvery = config.averageEvery;
  o.multicast = config.multicast;
  o.consistency = config.consistency;
  o.jmcss = config.selectMethod != SelectionMethod::kUniform;  // both JMCSS methods draw alike
  return o;
}

MetricsOptions metricsOptions(const TrainConfig& config) {
  MetricsOptions o;
  o.sync = toString(config.sync);
  o.batch = config.batch;
  o.select = config.select;
  o.multicast = comm::multicastName(config.multicast);
  o.consistency = toString(config.consistency);
  o.staleness = config.staleness;
  o.dropLinks = config.dropLinks;
  o.clocks = config.clocks;
  o.averageEvery = config.averageEvery;
  o.rotateEvery = config.rotateEvery;
  o.adapt = config.adapt;
  return o;
}

ConsistencyOptions consistencyOptions(const TrainConfig& config) {
  ConsistencyOptions o;
  o.clocks = config.clocks;
  o.consistency = config.consistency;
  o.timeoutSeconds = config.timeoutSeconds;
  return o;
}

OverlapOptions overlapOptions(const TrainConfig& config) {
  OverlapOptions o;
  o.overlap = config.overlap;
  o.sync = config.sync;
  o.consistency = config.consistency;
  o.dropLinks = config.dropLinks;
  o.selectUnit = config.selectUnit;
  o.timeoutSeconds = config.timeoutSeconds;
  return o;
}

}  // namespace orpheus::engine
