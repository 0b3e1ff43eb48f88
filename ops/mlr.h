// Multiclass logistic regression, built in: p = softmax(W x + b), loss = -log p_t.
// Its SVG for example (x, t) is u = p - onehot(t), v = x; the bias is updated from
// the same u.
//
// The model is the graph of examples/mlr.loss (graph() builds it) run by a
// GraphModel, with the built-in's own name, spec and initial values: the host pass
// is GraphExecutor's and the device pass DeviceExecutor's (ops/device_exec.h), so
// the replica is resident on a device (--device strict, cuda) and on the cpu and
// strict backends the device's SVs, loss and gradients are bitwise the host's.
// (Before it ran the graph, the built-in normalised the softmax by division and
// clamped p at 1e-30 in the loss; now p is scaled by 1 / sum and clamped at
// FLT_MIN, as the graph's operators are: U moves by at most a few ulps.)
#pragma once

#include "ops/graph_model.h"
#include "ops/model.h"

namespace orpheus::ops {

class MultinomialLogisticRegression final : public Model {
 public:
  MultinomialLogisticRegression(int64_t features, int64_t classes, float initScale = 0.01f);

  // examples/mlr.loss's graph for `features` and `classes`: parameters W (classes x
  // features, normal(0.01)) and b (classes), input x, label y, prediction W x + b.
  static Graph graph(int64_t features, int64_t classes);

  std::string spec() const override;
  std::vector<ParamSpec> paramSpecs() const override;
  // W normal(0) * initScale from the job seed's init stream, column by column; b zero.
  ParamSet initParams(uint64_t seed) const override;
  SvBatch computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const override;
  SvBatch computeSvgStreamed(const ParamSet& w, const ExampleBatch& x, double* meanLoss,
                             const SvReadyFn& ready) const override;
  std::vector<SvSiteInfo> svSites() const override { return graph_.svSites(); }
  ParamSet denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                         RebuildBuffers& buffers) const override;
  using Model::denseGradient;
  EvalSums evaluate(const ParamSet& w, const ExampleBatch& x) const override;

  std::string deviceRefusal() const override { return graph_.deviceRefusal(); }
  SvBatch computeSvgOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                             Backend& backend) const override;
  SvBatch computeSvgOnDeviceStreamed(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                     Backend& backend, const DeviceSvReadyFn& ready) const override;
  void denseGradientOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                             std::span<Tensor> grad) const override;
  std::vector<DeviceSvs> lastDeviceSvs() const override { return graph_.lastDeviceSvs(); }
  bool prefetchOnDevice(const ExampleBatch& next, Backend& backend) const override {
    check(next);
    return graph_.prefetchOnDevice(next, backend);
  }
  double takeDeviceDataWait() const override { return graph_.takeDeviceDataWait(); }
  void releaseDevice() const override { graph_.releaseDevice(); }
  EvalSums evaluateOnDevice(std::span<const Tensor> w, const ExampleBatch& x, Backend& backend) const override;

  int64_t features() const { return features_; }
  int64_t classes() const { return classes_; }

 private:
  // InputError naming the mismatch: the batch's features, a label out of range.
  void check(const ExampleBatch& x) const;

  int64_t features_;
  int64_t classes_;
  float initScale_;
  GraphModel graph_;
};

}  // namespace orpheus::ops
