#include "ops/mlr.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/base/rng.h"

namespace orpheus::ops {
namespace {

// The sizes checked before anything of their size is made.
Graph checkedGraph(int64_t features, int64_t classes) {
  ORPHEUS_CHECK_INPUT(features > 0, "MLR needs at least one feature, got {}", features);
  ORPHEUS_CHECK_INPUT(classes >= 2, "MLR needs at least two classes, got {}", classes);
  // Training holds W at least twice (the replica and its rebuilt update).
  checkFitsInMemory(static_cast<double>(classes) * static_cast<double>(features) * sizeof(float),
                    fmt::format("the MLR weights of {}x{} floats ({} classes, {} features)", classes, features, classes,
                                features),
                    0.5);
  return MultinomialLogisticRegression::graph(features, classes);
}

}  // namespace

Graph MultinomialLogisticRegression::graph(int64_t features, int64_t classes) {
  Graph g;
  const int w = g.param("W", classes, features, {Init::Kind::kNormal, 0.01});
  const int b = g.param("b", classes, 1, {});
  const int x = g.input("x", features);
  const int y = g.label("y", classes);
  const int product = g.apply(OpKind::kMatVec, {w, x}, "W * x");
  const int a = g.apply(OpKind::kAdd, {product, b}, "W * x + b");
  const int p = g.apply(OpKind::kSoftmax, {a}, "softmax(a)");
  g.setLoss(g.apply(OpKind::kCrossEntropy, {p, y}, "cross_entropy(softmax(a), y)"));
  g.setPrediction(a);
  return g;
}

MultinomialLogisticRegression::MultinomialLogisticRegression(int64_t features, int64_t classes, float initScale)
    : features_(features), classes_(classes), initScale_(initScale),
      graph_(checkedGraph(features, classes), spec(), 0) {}

std::string MultinomialLogisticRegression::spec() const {
  return fmt::format("mlr features={} classes={}", features_, classes_);
}

std::vector<ParamSpec> MultinomialLogisticRegression::paramSpecs() const {
  return {{"W", classes_, features_}, {"b", classes_, 1}};
}

ParamSet MultinomialLogisticRegression::initParams(uint64_t seed) const {
  ParamSet p = zeroParams();
  CounterRng rng(seed, RngPurpose::kInit, 0, 0);
  Matrix& w = p[0];
  for (int64_t j = 0; j < w.cols(); ++j) {
    for (int64_t i = 0; i < w.rows(); ++i) w(i, j) = static_cast<float>(rng.normal()) * initScale_;
  }
  return p;
}

void MultinomialLogisticRegression::check(const ExampleBatch& x) const {
  ORPHEUS_CHECK_INPUT(x.features() == features_, "examples have {} features, the model expects {}", x.features(),
                      features_);
  const auto& labels = *x.labels;
  for (int64_t i = 0; i < labels.size(); ++i) {
    ORPHEUS_CHECK_INPUT(labels(i) >= 0 && labels(i) < classes_, "label {} out of range: the model has {} classes",
                        labels(i), classes_);
  }
}

SvBatch MultinomialLogisticRegression::computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const {
  check(x);
  return graph_.computeSvg(w, x, meanLoss);
}

SvBatch MultinomialLogisticRegression::computeSvgStreamed(const ParamSet& w, const ExampleBatch& x, double* meanLoss,
                                                          const SvReadyFn& ready) const {
  check(x);
  return graph_.computeSvgStreamed(w, x, meanLoss, ready);
}

ParamSet MultinomialLogisticRegression::denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss,
                                                      Backend& backend, RebuildBuffers& buffers) const {
  check(x);
  return graph_.denseGradient(w, x, meanLoss, backend, buffers);
}

EvalSums MultinomialLogisticRegression::evaluate(const ParamSet& w, const ExampleBatch& x) const {
  check(x);
  return graph_.evaluate(w, x);
}

SvBatch MultinomialLogisticRegression::computeSvgOnDevice(std::span<const Tensor> w, const ExampleBatch& x,
                                                          double* meanLoss, Backend& backend) const {
  check(x);
  return graph_.computeSvgOnDevice(w, x, meanLoss, backend);
}

SvBatch MultinomialLogisticRegression::computeSvgOnDeviceStreamed(std::span<const Tensor> w, const ExampleBatch& x,
                                                                  double* meanLoss, Backend& backend,
                                                                  const DeviceSvReadyFn& ready) const {
  check(x);
  return graph_.computeSvgOnDeviceStreamed(w, x, meanLoss, backend, ready);
}

void MultinomialLogisticRegression::denseGradientOnDevice(std::span<const Tensor> w, const ExampleBatch& x,
                                                          double* meanLoss, Backend& backend,
                                                          std::span<Tensor> grad) const {
  check(x);
  graph_.denseGradientOnDevice(w, x, meanLoss, backend, grad);
}

EvalSums MultinomialLogisticRegression::evaluateOnDevice(std::span<const Tensor> w, const ExampleBatch& x,
                                                         Backend& backend) const {
  check(x);
  return graph_.evaluateOnDevice(w, x, backend);
}

}  // namespace orpheus::ops
