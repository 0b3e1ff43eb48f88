#include "engine/sim/sim_shards.h"

#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "engine/data/synthetic_data.h"
#include "engine/job/job_data.h"

#include <algorithm>

namespace orpheus::engine::sim {
namespace {

using data::Dataset;

// Every rank's shard of `path`, as `train` would read it on P ranks (readShard). An
// IDX file is read once and cut into the same contiguous ranges its reader gives
// each rank; other formats are read shard by shard.
std::vector<Dataset> readShards(const std::string& path, const TrainConfig& config, int ranks, int64_t features,
                                int indexBase) {
  std::vector<Dataset> shards(static_cast<size_t>(ranks));
  if (isSyntheticSource(path) || data::resolveFormat(path, config.format) != data::Format::kIdx) {
    for (int r = 0; r < ranks; ++r) {
      shards[static_cast<size_t>(r)] = readShard(path, config, r, ranks, features, indexBase);
    }
    return shards;
  }
  data::ReadOptions options;
  options.format = config.format;
  options.features = features;
  options.indexBase = indexBase;
  Dataset whole = data::readDataset(path, options);
  const int64_t total = whole.size();
  for (int r = 0; r < ranks; ++r) {
    const int64_t begin = total * r / ranks;
    const int64_t end = total * (r + 1) / ranks;
    ORPHEUS_CHECK_INPUT(end > begin, "{}: shard {} of {} is empty ({} examples); simulate fewer ranks", path, r, ranks,
                        total);
    Dataset& d = shards[static_cast<size_t>(r)];
    d.source = whole.source;
    d.features = whole.features;
    d.dense = whole.dense.middleCols(begin, end - begin);
    d.labels.assign(whole.labels.begin() + begin, whole.labels.begin() + end);
    d.globalOffset = begin;
    d.globalSize = total;
  }
  return shards;
}

}  // namespace

Shards loadShards(const TrainConfig& config, int ranks) {
  Shards s;
  int indexBase = -1;
  if (!isSyntheticSource(config.train)) indexBase = data::detectIndexBase(config.train, config.format);
  s.train = readShards(config.train, config, ranks, config.features, indexBase);
  int64_t maxLabel = -1;
  bool sparse = false;
  for (const Dataset& d : s.train) {
    ORPHEUS_CHECK_INPUT(d.size() >= 1, "a rank got no training examples from '{}'", config.train);
    checkTrainingShard(config, d);
    s.features = std::max(s.features, d.features);
    maxLabel = std::max<int64_t>(maxLabel, d.maxLabel());
    sparse = sparse || d.sparse;
  }
  for (Dataset& d : s.train) {
    if (d.sparse) {
      data::widen(d, s.features);
    } else {
      ORPHEUS_CHECK_INPUT(d.features == s.features, "training data '{}' has rows of {} and of {} features",
                          config.train, d.features, s.features);
    }
  }
  s.classes = config.classes > 0 ? config.classes : maxLabel + 1;
  ORPHEUS_CHECK_INPUT(maxLabel < s.classes, "training data '{}' has label {} but --classes is {} (labels 0..{})",
                      config.train, maxLabel, s.classes, s.classes - 1);
  if (config.test.empty()) return s;
  s.test = readShards(config.test, config, ranks, sparse ? s.features : -1, indexBase);
  for (Dataset& d : s.test) {
    checkDataKind("--test", config.test, d, config.model);
    if (d.sparse) data::widen(d, s.features);
    ORPHEUS_CHECK_INPUT(d.features == s.features, "test data '{}' has {} features but the training data '{}' has {}",
                        config.test, d.features, config.train, s.features);
    ORPHEUS_CHECK_INPUT(d.maxLabel() < s.classes, "test data '{}' has label {} but the model has {} classes",
                        config.test, d.maxLabel(), s.classes);
  }
  return s;
}

}  // namespace orpheus::engine::sim
