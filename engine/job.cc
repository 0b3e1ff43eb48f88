#include "engine/job.h"

#include "ckpt/model_file.h"
#include "engine/base/error.h"
#include "engine/checkpoint.h"
#include "engine/metrics.h"
#include "engine/synthetic_data.h"
#include "engine/worker.h"
#include "ops/graph_model.h"
#include "ops/mlr.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orpheus::engine {
namespace {

data::Dataset readShard(const std::string& path, const TrainConfig& config, const comm::Transport& transport,
                        int64_t features, int indexBase) {
  if (isSyntheticSource(path)) {
    return makeSyntheticShard(path, config.seed, transport.rank(), transport.size());
  }
  data::ReadOptions options;
  options.format = config.format;
  options.rank = transport.rank();
  options.worldSize = transport.size();
  options.features = features;
  options.indexBase = indexBase;
  return data::readDataset(path, options);
}

}  // namespace

void collectively(comm::Transport& transport, const std::function<void()>& step) {
  std::string message;
  int code = 0;
  try {
    step();
  } catch (const std::exception& e) {
    message = e.what();
    code = exitCodeFor(e);
  }
  const int size = transport.size();
  double agree[2] = {code != 0 ? static_cast<double>(transport.rank()) : static_cast<double>(size),
                     static_cast<double>(code)};
  transport.control().min({agree, 1});
  double worst[1] = {static_cast<double>(code)};
  transport.control().max(worst);
  if (agree[0] < size) {
    if (static_cast<int>(agree[0]) == transport.rank()) reportError(message);
    throw JobFailed(static_cast<int>(worst[0]));
  }
}

int exitCodeFor(const std::exception& e) {
  if (const auto* failed = dynamic_cast<const JobFailed*>(&e)) return failed->code();
  return dynamic_cast<const InputError*>(&e) != nullptr ? 2 : 1;
}

void reportError(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "orpheus: %s\n", message.c_str());
  std::fflush(stderr);
}

std::unique_ptr<ops::Model> makeModel(const std::string& name, int64_t features, int64_t classes, uint64_t seed) {
  if (name == "mlr") return std::make_unique<ops::MultinomialLogisticRegression>(features, classes);
  if (name.size() > 5 && name.ends_with(".loss")) {
    return ops::GraphModel::fromFile(name, ops::LossDims{features, classes}, seed);
  }
  throw InputError(fmt::format("unknown model '{}' (a .loss file, or the built-in 'mlr')", name));
}

int runTrain(const TrainConfig& config, comm::Transport& transport) {
  transport.setTimeout(std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000)));
  const bool leader = transport.rank() == 0;

  collectively(transport, [&] {
    validate(config, transport.size());
    if (config.ckptSv || config.resume) {
      ORPHEUS_CHECK_INPUT(!config.ckptDir.empty(), "--ckpt sv and --resume need --ckpt-dir DIR");
      ORPHEUS_CHECK_INPUT(config.sync == SyncMode::kSv, "--ckpt sv logs SV batches: it needs --sync sv");
    }
    if (config.resume) {
      ORPHEUS_CHECK_INPUT(std::filesystem::exists(std::filesystem::path(config.ckptDir) / "job.h5"),
                          "--resume: '{}' holds no checkpoint (no job.h5)", config.ckptDir);
      ORPHEUS_CHECK_INPUT(config.consistency == Consistency::kBsp,
                          "--resume continues a job exactly only under --consistency bsp");
    }
  });

  // Training shard, then the shape every rank agrees on.
  data::Dataset train;
  int indexBase = -1;
  collectively(transport, [&] {
    if (!isSyntheticSource(config.train)) {
      indexBase = data::detectIndexBase(config.train, config.format);
    }
    train = readShard(config.train, config, transport, config.features, indexBase);
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
  const int64_t maxLabel = static_cast<int64_t>(shape[1]);
  const int64_t classes = config.classes > 0 ? config.classes : maxLabel + 1;
  collectively(transport, [&] {
    ORPHEUS_CHECK_INPUT(maxLabel < classes, "training data '{}' has label {} but --classes is {} (labels 0..{})",
                        config.train, maxLabel, classes, classes - 1);
    ORPHEUS_CHECK_INPUT(train.size() >= 1, "rank {} got no training examples from '{}'", transport.rank(),
                        config.train);
  });

  // Test shard, read to the training data's width.
  data::Dataset test;
  const bool haveTest = !config.test.empty();
  if (haveTest) {
    collectively(transport, [&] {
      test = readShard(config.test, config, transport, train.sparse ? features : -1, indexBase);
      if (test.sparse) {
        ORPHEUS_CHECK_INPUT(test.features <= features,
                            "test data '{}' has {} features but the training data has {} (set --features)",
                            config.test, test.features, features);
        data::widen(test, features);
      }
      ORPHEUS_CHECK_INPUT(test.features == features, "test data '{}' has {} features but the training data '{}' has {}",
                          config.test, test.features, config.train, features);
      ORPHEUS_CHECK_INPUT(test.maxLabel() < classes,
                          "test data '{}' has label {} but the model has {} classes (labels 0..{})", config.test,
                          test.maxLabel(), classes, classes - 1);
    });
  }

  std::unique_ptr<ops::Model> model;
  std::unique_ptr<MetricsWriter> metrics;
  collectively(transport, [&] {
    model = makeModel(config.model, features, classes, config.seed);
    metrics = std::make_unique<MetricsWriter>(leader ? config.metrics : std::string());
    if (leader && !config.save.empty()) {
      const auto dir = std::filesystem::path(config.save).parent_path();
      ORPHEUS_CHECK_INPUT(dir.empty() || std::filesystem::is_directory(dir),
                          "cannot save the model to '{}': directory '{}' does not exist", config.save, dir.string());
    }
  });
  double counts[2] = {static_cast<double>(train.size()), static_cast<double>(test.size())};
  transport.control().sum(counts);
  if (leader) {
    spdlog::info("{} ranks, {} over {} ({} training examples, {} test), sync {}, {} clocks of {} per rank",
                 transport.size(), model->spec(), transport.name(), static_cast<int64_t>(counts[0]),
                 static_cast<int64_t>(counts[1]), toString(config.sync), config.clocks, config.batch);
    if (config.sync == SyncMode::kSv && transport.size() > 1) {
      spdlog::info("{}; {} consistency{}; {}", comm::MulticastSchedule(comm::ScheduleConfig{
                                                                       config.multicast, transport.size(),
                                                                       config.multicast == comm::MulticastKind::kAll
                                                                           ? transport.size() - 1
                                                                           : config.fanout,
                                                                       config.seed, config.dropLinks})
                                                   .describe(),
                   toString(config.consistency),
                   config.consistency == Consistency::kSsp ? fmt::format(" (staleness {})", config.staleness) : "",
                   config.select > 0 ? fmt::format("{} of {} SVGs sent per clock", config.select, config.batch)
                                     : "every SVG sent");
    }
  }

  if (leader && transport.size() == 1 && (config.averageEvery > 0 || config.rotateEvery > 0)) {
    spdlog::warn("one rank: --average-every and --rotate-every have nothing to do");
  }
  if (!config.saveReplicas.empty()) {
    collectively(transport, [&] {
      ORPHEUS_CHECK_INPUT(std::filesystem::is_directory(config.saveReplicas),
                          "cannot save replicas to '{}': not a directory", config.saveReplicas);
    });
  }

  // The incremental SV checkpoint: a fresh job records what it is; a resumed one
  // continues from the newest clock every replica's log reaches.
  uint64_t resumeClock = 0;
  if (config.ckptSv) {
    collectively(transport, [&] {
      if (config.resume) {
        if (leader) {
          const ckpt::Inventory inv = ckpt::inspect(config.ckptDir);
          resumeClock = resumableClock(inv);
          discardAfter(config.ckptDir, resumeClock);
        }
      } else if (leader) {
        std::error_code ec;
        std::filesystem::create_directories(config.ckptDir, ec);
        if (ec) throw IoError(fmt::format("cannot create checkpoint directory '{}': {}", config.ckptDir, ec.message()));
        ckpt::JobInfo info;
        info.modelName = config.model;
        if (config.model.ends_with(".loss")) {
          std::ifstream in(config.model);
          std::stringstream text;
          text << in.rdbuf();
          info.modelText = text.str();
        }
        info.modelSpec = model->spec();
        info.features = features;
        info.classes = classes;
        info.seed = config.seed;
        info.ranks = transport.size();
        info.batch = config.batch;
        info.lr = config.lr;
        ckpt::writeJobInfo(config.ckptDir, info);
      }
    });
    double shared[1] = {static_cast<double>(resumeClock)};
    transport.control().sum(shared);
    resumeClock = static_cast<uint64_t>(shared[0]);
  }

  Worker worker(config, *model, transport, train, haveTest ? &test : nullptr);
  if (config.resume && resumeClock > 0) {
    collectively(transport, [&] {
      const int id = replicaHeldAt(transport.rank(), transport.size(), resumeClock, config.rotateEvery);
      Restored r = restore(config.ckptDir, id, resumeClock);
      worker.resumeFrom(resumeClock, std::move(r.params), id);
    });
    if (leader) spdlog::info("resumed from clock {} of '{}'", resumeClock, config.ckptDir);
  }
  try {
    worker.run(*metrics);
  } catch (const JobFailed&) {
    throw;  // reported once, every rank stops
  } catch (const std::exception& e) {
    // Peers cannot know about this rank's failure: report it and end the job.
    reportError(e.what());
    transport.control().abortJob(exitCodeFor(e));
  }

  ckpt::ModelFileInfo info;
  info.modelSpec = model->spec();
  info.clock = static_cast<int64_t>(worker.lastClock());
  info.seed = config.seed;
  info.features = features;
  info.classes = classes;
  info.replica = worker.replicaId();
  if (!config.saveReplicas.empty()) {
    ckpt::saveParams(fmt::format("{}/replica-{}.h5", config.saveReplicas, worker.replicaId()), worker.replica(), info);
  }
  if (leader) {
    if (!config.save.empty()) ckpt::saveParams(config.save, worker.replica(), info);
    const EvalResult& eval = worker.lastEval();
    std::printf("trained %s on %d ranks: %lld clocks in %.2f s", model->spec().c_str(), transport.size(),
                static_cast<long long>(worker.lastClock()), worker.trainSeconds());
    if (haveTest && model->hasAccuracy()) std::printf(", test accuracy %.4f", eval.accuracy);
    if (haveTest) std::printf(", test loss %.4f", eval.loss);
    std::printf("\n");
    if (!config.metrics.empty()) std::printf("metrics: %s\n", config.metrics.c_str());
    if (!config.save.empty()) std::printf("model: %s\n", config.save.c_str());
    std::fflush(stdout);
  }
  return 0;
}

int runEval(const EvalConfig& config) {
  ckpt::ModelFileInfo info;
  const ParamSet saved = ckpt::loadParams(config.params, &info);

  data::ReadOptions options;
  options.format = config.format;
  options.features = config.features > 0 ? config.features : info.features;
  const data::Format format = data::resolveFormat(config.test, config.format);
  if (format != data::Format::kLibsvm && config.features <= 0) options.features = -1;
  data::Dataset test = data::readDataset(config.test, options);

  // The model's shape: from the file's attributes, else from its parameters (MLR) or the data.
  int64_t features = info.features > 0 ? info.features : test.features;
  int64_t classes = info.classes > 0 ? info.classes : test.maxLabel() + 1;
  if (config.model == "mlr" && info.features <= 0) {
    const int w = saved.find("W");
    ORPHEUS_CHECK_INPUT(w >= 0, "parameter file '{}' lacks the dataset 'W' of an MLR model", config.params);
    classes = saved[w].rows();
    features = saved[w].cols();
  }
  auto model = makeModel(config.model, features, classes, info.seed);
  // Parameters by name, in the model's order, with the model's shapes.
  ParamSet params = model->zeroParams();
  for (auto& p : params.params) {
    const int i = saved.find(p.name);
    ORPHEUS_CHECK_INPUT(i >= 0, "parameter file '{}' lacks the parameter '{}' of model '{}'", config.params, p.name,
                        config.model);
    ORPHEUS_CHECK_INPUT(saved[i].rows() == p.value.rows() && saved[i].cols() == p.value.cols(),
                        "parameter '{}' in '{}' has shape {}x{}, but model '{}' expects {}x{}", p.name, config.params,
                        saved[i].rows(), saved[i].cols(), config.model, p.value.rows(), p.value.cols());
    p.value = saved[i];
  }

  if (test.sparse && test.features < features) data::widen(test, features);
  ORPHEUS_CHECK_INPUT(test.features == features, "test data '{}' has {} features but the model '{}' has {}",
                      config.test, test.features, config.params, features);
  ORPHEUS_CHECK_INPUT(test.maxLabel() < classes, "test data '{}' has label {} but the model has {} classes (labels 0..{})",
                      config.test, test.maxLabel(), classes, classes - 1);

  ops::EvalSums sums;
  for (int64_t begin = 0; begin < test.size(); begin += 2000) {
    const data::Batch chunk = data::slice(test, begin, std::min(test.size(), begin + 2000));
    const ops::EvalSums part = model->evaluate(params, view(chunk));
    sums.lossSum += part.lossSum;
    sums.correct += part.correct;
    sums.count += part.count;
  }
  JsonLine line;
  line.add("params", config.params)
      .add("model_spec", info.modelSpec)
      .add("clock", info.clock)
      .add("examples", static_cast<int64_t>(sums.count))
      .add("test_loss", sums.lossSum / sums.count);
  if (model->hasAccuracy()) line.add("test_accuracy", sums.correct / sums.count);
  std::printf("%s\n", line.str().c_str());
  return 0;
}

}  // namespace orpheus::engine
