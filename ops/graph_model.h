// A model defined by an expression graph (a .loss file or the C++ builder): the
// engine derives compute_svg and compute_update from the loss alone.
#pragma once

#include "ops/device_exec.h"
#include "ops/graph.h"
#include "ops/graph_exec.h"
#include "ops/loss_parser.h"
#include "ops/model.h"

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace orpheus::ops {

class GraphModel final : public Model {
 public:
  // `spec` describes the model in saved files; `seed` keys the initial values of
  // parameters and data-dependent variables; `textDigest` is that of the .loss text
  // the graph was parsed from ("" for a graph built in C++).
  GraphModel(Graph graph, std::string spec, uint64_t seed, std::string textDigest = {});
  // Parses a .loss file for data of the given shape.
  static std::unique_ptr<GraphModel> fromFile(const std::string& path, const LossDims& dims, uint64_t seed);

  std::string spec() const override { return spec_; }
  std::string textDigest() const override { return textDigest_; }
  bool keepsPerExample() const override { return !graph_.locals().empty(); }
  std::vector<ParamSpec> paramSpecs() const override;
  ParamSet initParams(uint64_t seed) const override;
  // Optimises the batch's data-dependent variables (kept per example across clocks),
  // then returns one SV pair per matrix site and example. A sequence model's sites
  // are per step: a matrix used at every step has T entries of B columns, and its
  // carried states continue each stream's previous segment (kept per stream); the
  // mean loss is per token. The batch's n columns are its B examples, shared by all
  // entries, so selection (engine/select) keeps or drops whole examples with all
  // their steps, not single (example, step) pairs, unless setSvgUnit(kStep).
  SvBatch computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const override;
  // Where every matrix has one SV site (no recurrence), each gradient is one GEMM
  // U V^T written straight into the result, bitwise what the default's rebuild of
  // the batch gives, without the batch's copies of U and V; else the default.
  ParamSet denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                         RebuildBuffers& buffers) const override;
  using Model::denseGradient;
  std::vector<SvSiteInfo> svSites() const override;
  // Each site's matrix is handed out from inside the backward pass, as soon as
  // its U is final (GraphExecutor::backward).
  SvBatch computeSvgStreamed(const ParamSet& w, const ExampleBatch& x, double* meanLoss,
                             const SvReadyFn& ready) const override;
  // SvgUnit::kStep: every parameter's per-step entries as one of B * T columns.
  void setSvgUnit(SvgUnit unit) override { svgUnit_ = unit; }
  // Tests and benchmarks, before the first device pass: LSTM cells run node by
  // node instead of as fused cell steps (DeviceExecutor's fuseLstmCells).
  void setLstmCellFusion(bool on) { fuseLstmCells_ = on; }
  // Data-dependent variables of test examples are inferred afresh, never kept.
  // Sequence models: the batch is taken in runs of consecutive segments of distinct
  // streams, each run's states carried from the previous segment of its stream
  // (kept apart from training's); the sums count tokens.
  EvalSums evaluate(const ParamSet& w, const ExampleBatch& x) const override;
  bool hasAccuracy() const override;
  // The rows of its label (or of its sequence input: one per word).
  int64_t labelCount() const override;
  std::string labelName() const override;
  bool reportsPerplexity() const override { return graph_.steps() > 0; }
  bool carriesState() const override { return graph_.steps() > 0; }
  // The training states by stream: "carried_streams" (2 x S: stream, index of its
  // last segment) and "carried_<state>" (rows x S) per state, streams ascending.
  ParamSet carriedState() const override;
  void restoreCarriedState(const ParamSet& state) const override;

  // On a device: graphs DeviceExecutor runs (feed-forward products, elementwise
  // operators, softmax + cross-entropy, unrolled sequence models; a sequence
  // model's carried states stay on the device while batches continue their
  // streams (continuesDeviceStates), else come back to be kept by stream as on
  // the host; its SVs follow setSvgUnit). The executor is made for the backend
  // given and made anew when another one is; its tensors live on that backend's
  // device, so the backend must outlive the model or be replaced before it dies.
  // On the cpu and strict backends the batch and the gradient are bitwise
  // computeSvg's and denseGradient's where every matrix has one SV site (see
  // ops/device_exec.h for the operators that holds for); a matrix with several
  // sites gets their products summed one after another (beta 1), not one GEMM
  // over their columns, and so may differ in the last bits.
  std::string deviceRefusal() const override { return deviceRefusal_; }
  SvBatch computeSvgOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                             Backend& backend) const override;
  // A feed-forward graph hands out every site; a sequence model none.
  SvBatch computeSvgOnDeviceStreamed(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                     Backend& backend, const DeviceSvReadyFn& ready) const override;
  void denseGradientOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                             std::span<Tensor> grad) const override;
  // The next batch copied ahead (DeviceExecutor::prefetch): feed-forward graphs'
  // dense data, and sparse data where no node reads the input densely; a sequence
  // model's token one-hots (prefetchSequence).
  bool prefetchOnDevice(const ExampleBatch& next, Backend& backend) const override;
  double takeDeviceDataWait() const override { return deviceExec_ ? deviceExec_->takeDataWait() : 0.0; }
  // The last pass's SVs on the device, one per batch entry: a feed-forward graph's
  // sites and a sequence model's per (example, step) as the executor holds them;
  // per step each entry's sites joined there (copies on the device).
  std::vector<DeviceSvs> lastDeviceSvs() const override;
  void releaseDevice() const override {
    flushDeviceStates();
    queuedLocals_.clear();
    joinedU_.clear();
    joinedV_.clear();
    joinedTokensCopy_ = {};
    deviceExec_.reset();
    evalExec_.reset();
  }
  // Test batches run on an executor of their own, so training's buffers keep their shapes.
  EvalSums evaluateOnDevice(std::span<const Tensor> w, const ExampleBatch& x, Backend& backend) const override;

  const Graph& graph() const { return graph_; }

 private:
  std::vector<Matrix> initialLocals(const ExampleBatch& x, bool kept) const;
  void keepLocals(const ExampleBatch& x, const std::vector<Matrix>& locals) const;
  std::vector<const Matrix*> paramPointers(const ParamSet& w) const;
  // compute_svg's forward and backward pass: afterwards the executor holds every
  // site's u (a gradient) and v. Returns the mean loss.
  // `onSite`, when given, is called from inside the backward pass with each site's
  // index as soon as its u is final.
  double runBatch(const std::vector<const Matrix*>& params, const ExampleBatch& x, std::vector<Matrix>& locals,
                  const std::function<void(size_t)>* onSite = nullptr) const;
  // A site's V: dense or sparse, valid until the next pass.
  struct SiteV {
    const Matrix* dense = nullptr;
    const SparseMatrix* sparse = nullptr;
  };
  SiteV siteV(const SvSite& site, const ExampleBatch& x, const std::vector<Matrix>& locals) const;
  SvBatch svgs(const ParamSet& w, const ExampleBatch& x, double* meanLoss, const SvReadyFn* ready) const;
  SvMatrix siteMatrix(const SvSite& site, const ExampleBatch& x, const std::vector<Matrix>& locals) const;

  // The states a stream's last segment ended with.
  struct Carried {
    int64_t segment = -1;
    std::vector<Vector> states;
  };
  using CarriedStates = std::unordered_map<int64_t, Carried>;
  std::vector<Matrix> carriedStates(const Matrix& segments, const CarriedStates& kept) const;
  void keepStates(const Matrix& segments, CarriedStates& kept) const;
  // `finals`: each state after the last step, rows x B.
  void keepStates(const Matrix& segments, const std::vector<const Matrix*>& finals, CarriedStates& kept) const;
  // A test batch of segments in runs of distinct streams (evaluate's), summed.
  static EvalSums evaluateRuns(const Matrix& all, const std::function<EvalSums(const Matrix&)>& evaluateRun);
  // Examples whose argmax of `scores` (a step's prediction) is the step's next token.
  static double stepCorrect(const Matrix& scores, const Matrix& segments, size_t step);
  // The device executor's pass over segments: states carried from `kept` (kept
  // again afterwards, from the device's last step); returns the summed loss.
  double runSegmentsOnDevice(DeviceExecutor& exec, std::span<const Tensor> w, const Matrix& segments,
                             CarriedStates& kept, bool train) const;
  // The training executor for `backend`, made anew when it is another backend's.
  DeviceExecutor& trainingExecutor(Backend& backend) const;
  // The device executor's forward and backward pass on the batch: sets *meanLoss and
  // returns the executor, which holds every site's U and V. `siteReady` as
  // DeviceExecutor::run's (feed-forward graphs).
  DeviceExecutor& runOnDevice(std::span<const Tensor> w, const ExampleBatch& x, Backend& backend, double* meanLoss,
                              const std::function<void(size_t)>& siteReady = {}) const;
  // computeSvgOnDevice, the sites handed to `ready` when it is given.
  SvBatch deviceBatch(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                      const DeviceSvReadyFn& ready) const;
  EvalSums evaluateSegments(const std::vector<const Matrix*>& params, const Matrix& segments) const;
  // A training pass on the device leaves its last step's states there: the next
  // one starts from them when its segments continue the same streams column by
  // column; they come to trainStates_ (flushDeviceStates) only when something else
  // needs them (another batch, the host's pass, carriedState, releaseDevice).
  bool continuesDeviceStates(const Matrix& segments) const;
  void flushDeviceStates() const;

  Graph graph_;
  std::string spec_;
  std::string textDigest_;
  uint64_t seed_;
  SvgUnit svgUnit_ = SvgUnit::kExample;
  bool fuseLstmCells_ = true;
  // The compute thread owns these; a model is used by one worker.
  mutable std::unique_ptr<GraphExecutor<float>> exec_;
  bool oneSitePerMatrix_ = false;  // denseGradient's direct path applies
  std::string deviceRefusal_;
  mutable std::unique_ptr<DeviceExecutor> deviceExec_;  // for one backend
  mutable std::unique_ptr<DeviceExecutor> evalExec_;    // evaluateOnDevice's, for one backend
  mutable std::vector<std::unordered_map<int64_t, Vector>> kept_;  // per local, by example index
  // The examples whose kept values went to the device with the batch queued ahead
  // (prefetchOnDevice): keeping any of them again before that batch runs makes the
  // queued copy stale, and the run copies its own in.
  mutable std::unordered_set<int64_t> queuedLocals_;
  mutable CarriedStates trainStates_;  // by stream
  mutable CarriedStates evalStates_;
  mutable Matrix deviceStatesOf_;  // stream and index rows (2 x B) of the states left on the device, or empty
  // Sites' U and dense V joined side by side on the training executor's device, kept
  // from clock to clock: per batch entry of a step (lastDeviceSvs, stepColumns), or
  // per parameter (denseGradientOnDevice); a job runs one of the two.
  mutable std::vector<Tensor> joinedU_, joinedV_;
  // denseGradientOnDevice: the embedding's token one-hots of every step side by side
  // (on the host, and its copy on the device).
  mutable SparseMatrix joinedTokens_;
  mutable SparseCopy joinedTokensCopy_;
  // `parts` (same rows) side by side in `store`, allocated there when its shape differs.
  static Tensor& joinColumns(Tensor& store, const std::vector<const Tensor*>& parts, Backend& backend);
  static SparseMatrix sideBySide(const std::vector<const SparseMatrix*>& parts);
};

// Entries of the same matrix (and bias), one per step, as one entry whose columns
// are the steps' side by side; the batch's columns become (example, step) pairs
// (SvgUnit::kStep). `b`: the examples.
SvBatch stepColumns(SvBatch steps, int64_t b);

// A value of `init` for a parameter of the given shape, from the stream `rng`.
Matrix initialValue(const Init& init, int64_t rows, int64_t cols, uint64_t seed, uint64_t key, uint64_t index);

}  // namespace orpheus::ops
