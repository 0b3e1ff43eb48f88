#include "engine/job/job_data.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/data/synthetic_data.h"
#include "engine/failures.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>

namespace orpheus::engine {
namespace {


// Whether a .loss file declares a `sequence` input (a model unrolled over time steps).
bool declaresSequence(const std::string& path) {
  if (!path.ends_with(".loss")) return false;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find_first_not_of(" \t");
    if (at != std::string::npos && line.compare(at, 9, "sequence ") == 0) return true;
  }
  return false;
}

}  // namespace

// The training shard, then the shape every rank agrees on: the widest rows, the
// largest label.
void loadTrainShard(const TrainConfig& config, comm::Transport& transport, Shards& shards) {
  data::Dataset& train = shards.train;
  collectively(transport, [&] {
    if (!isSyntheticSource(config.train)) shards.indexBase = data::detectIndexBase(config.train, config.format);
    train = readShard(config.train, config, transport.rank(), transport.size(), config.features, shards.indexBase);
    checkTrainingShard(config, train);
  });
  double shape[3] = {static_cast<double>(train.features), static_cast<double>(train.maxLabel()),
                     train.sparse ? 1.0 : 0.0};
  transport.control().max(shape);
  double minFeatures[1] = {static_cast<double>(train.features)};
  transport.control().min(minFeatures);
  const auto features = static_cast<int64_t>(shape[0]);
  collectively(transport, [&] {
    if (train.sparse) {
      data::widen(train, features);
    } else {
      ORPHEUS_CHECK_INPUT(static_cast<int64_t>(minFeatures[0]) == features,
                          "training data '{}' has rows of {} and of {} features", config.train,
                          static_cast<int64_t>(minFeatures[0]), features);
    }
  });
  const auto maxLabel = static_cast<int64_t>(shape[1]);
  const int64_t classes = config.classes > 0 ? config.classes : maxLabel + 1;
  collectively(transport, [&] {
    ORPHEUS_CHECK_INPUT(maxLabel < classes, "training data '{}' has label {} but --classes is {} (labels 0..{})",
                        config.train, maxLabel, classes, classes - 1);
    ORPHEUS_CHECK_INPUT(train.size() >= 1, "rank {} got no training examples from '{}'", transport.rank(),
                        config.train);
  });
  shards.features = features;
  shards.classes = classes;
  // The minibatches in flight (the one being trained on and the prefetched ones)
  // must fit, whatever --batch says.
  collectively(transport, [&] {
    const double perExample = train.sparse ? 64.0 : 4.0 * static_cast<double>(features) + 16.0;
    checkFitsInMemory(3.0 * static_cast<double>(config.batch) * perExample,
                      fmt::format("--batch {}: three minibatches of {} examples of {} features", config.batch,
                                  config.batch, features),
                      0.5);
  });
}

// The test shard, read to the training data's width.
void loadTestShard(const TrainConfig& config, comm::Transport& transport, Shards& shards) {
  shards.haveTest = !config.test.empty();
  if (!shards.haveTest) return;
  const int64_t features = shards.features;
  const int64_t classes = shards.classes;
  data::Dataset& test = shards.test;
  collectively(transport, [&] {
    test = readShard(config.test, config, transport.rank(), transport.size(), shards.train.sparse ? features : -1, shards.indexBase);
    checkDataKind("--test", config.test, test, config.model);
    if (test.sparse) {
      ORPHEUS_CHECK_INPUT(test.features <= features,
                          "test data '{}' has {} features but the training data has {} (set --features)",
                          config.test, test.features, features);
      data::widen(test, features);
    }
    if (test.steps > 0 || shards.train.steps > 0) {  // token streams: their segments and words, not features
      ORPHEUS_CHECK_INPUT(test.steps == shards.train.steps,
                          "--test '{}' has steps={}, the training stream '{}' steps={}: give both the same", config.test,
                          test.steps, config.train, shards.train.steps);
      ORPHEUS_CHECK_INPUT(test.vocabulary <= classes,
                          "--test '{}' has vocabulary={}, more than the model's {} words (the training stream's "
                          "vocabulary)",
                          config.test, test.vocabulary, classes);
    }
    ORPHEUS_CHECK_INPUT(test.features == features, "test data '{}' has {} features but the training data '{}' has {}",
                        config.test, test.features, config.train, features);
    ORPHEUS_CHECK_INPUT(test.maxLabel() < classes,
                        "test data '{}' has label {} but the model has {} classes (labels 0..{})", config.test,
                        test.maxLabel(), classes, classes - 1);
  });
}

// Reads this epoch's shards over `group`: the same shape as the job's model.
std::unique_ptr<Shards> reshard(const TrainConfig& config, comm::Transport& group, int64_t features,
                                int64_t classes) {
  auto shards = std::make_unique<Shards>();
  loadTrainShard(config, group, *shards);
  loadTestShard(config, group, *shards);
  collectively(group, [&] {
    if (features > 0 && (shards->features != features || shards->classes != classes)) {
      throw Error(fmt::format("the resharded data has {} features and {} classes, the job's model {} and {}",
                              shards->features, shards->classes, features, classes));
    }
  });
  return shards;
}

data::Dataset readShard(const std::string& path, const TrainConfig& config, int rank, int ranks, int64_t features,
                        int indexBase) {
  if (isSyntheticSource(path)) {
    // Its spec sets its shape: a --format or --features meant for a file would be ignored.
    ORPHEUS_CHECK_INPUT(config.format == data::Format::kAuto,
                        "--format applies to data files; synthetic data '{}' has none (drop --format)", path);
    ORPHEUS_CHECK_INPUT(config.features <= 0, "--features {} applies to LIBSVM and CSV files; synthetic data '{}' sets "
                        "its width with features=D", config.features, path);
    return makeSyntheticShard(path, config.seed, rank, ranks);
  }
  data::ReadOptions options;
  options.format = config.format;
  options.rank = rank;
  options.worldSize = ranks;
  options.features = features;
  options.indexBase = indexBase;
  options.streams = config.batch;  // token streams: minibatch column b continues stream b
  return data::readDataset(path, options);
}

void checkTrainingShard(const TrainConfig& config, const data::Dataset& train) {
  checkDataKind("--train", config.train, train, config.model);
  ORPHEUS_CHECK_INPUT(config.features <= 0 || train.streams == 0,
                      "--features {} applies to LIBSVM and CSV files; the token stream '{}' sets its vocabulary in "
                      "its header (drop --features)", config.features, config.train);
  ORPHEUS_CHECK_INPUT(config.classes <= 0 || train.streams == 0,
                      "--classes {} applies to labelled examples; the token stream '{}' sets its words in its header's "
                      "vocabulary= (drop --classes)", config.classes, config.train);
  ORPHEUS_CHECK_INPUT(!config.balance || train.streams == 0,
                      "--balance moves rows between ranks, but the token streams of '{}' stay on theirs", config.train);
}

void configureModel(const TrainConfig& config, ops::Model& model, int64_t steps) {
  // Each matrix's sites a clock (a sequence model's: one a step, or more where a step uses it twice).
  std::map<std::pair<uint32_t, int32_t>, int64_t> uses;
  for (const auto& site : model.svSites()) ++uses[{site.paramId, site.biasId}];
  const std::vector<ops::ParamSpec> specs = model.paramSpecs();
  if (config.selectUnit == ops::Model::SvgUnit::kStep) {
    ORPHEUS_CHECK_INPUT(model.carriesState(),
                        "--select-unit step selects (example, step) pairs: model '{}' has no steps", config.model);
    // A pair's SV column holds one site of every matrix: a matrix used twice a step
    // (W h and W tanh(h)) has two columns a pair and no single one to send.
    for (const auto& [key, n] : uses) {
      const auto& [first, firstN] = *uses.begin();
      ORPHEUS_CHECK_INPUT(n == firstN,
                          "--select-unit step needs every matrix used once a step: model '{}' uses '{}' at {} "
                          "sites of a clock and '{}' at {} (use --select-unit example)",
                          config.model, specs.at(key.first).name, n, specs.at(first.first).name, firstN);
    }
    model.setSvgUnit(config.selectUnit);
    const int64_t svgs = svgsPerClock(config, steps);
    ORPHEUS_CHECK_INPUT(config.select <= svgs,
                        "--select {} must be at most B*T = {} with --select-unit step ({} examples of {} steps)",
                        config.select, svgs, config.batch, steps);
    ORPHEUS_CHECK_INPUT(!config.adapt || config.adaptSelect.second <= svgs,
                        "--adapt-select {}:{} must lie in 1:{}, the B*T with --select-unit step ({} examples of {} "
                        "steps)",
                        config.adaptSelect.first, config.adaptSelect.second, svgs, config.batch, steps);
  }
  // --sv-rank R sends R + 1 SVGs a matrix in place of its columns: a clock's batch
  // times its sites (all of a parameter's steps are compressed as one matrix).
  if (config.svRank > 0 && config.sync == SyncMode::kSv) {
    int64_t sites = 1;
    if (!uses.empty()) {
      sites = std::min_element(uses.begin(), uses.end(), [](const auto& a, const auto& b) {
                return a.second < b.second;
              })->second;
    }
    const int64_t columns = config.batch * sites;
    const std::string without =
        steps > 0 ? fmt::format("the B*T = {} a clock sends without it ({} examples of {} steps)", columns,
                                config.batch, sites)
                  : fmt::format("the {} a clock sends at --batch {} without it", columns, config.batch);
    ORPHEUS_CHECK_INPUT(config.svRank + 1 < columns, "--sv-rank {} sends {} SVGs per matrix, no fewer than {}: {}",
                        config.svRank, config.svRank + 1, without,
                        columns >= 3 ? fmt::format("give --sv-rank {} or less", columns - 2)
                                     : std::string("--sv-rank needs --batch 3 or more"));
  }
  ORPHEUS_CHECK_INPUT(!config.balance || !model.carriesState(),
                      "--balance changes each rank's minibatch size, but model '{}' carries state from one "
                      "minibatch to the next", config.model);
  ORPHEUS_CHECK_INPUT(config.targetAccuracy == 0.0 || model.hasAccuracy(),
                      "--target-accuracy {}: model '{}' predicts no class (it has no 'predict'), so it has no "
                      "accuracy to reach", config.targetAccuracy, config.model);
  ORPHEUS_CHECK_INPUT(!config.balance || !model.keepsPerExample(),
                      "--balance moves rows between ranks, but model '{}' keeps data-dependent variables (its "
                      "'local's) for each row of a rank's shard", config.model);
}

void checkLabelsFit(const char* flag, const std::string& path, const data::Dataset& data, const ops::Model& model,
                    const std::string& name) {
  const int64_t count = model.labelCount();
  if (count < 0 || data.maxLabel() < count) return;
  ORPHEUS_CHECK_INPUT(data.steps == 0, "{} '{}' has word {}, but model '{}' takes words 0..{} ({})", flag, path,
                      data.maxLabel(), name, count - 1, model.labelName());
  throw InputError(fmt::format("{} '{}' has label {}, but model '{}' takes labels 0..{} ({})", flag, path,
                               data.maxLabel(), name, count - 1, model.labelName()));
}

void checkDataKind(const char* flag, const std::string& path, const data::Dataset& data, const std::string& model) {
  // A sequence model reads token streams; other data would be unrolled as if its rows were segments.
  const bool sequence = declaresSequence(model);
  ORPHEUS_CHECK_INPUT(data.steps > 0 || !sequence,
                      "model '{}' is a sequence model: it reads token streams ('#orpheus-tokens' files, "
                      "scripts/data/make_tokens.sh), and {} '{}' is not one",
                      model, flag, path);
  // A token stream is a sequence model's data; any other model would read its encoding as features.
  ORPHEUS_CHECK_INPUT(data.steps == 0 || sequence,
                      "{} '{}' is a token stream, but model '{}' takes feature vectors (token streams are for "
                      "sequence models such as examples/lstm.loss)",
                      flag, path, model);
}

}  // namespace orpheus::engine
