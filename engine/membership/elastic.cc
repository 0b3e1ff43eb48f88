#include "engine/membership/elastic.h"

#include "ckpt/durable.h"
#include "ckpt/job_info.h"
#include "ckpt/layout.h"
#include "ckpt/snapshot.h"
#include "engine/base/error.h"
#include "engine/recovery/checkpoint.h"
#include "engine/failures.h"
#include "engine/worker/optimizer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace orpheus::engine {

namespace fs = std::filesystem;

namespace {

void addInto(ParamSet& sum, const ParamSet& term) {
  for (size_t i = 0; i < sum.params.size(); ++i) sum.params[i].value += term.params[i].value;
}

void zero(ParamSet& set) {
  for (auto& p : set.params) p.value.setZero();
}

}  // namespace

ElasticOptions elasticOptions(const TrainConfig& config) {
  ElasticOptions o;
  o.dir = config.ckptDir;
  o.seed = config.seed;
  o.optimizer = optimizerSettings(config);
  return o;
}

ElasticStart redistribute(const ElasticOptions& options, comm::Transport& transport, const ops::Model& model,
                          ops::Backend& backend,
                          const std::vector<Epoch>& epochs, uint64_t clock) {
  const Epoch& previous = epochAfter(epochs, clock);
  ElasticStart start;
  start.epoch.epoch = epochs.back().epoch + 1;
  start.epoch.clock = clock;
  start.epoch.ranks = transport.size();

  const OptimizerSettings& settings = options.optimizer;
  const ParamSet params = model.initParams(options.seed);
  const ParamSet stateShapes = Optimizer(settings, model.zeroParams()).stateShapes();
  // Where the old job averaged at `clock`, every replica is that snapshot already.
  std::optional<ParamSet> snapshot;
  collectively(transport, [&] {
    std::error_code ec;
    if (fs::exists(ckpt::snapshotDir(options.dir, clock), ec)) {
      snapshot = ckpt::readSnapshot(options.dir, clock, snapshotShapes(params, settings));
    }
  });
  double usable[1] = {snapshot ? 1.0 : 0.0};
  transport.control().min(usable);
  if (usable[0] > 0) {
    auto [p, s] = splitState(std::move(*snapshot), params.size());
    start.params = std::move(p);
    start.optimizerState = std::move(s);
    return start;
  }

  ParamSet sum = params;
  ParamSet stateSum = stateShapes;
  zero(sum);
  zero(stateSum);
  collectively(transport, [&] {
    for (int id = transport.rank(); id < previous.ranks; id += transport.size()) {
      Restored r = restore(options.dir, id, clock, backend);
      addInto(sum, r.params);
      addInto(stateSum, r.optimizerState);
    }
  });
  const auto p = static_cast<float>(previous.ranks);
  for (ParamSet* set : {&sum, &stateSum}) {
    for (auto& param : set->params) {
      transport.allreduceSumIdentical({param.value.data(), static_cast<size_t>(param.value.size())}, clock);
      param.value /= p;
    }
  }
  start.params = std::move(sum);
  start.optimizerState = std::move(stateSum);
  start.writeSnapshot = true;
  // A damaged or partial snapshot of `clock` is set aside before this epoch writes its own.
  if (transport.rank() == 0) {
    const fs::path dir = ckpt::snapshotDir(options.dir, clock);
    std::error_code ec;
    if (fs::exists(dir, ec)) fs::rename(dir, ckpt::discardedPath(dir), ec);
  }
  double done[1] = {0.0};
  transport.control().sum(done);  // no part is written before it is set aside
  return start;
}

}  // namespace orpheus::engine
