#include "engine/memory_check.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/worker/optimizer.h"

#include <algorithm>

namespace orpheus::engine {

void checkJobMemory(const TrainConfig& config, const ops::Model& model, const DataShape& data, int replicas,
                    int running) {
  double params = 0.0;
  for (const auto& [rows, cols] : model.paramShapes()) params += static_cast<double>(rows) * static_cast<double>(cols);
  const OptimizerSettings optimizer = optimizerSettings(config);
  if (isQuasiNewton(optimizer.kind)) {
    ORPHEUS_CHECK_INPUT(params <= static_cast<double>(kQuasiNewtonMaxEntries),
                        "--optimizer {}: model '{}' has {:.0f} parameter entries; its n x n approximation would need "
                        "{:.1f} GiB (at most {} entries: MLR or a .loss model with a few hundred features)",
                        toString(optimizer.kind), config.model, params, params * params * 12.0 / (1 << 30),
                        kQuasiNewtonMaxEntries);
  }
  const double stateCopies = optimizer.kind == OptimizerKind::kAdam || isQuasiNewton(optimizer.kind) ? 2.0
                             : optimizer.kind == OptimizerKind::kSgd                                 ? 0.0
                                                                                                     : 1.0;
  // W in float, and in double on the host during a step.
  const double qnBytes = isQuasiNewton(optimizer.kind) ? params * params * (sizeof(float) + sizeof(double)) : 0.0;
  const double replicaBytes =
      params * sizeof(float) * (2.0 + stateCopies + (optimizer.foldsLearningRate() ? 0.0 : 1.0)) + qnBytes;
  const double batch = static_cast<double>(config.batch);
  const double perExample = data.sparse ? 64.0 : 4.0 * static_cast<double>(data.features) + 16.0;
  const double outputs = 3.0 * batch * static_cast<double>(std::max<int64_t>(data.steps, 1)) *
                         static_cast<double>(data.classes) * sizeof(float);
  const double bytes = replicas * replicaBytes + running * (3.0 * batch * perExample + outputs);
  checkFitsInMemory(bytes,
                    fmt::format("{} replica{} of model '{}' ({:.0f} parameters) with --batch {} over {} classes{}",
                                replicas, replicas == 1 ? "" : "s", config.model, params, config.batch, data.classes,
                                data.steps > 0 ? fmt::format(" and {} steps", data.steps) : ""),
                    0.5);
}

}  // namespace orpheus::engine
