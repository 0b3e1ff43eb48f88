#include "engine/coordinator/coordinator.h"

#include <vector>

namespace orpheus::engine {

Coordination Coordinator::average(ParamSet& replica, Optimizer& optimizer, uint64_t clock) {
  Coordination done;
  done.averaged = true;
  const double p = transport_.size();
  ParamSet mean = replica;
  for (auto& param : mean.params) {
    transport_.allreduceSumIdentical({param.value.data(), static_cast<size_t>(param.value.size())}, clock);
    param.value /= static_cast<float>(p);
  }
  double maxStat[1] = {relativeDifference(replica, mean)};
  double sumStat[1] = {maxStat[0]};
  transport_.control().max(maxStat);
  transport_.control().sum(sumStat);
  done.divergenceMax = maxStat[0];
  done.divergenceMean = sumStat[0] / p;
  outer_.apply(mean);         // the same anchor and mean everywhere: the same W
  replica = std::move(mean);  // bitwise the same on every rank (Transport::allreduceSumIdentical)
  if (optimizer.hasState()) {
    for (Matrix* buffer : optimizer.buffers()) {
      transport_.allreduceSumIdentical({buffer->data(), static_cast<size_t>(buffer->size())}, clock);
      *buffer /= static_cast<float>(p);
    }
    double steps[1] = {static_cast<double>(optimizer.steps())};
    transport_.control().max(steps);
    optimizer.setSteps(static_cast<int64_t>(steps[0]));
  }
  return done;
}

void Coordinator::rotate(ParamSet& replica, Optimizer& optimizer, int& replicaId, uint64_t clock) {
  for (auto& param : replica.params) {
    transport_.shiftRing({param.value.data(), static_cast<size_t>(param.value.size())}, clock);
  }
  for (Matrix* buffer : optimizer.buffers()) {
    transport_.shiftRing({buffer->data(), static_cast<size_t>(buffer->size())}, clock);
  }
  // The replica now here is the one rank-1 held; its id (and step count) travel with it.
  std::vector<float> carried = {static_cast<float>(replicaId)};
  if (optimizer.hasState()) carried.push_back(static_cast<float>(optimizer.steps()));
  transport_.shiftRing(carried, clock);
  replicaId = static_cast<int>(carried[0]);
  if (optimizer.hasState()) optimizer.setSteps(static_cast<int64_t>(carried[1]));
}

}  // namespace orpheus::engine
