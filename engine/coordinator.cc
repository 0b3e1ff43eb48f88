#include "engine/coordinator.h"

#include <vector>

namespace orpheus::engine {

Coordination Coordinator::average(ParamSet& replica, uint64_t clock) {
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
  replica = std::move(mean);  // bitwise the same on every rank (Transport::allreduceSumIdentical)
  return done;
}

void Coordinator::rotate(ParamSet& replica, int& replicaId, uint64_t clock) {
  for (auto& param : replica.params) {
    transport_.shiftRing({param.value.data(), static_cast<size_t>(param.value.size())}, clock);
  }
  // The replica now here is the one rank-1 held; its id travels with it.
  std::vector<float> carried = {static_cast<float>(replicaId)};
  transport_.shiftRing(carried, clock);
  replicaId = static_cast<int>(carried[0]);
}

}  // namespace orpheus::engine
