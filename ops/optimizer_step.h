// The settings of one optimizer step on one parameter matrix (Backend::optimizerStep).
// Dependency-free so CUDA kernels can include it.
//
// Per element, with g the gradient, w the parameter, b0 and b1 the state buffers
// (engine/worker/optimizer.h has the optimizers these are):
//   every kind d  = g + weightDecay w   (just g when weightDecay is 0)
//   kSgd       w -= lr d
//   kMomentum  b0 = momentum b0 + d;  w -= lr b0
//   kNesterov  b0 = momentum b0 + d;  w -= lr (d + momentum b0)
//   kAdagrad   b0 += d d;             w -= lr d / (sqrt(b0) + eps)
//   kAdam      b0 = beta1 b0 + (1 - beta1) d;  b1 = beta2 b1 + (1 - beta2) d d;
//              w -= adamStepSize b0 / (sqrt(b1) / adamBc2Sqrt + eps)
#pragma once

#include <cstdint>

namespace orpheus::ops {

struct OptimizerStep {
  enum class Kind : uint8_t { kSgd, kMomentum, kNesterov, kAdagrad, kAdam } kind = Kind::kSgd;
  float lr = 0;
  float weightDecay = 0;
  float momentum = 0;
  float eps = 0;
  float beta1 = 0;
  float beta2 = 0;
  // Adam's bias corrections at step t, computed by the caller (in double, rounded once):
  float adamStepSize = 0;  // lr / (1 - beta1^t)
  float adamBc2Sqrt = 0;   // sqrt(1 - beta2^t)
};

// How many state buffers a kind reads and writes (b0, then b1).
constexpr int optimizerBuffers(OptimizerStep::Kind kind) {
  switch (kind) {
    case OptimizerStep::Kind::kSgd: return 0;
    case OptimizerStep::Kind::kMomentum:
    case OptimizerStep::Kind::kNesterov:
    case OptimizerStep::Kind::kAdagrad: return 1;
    case OptimizerStep::Kind::kAdam: return 2;
  }
  return 0;
}

}  // namespace orpheus::ops
