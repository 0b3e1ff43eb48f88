// DeviceExecutor's data queue: the next minibatch copied to the device while the
// current one computes (ops/device_exec.h, prefetch).
#include "engine/base/error.h"
#include "ops/device_exec.h"

#include <algorithm>
#include <cstring>

namespace orpheus::ops {

void DeviceExecutor::oneHot(const Eigen::VectorXi& labels, Eigen::Map<Matrix> out) const {
  out.setZero();
  for (int64_t j = 0; j < labels.size(); ++j) {
    const int t = labels(j);
    ORPHEUS_CHECK_INPUT(t >= 0 && t < out.rows(), "label {} out of range: the model has {} classes", t, out.rows());
    out(t, j) = 1.0f;
  }
}

void DeviceExecutor::prefetch(const Matrix& dense, const Eigen::VectorXi& labels) {
  const int input = graph_.inputNode();
  ORPHEUS_ENFORCE(graph_.steps() == 0 && input >= 0, "only a feed-forward graph with an input copies batches ahead");
  const int64_t features = graph_.node(input).rows;
  ORPHEUS_CHECK_INPUT(dense.rows() == features, "the model has {} features, the data {}", features, dense.rows());
  const int64_t batch = dense.cols();
  const int label = graph_.labelNode();
  const int64_t classes = label >= 0 ? graph_.node(label).rows : 0;
  if (label >= 0) {
    ORPHEUS_CHECK_INPUT(labels.size() == batch, "the batch has {} examples but {} labels", batch, labels.size());
  }
  Ahead& a = ahead_[aheadNext_];
  aheadNext_ ^= 1;
  // The copy that read the staging buffer last (two batches ago) must be done before it is written.
  backend_.wait(a.stagingRead);
  const size_t inputBytes = static_cast<size_t>(dense.size()) * sizeof(float);
  const size_t labelBytes = static_cast<size_t>(classes * batch) * sizeof(float);
  if (a.staging.bytes() < inputBytes + labelBytes) a.staging = backend_.allocateHost(inputBytes + labelBytes);
  if (inputBytes > 0) std::memcpy(a.staging.data(), dense.data(), inputBytes);
  if (a.input.rows() != features || a.input.cols() != batch) a.input = backend_.allocate(features, batch);
  a.copyInput = backend_.copyToDeviceAsync(a.staging, 0, a.input);
  a.copyLabels = AsyncCopy();
  if (label >= 0) {
    const Tensor host = a.staging.floats(inputBytes, classes, batch);
    oneHot(labels, Eigen::Map<Matrix>(host.data(), classes, batch));
    if (a.oneHot.rows() != classes || a.oneHot.cols() != batch) a.oneHot = backend_.allocate(classes, batch);
    a.copyLabels = backend_.copyToDeviceAsync(a.staging, inputBytes, a.oneHot);
  }
  a.stagingRead = label >= 0 ? a.copyLabels.done : a.copyInput.done;
  a.dense = &dense;
  a.data = dense.data();
  a.labels = &labels;
}

bool DeviceExecutor::takePrefetched(const Matrix* dense, const Eigen::VectorXi& labels) {
  const auto it = std::find_if(ahead_.begin(), ahead_.end(), [&](const Ahead& a) {
    return a.dense != nullptr && a.dense == dense && a.data == dense->data() && a.labels == &labels &&
           a.input.cols() == dense->cols();
  });
  if (it == ahead_.end()) return false;
  Ahead& a = *it;
  a.dense = nullptr;
  reserve(dense->cols());
  sparseBatch_ = false;
  const bool labelled = graph_.labelNode() >= 0;
  input_ = Tensor::view(a.input.device(), a.input.data(), a.input.rows(), a.input.cols());
  if (labelled) oneHot_ = Tensor::view(a.oneHot.device(), a.oneHot.data(), a.oneHot.rows(), a.oneHot.cols());
  // The pass's operations begin once the copies have landed; the host goes on.
  const Event reached = backend_.record();
  backend_.waitOnDevice(a.copyInput.done);
  if (labelled) backend_.waitOnDevice(a.copyLabels.done);
  dataWaits_.emplace_back(reached, labelled ? a.copyLabels.done : a.copyInput.done);
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
