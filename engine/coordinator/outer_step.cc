#include "engine/coordinator/outer_step.h"

#include "engine/base/error.h"

namespace orpheus::engine {

ParamSet OuterStep::momentumShapes(const ParamSet& params) {
  ParamSet out;
  for (const Param& p : params.params) {
    out.params.push_back({"outer/momentum/" + p.name, Matrix::Zero(p.value.rows(), p.value.cols())});
  }
  return out;
}

void OuterStep::start(const ParamSet& initial) {
  if (!active()) return;
  anchor_ = initial;
  momentum_ = momentumShapes(initial);
}

void OuterStep::resume(ParamSet anchor, ParamSet momentum) {
  if (!active()) return;
  ORPHEUS_ENFORCE(anchor.size() == momentum.size(), "outer step: {} anchor parameters, {} momentum entries",
                  anchor.size(), momentum.size());
  anchor_ = std::move(anchor);
  momentum_ = std::move(momentum);
}

void OuterStep::apply(ParamSet& mean) {
  if (!active()) return;
  ORPHEUS_ENFORCE(anchor_.size() == mean.size(), "outer step: {} anchor parameters for {}", anchor_.size(),
                  mean.size());
  const float lr = static_cast<float>(options_.lr);
  const float mu = static_cast<float>(options_.momentum);
  for (size_t i = 0; i < mean.size(); ++i) {
    float* w = mean[i].data();
    float* a = anchor_[i].data();
    float* m = momentum_[i].data();
    const Eigen::Index n = mean[i].size();
    ORPHEUS_ENFORCE(anchor_[i].size() == n, "outer step: parameter {} has {} entries, its anchor {}", i, n,
                    anchor_[i].size());
    // Element by element, in this order, so that every rank (and the tests' hand
    // computation) rounds the same way.
    for (Eigen::Index k = 0; k < n; ++k) {
      const float delta = w[k] - a[k];
      m[k] = mu * m[k] + delta;
      w[k] = a[k] + lr * (delta + mu * m[k]);
      a[k] = w[k];
    }
  }
}

}  // namespace orpheus::engine
