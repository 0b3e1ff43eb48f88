// The one model factory: what `--model` names, built for data of a given shape.
#pragma once

#include "ops/model.h"

#include <cstdint>
#include <memory>
#include <string>

namespace orpheus::ops {

// What a model is built from: its name as given ("mlr" or a .loss path) and, for a
// .loss model a checkpoint recorded, the file's text and the spec it had then
// (the file itself may be gone or changed since).
struct ModelSource {
  std::string name;
  std::string text;  // empty: read the .loss file `name`
  std::string spec;  // with `text`
};

// The one model factory: the built-in MLR or a .loss model, for data of the given
// shape. InputError naming the model when it is neither.
std::unique_ptr<Model> makeModel(const ModelSource& source, int64_t features, int64_t classes, uint64_t seed);

}  // namespace orpheus::ops
