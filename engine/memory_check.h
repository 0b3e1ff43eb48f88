// Whether a job fits this machine's memory, checked before its first clock (the
// training job and the simulator both ask).
#pragma once

#include "engine/config.h"
#include "ops/model.h"

#include <cstdint>

namespace orpheus::engine {

// What a process needs for `replicas` replicas of `model` (parameters, the update
// buffer, the optimizer's state, the rebuild's operands) and, for `running` of them
// at once, their minibatches in flight and their outputs (batch x steps x classes
// probabilities and gradients): an InputError that names the parts, before the first
// clock, when that passes half of this machine's memory.
struct DataShape {
  int64_t features = 0;
  int64_t classes = 0;
  int64_t steps = 0;  // token streams: steps per segment; 0 otherwise
  bool sparse = false;
};
void checkJobMemory(const TrainConfig& config, const ops::Model& model, const DataShape& data, int replicas,
                    int running);

}  // namespace orpheus::engine
