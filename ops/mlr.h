// Multiclass logistic regression, written by hand: p = softmax(W x + b), loss
// = -log p_t. Its SVG for example (x, t) is u = p - onehot(t), v = x; the bias
// is updated from the same u.
#pragma once

#include "ops/model.h"

namespace orpheus::ops {

class MultinomialLogisticRegression final : public Model {
 public:
  MultinomialLogisticRegression(int64_t features, int64_t classes, float initScale = 0.01f);

  std::string spec() const override;
  std::vector<ParamSpec> paramSpecs() const override;
  ParamSet initParams(uint64_t seed) const override;
  SvBatch computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const override;
  std::vector<SvSiteInfo> svSites() const override { return {{0, 1}}; }
  EvalSums evaluate(const ParamSet& w, const ExampleBatch& x) const override;

  int64_t features() const { return features_; }
  int64_t classes() const { return classes_; }

 private:
  // Column-wise softmax probabilities of W x + b, and the summed loss.
  Matrix probabilities(const ParamSet& w, const ExampleBatch& x) const;

  int64_t features_;
  int64_t classes_;
  float initScale_;
};

}  // namespace orpheus::ops
