// A model defined by an expression graph (a .loss file or the C++ builder): the
// engine derives compute_svg and compute_update from the loss alone.
#pragma once

#include "ops/graph.h"
#include "ops/graph_exec.h"
#include "ops/loss_parser.h"
#include "ops/model.h"

#include <memory>
#include <string>
#include <unordered_map>

namespace orpheus::ops {

class GraphModel final : public Model {
 public:
  // `spec` describes the model in saved files; `seed` keys the initial values of
  // parameters and data-dependent variables.
  GraphModel(Graph graph, std::string spec, uint64_t seed);
  // Parses a .loss file for data of the given shape.
  static std::unique_ptr<GraphModel> fromFile(const std::string& path, const LossDims& dims, uint64_t seed);

  std::string spec() const override { return spec_; }
  std::vector<ParamSpec> paramSpecs() const override;
  ParamSet initParams(uint64_t seed) const override;
  // Optimises the batch's data-dependent variables (kept per example across clocks),
  // then returns one SV pair per matrix site and example.
  SvBatch computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const override;
  // Data-dependent variables of test examples are inferred afresh, never kept.
  EvalSums evaluate(const ParamSet& w, const ExampleBatch& x) const override;
  bool hasAccuracy() const override;

  const Graph& graph() const { return graph_; }

 private:
  std::vector<Matrix> initialLocals(const ExampleBatch& x, bool kept) const;
  void keepLocals(const ExampleBatch& x, const std::vector<Matrix>& locals) const;
  std::vector<const Matrix*> paramPointers(const ParamSet& w) const;

  Graph graph_;
  std::string spec_;
  uint64_t seed_;
  // The compute thread owns these; a model is used by one worker.
  mutable std::unique_ptr<GraphExecutor<float>> exec_;
  mutable std::vector<std::unordered_map<int64_t, Vector>> kept_;  // per local, by example index
};

// A value of `init` for a parameter of the given shape, from the stream `rng`.
Matrix initialValue(const Init& init, int64_t rows, int64_t cols, uint64_t seed, uint64_t key, uint64_t index);

}  // namespace orpheus::ops
