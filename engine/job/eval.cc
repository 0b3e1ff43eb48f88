// The single-process evaluation of a saved model (runEval, job.h).
#include "engine/job/job.h"
#include "engine/job/job_data.h"

#include "ckpt/model_file.h"
#include "engine/base/error.h"
#include "engine/data/synthetic_data.h"
#include "engine/failures.h"
#include "engine/metrics/metrics.h"
#include "engine/worker/worker.h"
#include "ops/model_factory.h"
#include "ops/sequence_layout.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

namespace orpheus::engine {

namespace {

// A spec's model: "mlr", or a .loss file's name ("graph DIR/mlp.loss features=..." gives "mlp.loss").
std::string modelNameOf(const std::string& spec) {
  std::istringstream words(spec);
  std::string kind, path;
  words >> kind;
  if (kind != "graph") return kind;
  words >> path;
  return std::filesystem::path(path).filename().string();
}

// Parameters that fit another model by name and shape are scored under it: said, since
// the scores are then of the model given, not of the one the file was trained as. The
// .loss texts are compared where the file recorded its digest (a renamed copy is the
// same model, an edited file under the same name is not); else the models' names.
void warnIfOtherModel(const EvalConfig& config, const ckpt::ModelFileInfo& info, const ops::Model& model) {
  const std::string& saved = info.modelSpec;
  const std::string given = model.spec();
  const bool texts = !info.modelDigest.empty() && !model.textDigest().empty();
  if (texts && info.modelDigest == model.textDigest()) return;
  if (texts && modelNameOf(saved) == modelNameOf(given)) {
    spdlog::warn("'{}' was trained with another text of '{}' (digest {} then, {} now): its parameters fit by name and "
                 "shape, and the scores are those of the file as it is now",
                 config.params, config.model, info.modelDigest, model.textDigest());
    return;
  }
  if (saved.empty() || (!texts && modelNameOf(saved) == modelNameOf(given))) return;
  spdlog::warn("'{}' was trained as model '{}' (its model_spec '{}') and is evaluated as '{}': its parameters fit by "
               "name and shape, and the scores are those of '{}'",
               config.params, modelNameOf(saved), saved, modelNameOf(given), config.model);
}

}  // namespace

int runEval(const EvalConfig& config) {
  checkInputExists("--test", config.test);
  ckpt::ModelFileInfo info;
  const ParamSet saved = ckpt::loadParams(config.params, &info);
  ORPHEUS_CHECK_INPUT(info.features >= 0 && info.classes >= 0,
                      "parameter file '{}': its features ({}) and classes ({}) attributes must not be negative",
                      config.params, info.features, info.classes);

  data::Dataset test;
  if (isSyntheticSource(config.test)) {
    // The training job's own test set: the same spec drawn from the job's seed.
    ORPHEUS_CHECK_INPUT(config.format == data::Format::kAuto && config.features <= 0,
                        "--format and --features apply to data files; synthetic data '{}' has neither", config.test);
    test = makeSyntheticShard(config.test, info.seed, 0, 1);
  } else {
    data::ReadOptions options;
    options.format = config.format;
    options.features = config.features > 0 ? config.features : info.features > 0 ? info.features : -1;
    const data::Format format = data::resolveFormat(config.test, config.format);
    if (format != data::Format::kLibsvm && config.features <= 0) options.features = -1;
    try {
      test = data::readDataset(config.test, options);
    } catch (const InputError& e) {
      // A width the file's attribute gave is named as its, not only the data's.
      if (config.features > 0 || options.features <= 0) throw;
      throw InputError(fmt::format("{} (the width of '{}''s features attribute, {})", e.what(), config.params,
                                   options.features));
    }
  }

  // The model's shape: from the file's attributes, else from its parameters (MLR) or the data.
  int64_t features = info.features > 0 ? info.features : test.features;
  int64_t classes = info.classes > 0 ? info.classes : test.maxLabel() + 1;
  if (config.model == "mlr" && info.features <= 0) {
    const int w = saved.find("W");
    ORPHEUS_CHECK_INPUT(w >= 0, "parameter file '{}' lacks the dataset 'W' of an MLR model", config.params);
    classes = saved[w].rows();
    features = saved[w].cols();
  }
  checkDataKind("--test", config.test, test, config.model);
  auto model = ops::makeModel({config.model, "", ""}, features, classes, info.seed);
  // The file's own features/classes attributes shape the model: where they disagree
  // with its parameters, the attributes are named (not the data), before the model's
  // parameters take any memory.
  const std::string shapedBy =
      info.features > 0 || info.classes > 0
          ? fmt::format(" at the file's attributes features={}, classes={}", features, classes)
          : std::string();
  for (const auto& spec : model->paramSpecs()) {
    const int i = saved.find(spec.name);
    ORPHEUS_CHECK_INPUT(i >= 0, "parameter file '{}' lacks the parameter '{}' of model '{}'", config.params, spec.name,
                        config.model);
    ORPHEUS_CHECK_INPUT(saved[i].rows() == spec.rows && saved[i].cols() == spec.cols,
                        "parameter '{}' in '{}' has shape {}x{}, but model '{}' expects {}x{}{}", spec.name,
                        config.params, saved[i].rows(), saved[i].cols(), config.model, spec.rows, spec.cols,
                        shapedBy);
  }
  // Parameters by name, in the model's order, with the model's shapes.
  ParamSet params = model->zeroParams();
  for (auto& p : params.params) p.value = saved[saved.find(p.name)];
  warnIfOtherModel(config, info, *model);

  if (test.steps > 0) {  // a token stream: its steps and words, not features
    ORPHEUS_CHECK_INPUT(config.features <= 0,
                        "--features applies to feature data; '{}' is a token stream (its header gives steps and "
                        "vocabulary)",
                        config.test);
    const int64_t steps = features - ops::segmentRows(0);
    ORPHEUS_CHECK_INPUT(test.features == features,
                        "--test '{}' has steps={}, the model '{}' was trained on steps={}: give a stream of the same "
                        "steps",
                        config.test, test.steps, config.params, steps);
    ORPHEUS_CHECK_INPUT(test.vocabulary <= classes,
                        "--test '{}' has vocabulary={}, more than the model's {} words", config.test, test.vocabulary,
                        classes);
  }
  if (test.sparse && test.features < features) data::widen(test, features);
  ORPHEUS_CHECK_INPUT(test.features == features, "test data '{}' has {} features but the model '{}' has {}",
                      config.test, test.features, config.params, features);
  ORPHEUS_CHECK_INPUT(test.maxLabel() < classes, "test data '{}' has label {} but the model has {} classes (labels 0..{})",
                      config.test, test.maxLabel(), classes, classes - 1);

  const ops::EvalSums sums = evaluateOn(*model, params, test);
  JsonLine line;
  line.add("params", config.params)
      .add("model_spec", info.modelSpec)
      .add("clock", info.clock)  // -1: unknown
      .add("examples", static_cast<int64_t>(sums.count))
      .add("test_loss", sums.lossSum / sums.count);
  if (model->reportsPerplexity()) line.add("test_perplexity", std::exp(sums.lossSum / sums.count));
  if (model->hasAccuracy()) line.add("test_accuracy", sums.correct / sums.count);
  std::printf("%s\n", line.str().c_str());
  return 0;
}

}  // namespace orpheus::engine
