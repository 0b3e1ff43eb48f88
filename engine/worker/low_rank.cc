#include "engine/worker/low_rank.h"

#include "engine/base/error.h"

#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

namespace orpheus::engine {

namespace {
void roundAllToBf16(Matrix& m) {
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = roundToBf16(m.data()[i]);
}

// Q's columns [from, to) for matrix p: Gaussian, each column from its own stream, so
// a column is the same whichever rank it was first needed at.
void drawColumns(Matrix& q, Eigen::Index from, Eigen::Index to, uint64_t seed, size_t p) {
  for (Eigen::Index c = from; c < to; ++c) {
    std::mt19937_64 gen(seed ^ (0x9e3779b97f4a7c15ULL * (p + 1)) ^ (0xbf58476d1ce4e5b9ULL * static_cast<uint64_t>(c)));
    std::normal_distribution<float> normal;
    for (Eigen::Index i = 0; i < q.rows(); ++i) q(i, c) = normal(gen);
  }
}
}  // namespace

void LowRankSender::setRank(int64_t rank) {
  ORPHEUS_ENFORCE(rank >= 1, "--sv-rank: a rank of {}", rank);
  rank_ = rank;
}

std::vector<double> LowRankSender::errorsAt(std::span<const int64_t> ranks) const {
  std::vector<double> out;
  for (const int64_t k : ranks) {
    double captured = 0.0;
    for (const MatrixState& s : state_) {
      const auto n = std::min<size_t>(s.captured.size(), static_cast<size_t>(std::max<int64_t>(0, k)));
      for (size_t i = 0; i < n; ++i) captured += s.captured[i];
    }
    out.push_back(lastWhole_ > 0.0 ? std::sqrt(std::max(0.0, lastWhole_ - captured) / lastWhole_) : 0.0);
  }
  return out;
}

SvMatrix LowRankSender::compressMatrix(const SvMatrix& m, const Vector& coeffs, size_t p, double& kept,
                                       double& whole) {
  ORPHEUS_ENFORCE(!m.sparseV, "--sv-rank needs a dense V (matrix {} has a sparse one)", m.paramId);
  const int64_t r = rank_;
  MatrixState& s = state_[p];
  const Eigen::Index j = m.u.rows(), k = m.vDense.rows();
  if (s.e.rows() != j || s.e.cols() != k) {
    s.e = Matrix::Zero(j, k);
    std::mt19937_64 gen(seed_ ^ (0x9e3779b97f4a7c15ULL * (p + 1)));
    std::normal_distribution<float> normal;
    s.q.resize(k, r);
    for (Eigen::Index i = 0; i < s.q.size(); ++i) s.q.data()[i] = normal(gen);
  } else if (s.q.cols() != r) {
    // The rank moved (--adapt): keep the first r columns, or draw the new ones.
    const Eigen::Index had = s.q.cols();
    s.q.conservativeResize(k, r);
    if (r > had) drawColumns(s.q, had, r, seed_, p);
  }
  // M = E + U C V^T is never formed on its own: with A = U C,
  //   M Q = E Q + A (V^T Q),   M^T P = E^T P + V (A^T P),   E' = E + [A, -P] [V, Q']^T,
  // two reads of E and one update in place. ||M||^2 = ||E'||^2 + ||Q'||^2, as P P^T M is
  // an orthogonal projection of M.
  const Matrix a = m.core.size() > 0 ? Matrix(m.u * m.core) : Matrix(m.u * coeffs.asDiagonal());
  const Eigen::Index n = a.cols();
  Matrix mq = s.e * s.q;
  mq.noalias() += a * (m.vDense.transpose() * s.q);
  const Eigen::HouseholderQR<Matrix> qr(mq);
  Matrix basis = qr.householderQ() * Matrix::Identity(j, r);
  const bool bf16 = dtype_ == SvDtype::kBf16;
  if (bf16) roundAllToBf16(basis);
  s.q.noalias() = s.e.transpose() * basis;
  s.q.noalias() += m.vDense * (a.transpose() * basis);
  if (bf16) roundAllToBf16(s.q);
  Matrix left(j, n + r), right(k, n + r);
  left << a, -basis;
  right << m.vDense, s.q;
  s.e.noalias() += left * right.transpose();
  const double carried = static_cast<double>(s.e.squaredNorm());
  // What the best k directions within span(P) carry: the eigenvalues of
  // Q'^T Q' = P^T M M^T P (r x r), largest first.
  const Eigen::MatrixXd gram = s.q.cast<double>().transpose() * s.q.cast<double>();
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(gram, Eigen::EigenvaluesOnly);
  s.captured.assign(eig.eigenvalues().data(), eig.eigenvalues().data() + r);
  std::sort(s.captured.begin(), s.captured.end(), std::greater<>());
  kept += carried;
  whole += carried + static_cast<double>(s.q.squaredNorm());

  SvMatrix o;
  o.paramId = m.paramId;
  o.biasId = m.biasId;
  o.u = Matrix::Zero(j, r + 1);
  o.vDense = Matrix::Zero(k, r + 1);
  o.core = Matrix::Zero(r + 1, r + 1);
  o.u.leftCols(r) = basis;
  o.vDense.leftCols(r) = s.q;
  for (Eigen::Index i = 0; i < r; ++i) o.core(i, i) = 1.0f;
  if (m.biasId >= 0) {
    // The bias update, exactly: U times the bias coefficients (in bf16, with the
    // rounding error of earlier clocks added and this clock's carried on).
    o.u.col(r) = m.u * (m.core.size() > 0 ? m.biasCoeffs : coeffs);
    if (bf16) {
      if (s.eb.size() != j) s.eb = Vector::Zero(j);
      const Vector want = o.u.col(r) + s.eb;
      for (Eigen::Index i = 0; i < j; ++i) o.u(i, r) = roundToBf16(want(i));
      s.eb = want - o.u.col(r);
    }
    o.biasCoeffs = Vector::Zero(r + 1);
    o.biasCoeffs(r) = 1.0f;
  }
  return o;
}

ParamSet LowRankSender::state(const std::string& prefix) const {
  ParamSet out;
  for (size_t p = 0; p < state_.size(); ++p) {
    const MatrixState& s = state_[p];
    out.params.push_back({fmt::format("{}{}.e", prefix, p), s.e});
    out.params.push_back({fmt::format("{}{}.q", prefix, p), s.q});
    if (s.eb.size() > 0) out.params.push_back({fmt::format("{}{}.eb", prefix, p), Matrix(s.eb)});
  }
  return out;
}

void LowRankSender::restore(const ParamSet& state, const std::string& prefix,
                            std::span<const std::pair<int64_t, int64_t>> shapes) {
  state_.clear();
  for (size_t p = 0;; ++p) {
    const std::string name = fmt::format("{}{}", prefix, p);
    const int e = state.find(name + ".e");
    const int q = state.find(name + ".q");
    const int eb = state.find(name + ".eb");
    if (e < 0 && q < 0 && eb < 0) break;
    ORPHEUS_CHECK_INPUT(e >= 0 && q >= 0, "the --sv-rank state of matrix {} lacks its {}", p, e < 0 ? ".e" : ".q");
    MatrixState s;
    s.e = state.params[static_cast<size_t>(e)].value;
    s.q = state.params[static_cast<size_t>(q)].value;
    ORPHEUS_CHECK_INPUT(s.q.rows() == s.e.cols() && s.q.cols() >= 1 && s.e.size() > 0,
                        "the --sv-rank state of matrix {} holds a {}x{} residual and a {}x{} basis (expected J x K "
                        "and K x r, r >= 1)", p, s.e.rows(), s.e.cols(), s.q.rows(), s.q.cols());
    if (p < shapes.size()) {
      ORPHEUS_CHECK_INPUT(s.e.rows() == shapes[p].first && s.e.cols() == shapes[p].second,
                          "the --sv-rank state of matrix {} is {}x{}, but the model's matrix is {}x{}", p, s.e.rows(),
                          s.e.cols(), shapes[p].first, shapes[p].second);
    }
    if (eb >= 0) {
      const Matrix& bias = state.params[static_cast<size_t>(eb)].value;
      ORPHEUS_CHECK_INPUT(bias.cols() == 1 && bias.rows() == s.e.rows(),
                          "the --sv-rank bias residual of matrix {} is {}x{}, expected {}x1", p, bias.rows(),
                          bias.cols(), s.e.rows());
      s.eb = bias.col(0);
    }
    state_.push_back(std::move(s));
  }
  ORPHEUS_CHECK_INPUT(state_.empty() || shapes.empty() || state_.size() == shapes.size(),
                      "the --sv-rank state holds {} matrices, the model's update {}", state_.size(), shapes.size());
}

SvBatch LowRankSender::compress(const SvBatch& batch) {
  if (state_.size() != batch.matrices.size()) state_.assign(batch.matrices.size(), MatrixState{});
  SvBatch out;
  out.header = batch.header;
  out.coeffs = Vector::Ones(rank_ + 1);  // every matrix carries a core
  out.dtype = dtype_;
  double kept = 0.0, whole = 0.0;
  for (size_t p = 0; p < batch.matrices.size(); ++p) {
    out.matrices.push_back(compressMatrix(batch.matrices[p], batch.coeffs, p, kept, whole));
  }
  lastError_ = whole > 0.0 ? std::sqrt(kept / whole) : 0.0;
  lastWhole_ = whole;
  return out;
}

}  // namespace orpheus::engine
