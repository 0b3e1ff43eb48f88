#include "ops/graph_model.h"

#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/operators.h"
#include "ops/sequence_layout.h"

#include <algorithm>
#include <cmath>

namespace orpheus::ops {

Matrix initialValue(const Init& init, int64_t rows, int64_t cols, uint64_t seed, uint64_t key, uint64_t index) {
  Matrix m(rows, cols);
  CounterRng rng(seed, RngPurpose::kInit, key, index);
  // Fan-in and fan-out of a layer W (out x in); a vector's fan-in is its length.
  const double fanIn = static_cast<double>(cols > 1 ? cols : rows);
  const double fanOut = static_cast<double>(rows);
  switch (init.kind) {
    case Init::Kind::kZeros:
      m.setZero();
      break;
    case Init::Kind::kConstant:
      m.setConstant(static_cast<float>(init.value));
      break;
    case Init::Kind::kNormal:
      for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(rng.normal() * init.value);
      break;
    case Init::Kind::kUniform:
      for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>((2 * rng.uniform() - 1) * init.value);
      break;
    case Init::Kind::kGlorot: {
      const double a = std::sqrt(6.0 / (fanIn + fanOut));
      for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>((2 * rng.uniform() - 1) * a);
      break;
    }
    case Init::Kind::kHe: {
      const double s = std::sqrt(2.0 / fanIn);
      for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(rng.normal() * s);
      break;
    }
  }
  return m;
}

GraphModel::GraphModel(Graph graph, std::string spec, uint64_t seed, std::string textDigest)
    : graph_(std::move(graph)), spec_(std::move(spec)), textDigest_(std::move(textDigest)), seed_(seed) {
  exec_ = std::make_unique<GraphExecutor<float>>(graph_);  // identifies the SVs: refuses models without them
  kept_.resize(graph_.locals().size());
  // A parameter (or bias) with several sites gets their sum, which the rebuild
  // computes as one GEMM over the concatenated columns: left to the default.
  std::vector<int> uses(graph_.params().size(), 0);
  oneSitePerMatrix_ = graph_.steps() == 0;
  for (const SvSite& site : exec_->sites()) {
    oneSitePerMatrix_ = oneSitePerMatrix_ && ++uses[static_cast<size_t>(site.param)] == 1;
    if (site.bias >= 0) oneSitePerMatrix_ = oneSitePerMatrix_ && ++uses[static_cast<size_t>(site.bias)] == 1;
  }
  deviceRefusal_ = DeviceExecutor::unsupported(graph_);
}

std::unique_ptr<GraphModel> GraphModel::fromFile(const std::string& path, const LossDims& dims, uint64_t seed) {
  const std::string text = readLossFile(path);
  return std::make_unique<GraphModel>(parseLoss(text, path, dims),
                                      fmt::format("graph {} features={} classes={}", path, dims.features, dims.classes),
                                      seed, orpheus::textDigest(text));
}

std::vector<ParamSpec> GraphModel::paramSpecs() const {
  std::vector<ParamSpec> specs;
  for (int id : graph_.params()) {
    const Node& n = graph_.node(id);
    specs.push_back({n.name, n.rows, n.cols});
  }
  return specs;
}

ParamSet GraphModel::initParams(uint64_t seed) const {
  ParamSet p;
  for (size_t i = 0; i < graph_.params().size(); ++i) {
    const Node& n = graph_.node(graph_.params()[i]);
    p.params.push_back({n.name, initialValue(n.init, n.rows, n.cols, seed, 0, i)});
  }
  return p;
}

bool GraphModel::hasAccuracy() const {
  if (graph_.steps() > 0) return !graph_.stepPredictions().empty();
  return graph_.prediction() >= 0 && graph_.labelNode() >= 0;
}

int64_t GraphModel::labelCount() const {
  return graph_.labelNode() >= 0 ? graph_.node(graph_.labelNode()).rows : -1;
}

std::string GraphModel::labelName() const {
  if (graph_.labelNode() < 0) return {};
  const Node& n = graph_.node(graph_.labelNode());
  return fmt::format("label {}[{}]", n.name, n.rows);
}

std::vector<Matrix> GraphModel::carriedStates(const Matrix& segments, const CarriedStates& kept) const {
  std::vector<Matrix> states;
  for (int id : graph_.states()) states.push_back(Matrix::Zero(graph_.node(id).rows, segments.cols()));
  for (int64_t j = 0; j < segments.cols(); ++j) {
    const auto it = kept.find(static_cast<int64_t>(segments(kSegmentStreamRow, j)));
    if (it == kept.end() || it->second.segment + 1 != static_cast<int64_t>(segments(kSegmentIndexRow, j))) continue;
    for (size_t k = 0; k < states.size(); ++k) states[k].col(j) = it->second.states[k];
  }
  return states;
}

void GraphModel::keepStates(const Matrix& segments, CarriedStates& kept) const {
  std::vector<const Matrix*> finals;
  for (int id : graph_.finalStates()) finals.push_back(&exec_->value(id));
  keepStates(segments, finals, kept);
}

void GraphModel::keepStates(const Matrix& segments, const std::vector<const Matrix*>& finals,
                            CarriedStates& kept) const {
  for (int64_t j = 0; j < segments.cols(); ++j) {
    Carried& c = kept[static_cast<int64_t>(segments(kSegmentStreamRow, j))];
    c.segment = static_cast<int64_t>(segments(kSegmentIndexRow, j));
    c.states.resize(finals.size());
    for (size_t k = 0; k < c.states.size(); ++k) c.states[k] = finals[k]->col(j);
  }
}

ParamSet GraphModel::carriedState() const {
  flushDeviceStates();
  std::vector<int64_t> streams;
  for (const auto& [stream, carried] : trainStates_) streams.push_back(stream);
  std::sort(streams.begin(), streams.end());
  const auto count = static_cast<int64_t>(streams.size());
  ParamSet out;
  // Stream ids and segment indices are floats in the segments too (ops/sequence_layout.h).
  Matrix index(2, count);
  for (int64_t j = 0; j < count; ++j) {
    index(0, j) = static_cast<float>(streams[static_cast<size_t>(j)]);
    index(1, j) = static_cast<float>(trainStates_.at(streams[static_cast<size_t>(j)]).segment);
  }
  out.params.push_back({"carried_streams", std::move(index)});
  for (size_t k = 0; k < graph_.finalStates().size(); ++k) {
    const Node& n = graph_.node(graph_.states()[k]);
    Matrix m(n.rows, count);
    for (int64_t j = 0; j < count; ++j) m.col(j) = trainStates_.at(streams[static_cast<size_t>(j)]).states[k];
    out.params.push_back({"carried_" + n.name, std::move(m)});
  }
  return out;
}

void GraphModel::restoreCarriedState(const ParamSet& state) const {
  const int at = state.find("carried_streams");
  ORPHEUS_CHECK_INPUT(at >= 0 && state[at].rows() == 2, "carried states lack their stream index ('carried_streams')");
  const Matrix& index = state[static_cast<size_t>(at)];
  CarriedStates restored;
  for (int64_t j = 0; j < index.cols(); ++j) {
    Carried& c = restored[static_cast<int64_t>(index(0, j))];
    c.segment = static_cast<int64_t>(index(1, j));
    c.states.resize(graph_.finalStates().size());
  }
  for (size_t k = 0; k < graph_.finalStates().size(); ++k) {
    const Node& n = graph_.node(graph_.states()[k]);
    const int i = state.find("carried_" + n.name);
    ORPHEUS_CHECK_INPUT(i >= 0, "carried states lack state '{}'", n.name);
    const Matrix& m = state[static_cast<size_t>(i)];
    ORPHEUS_CHECK_INPUT(m.rows() == n.rows && m.cols() == index.cols(), "carried state '{}' is {} x {}, not {} x {}",
                        n.name, m.rows(), m.cols(), n.rows, index.cols());
    for (int64_t j = 0; j < index.cols(); ++j) restored[static_cast<int64_t>(index(0, j))].states[k] = m.col(j);
  }
  trainStates_ = std::move(restored);
  deviceStatesOf_.resize(0, 0);  // superseded
}

std::vector<const Matrix*> GraphModel::paramPointers(const ParamSet& w) const {
  ORPHEUS_CHECK_INPUT(w.size() == graph_.params().size(), "the model has {} parameters, got {}",
                      graph_.params().size(), w.size());
  std::vector<const Matrix*> ptrs;
  for (size_t i = 0; i < w.size(); ++i) {
    const Node& n = graph_.node(graph_.params()[i]);
    ORPHEUS_CHECK_INPUT(w[i].rows() == n.rows && w[i].cols() == n.cols,
                        "parameter '{}' has shape {}x{}, the model expects {}x{}", n.name, w[i].rows(), w[i].cols(),
                        n.rows, n.cols);
    ptrs.push_back(&w[i]);
  }
  return ptrs;
}

std::vector<Matrix> GraphModel::initialLocals(const ExampleBatch& x, bool kept) const {
  std::vector<Matrix> locals;
  const int64_t b = x.size();
  for (size_t k = 0; k < graph_.locals().size(); ++k) {
    const Node& n = graph_.node(graph_.locals()[k]);
    Matrix m(n.rows, b);
    for (int64_t j = 0; j < b; ++j) {
      const int64_t index = x.indices ? (*x.indices)[static_cast<size_t>(j)] : j;
      if (kept) {
        const auto it = kept_[k].find(index);
        if (it != kept_[k].end()) {
          m.col(j) = it->second;
          continue;
        }
      }
      m.col(j) = initialValue(n.init, n.rows, 1, seed_, 1 + k, static_cast<uint64_t>(index)).col(0);
    }
    locals.push_back(std::move(m));
  }
  return locals;
}

void GraphModel::keepLocals(const ExampleBatch& x, const std::vector<Matrix>& locals) const {
  if (!x.indices) return;
  if (!queuedLocals_.empty()) {
    for (const int64_t index : *x.indices) {
      if (queuedLocals_.count(index) == 0) continue;
      if (deviceExec_) deviceExec_->forgetQueuedLocals();
      queuedLocals_.clear();
      break;
    }
  }
  for (size_t k = 0; k < locals.size(); ++k) {
    for (int64_t j = 0; j < x.size(); ++j) kept_[k][(*x.indices)[static_cast<size_t>(j)]] = locals[k].col(j);
  }
}

namespace {

GraphInputs<float> inputsOf(const ExampleBatch& x, std::vector<Matrix>* locals) {
  GraphInputs<float> in;
  in.dense = x.dense;
  in.sparse = x.sparse;
  in.labels = x.labels;
  in.locals = locals;
  return in;
}

}  // namespace

SvBatch stepColumns(SvBatch steps, int64_t b) {
  SvBatch out;
  std::vector<std::vector<const SvMatrix*>> groups;
  for (const SvMatrix& m : steps.matrices) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<const SvMatrix*>& g) {
      return g.front()->paramId == m.paramId && g.front()->biasId == m.biasId && g.front()->sparseV == m.sparseV;
    });
    if (it == groups.end()) {
      groups.push_back({&m});
    } else {
      it->push_back(&m);
    }
  }
  int64_t columns = 0;
  for (const auto& g : groups) {
    const auto n = static_cast<int64_t>(g.size()) * b;
    ORPHEUS_ENFORCE(columns == 0 || columns == n, "per-step SV sites: {} columns against {}", n, columns);
    columns = n;
    SvMatrix m;
    m.paramId = g.front()->paramId;
    m.biasId = g.front()->biasId;
    m.sparseV = g.front()->sparseV;
    m.u.resize(g.front()->u.rows(), n);
    for (size_t t = 0; t < g.size(); ++t) m.u.middleCols(static_cast<int64_t>(t) * b, b) = g[t]->u;
    if (m.sparseV) {
      std::vector<Eigen::Triplet<float, int32_t>> entries;
      for (size_t t = 0; t < g.size(); ++t) {
        const SparseMatrix& v = g[t]->vSparse;
        for (int64_t j = 0; j < v.outerSize(); ++j) {
          for (SparseMatrix::InnerIterator it(v, j); it; ++it) {
            entries.emplace_back(static_cast<int32_t>(it.row()), static_cast<int32_t>(static_cast<int64_t>(t) * b + j),
                                 it.value());
          }
        }
      }
      m.vSparse.resize(g.front()->vSparse.rows(), n);
      m.vSparse.setFromTriplets(entries.begin(), entries.end());
    } else {
      m.vDense.resize(g.front()->vDense.rows(), n);
      for (size_t t = 0; t < g.size(); ++t) m.vDense.middleCols(static_cast<int64_t>(t) * b, b) = g[t]->vDense;
    }
    out.matrices.push_back(std::move(m));
  }
  out.coeffs = Vector::Ones(columns);
  return out;
}

double GraphModel::runBatch(const std::vector<const Matrix*>& params, const ExampleBatch& x,
                            std::vector<Matrix>& locals, const std::function<void(size_t)>* onSite) const {
  const GraphInputs<float> in = inputsOf(x, &locals);
  if (!locals.empty()) {
    exec_->optimizeLocals(params, in);
    keepLocals(x, locals);
  }
  const bool sequence = graph_.steps() > 0;
  std::vector<Matrix> states;
  GraphInputs<float> sequenceIn = in;
  if (sequence) {
    ORPHEUS_CHECK_INPUT(x.dense != nullptr, "a sequence model needs token-stream data");
    flushDeviceStates();
    states = carriedStates(*x.dense, trainStates_);
    sequenceIn.states = &states;
  }
  const double loss = exec_->forward(params, sequenceIn);
  exec_->backward(params, sequenceIn, onSite != nullptr ? *onSite : std::function<void(size_t)>{});
  if (sequence) keepStates(*x.dense, trainStates_);
  const double counted = static_cast<double>(x.size()) * (sequence ? graph_.steps() : 1);
  return x.size() > 0 ? loss / counted : 0.0;
}

GraphModel::SiteV GraphModel::siteV(const SvSite& site, const ExampleBatch& x, const std::vector<Matrix>& locals) const {
  const Node& v = graph_.node(site.vectorNode);
  if (v.kind == NodeKind::kToken) return {nullptr, &exec_->tokens(v.id)};
  if (v.kind == NodeKind::kInput && x.sparse) return {nullptr, x.sparse};
  if (v.kind == NodeKind::kInput) return {x.dense, nullptr};
  if (v.kind == NodeKind::kLocal) {
    const auto& ids = graph_.locals();
    return {&locals[static_cast<size_t>(std::find(ids.begin(), ids.end(), v.id) - ids.begin())], nullptr};
  }
  return {&exec_->value(site.vectorNode), nullptr};
}

SvBatch GraphModel::computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const {
  return svgs(w, x, meanLoss, nullptr);
}

SvBatch GraphModel::computeSvgStreamed(const ParamSet& w, const ExampleBatch& x, double* meanLoss,
                                       const SvReadyFn& ready) const {
  return svgs(w, x, meanLoss, &ready);
}

std::vector<Model::SvSiteInfo> GraphModel::svSites() const {
  std::vector<SvSiteInfo> out;
  for (const SvSite& site : exec_->sites()) {
    out.push_back({static_cast<uint32_t>(site.param), static_cast<int32_t>(site.bias)});
  }
  return out;
}

SvMatrix GraphModel::siteMatrix(const SvSite& site, const ExampleBatch& x, const std::vector<Matrix>& locals) const {
  SvMatrix m;
  m.paramId = static_cast<uint32_t>(site.param);
  m.biasId = site.bias;
  const Matrix& u = exec_->grad(site.matvecNode);
  m.u = u.size() > 0 ? u : Matrix::Zero(graph_.node(site.matvecNode).rows, x.size());
  const SiteV v = siteV(site, x, locals);
  m.sparseV = v.sparse != nullptr;
  if (v.sparse) {
    m.vSparse = *v.sparse;
  } else {
    m.vDense = *v.dense;
  }
  return m;
}

SvBatch GraphModel::svgs(const ParamSet& w, const ExampleBatch& x, double* meanLoss, const SvReadyFn* ready) const {
  const std::vector<const Matrix*> params = paramPointers(w);
  std::vector<Matrix> locals = initialLocals(x, true);
  SvBatch batch;
  batch.coeffs = Vector::Ones(x.size());
  const std::vector<SvSite>& sites = exec_->sites();
  batch.matrices.resize(sites.size());
  // Each site's SVs the moment its U is final; the V they pair with were fixed by the forward pass.
  const std::function<void(size_t)> onSite = [&](size_t i) {
    batch.matrices[i] = siteMatrix(sites[i], x, locals);
    (*ready)(i, batch.matrices[i]);
  };
  const double loss = runBatch(params, x, locals, ready != nullptr ? &onSite : nullptr);
  if (meanLoss) *meanLoss = loss;
  if (ready == nullptr) {
    for (size_t i = 0; i < sites.size(); ++i) batch.matrices[i] = siteMatrix(sites[i], x, locals);
  }
  if (graph_.steps() > 0 && svgUnit_ == SvgUnit::kStep && x.size() > 0) return stepColumns(std::move(batch), x.size());
  return batch;
}

ParamSet GraphModel::denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                                   RebuildBuffers& buffers) const {
  // (The sparse products take compressed data only.)
  if (!oneSitePerMatrix_ || (x.sparse && !x.sparse->isCompressed())) {
    return Model::denseGradient(w, x, meanLoss, backend, buffers);
  }
  const std::vector<const Matrix*> params = paramPointers(w);
  std::vector<Matrix> locals = initialLocals(x, true);
  const double loss = runBatch(params, x, locals);
  if (meanLoss) *meanLoss = loss;

  ParamSet grad;
  grad.params.reserve(w.size());
  for (const Param& p : w.params) grad.params.push_back({p.name, Matrix(p.value.rows(), p.value.cols())});
  std::vector<bool> written(w.size(), false);
  // The rebuild's products (beta 0 here, onto zeros there: the same sums), and its
  // bias update U diag(1) 1 = U 1.
  for (const SvSite& site : exec_->sites()) {
    const Matrix& u = exec_->grad(site.matvecNode);
    if (u.size() == 0) continue;  // the loss does not depend on it: zero
    const SiteV v = siteV(site, x, locals);
    outerProduct(backend, buffers.device, static_cast<size_t>(site.param), u, v.dense, v.sparse,
                 grad[static_cast<size_t>(site.param)]);
    written[static_cast<size_t>(site.param)] = true;
    if (site.bias >= 0) {
      grad[static_cast<size_t>(site.bias)].col(0) = sumColumnsInOrder(u);
      written[static_cast<size_t>(site.bias)] = true;
    }
  }
  for (size_t i = 0; i < grad.size(); ++i) {
    if (!written[i]) grad[i].setZero();
  }
  return grad;
}

EvalSums GraphModel::evaluateRuns(const Matrix& all, const std::function<EvalSums(const Matrix&)>& evaluateRun) {
  EvalSums sums;
  // Runs of segments of distinct streams: a stream's next segment starts a new run,
  // so it starts from the states this one ends with.
  int64_t begin = 0;
  std::unordered_map<int64_t, int> inRun;
  for (int64_t j = 0; j <= all.cols(); ++j) {
    const bool end = j == all.cols() || inRun.count(static_cast<int64_t>(all(kSegmentStreamRow, j))) > 0;
    if (end && j > begin) {
      const Matrix run = all.middleCols(begin, j - begin);
      const EvalSums part = evaluateRun(run);
      sums.lossSum += part.lossSum;
      sums.correct += part.correct;
      sums.count += part.count;
      inRun.clear();
      begin = j;
    }
    if (j < all.cols()) inRun[static_cast<int64_t>(all(kSegmentStreamRow, j))] = 1;
  }
  return sums;
}

EvalSums GraphModel::evaluateSegments(const std::vector<const Matrix*>& params, const Matrix& segments) const {
  std::vector<Matrix> states = carriedStates(segments, evalStates_);
  GraphInputs<float> in;
  in.dense = &segments;
  in.states = &states;
  EvalSums sums;
  sums.lossSum = exec_->forward(params, in);
  keepStates(segments, evalStates_);
  sums.count = static_cast<double>(segments.cols() * graph_.steps());
  for (size_t t = 0; t < graph_.stepPredictions().size(); ++t) {
    sums.correct += stepCorrect(exec_->value(graph_.stepPredictions()[t]), segments, t);
  }
  return sums;
}

double GraphModel::stepCorrect(const Matrix& scores, const Matrix& segments, size_t step) {
  double correct = 0.0;
  for (int64_t j = 0; j < segments.cols(); ++j) {
    Eigen::Index best = 0;
    scores.col(j).maxCoeff(&best);
    const auto next = static_cast<Eigen::Index>(segments(kSegmentTokenRow + 1 + static_cast<int64_t>(step), j));
    correct += best == next ? 1.0 : 0.0;
  }
  return correct;
}

EvalSums GraphModel::evaluate(const ParamSet& w, const ExampleBatch& x) const {
  const std::vector<const Matrix*> params = paramPointers(w);
  if (graph_.steps() > 0) {
    ORPHEUS_CHECK_INPUT(x.dense != nullptr, "a sequence model needs token-stream data");
    return evaluateRuns(*x.dense, [&](const Matrix& run) { return evaluateSegments(params, run); });
  }
  std::vector<Matrix> locals = initialLocals(x, false);
  const GraphInputs<float> in = inputsOf(x, &locals);
  if (!locals.empty()) exec_->optimizeLocals(params, in);
  EvalSums sums;
  sums.lossSum = exec_->forward(params, in);
  sums.count = static_cast<double>(x.size());
  if (hasAccuracy()) {
    const Matrix& scores = exec_->value(graph_.prediction());
    for (int64_t j = 0; j < x.size(); ++j) {
      Eigen::Index best = 0;
      scores.col(j).maxCoeff(&best);
      sums.correct += best == (*x.labels)(j) ? 1.0 : 0.0;
    }
  }
  return sums;
}

}  // namespace orpheus::ops
