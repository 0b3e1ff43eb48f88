#include "engine/worker/device_replica.h"

#include "engine/base/error.h"

#include <algorithm>
#include <array>
#include <limits>

namespace orpheus::engine {
namespace {

ops::Tensor hostView(Matrix& m) { return ops::Tensor::host(m.data(), m.rows(), m.cols()); }
ops::Tensor hostView(const Matrix& m) { return ops::Tensor::host(m.data(), m.rows(), m.cols()); }

}  // namespace

std::string residencyRefusal(const ops::Model& model, const ops::Backend& backend) {
  if (backend.device() == ops::Device::kCpu) return "the host is the device";
  if (std::string why = model.deviceRefusal(); !why.empty()) return why;
  return "";
}

DeviceReplica::DeviceReplica(ops::Backend& backend, const ParamSet& params, Optimizer& optimizer, bool stagedUploads)
    : backend_(backend), poisons_(backend.device() == ops::Device::kStrict) {
  rebuild_.device.staged = stagedUploads;
  int64_t largest = 1;
  for (const Param& p : params.params) {
    params_.push_back(backend.allocate(p.value.rows(), p.value.cols()));
    if (!optimizer.settings().foldsLearningRate()) gradient_.push_back(backend.allocate(p.value.rows(), p.value.cols()));
    largest = std::max<int64_t>(largest, p.value.size());
  }
  for (const Matrix* b : optimizer.buffers()) state_.push_back(backend.allocate(b->rows(), b->cols()));
  zeros_ = backend.allocate(largest, 1);
  const Vector zero = Vector::Zero(largest);
  backend.copy(ops::Tensor::host(zero.data(), largest, 1), zeros_);
  zeroGradient();
}

void DeviceReplica::upload(ParamSet& host, Optimizer& optimizer) {
  ORPHEUS_ENFORCE(host.size() == params_.size(), "a replica of {} parameters for a device replica of {}", host.size(),
                  params_.size());
  for (size_t i = 0; i < params_.size(); ++i) backend_.copy(hostView(host[i]), params_[i]);
  const std::vector<Matrix*> buffers = optimizer.buffers();
  ORPHEUS_ENFORCE(buffers.size() == state_.size(), "optimizer state of {} buffers for {}", buffers.size(),
                  state_.size());
  for (size_t i = 0; i < state_.size(); ++i) backend_.copy(hostView(*buffers[i]), state_[i]);
  current_ = Current::kBoth;
}

void DeviceReplica::moved(ParamSet& host, Optimizer& optimizer) {
  if (current_ == Current::kDevice) return;
  current_ = Current::kDevice;
  if (!poisons_) return;
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (Param& p : host.params) p.value.setConstant(kNaN);
  for (Matrix* b : optimizer.buffers()) b->setConstant(kNaN);
}

std::span<const ops::Tensor> DeviceReplica::params(ParamSet& host, Optimizer& optimizer) {
  if (current_ == Current::kHost) upload(host, optimizer);
  return params_;
}

void DeviceReplica::rebuild(std::span<const SvBatchView* const> batches, bool intoGradient, ParamSet& host,
                            Optimizer& optimizer, std::span<const ops::DeviceSvs> onDevice) {
  if (current_ == Current::kHost) upload(host, optimizer);
  ORPHEUS_ENFORCE(!intoGradient || !gradient_.empty(), "a rebuild into the gradient of an optimizer that folds");
  ops::applySvBatches(batches, intoGradient ? std::span<ops::Tensor>(gradient_) : std::span<ops::Tensor>(params_),
                      backend_, rebuild_, onDevice);
  if (!intoGradient) moved(host, optimizer);
}

void DeviceReplica::loadGradient(const ParamSet& gradient, float scale, ParamSet& host, Optimizer& optimizer) {
  if (current_ == Current::kHost) upload(host, optimizer);
  for (size_t i = 0; i < gradient_.size(); ++i) {
    backend_.copy(hostView(gradient[i]), gradient_[i]);
    backend_.scale(scale, gradient_[i]);
  }
}

void DeviceReplica::addScaled(const ParamSet& gradient, float scale, ParamSet& host, Optimizer& optimizer) {
  if (current_ == Current::kHost) upload(host, optimizer);
  for (size_t i = 0; i < params_.size(); ++i) {
    // The rebuild's V buffer holds the gradient on its way: no tensor of its own.
    ops::Tensor& store = rebuild_.device.v;
    if (store.size() < gradient[i].size()) store = backend_.allocate(1, gradient[i].size());
    ops::Tensor g = ops::Tensor::view(backend_.device(), store.data(), gradient[i].rows(), gradient[i].cols());
    backend_.copy(hostView(gradient[i]), g);
    backend_.axpy(scale, g, params_[i]);
  }
  moved(host, optimizer);
}

void DeviceReplica::loadGradient(std::span<const ops::Tensor> gradient, float scale, ParamSet& host,
                                 Optimizer& optimizer) {
  if (current_ == Current::kHost) upload(host, optimizer);
  ORPHEUS_ENFORCE(gradient.size() == gradient_.size(), "a device gradient of {} parameters for {}", gradient.size(),
                  gradient_.size());
  for (size_t i = 0; i < gradient_.size(); ++i) {
    backend_.copy(gradient[i], gradient_[i]);
    backend_.scale(scale, gradient_[i]);
  }
}

void DeviceReplica::addScaled(std::span<const ops::Tensor> gradient, float scale, ParamSet& host,
                              Optimizer& optimizer) {
  if (current_ == Current::kHost) upload(host, optimizer);
  ORPHEUS_ENFORCE(gradient.size() == params_.size(), "a device gradient of {} parameters for {}", gradient.size(),
                  params_.size());
  for (size_t i = 0; i < params_.size(); ++i) backend_.axpy(scale, gradient[i], params_[i]);
  moved(host, optimizer);
}

void DeviceReplica::step(uint64_t clock, ParamSet& host, Optimizer& optimizer) {
  if (current_ == Current::kHost) upload(host, optimizer);
  // The step count moves as Optimizer::step moves it.
  optimizer.setSteps(optimizer.steps() + 1);
  if (isQuasiNewton(optimizer.settings().kind)) {
    quasiNewtonStep(clock, optimizer);
    zeroGradient();
    moved(host, optimizer);
    return;
  }
  const ops::OptimizerStep s = stepSettings(optimizer.settings(), clock, optimizer.steps());
  const size_t n = params_.size();
  for (size_t i = 0; i < n; ++i) {
    ops::Tensor* b0 = state_.size() >= n ? &state_[i] : nullptr;
    ops::Tensor* b1 = state_.size() >= 2 * n ? &state_[n + i] : nullptr;
    backend_.optimizerStep(s, gradient_[i], params_[i], b0, b1);
  }
  zeroGradient();
  moved(host, optimizer);
}

// Optimizer::quasiNewtonStep in float through the backend: every parameter
// flattened into x (and its gradient plus weight decay into d), the pair s, y and
// h = W y formed beside it, and their 3 x 3 products read back, from which
// ops::planQnUpdate decides as the host does. W = scale W + [a, -v] [a, v]^T is one
// GEMM, the step x -= lr W d another.
void DeviceReplica::quasiNewtonStep(uint64_t clock, Optimizer& optimizer) {
  const size_t count = params_.size();
  ORPHEUS_ENFORCE(state_.size() == 2 * count + 1, "quasi-Newton state of {} buffers for {} parameters",
                  state_.size(), count);
  ops::Tensor& w = state_[2 * count];
  const int64_t n = w.rows();
  if (qn_.vectors.size() == 0) {
    qn_.vectors = backend_.allocate(n, 3);
    qn_.pair = backend_.allocate(n, 3);
    qn_.svs = backend_.allocate(n, 2);
    qn_.signedSvs = backend_.allocate(n, 2);
    qn_.products = backend_.allocate(3, 3);
  }
  const ops::Device device = backend_.device();
  // Parameter i's entries of a flat column, shaped like the parameter.
  const auto segment = [&](const ops::Tensor& column, int64_t at, const ops::Tensor& like) {
    return ops::Tensor::view(device, column.data() + at, like.rows(), like.cols());
  };
  const ops::Tensor x = qn_.vectors.middleCols(0, 1), d = qn_.vectors.middleCols(1, 1);
  ops::Tensor direction = qn_.vectors.middleCols(2, 1);
  ops::Tensor s = qn_.pair.middleCols(0, 1), y = qn_.pair.middleCols(1, 1), h = qn_.pair.middleCols(2, 1);
  const auto wd = static_cast<float>(optimizer.settings().weightDecay);
  int64_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    ops::Tensor xi = segment(x, at, params_[i]), di = segment(d, at, params_[i]);
    backend_.copy(params_[i], xi);
    backend_.copy(gradient_[i], di);
    if (wd != 0.0f) backend_.axpy(wd, params_[i], di);
    at += params_[i].size();
  }
  ORPHEUS_ENFORCE(at == n, "quasi-Newton W is {}x{} for {} parameter entries", n, n, at);
  if (optimizer.steps() > 1) {
    at = 0;
    for (size_t i = 0; i < count; ++i) {
      ops::Tensor si = segment(s, at, params_[i]), yi = segment(y, at, params_[i]);
      backend_.copy(segment(x, at, params_[i]), si);
      backend_.axpy(-1.0f, state_[i], si);
      backend_.copy(segment(d, at, params_[i]), yi);
      backend_.axpy(-1.0f, state_[count + i], yi);
      at += params_[i].size();
    }
    backend_.gemm(ops::Trans::kNo, ops::Trans::kNo, 1.0f, w, y, 0.0f, h);
    backend_.gemm(ops::Trans::kYes, ops::Trans::kNo, 1.0f, qn_.pair, qn_.pair, 0.0f, qn_.products);
    Matrix products(3, 3);
    ops::Tensor hostProducts = hostView(products);
    backend_.copy(qn_.products, hostProducts);
    const ops::QnUpdate update =
        ops::planQnUpdate(quasiNewtonMethod(optimizer.settings().kind), products(0, 1), products(1, 1),
                          products(0, 0), products(1, 2), optimizer.firstQuasiNewtonUpdate());
    if (update.skip) {
      optimizer.noteSkip();
    } else {
      const std::array<double, 4>& c = update.coefficients;
      for (int k = 0; k < 2; ++k) {
        ops::Tensor sv = qn_.svs.middleCols(k, 1);
        backend_.copy(s, sv);
        backend_.scale(static_cast<float>(c[2 * k]), sv);
        if (c[2 * k + 1] != 0.0) backend_.axpy(static_cast<float>(c[2 * k + 1]), h, sv);
      }
      backend_.copy(qn_.svs, qn_.signedSvs);
      ops::Tensor negated = qn_.signedSvs.middleCols(1, 1);
      backend_.scale(-1.0f, negated);
      if (update.scale != 1.0) backend_.scale(static_cast<float>(update.scale), w);
      backend_.gemm(ops::Trans::kNo, ops::Trans::kYes, 1.0f, qn_.signedSvs, qn_.svs, 1.0f, w);
    }
  }
  backend_.gemm(ops::Trans::kNo, ops::Trans::kNo, 1.0f, w, d, 0.0f, direction);
  const auto lr = static_cast<float>(learningRate(optimizer.settings(), clock));
  at = 0;
  for (size_t i = 0; i < count; ++i) {
    backend_.copy(segment(x, at, params_[i]), state_[i]);
    backend_.copy(segment(d, at, params_[i]), state_[count + i]);
    backend_.axpy(-lr, segment(direction, at, params_[i]), params_[i]);
    at += params_[i].size();
  }
}

void DeviceReplica::zeroGradient() {
  for (ops::Tensor& g : gradient_) {
    backend_.copy(ops::Tensor::view(backend_.device(), zeros_.data(), g.rows(), g.cols()), g);
  }
}

void DeviceReplica::gradientToHost(ParamSet& out) {
  for (size_t i = 0; i < gradient_.size(); ++i) {
    ops::Tensor h = hostView(out[i]);
    backend_.copy(gradient_[i], h);
  }
}

void DeviceReplica::hostChanged() {
  ORPHEUS_ENFORCE(current_ != Current::kDevice, "the host changed a replica whose mirror was behind its device");
  current_ = Current::kHost;
}

void DeviceReplica::toHost(ParamSet& host, Optimizer& optimizer) {
  if (current_ != Current::kDevice) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    ops::Tensor h = hostView(host[i]);
    backend_.copy(params_[i], h);
  }
  const std::vector<Matrix*> buffers = optimizer.buffers();
  for (size_t i = 0; i < state_.size(); ++i) {
    ops::Tensor h = hostView(*buffers[i]);
    backend_.copy(state_[i], h);
  }
  current_ = Current::kBoth;
}

}  // namespace orpheus::engine
