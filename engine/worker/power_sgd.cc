#include "engine/worker/power_sgd.h"

#include <algorithm>
#include <random>

namespace orpheus::engine {
void orthonormalizeColumns(Matrix& m) {
  for (Eigen::Index i = 0; i < m.cols(); ++i) {
    auto col = m.col(i);
    const float norm = col.norm();
    if (norm > 0.0f) col /= norm;
    for (Eigen::Index k = i + 1; k < m.cols(); ++k) m.col(k) -= col.dot(m.col(k)) * col;
  }
}

int64_t PowerSgdReducer::compressedRank(int64_t j, int64_t k, int64_t rank, int64_t minCompressionRate) {
  if (j <= 1 || k <= 1) return 0;
  const int64_t r = std::min({j, k, rank});
  return (j + k) * r * minCompressionRate < j * k ? r : 0;
}

Matrix PowerSgdReducer::residual(size_t p) const {
  const MatrixState& s = state_.at(p);
  if (s.e.size() == 0) return {};
  Matrix m(s.e.rows(), s.e.cols());
  ops::Tensor host = ops::Tensor::host(m.data(), m.rows(), m.cols());
  backend_.copy(s.e, host);
  return m;
}

void PowerSgdReducer::start(std::span<const ops::Tensor> gradient) {
  state_.clear();
  state_.resize(gradient.size());
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    const int64_t j = gradient[p].rows(), k = gradient[p].cols();
    s.r = compressedRank(j, k);
    if (s.r == 0) continue;
    const Matrix zero = Matrix::Zero(j, k);
    s.e = backend_.allocate(j, k);
    backend_.copy(ops::Tensor::host(zero.data(), j, k), s.e);
    s.q = backend_.allocate(k, s.r);
    s.p = backend_.allocate(j, s.r);
    std::mt19937_64 gen(seed_ ^ (0x9e3779b97f4a7c15ULL * (p + 1)));
    std::normal_distribution<float> normal;
    s.qHost.resize(k, s.r);
    for (Eigen::Index i = 0; i < s.qHost.size(); ++i) s.qHost.data()[i] = normal(gen);
  }
}

size_t PowerSgdReducer::reserve(size_t floats) {
  return staging_.reserveFloats(static_cast<int64_t>(floats)) / sizeof(float);
}

void PowerSgdReducer::get(const ops::Tensor& src, size_t at) { staging_.down(src, at * sizeof(float)); }

void PowerSgdReducer::put(size_t at, ops::Tensor& dst) { backend_.waitOnDevice(staging_.up(at * sizeof(float), dst)); }

void PowerSgdReducer::reduce(ParamSet& gradient, comm::Transport& transport, uint64_t clock) {
  if (backend_.device() == ops::Device::kCpu) {
    std::vector<ops::Tensor> views;
    for (auto& p : gradient.params) views.push_back(ops::Tensor::host(p.value.data(), p.value.rows(), p.value.cols()));
    reduce(views, transport, clock);
    return;
  }
  if (hostGradient_.size() != gradient.size()) {
    hostGradient_.clear();
    for (auto& p : gradient.params) hostGradient_.push_back(backend_.allocate(p.value.rows(), p.value.cols()));
  }
  for (size_t i = 0; i < gradient.size(); ++i) {
    backend_.copy(ops::Tensor::host(gradient[i].data(), gradient[i].rows(), gradient[i].cols()), hostGradient_[i]);
  }
  reduce(hostGradient_, transport, clock);
  for (size_t i = 0; i < gradient.size(); ++i) {
    ops::Tensor host = ops::Tensor::host(gradient[i].data(), gradient[i].rows(), gradient[i].cols());
    backend_.copy(hostGradient_[i], host);
  }
}

void PowerSgdReducer::reduce(std::span<ops::Tensor> gradient, comm::Transport& transport, uint64_t clock) {
  using ops::Trans;
  if (state_.size() != gradient.size()) start(gradient);
  if (clock <= kPlainClocks) {
    if (backend_.device() == ops::Device::kCpu) {
      for (ops::Tensor& g : gradient) transport.allreduceSum({g.data(), static_cast<size_t>(g.size())}, clock);
      return;
    }
    size_t floats = 0;
    for (const ops::Tensor& g : gradient) floats += static_cast<size_t>(g.size());
    staging_.begin(backend_, floats * sizeof(float));
    std::vector<size_t> at;
    for (const ops::Tensor& g : gradient) {
      at.push_back(reserve(static_cast<size_t>(g.size())));
      get(g, at.back());
    }
    staging_.wait();
    for (size_t p = 0; p < gradient.size(); ++p) {
      transport.allreduceSum({staged(at[p]), static_cast<size_t>(gradient[p].size())}, clock);
      put(at[p], gradient[p]);
    }
    return;
  }
  // One stretch of the buffer for the uncompressed gradients and every P = M orth(Q),
  // one for every Q, and the Q, P and Q going up.
  size_t firstSize = 0, secondSize = 0, upSize = 0;
  for (size_t p = 0; p < gradient.size(); ++p) {
    const MatrixState& s = state_[p];
    firstSize += static_cast<size_t>(s.r == 0 ? gradient[p].size() : s.p.size());
    secondSize += static_cast<size_t>(s.q.size());
    upSize += static_cast<size_t>(2 * s.q.size() + s.p.size());
  }
  staging_.begin(backend_, (firstSize + secondSize + upSize) * sizeof(float));
  const size_t first = reserve(firstSize), second = reserve(secondSize);
  size_t at = first;
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    ops::Tensor& g = gradient[p];
    if (s.r == 0) {
      get(g, at);
      at += static_cast<size_t>(g.size());
      continue;
    }
    backend_.axpy(1.0f, g, s.e);  // M, kept in E until the update is known
    orthonormalizeColumns(s.qHost);
    const size_t q = reserve(static_cast<size_t>(s.qHost.size()));
    Eigen::Map<Matrix>(staged(q), s.qHost.rows(), s.qHost.cols()) = s.qHost;
    put(q, s.q);
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, s.e, s.q, 0.0f, s.p);
    get(s.p, at);
    at += static_cast<size_t>(s.p.size());
  }
  staging_.wait();
  transport.allreduceSum({staged(first), firstSize}, clock);
  at = first;
  size_t qAt = second;
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    if (s.r == 0) {
      put(at, gradient[p]);
      at += static_cast<size_t>(gradient[p].size());
      continue;
    }
    Matrix pHost = Eigen::Map<const Matrix>(staged(at), s.p.rows(), s.p.cols());
    at += static_cast<size_t>(s.p.size());
    orthonormalizeColumns(pHost);
    const size_t up = reserve(static_cast<size_t>(pHost.size()));
    Eigen::Map<Matrix>(staged(up), pHost.rows(), pHost.cols()) = pHost;
    put(up, s.p);
    backend_.gemm(Trans::kYes, Trans::kNo, 1.0f, s.e, s.p, 0.0f, s.q);
    get(s.q, qAt);
    qAt += static_cast<size_t>(s.q.size());
  }
  staging_.wait();
  transport.allreduceSum({staged(second), secondSize}, clock);
  qAt = second;
  const float ranks = static_cast<float>(transport.size());
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    if (s.r == 0) continue;
    s.qHost = Eigen::Map<const Matrix>(staged(qAt), s.q.rows(), s.q.cols());
    const size_t up = reserve(static_cast<size_t>(s.qHost.size()));
    Eigen::Map<Matrix>(staged(up), s.qHost.rows(), s.qHost.cols()) = s.qHost;
    qAt += static_cast<size_t>(s.q.size());
    put(up, s.q);
    backend_.gemm(Trans::kNo, Trans::kYes, 1.0f, s.p, s.q, 0.0f, gradient[p]);
    backend_.axpy(-1.0f / ranks, gradient[p], s.e);
  }
}

}  // namespace orpheus::engine
