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

int64_t PowerSgdReducer::compressedRank(const Matrix& param) const {
  const int64_t j = param.rows(), k = param.cols();
  if (j <= 1 || k <= 1) return 0;
  const int64_t r = std::min({j, k, rank_});
  return (j + k) * r * minCompressionRate_ < j * k ? r : 0;
}

void PowerSgdReducer::start(const ParamSet& gradient) {
  state_.assign(gradient.size(), MatrixState{});
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    s.r = compressedRank(gradient[p]);
    if (s.r == 0) continue;
    s.e = Matrix::Zero(gradient[p].rows(), gradient[p].cols());
    std::mt19937_64 gen(seed_ ^ (0x9e3779b97f4a7c15ULL * (p + 1)));
    std::normal_distribution<float> normal;
    s.q.resize(gradient[p].cols(), s.r);
    for (Eigen::Index i = 0; i < s.q.size(); ++i) s.q.data()[i] = normal(gen);
  }
}

void PowerSgdReducer::sumWhole(ParamSet& gradient, comm::Transport& transport, uint64_t clock) {
  for (auto& p : gradient.params) transport.allreduceSum({p.value.data(), static_cast<size_t>(p.value.size())}, clock);
}

void PowerSgdReducer::reduce(ParamSet& gradient, comm::Transport& transport, uint64_t clock) {
  if (state_.size() != gradient.size()) start(gradient);
  if (clock <= kPlainClocks) {
    sumWhole(gradient, transport, clock);
    return;
  }
  // One buffer for the uncompressed gradients and every P = M orth(Q), one for every Q.
  std::vector<float> first, second;
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    Matrix& g = gradient[p];
    if (s.r == 0) {
      first.insert(first.end(), g.data(), g.data() + g.size());
      continue;
    }
    s.e += g;  // M, kept in E until the update is known
    orthonormalizeColumns(s.q);
    s.p.noalias() = s.e * s.q;
    first.insert(first.end(), s.p.data(), s.p.data() + s.p.size());
  }
  transport.allreduceSum({first.data(), first.size()}, clock);
  size_t at = 0;
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    Matrix& target = s.r == 0 ? gradient[p] : s.p;
    std::copy_n(first.data() + at, target.size(), target.data());
    at += static_cast<size_t>(target.size());
    if (s.r == 0) continue;
    orthonormalizeColumns(s.p);
    s.q.noalias() = s.e.transpose() * s.p;
    second.insert(second.end(), s.q.data(), s.q.data() + s.q.size());
  }
  transport.allreduceSum({second.data(), second.size()}, clock);
  at = 0;
  const auto ranks = static_cast<float>(transport.size());
  for (size_t p = 0; p < gradient.size(); ++p) {
    MatrixState& s = state_[p];
    if (s.r == 0) continue;
    std::copy_n(second.data() + at, s.q.size(), s.q.data());
    at += static_cast<size_t>(s.q.size());
    gradient[p].noalias() = s.p * s.q.transpose();
    s.e -= gradient[p] / ranks;
  }
}

}  // namespace orpheus::engine
