#include "ops/mlr.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/base/rng.h"

#include <cmath>

namespace orpheus::ops {

MultinomialLogisticRegression::MultinomialLogisticRegression(int64_t features, int64_t classes, float initScale)
    : features_(features), classes_(classes), initScale_(initScale) {
  ORPHEUS_CHECK_INPUT(features > 0, "MLR needs at least one feature, got {}", features);
  ORPHEUS_CHECK_INPUT(classes >= 2, "MLR needs at least two classes, got {}", classes);
  // Training holds W at least twice (the replica and its rebuilt update).
  checkFitsInMemory(static_cast<double>(classes) * static_cast<double>(features) * sizeof(float),
                    fmt::format("the MLR weights of {}x{} floats ({} classes, {} features)", classes, features, classes,
                                features),
                    0.5);
}

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

Matrix MultinomialLogisticRegression::probabilities(const ParamSet& w, const ExampleBatch& x) const {
  ORPHEUS_CHECK_INPUT(x.features() == features_, "examples have {} features, the model expects {}", x.features(),
                      features_);
  Matrix z(classes_, x.size());
  if (x.dense) {
    z.noalias() = w[0] * *x.dense;
  } else {
    z.noalias() = w[0] * *x.sparse;
  }
  z.colwise() += w[1].col(0);
  // Stable softmax per column.
  const Eigen::RowVectorXf maxes = z.colwise().maxCoeff();
  z.rowwise() -= maxes;
  z = z.array().exp();
  const Eigen::RowVectorXf sums = z.colwise().sum();
  z.array().rowwise() /= sums.array();
  return z;
}

SvBatch MultinomialLogisticRegression::computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const {
  Matrix p = probabilities(w, x);
  const auto& labels = *x.labels;
  double loss = 0.0;
  for (int64_t i = 0; i < x.size(); ++i) {
    const int t = labels(i);
    ORPHEUS_CHECK_INPUT(t >= 0 && t < classes_, "label {} out of range: the model has {} classes", t, classes_);
    loss -= std::log(std::max(p(t, i), 1e-30f));
    p(t, i) -= 1.0f;  // u = p - onehot(t)
  }
  if (meanLoss) *meanLoss = x.size() > 0 ? loss / static_cast<double>(x.size()) : 0.0;

  SvBatch batch;
  batch.coeffs = Vector::Ones(x.size());
  SvMatrix m;
  m.paramId = 0;
  m.biasId = 1;
  m.u = std::move(p);
  if (x.dense) {
    m.vDense = *x.dense;
  } else {
    m.sparseV = true;
    m.vSparse = *x.sparse;
  }
  batch.matrices.push_back(std::move(m));
  return batch;
}

EvalSums MultinomialLogisticRegression::evaluate(const ParamSet& w, const ExampleBatch& x) const {
  const Matrix p = probabilities(w, x);
  const auto& labels = *x.labels;
  EvalSums sums;
  for (int64_t i = 0; i < x.size(); ++i) {
    const int t = labels(i);
    ORPHEUS_CHECK_INPUT(t >= 0 && t < classes_, "label {} out of range: the model has {} classes", t, classes_);
    Eigen::Index best = 0;
    p.col(i).maxCoeff(&best);
    sums.lossSum -= std::log(std::max(p(t, i), 1e-30f));
    sums.correct += (best == t) ? 1.0 : 0.0;
    sums.count += 1.0;
  }
  return sums;
}

}  // namespace orpheus::ops
