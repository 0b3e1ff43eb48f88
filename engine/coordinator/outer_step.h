// DiLoCo's outer step (Douillard et al. 2023) at the averaging barrier: the replicas'
// mean is not taken as it is, but read as an outer gradient on the parameters the
// previous barrier left (the anchor) and stepped with Nesterov momentum, as
// torch.optim.SGD(nesterov=True) on -delta (scripts/bench/peers.py, DiLoCo):
//   delta = mean - anchor,  m = M m + delta,  W = anchor + L (delta + M m),
// and W becomes every replica and the next anchor. m starts at zero, so the first
// barrier has m = delta, as torch's first step has buf = g.
// The state (anchor and m) is the same on every rank: every rank steps from the same
// anchor with the same bitwise mean. Not thread-safe; the coordinator owns it.
#pragma once

#include "engine/base/params.h"

namespace orpheus::engine {

struct OuterStepOptions {
  double lr = 0.0;        // L (--outer-lr); 0: off, the mean as it is
  double momentum = 0.0;  // M (--outer-momentum), in [0, 1)

  // L = 1 without momentum is W = mean: plain averaging, which stays bitwise the
  // mean by taking no step at all.
  bool active() const { return lr > 0.0 && !(lr == 1.0 && momentum == 0.0); }
};

class OuterStep {
 public:
  explicit OuterStep(const OuterStepOptions& options) : options_(options) {}

  bool active() const { return options_.active(); }
  // The parameters every replica starts from (W0): the first anchor; m = 0.
  void start(const ParamSet& initial);
  // `mean` (the replicas' mean) becomes W; the anchor becomes W, m advances.
  void apply(ParamSet& mean);

  const ParamSet& anchor() const { return anchor_; }
  // m, its entries named "outer/momentum/" + the parameter's name (snapshots hold it).
  const ParamSet& momentum() const { return momentum_; }
  // Resume: the anchor (the snapshot of the last averaging) and m from that snapshot.
  void resume(ParamSet anchor, ParamSet momentum);

  // m's names and shapes (values zero) for parameters shaped as `params`.
  static ParamSet momentumShapes(const ParamSet& params);

 private:
  OuterStepOptions options_;
  ParamSet anchor_;
  ParamSet momentum_;
};

}  // namespace orpheus::engine
