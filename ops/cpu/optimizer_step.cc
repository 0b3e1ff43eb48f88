#include "ops/cpu/optimizer_step.h"

#include <Eigen/Dense>

#include <cstdint>

namespace orpheus::ops::cpu {
namespace {

using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;

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

// Every other kind, as Eigen expressions. Eigen runs an expression in packets from
// the first element of its destination at an aligned one (else from the first
// aligned element on), and its packet square root approximates (EIGEN_FAST_MATH),
// so where the packets start shows in adagrad's and adam's last bits: the
// destinations (param and the buffers) must be aligned.
void expressionStep(const OptimizerStep& s, int64_t n, const float* gradient, float* param, float* buffer0,
                    float* buffer1) {
  ArrayMap w(param, n);
  // d = g + wd w (L2 weight decay on the gradient).
  Eigen::ArrayXf d = ConstArrayMap(gradient, n);
  if (s.weightDecay != 0.0f) d += s.weightDecay * w;
  switch (s.kind) {
    case OptimizerStep::Kind::kSgd:
      w -= s.lr * d;
      break;
    case OptimizerStep::Kind::kMomentum:
    case OptimizerStep::Kind::kNesterov:
      break;  // above
    case OptimizerStep::Kind::kAdagrad: {
      ArrayMap sum(buffer0, n);
      sum += d * d;
      w -= s.lr * d / (sum.sqrt() + s.eps);
      break;
    }
    case OptimizerStep::Kind::kAdam: {
      ArrayMap m(buffer0, n);
      ArrayMap v(buffer1, n);
      const float b1 = s.beta1, b2 = s.beta2;
      m = b1 * m + (1.0f - b1) * d;
      v = b2 * v + (1.0f - b2) * d * d;
      w -= s.adamStepSize * m / (v.sqrt() / s.adamBc2Sqrt + s.eps);
      break;
    }
  }
}

bool aligned(const float* p) { return reinterpret_cast<uintptr_t>(p) % EIGEN_DEFAULT_ALIGN_BYTES == 0; }

}  // namespace

void applyOptimizerStep(const OptimizerStep& s, int64_t n, const float* gradient, float* param, float* buffer0,
                        float* buffer1) {
  if (n == 0) return;
  if (s.kind == OptimizerStep::Kind::kMomentum || s.kind == OptimizerStep::Kind::kNesterov) {
    momentumStep(s, n, gradient, param, buffer0);
    return;
  }
  const int buffers = optimizerBuffers(s.kind);
  if (aligned(param) && (buffers < 1 || aligned(buffer0)) && (buffers < 2 || aligned(buffer1))) {
    expressionStep(s, n, gradient, param, buffer0, buffer1);
    return;
  }
  // A view that starts inside an allocation (Tensor::middleCols): stepped in aligned
  // copies, so that the bits do not depend on where a matrix lies.
  Eigen::ArrayXf w = ArrayMap(param, n);
  Eigen::ArrayXf b0 = buffers >= 1 ? Eigen::ArrayXf(ArrayMap(buffer0, n)) : Eigen::ArrayXf();
  Eigen::ArrayXf b1 = buffers >= 2 ? Eigen::ArrayXf(ArrayMap(buffer1, n)) : Eigen::ArrayXf();
  expressionStep(s, n, gradient, w.data(), b0.data(), b1.data());
  ArrayMap(param, n) = w;
  if (buffers >= 1) ArrayMap(buffer0, n) = b0;
  if (buffers >= 2) ArrayMap(buffer1, n) = b1;
}

}  // namespace orpheus::ops::cpu
