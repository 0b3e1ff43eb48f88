// GraphModel on a device: DeviceExecutor's passes, their SVs and gradients, and
// test batches scored where the parameters live.
#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/graph_model.h"
#include "ops/sequence_layout.h"

#include <algorithm>
#include <unordered_map>

namespace orpheus::ops {
namespace {

// One object for a batch without labels, so the data queue knows it again.
const Eigen::VectorXi& noLabels() {
  static const Eigen::VectorXi none;
  return none;
}

}  // namespace

DeviceExecutor& GraphModel::runOnDevice(std::span<const Tensor> w, const ExampleBatch& x, Backend& backend,
                                        double* meanLoss, const std::function<void(size_t)>& siteReady) const {
  if (!deviceRefusal_.empty()) throw Error(fmt::format("model {} does not run on a device: {}", spec_, deviceRefusal_));
  ORPHEUS_CHECK_INPUT(w.size() == graph_.params().size(), "the model has {} parameters, got {}",
                      graph_.params().size(), w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const Node& n = graph_.node(graph_.params()[i]);
    ORPHEUS_CHECK_INPUT(w[i].rows() == n.rows && w[i].cols() == n.cols,
                        "parameter '{}' has shape {}x{}, the model expects {}x{}", n.name, w[i].rows(), w[i].cols(),
                        n.rows, n.cols);
    ORPHEUS_ENFORCE(w[i].device() == backend.device(), "parameter '{}' lives in {} memory, the backend is {}", n.name,
                    deviceName(w[i].device()), backend.name());
  }
  trainingExecutor(backend);
  const int64_t b = x.dense ? x.dense->cols() : x.sparse ? x.sparse->cols() : x.size();
  if (graph_.steps() > 0) {
    ORPHEUS_CHECK_INPUT(x.dense != nullptr, "a sequence model needs token-stream data");
    const double loss = runSegmentsOnDevice(*deviceExec_, w, *x.dense, trainStates_, true);
    // Per token, as runBatch.
    if (meanLoss) *meanLoss = b > 0 ? loss / static_cast<double>(b * graph_.steps()) : 0.0;
    return *deviceExec_;
  }
  // Data-dependent variables: the kept values of the batch's examples in, refined
  // on the device, and kept again, as runBatch keeps them.
  std::vector<Matrix> locals = initialLocals(x, true);
  const double loss = deviceExec_->run(w, x.dense, x.sparse, x.labels ? *x.labels : noLabels(), siteReady,
                                       locals.empty() ? nullptr : &locals);
  keepLocals(x, locals);
  if (meanLoss) *meanLoss = b > 0 ? loss / static_cast<double>(b) : 0.0;
  return *deviceExec_;
}

DeviceExecutor& GraphModel::trainingExecutor(Backend& backend) const {
  if (!deviceExec_ || &deviceExec_->backend() != &backend) {
    flushDeviceStates();
    joinedU_.clear();
    joinedV_.clear();
    joinedTokensCopy_ = {};
    deviceExec_.reset();  // its tensors go back to the backend they came from first
    deviceExec_ = std::make_unique<DeviceExecutor>(graph_, backend, fuseLstmCells_);
  }
  return *deviceExec_;
}

bool GraphModel::prefetchOnDevice(const ExampleBatch& next, Backend& backend) const {
  if (!deviceRefusal_.empty()) return false;
  if (graph_.steps() > 0) {
    if (next.dense == nullptr) return false;
    trainingExecutor(backend).prefetchSequence(*next.dense);
    return true;
  }
  if (graph_.inputNode() < 0) return false;
  const Eigen::VectorXi& labels = next.labels ? *next.labels : noLabels();
  if (next.dense == nullptr && (next.sparse == nullptr || !trainingExecutor(backend).queuesSparse())) return false;
  // The DDV swap queue's way in: the batch's data-dependent variables as kept now
  // travel with it; keepLocals marks them stale if any of its examples is kept again first.
  std::vector<Matrix> locals = initialLocals(next, true);
  const std::vector<Matrix>* queued = locals.empty() ? nullptr : &locals;
  queuedLocals_.clear();
  if (queued != nullptr && next.indices) queuedLocals_.insert(next.indices->begin(), next.indices->end());
  if (next.dense != nullptr) {
    trainingExecutor(backend).prefetch(*next.dense, labels, queued);
  } else {
    trainingExecutor(backend).prefetch(*next.sparse, labels, queued);
  }
  return true;
}

bool GraphModel::continuesDeviceStates(const Matrix& segments) const {
  const Matrix& last = deviceStatesOf_;
  if (last.size() == 0 || last.cols() != segments.cols()) return false;
  std::unordered_map<int64_t, int> streams;
  for (int64_t j = 0; j < segments.cols(); ++j) {
    const float stream = segments(kSegmentStreamRow, j);
    if (stream != last(kSegmentStreamRow, j) || ++streams[static_cast<int64_t>(stream)] > 1) return false;
    const auto index = static_cast<int64_t>(segments(kSegmentIndexRow, j));
    if (index != static_cast<int64_t>(last(kSegmentIndexRow, j)) + 1) return false;
  }
  return true;
}

void GraphModel::flushDeviceStates() const {
  if (deviceStatesOf_.size() == 0) return;
  std::vector<Matrix> finals(graph_.finalStates().size());
  std::vector<const Matrix*> pointers;
  for (size_t k = 0; k < finals.size(); ++k) {
    deviceExec_->finalState(k, finals[k]);
    pointers.push_back(&finals[k]);
  }
  keepStates(deviceStatesOf_, pointers, trainStates_);
  deviceStatesOf_.resize(0, 0);
}

double GraphModel::runSegmentsOnDevice(DeviceExecutor& exec, std::span<const Tensor> w, const Matrix& segments,
                                       CarriedStates& kept, bool train) const {
  if (train) {
    // Segments that continue the last pass's streams, column by column, start from
    // its states where they are; the new ones stay there too.
    if (continuesDeviceStates(segments)) {
      exec.carryFinalStates();
    } else {
      flushDeviceStates();
    }
    const bool carried = deviceStatesOf_.size() > 0;
    const std::vector<Matrix> states = carried ? std::vector<Matrix>{} : carriedStates(segments, kept);
    const double loss = exec.runSequence(w, segments, carried ? nullptr : &states);
    deviceStatesOf_ = segments.topRows(kSegmentIndexRow + 1);
    return loss;
  }
  const std::vector<Matrix> states = carriedStates(segments, kept);
  const double loss = train ? exec.runSequence(w, segments, &states) : exec.evaluateSequence(w, segments, &states);
  // The last step's states come to the host, where they are kept by stream.
  std::vector<Matrix> finals(graph_.finalStates().size());
  std::vector<const Matrix*> pointers;
  for (size_t k = 0; k < finals.size(); ++k) {
    exec.finalState(k, finals[k]);
    pointers.push_back(&finals[k]);
  }
  keepStates(segments, pointers, kept);
  return loss;
}

EvalSums GraphModel::evaluateOnDevice(std::span<const Tensor> w, const ExampleBatch& x, Backend& backend) const {
  if (!deviceRefusal_.empty()) throw Error(fmt::format("model {} does not run on a device: {}", spec_, deviceRefusal_));
  ORPHEUS_CHECK_INPUT(w.size() == graph_.params().size(), "the model has {} parameters, got {}",
                      graph_.params().size(), w.size());
  if (!evalExec_ || &evalExec_->backend() != &backend) {
    evalExec_.reset();
    evalExec_ = std::make_unique<DeviceExecutor>(graph_, backend, fuseLstmCells_);
  }
  if (graph_.steps() > 0) {
    ORPHEUS_CHECK_INPUT(x.dense != nullptr, "a sequence model needs token-stream data");
    // As evaluate: runs of distinct streams, states carried apart from training's.
    return evaluateRuns(*x.dense, [&](const Matrix& run) {
      EvalSums sums;
      sums.lossSum = runSegmentsOnDevice(*evalExec_, w, run, evalStates_, false);
      sums.count = static_cast<double>(run.cols() * graph_.steps());
      Matrix scores;
      for (size_t t = 0; t < graph_.stepPredictions().size(); ++t) {
        evalExec_->copyOut(graph_.stepPredictions()[t], scores);
        sums.correct += stepCorrect(scores, run, t);
      }
      return sums;
    });
  }
  static const Eigen::VectorXi kNoLabels;
  Matrix scores;
  EvalSums sums;
  // A test example's data-dependent variables are inferred afresh, never kept.
  std::vector<Matrix> locals = initialLocals(x, false);
  sums.lossSum = evalExec_->evaluate(w, x.dense, x.sparse, x.labels ? *x.labels : kNoLabels,
                                     hasAccuracy() ? &scores : nullptr, locals.empty() ? nullptr : &locals);
  sums.count = static_cast<double>(x.size());
  if (hasAccuracy()) {
    for (int64_t j = 0; j < x.size(); ++j) {
      Eigen::Index best = 0;
      scores.col(j).maxCoeff(&best);
      sums.correct += best == (*x.labels)(j) ? 1.0 : 0.0;
    }
  }
  return sums;
}

SvBatch GraphModel::computeSvgOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                       Backend& backend) const {
  return deviceBatch(w, x, meanLoss, backend, {});
}

SvBatch GraphModel::computeSvgOnDeviceStreamed(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                               Backend& backend, const DeviceSvReadyFn& ready) const {
  // A sequence model's batch entries are not the executor's sites one to one (stepColumns).
  return deviceBatch(w, x, meanLoss, backend, graph_.steps() > 0 ? DeviceSvReadyFn() : ready);
}

SvBatch GraphModel::deviceBatch(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                                const DeviceSvReadyFn& ready) const {
  // A site's V is a value of the pass unless it is host data: the input, or token one-hots.
  const auto deviceV = [](const DeviceExecutor& e, size_t i) -> const Tensor* {
    return e.siteVTokens(i) != nullptr || e.siteVIsInput(i) ? nullptr : e.siteVDense(i);
  };
  std::function<void(size_t)> siteReady;
  if (ready) {
    siteReady = [&](size_t i) { ready(i, deviceExec_->siteU(i), deviceV(*deviceExec_, i)); };
  }
  DeviceExecutor& exec = runOnDevice(w, x, backend, meanLoss, siteReady);
  const std::vector<SvSite>& sites = exec.sites();
  SvBatch batch;
  batch.matrices.resize(sites.size());
  for (size_t i = 0; i < sites.size(); ++i) {
    SvMatrix& m = batch.matrices[i];
    m.paramId = static_cast<uint32_t>(sites[i].param);
    m.biasId = sites[i].bias;
    const Tensor& u = exec.siteU(i);
    m.u.resize(u.rows(), u.cols());
    if (!ready) {
      Tensor hostU = cpu::view(m.u);
      backend.copy(u, hostU);
    }
    // V of a token is the one-hot the executor built on the host.
    if (const SparseMatrix* tokens = exec.siteVTokens(i)) {
      m.sparseV = true;
      m.vSparse = *tokens;
      continue;
    }
    // V of the input is the batch itself, already in host memory.
    if (exec.siteVIsInput(i)) {
      m.sparseV = x.sparse != nullptr;
      if (m.sparseV) {
        m.vSparse = *x.sparse;
      } else {
        m.vDense = *x.dense;
      }
      continue;
    }
    const Tensor& v = *deviceV(exec, i);
    m.vDense.resize(v.rows(), v.cols());
    if (ready) continue;
    Tensor hostV = cpu::view(m.vDense);
    backend.copy(v, hostV);
  }
  const int64_t b = x.dense ? x.dense->cols() : x.sparse ? x.sparse->cols() : x.size();
  batch.coeffs = Vector::Ones(b);
  if (graph_.steps() > 0 && svgUnit_ == SvgUnit::kStep && b > 0) return stepColumns(std::move(batch), b);
  return batch;
}

std::vector<DeviceSvs> GraphModel::lastDeviceSvs() const {
  if (!deviceExec_) return {};
  const DeviceExecutor& exec = *deviceExec_;
  // Per (example, step), a sequence model's batch has one entry per site, as a
  // feed-forward one: its U, and its V unless that is a token's one-hot (sparse, on
  // the host).
  if (graph_.steps() == 0 || svgUnit_ != SvgUnit::kStep) {
    std::vector<DeviceSvs> svs(exec.sites().size());
    for (size_t i = 0; i < svs.size(); ++i) {
      svs[i].u = &exec.siteU(i);
      svs[i].vDense = exec.siteVDense(i);
    }
    return svs;
  }
  // Per step, an entry joins the sites stepColumns joins (same parameter, bias and
  // kind of V, in site order), their columns side by side: joined here the same way.
  const std::vector<SvSite>& sites = exec.sites();
  std::vector<std::vector<size_t>> groups;
  const auto sameEntry = [&](size_t a, size_t b) {
    return sites[a].param == sites[b].param && sites[a].bias == sites[b].bias &&
           (exec.siteVDense(a) == nullptr) == (exec.siteVDense(b) == nullptr);
  };
  for (size_t i = 0; i < sites.size(); ++i) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return sameEntry(g.front(), i); });
    if (it == groups.end()) {
      groups.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  Backend& backend = exec.backend();
  // Sized first: the entries point into them.
  joinedU_.resize(std::max(joinedU_.size(), groups.size()));
  joinedV_.resize(std::max(joinedV_.size(), groups.size()));
  std::vector<DeviceSvs> svs(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    std::vector<const Tensor*> u, v;
    for (size_t i : groups[k]) {
      u.push_back(&exec.siteU(i));
      if (const Tensor* dense = exec.siteVDense(i)) v.push_back(dense);
    }
    svs[k].u = &joinColumns(joinedU_[k], u, backend);
    if (!v.empty()) svs[k].vDense = &joinColumns(joinedV_[k], v, backend);
  }
  return svs;
}

SparseMatrix GraphModel::sideBySide(const std::vector<const SparseMatrix*>& parts) {
  int64_t cols = 0, nnz = 0;
  for (const SparseMatrix* part : parts) {
    cols += part->cols();
    nnz += part->nonZeros();
  }
  SparseMatrix out(parts.front()->rows(), cols);
  out.reserve(nnz);
  int64_t at = 0;
  for (const SparseMatrix* part : parts) {
    for (int64_t j = 0; j < part->cols(); ++j) {
      out.startVec(static_cast<int32_t>(at + j));
      for (SparseMatrix::InnerIterator it(*part, j); it; ++it) out.insertBack(it.row(), at + j) = it.value();
    }
    at += part->cols();
  }
  out.finalize();
  return out;
}

Tensor& GraphModel::joinColumns(Tensor& store, const std::vector<const Tensor*>& parts, Backend& backend) {
  const int64_t rows = parts.front()->rows();
  int64_t cols = 0;
  for (const Tensor* part : parts) cols += part->cols();
  if (store.rows() != rows || store.cols() != cols || store.device() != backend.device()) {
    store = backend.allocate(rows, cols);
  }
  int64_t at = 0;
  for (const Tensor* part : parts) {
    Tensor block = store.middleCols(at, part->cols());
    backend.copy(*part, block);
    at += part->cols();
  }
  return store;
}

void GraphModel::denseGradientOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                       Backend& backend, std::span<Tensor> grad) const {
  ORPHEUS_CHECK_INPUT(grad.size() == w.size(), "{} gradient tensors for {} parameters", grad.size(), w.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    ORPHEUS_ENFORCE(grad[i].rows() == w[i].rows() && grad[i].cols() == w[i].cols() &&
                        grad[i].device() == backend.device(),
                    "gradient {} is a {}x{} tensor in {} memory, its parameter {}x{} on {}", i, grad[i].rows(),
                    grad[i].cols(), deviceName(grad[i].device()), w[i].rows(), w[i].cols(), backend.name());
  }
  DeviceExecutor& exec = runOnDevice(w, x, backend, meanLoss);
  // A parameter's first term overwrites its gradient (beta 0), later ones add to it.
  std::vector<bool> written(grad.size(), false);
  const auto beta = [&](int param) { return written[static_cast<size_t>(param)] ? 1.0f : 0.0f; };
  const std::vector<SvSite>& sites = exec.sites();
  // Per parameter, the terms as the rebuild sums a batch's (ops/rebuild.cc), so the
  // host's dense gradient and this one are the same sums: the sites with a dense V
  // (a sequence model's steps) joined side by side into one product, then those with
  // a sparse V one by one.
  std::vector<std::vector<size_t>> denseSites(grad.size()), tokenSites(grad.size());
  for (size_t i = 0; i < sites.size(); ++i) {
    const auto p = static_cast<size_t>(sites[i].param);
    if (exec.siteVDense(i) != nullptr) denseSites[p].push_back(i);
    if (exec.siteVTokens(i) != nullptr) tokenSites[p].push_back(i);
  }
  joinedU_.resize(std::max(joinedU_.size(), grad.size()));
  joinedV_.resize(std::max(joinedV_.size(), grad.size()));
  for (size_t p = 0; p < grad.size(); ++p) {
    const std::vector<size_t>& terms = denseSites[p];
    if (terms.empty()) continue;
    const Tensor* u = &exec.siteU(terms.front());
    const Tensor* v = exec.siteVDense(terms.front());
    if (terms.size() > 1) {
      std::vector<const Tensor*> us, vs;
      for (size_t i : terms) {
        us.push_back(&exec.siteU(i));
        vs.push_back(exec.siteVDense(i));
      }
      u = &joinColumns(joinedU_[p], us, backend);
      v = &joinColumns(joinedV_[p], vs, backend);
    }
    backend.gemm(Trans::kNo, Trans::kYes, 1.0f, *u, *v, 0.0f, grad[p]);
    written[p] = true;
  }
  // A sequence model's token one-hots (its embedding's V, one per step) joined on
  // the host, where they are made, and copied over once.
  for (size_t p = 0; p < grad.size(); ++p) {
    const std::vector<size_t>& terms = tokenSites[p];
    if (terms.size() < 2) continue;
    std::vector<const Tensor*> us;
    std::vector<const SparseMatrix*> vs;
    for (size_t i : terms) {
      us.push_back(&exec.siteU(i));
      vs.push_back(exec.siteVTokens(i));
    }
    joinedTokens_ = sideBySide(vs);
    backend.copySparse(cpu::view(joinedTokens_), joinedTokensCopy_);
    backend.gemmSparse(1.0f, joinColumns(joinedU_[p], us, backend), joinedTokensCopy_.view, Trans::kYes, beta(p),
                       grad[p]);
    written[p] = true;
  }
  for (size_t i = 0; i < sites.size(); ++i) {
    const SvSite& site = sites[i];
    const Tensor& u = exec.siteU(i);
    const SparseTensor* v = exec.siteVSparse(i);
    if (v != nullptr && tokenSites[static_cast<size_t>(site.param)].size() < 2) {
      backend.gemmSparse(1.0f, u, *v, Trans::kYes, beta(site.param), grad[static_cast<size_t>(site.param)]);
      written[static_cast<size_t>(site.param)] = true;
    }
    if (site.bias >= 0) {
      backend.sumColumns(u, beta(site.bias), grad[static_cast<size_t>(site.bias)]);
      written[static_cast<size_t>(site.bias)] = true;
    }
  }
  // identifySvs refuses a parameter that is neither a site's matrix nor its bias.
  for (size_t i = 0; i < written.size(); ++i) {
    ORPHEUS_ENFORCE(written[i], "parameter '{}' has no SV site", graph_.node(graph_.params()[i]).name);
  }
}

}  // namespace orpheus::ops
