#include "engine/memory_check.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/worker/optimizer.h"

#include "engine/base/log.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include <sched.h>

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

std::string threadsWarning(int requested, int inForce, int ranksOnHost, int usable, int cores) {
  if (requested <= 1) return {};
  std::string why;
  const auto also = [&why](const std::string& part) { why += (why.empty() ? "" : "; ") + part; };
  if (inForce < requested) also(fmt::format("BLAS runs at most {} threads, so {} run", inForce, inForce));
  const int threads = std::min(requested, inForce);
  if (threads > 1 && usable < threads && usable < cores) {
    also(fmt::format("this rank may run on {} of the host's {} cores (its CPU affinity: mpirun binds ranks to a "
                     "core or a socket unless launched with --bind-to none)",
                     usable, cores));
  } else if (threads * ranksOnHost > cores) {
    also(fmt::format("{} rank{} on this host with {} threads each are {} compute threads on {} cores, which "
                     "time-slice (--threads {} fits)",
                     ranksOnHost, ranksOnHost == 1 ? "" : "s", threads, threads * ranksOnHost, cores,
                     std::max(1, cores / std::max(1, ranksOnHost))));
  }
  return why.empty() ? std::string() : fmt::format("--threads {}: {}", requested, why);
}

std::string threadsWarning(int requested, int ranksOnHost) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  const int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : cores;
  return threadsWarning(requested, blasThreads(), ranksOnHost, usable, cores);
}

}  // namespace orpheus::engine
