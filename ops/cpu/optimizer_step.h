// The host arithmetic of one optimizer step (ops/optimizer_step.h): the one
// implementation behind the CPU and strict backends' optimizerStep and the
// engine's Optimizer::step, so all three give the same bits.
#pragma once

#include "ops/optimizer_step.h"

#include <cstdint>

namespace orpheus::ops::cpu {

// One step on n contiguous elements: param, buffer0 and buffer1 are updated in
// place (the buffers s.kind does not use may be null). No pointer may alias another.
void applyOptimizerStep(const OptimizerStep& s, int64_t n, const float* gradient, float* param, float* buffer0,
                        float* buffer1);

}  // namespace orpheus::ops::cpu
