#include "ops/cpu/optimizer_step.h"

#include <cmath>
#include <cstdint>

namespace orpheus::ops::cpu {
namespace {

// Momentum and Nesterov in one pass over the parameter, its gradient and its buffer.
void momentumStep(const OptimizerStep& s, int64_t n, const float* g, float* w, float* b) {
  const float lr = s.lr;
  const float wd = s.weightDecay;
  const float mu = s.momentum;
  const bool nesterov = s.kind == OptimizerStep::Kind::kNesterov;
  for (int64_t k = 0; k < n; ++k) {
    const float d = wd != 0.0f ? g[k] + wd * w[k] : g[k];  // L2 weight decay on the gradient
    const float next = mu * b[k] + d;
    b[k] = next;
    w[k] -= lr * (nesterov ? d + mu * next : next);
  }
}

// Every other kind, element by element with IEEE square roots (std::sqrt: exact,
// like the packet square root the compiler vectorizes it into, ops/CMakeLists.txt
// builds this file with -fno-math-errno), so every element's bits are the same
// wherever it lies and however many elements a call steps: a whole matrix, one
// column of it (adagrad's touched columns) or a view inside an allocation.
void elementStep(const OptimizerStep& s, int64_t n, const float* g, float* w, float* b0, float* b1) {
  const float lr = s.lr;
  const float wd = s.weightDecay;
  const float eps = s.eps;
  switch (s.kind) {
    case OptimizerStep::Kind::kSgd:
      for (int64_t k = 0; k < n; ++k) {
        const float d = wd != 0.0f ? g[k] + wd * w[k] : g[k];
        w[k] -= lr * d;
      }
      break;
    case OptimizerStep::Kind::kMomentum:
    case OptimizerStep::Kind::kNesterov:
      break;  // momentumStep
    case OptimizerStep::Kind::kAdagrad:
      for (int64_t k = 0; k < n; ++k) {
        const float d = wd != 0.0f ? g[k] + wd * w[k] : g[k];
        const float sum = b0[k] + d * d;
        b0[k] = sum;
        w[k] -= lr * d / (std::sqrt(sum) + eps);
      }
      break;
    case OptimizerStep::Kind::kAdam: {
      const float beta1 = s.beta1, beta2 = s.beta2;
      const float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
      for (int64_t k = 0; k < n; ++k) {
        const float d = wd != 0.0f ? g[k] + wd * w[k] : g[k];
        const float m = beta1 * b0[k] + c1 * d;
        const float v = beta2 * b1[k] + c2 * d * d;
        b0[k] = m;
        b1[k] = v;
        w[k] -= s.adamStepSize * m / (std::sqrt(v) / s.adamBc2Sqrt + eps);
      }
      break;
    }
  }
}

}  // namespace

void applyOptimizerStep(const OptimizerStep& s, int64_t n, const float* gradient, float* param, float* buffer0,
                        float* buffer1) {
  if (n == 0) return;
  if (s.kind == OptimizerStep::Kind::kMomentum || s.kind == OptimizerStep::Kind::kNesterov) {
    momentumStep(s, n, gradient, param, buffer0);
    return;
  }
  elementStep(s, n, gradient, param, buffer0, buffer1);
}

}  // namespace orpheus::ops::cpu
