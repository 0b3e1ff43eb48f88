#include "ops/model_factory.h"

#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "ops/mlr.h"

#include <fmt/format.h>

namespace orpheus::ops {

std::unique_ptr<Model> makeModel(const ModelSource& source, int64_t features, int64_t classes, uint64_t seed) {
  if (source.name == "mlr") return std::make_unique<MultinomialLogisticRegression>(features, classes);
  const LossDims dims{features, classes};
  if (!source.text.empty()) {
    return std::make_unique<GraphModel>(parseLoss(source.text, source.name, dims), source.spec, seed,
                                        textDigest(source.text));
  }
  if (source.name.size() > 5 && source.name.ends_with(".loss")) {
    return GraphModel::fromFile(source.name, dims, seed);
  }
  throw InputError(fmt::format("unknown model '{}' (a .loss file, or the built-in 'mlr')", source.name));
}

}  // namespace orpheus::ops
