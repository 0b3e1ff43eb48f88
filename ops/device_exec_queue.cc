// DeviceExecutor's data queue: the next minibatch copied to the device while the
// current one computes (ops/device_exec.h, prefetch): dense and sparse data, and
// a sequence model's token one-hots.
#include "engine/base/error.h"
#include "ops/device_exec.h"
#include "ops/sequence_layout.h"
#include "ops/staging.h"

#include <algorithm>
#include <cstring>

namespace orpheus::ops {
namespace {

// Bytes of the data-dependent variables queued with a batch (none: 0).
size_t localsBytes(const std::vector<Matrix>* locals) {
  size_t bytes = 0;
  if (locals != nullptr) {
    for (const Matrix& m : *locals) bytes += static_cast<size_t>(m.size()) * sizeof(float);
  }
  return bytes;
}

}  // namespace

void DeviceExecutor::oneHot(const Eigen::VectorXi& labels, Eigen::Map<Matrix> out) const {
  out.setZero();
  for (int64_t j = 0; j < labels.size(); ++j) {
    const int t = labels(j);
    ORPHEUS_CHECK_INPUT(t >= 0 && t < out.rows(), "label {} out of range: the model has {} classes", t, out.rows());
    out(t, j) = 1.0f;
  }
}

DeviceExecutor::Ahead& DeviceExecutor::nextAhead(size_t bytes) {
  Ahead& a = ahead_[aheadNext_];
  aheadNext_ ^= 1;
  // The copy that read the staging buffer last (two batches ago) must be done before it is written.
  a.staging.begin(backend_, bytes);
  a.dense = nullptr;
  a.sparse = nullptr;
  a.labels = nullptr;
  a.withLocals = false;
  return a;
}

void DeviceExecutor::stageLocals(Ahead& a, const std::vector<Matrix>& locals, int64_t batch) {
  const auto& ids = graph_.locals();
  ORPHEUS_ENFORCE(locals.size() == ids.size(), "the graph has {} data-dependent variables, {} were queued",
                  ids.size(), locals.size());
  a.locals.resize(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const Matrix& m = locals[k];
    const int64_t rows = graph_.node(ids[k]).rows;
    ORPHEUS_ENFORCE(m.rows() == rows && m.cols() == batch, "data-dependent variable '{}' is {}x{}, the batch needs {}x{}",
                    graph_.node(ids[k]).name, m.rows(), m.cols(), rows, batch);
    if (a.locals[k].rows() != rows || a.locals[k].cols() != batch) a.locals[k] = backend_.allocate(rows, batch);
    a.staging.up(m.data(), a.locals[k]);
  }
  a.withLocals = true;
}

void DeviceExecutor::forgetQueuedLocals() {
  for (Ahead& a : ahead_) a.withLocals = false;
}

void DeviceExecutor::stageLabels(Ahead& a, const Eigen::VectorXi& labels, int64_t batch) {
  const int label = graph_.labelNode();
  if (label < 0) return;
  ORPHEUS_CHECK_INPUT(labels.size() == batch, "the batch has {} examples but {} labels", batch, labels.size());
  const int64_t classes = graph_.node(label).rows;
  const size_t at = a.staging.reserveFloats(classes * batch);
  oneHot(labels, Eigen::Map<Matrix>(a.staging.floats(at), classes, batch));
  if (a.oneHot.rows() != classes || a.oneHot.cols() != batch) a.oneHot = backend_.allocate(classes, batch);
  a.staging.up(at, a.oneHot);
}


void DeviceExecutor::prefetch(const Matrix& dense, const Eigen::VectorXi& labels, const std::vector<Matrix>* locals) {
  const int input = graph_.inputNode();
  ORPHEUS_ENFORCE(graph_.steps() == 0 && input >= 0, "only a feed-forward graph with an input copies batches ahead");
  const int64_t features = graph_.node(input).rows;
  ORPHEUS_CHECK_INPUT(dense.rows() == features, "the model has {} features, the data {}", features, dense.rows());
  const int64_t batch = dense.cols();
  const int label = graph_.labelNode();
  const int64_t classes = label >= 0 ? graph_.node(label).rows : 0;
  const size_t inputBytes = static_cast<size_t>(dense.size()) * sizeof(float);
  Ahead& a = nextAhead(inputBytes + static_cast<size_t>(classes * batch) * sizeof(float) + localsBytes(locals));
  if (a.input.rows() != features || a.input.cols() != batch) a.input = backend_.allocate(features, batch);
  a.staging.up(dense.data(), a.input);
  stageLabels(a, labels, batch);
  if (locals != nullptr) stageLocals(a, *locals, batch);
  a.dense = &dense;
  a.data = dense.data();
  a.cols = batch;
  a.labels = &labels;
}

void DeviceExecutor::prefetch(const SparseMatrix& sparse, const Eigen::VectorXi& labels,
                              const std::vector<Matrix>* locals) {
  ORPHEUS_ENFORCE(queuesSparse(), "only a feed-forward graph with an input copies sparse batches ahead");
  const int64_t features = graph_.node(graph_.inputNode()).rows;
  ORPHEUS_CHECK_INPUT(sparse.rows() == features, "the model has {} features, the data {}", features, sparse.rows());
  const int64_t batch = sparse.cols();
  SparseMatrix compressed;
  if (!sparse.isCompressed()) {
    compressed = sparse;
    compressed.makeCompressed();
  }
  const SparseMatrix& m = sparse.isCompressed() ? sparse : compressed;
  const int label = graph_.labelNode();
  const int64_t classes = label >= 0 ? graph_.node(label).rows : 0;
  const size_t denseBytes = inputReadDensely_ ? static_cast<size_t>(features * batch) * sizeof(float) : 0;
  Ahead& a = nextAhead(stagedSparseBytes(backend_, m) + denseBytes + static_cast<size_t>(classes * batch) * sizeof(float) +
                       localsBytes(locals));
  stageSparse(backend_, m, a.staging, a.sparseInput);
  if (inputReadDensely_) {
    // Its dense copy, as upload() makes it (hostDense_ = the sparse batch).
    const size_t at = a.staging.reserveFloats(features * batch);
    Eigen::Map<Matrix>(a.staging.floats(at), features, batch) = m;
    if (a.input.rows() != features || a.input.cols() != batch) a.input = backend_.allocate(features, batch);
    a.staging.up(at, a.input);
  }
  stageLabels(a, labels, batch);
  if (locals != nullptr) stageLocals(a, *locals, batch);
  a.sparse = &sparse;
  a.data = sparse.valuePtr();
  a.cols = batch;
  a.labels = &labels;
}

void DeviceExecutor::prefetchSequence(const Matrix& segments) {
  ORPHEUS_ENFORCE(graph_.steps() > 0, "prefetchSequence: the graph is not an unrolled sequence model");
  ORPHEUS_CHECK_INPUT(segments.rows() == segmentRows(graph_.steps()),
                      "the model unrolls {} steps, so a segment needs {} rows, but the data has {}", graph_.steps(),
                      segmentRows(graph_.steps()), segments.rows());
  const int64_t b = segments.cols();
  const size_t nodes = graph_.nodes().size();
  // The one-hots are built into the slot that is free: the other may still be the pass's.
  Ahead& a = ahead_[aheadNext_];
  a.tokens.resize(nodes);
  a.sparseTokens.resize(nodes);
  a.denseTokens.resize(nodes);
  size_t bytes = 0;
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (n.kind != NodeKind::kToken) continue;
    buildTokens(segments, n, a.tokens[i]);
    if (tokenSparse_[i]) bytes += stagedSparseBytes(backend_, a.tokens[i]);
    if (tokenDense_[i]) bytes += static_cast<size_t>(n.rows * b) * sizeof(float);
  }
  nextAhead(bytes);
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (n.kind != NodeKind::kToken) continue;
    if (tokenSparse_[i]) stageSparse(backend_, a.tokens[i], a.staging, a.sparseTokens[i]);
    if (tokenDense_[i]) {
      // The dense one-hot as uploadSequence makes it (hostStep_ = m: zeros and ones).
      const size_t at = a.staging.reserveFloats(n.rows * b);
      Eigen::Map<Matrix>(a.staging.floats(at), n.rows, b) = a.tokens[i];
      Tensor& dst = a.denseTokens[i];
      if (dst.rows() != n.rows || dst.cols() != b) dst = backend_.allocate(n.rows, b);
      a.staging.up(at, dst);
    }
  }
  a.dense = &segments;
  a.data = segments.data();
  a.cols = b;
}

void DeviceExecutor::orderAfter(const Ahead& a) {
  // The pass's operations begin once the copies have landed; the host goes on.
  const Event landed = a.staging.last();
  if (landed.empty()) return;
  const Event reached = backend_.record();
  backend_.waitOnDevice(landed);
  dataWaits_.emplace_back(reached, landed);
}

bool DeviceExecutor::takePrefetched(const Matrix* dense, const SparseMatrix* sparse, const Eigen::VectorXi& labels) {
  const void* data = dense != nullptr ? static_cast<const void*>(dense->data())
                     : sparse != nullptr ? static_cast<const void*>(sparse->valuePtr())
                                         : nullptr;
  const int64_t cols = dense != nullptr ? dense->cols() : sparse != nullptr ? sparse->cols() : -1;
  const auto it = std::find_if(ahead_.begin(), ahead_.end(), [&](const Ahead& a) {
    return (a.dense != nullptr || a.sparse != nullptr) && a.dense == dense && a.sparse == sparse && a.data == data &&
           a.labels == &labels && a.cols == cols;
  });
  if (it == ahead_.end()) return false;
  Ahead& a = *it;
  a.dense = nullptr;
  a.sparse = nullptr;
  reserve(cols);
  sparseBatch_ = sparse != nullptr;
  if (dense != nullptr || inputReadDensely_) {
    input_ = Tensor::view(a.input.device(), a.input.data(), a.input.rows(), a.input.cols());
  }
  if (a.withLocals) localsTaken_ = &a;
  a.withLocals = false;
  // sparse_ keeps its storage for batches copied in later; its view is the slot's.
  if (sparse != nullptr) sparse_.view = a.sparseInput.view;
  if (graph_.labelNode() >= 0) {
    oneHot_ = Tensor::view(a.oneHot.device(), a.oneHot.data(), a.oneHot.rows(), a.oneHot.cols());
  }
  orderAfter(a);
  return true;
}

bool DeviceExecutor::takePrefetchedSequence(const Matrix& segments) {
  const auto it = std::find_if(ahead_.begin(), ahead_.end(), [&](const Ahead& a) {
    return a.dense == &segments && a.data == segments.data() && a.cols == segments.cols();
  });
  if (it == ahead_.end()) return false;
  Ahead& a = *it;
  a.dense = nullptr;
  for (const Node& n : graph_.nodes()) {
    const size_t i = static_cast<size_t>(n.id);
    if (n.kind != NodeKind::kToken) continue;
    // The host one-hots are the batch's V (siteVTokens); the slot keeps the last batch's.
    std::swap(hostTokens_[i], a.tokens[i]);
    if (tokenSparse_[i]) deviceTokens_[i].view = a.sparseTokens[i].view;
    if (tokenDense_[i]) std::swap(values_[i], a.denseTokens[i]);
  }
  orderAfter(a);
  return true;
}

double DeviceExecutor::takeDataWait() {
  double waited = 0.0;
  for (const auto& [reached, landed] : dataWaits_) {
    backend_.wait(reached);
    backend_.wait(landed);
    waited += std::max(0.0, backend_.secondsBetween(reached, landed));
  }
  dataWaits_.clear();
  return waited;
}

}  // namespace orpheus::ops
