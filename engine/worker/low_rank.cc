#include "engine/worker/low_rank.h"

#include "engine/base/error.h"
#include "ops/operators.h"

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

ops::Tensor LowRankSender::buffer(ops::Tensor& store, int64_t rows, int64_t cols) {
  if (store.size() < rows * cols) store = backend_.allocate(1, std::max<int64_t>(rows * cols, 1));
  return ops::Tensor::view(backend_.device(), store.data(), rows, cols);
}

ops::Tensor LowRankSender::operand(const Matrix& m, ops::Tensor& store) {
  if (backend_.device() == ops::Device::kCpu) return ops::Tensor::host(m.data(), m.rows(), m.cols());
  ops::Tensor t = buffer(store, m.rows(), m.cols());
  backend_.copy(ops::Tensor::host(m.data(), m.rows(), m.cols()), t);
  return t;
}

ops::Tensor LowRankSender::upload(const Matrix& m) {
  ops::Tensor t = backend_.allocate(m.rows(), m.cols());
  backend_.copy(ops::Tensor::host(m.data(), m.rows(), m.cols()), t);
  return t;
}

Matrix LowRankSender::download(const ops::Tensor& t) const {
  Matrix m(t.rows(), t.cols());
  ops::Tensor host = ops::Tensor::host(m.data(), m.rows(), m.cols());
  backend_.copy(t, host);
  return m;
}

Matrix LowRankSender::carried(size_t p) const {
  if (p >= state_.size() || state_[p].e.size() == 0) return {};
  return download(state_[p].e);
}

SvMatrix LowRankSender::compressMatrix(const SvMatrix& m, const Vector& coeffs, const ops::DeviceSvs* onDevice,
                                       size_t p, double& kept, double& whole) {
  using ops::Tensor;
  using ops::Trans;
  ORPHEUS_ENFORCE(!m.sparseV, "--sv-rank needs a dense V (matrix {} has a sparse one)", m.paramId);
  const int64_t r = rank_;
  MatrixState& s = state_[p];
  const Eigen::Index j = m.u.rows(), k = m.vDense.rows(), n = m.u.cols();
  if (s.e.rows() != j || s.e.cols() != k) {
    s.e = upload(Matrix::Zero(j, k));
    std::mt19937_64 gen(seed_ ^ (0x9e3779b97f4a7c15ULL * (p + 1)));
    std::normal_distribution<float> normal;
    Matrix q(k, r);
    for (Eigen::Index i = 0; i < q.size(); ++i) q.data()[i] = normal(gen);
    s.q = upload(q);
  } else if (s.q.cols() != r) {
    // The rank moved (--adapt): keep the first r columns, or draw the new ones.
    Matrix q = download(s.q);
    const Eigen::Index had = q.cols();
    q.conservativeResize(k, r);
    if (r > had) drawColumns(q, had, r, seed_, p);
    s.q = upload(q);
  }
  // M = E + U C V^T is never formed on its own: with A = U C,
  //   M Q = E Q + A (V^T Q),   M^T P = E^T P + V (A^T P),   E' = E + [A, -P] [V, Q']^T,
  // two reads of E and one update in place. ||M||^2 = ||E'||^2 + ||Q'||^2, as P P^T M is
  // an orthogonal projection of M.
  const auto where = [](const Tensor& t) { return Tensor::view(t.device(), t.data(), t.rows(), t.cols()); };
  const Tensor u = onDevice != nullptr && onDevice->u != nullptr ? where(*onDevice->u) : operand(m.u, scratch_.u);
  const Tensor v = onDevice != nullptr && onDevice->vDense != nullptr ? where(*onDevice->vDense)
                                                                       : operand(m.vDense, scratch_.v);
  Tensor left = buffer(scratch_.left, j, n + r);
  Tensor right = buffer(scratch_.right, k, n + r);
  Tensor a = left.middleCols(0, n);
  const bool withCore = m.core.size() > 0;
  const bool uniform = !withCore && n > 0 && (coeffs.array() == coeffs(0)).all();
  if (uniform) {
    ops::scaledCopy(backend_, u, coeffs(0), a);  // U c, u * c bit for bit
  } else {
    // U core, or U diag(c): each entry one product plus zeros, u * c bit for bit.
    const Matrix core = withCore ? m.core : Matrix(coeffs.asDiagonal());
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, u, operand(core, scratch_.core), 0.0f, a);
  }
  Tensor small = buffer(scratch_.small, n, r);
  Tensor mq = buffer(scratch_.mq, j, r);
  backend_.gemm(Trans::kYes, Trans::kNo, 1.0f, v, s.q, 0.0f, small);  // V^T Q
  backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, s.e, s.q, 0.0f, mq);     // E Q
  backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, a, small, 1.0f, mq);     // + A V^T Q
  // P, an orthonormal basis of M Q's range, formed on the host (J x R).
  const Eigen::HouseholderQR<Matrix> qr(download(mq));
  Matrix basis = qr.householderQ() * Matrix::Identity(j, r);
  const bool bf16 = dtype_ == SvDtype::kBf16;
  if (bf16) roundAllToBf16(basis);
  Tensor minusP = left.middleCols(n, r);
  const Matrix negated = -basis;
  backend_.copy(Tensor::host(negated.data(), j, r), minusP);
  // Q' = M^T P = -(E^T (-P)) - V (A^T (-P)): negations are exact, so this is E^T P + V A^T P.
  Tensor q = right.middleCols(n, r);
  backend_.gemm(Trans::kYes, Trans::kNo, -1.0f, s.e, minusP, 0.0f, q);
  backend_.gemm(Trans::kYes, Trans::kNo, -1.0f, a, minusP, 0.0f, small);
  backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, v, small, 1.0f, q);
  Matrix qHost = download(q);
  if (bf16) {
    roundAllToBf16(qHost);
    backend_.copy(Tensor::host(qHost.data(), k, r), q);
  }
  if (s.q.cols() != r || s.q.rows() != k) s.q = backend_.allocate(k, r);
  backend_.copy(q, s.q);
  Tensor vPart = right.middleCols(0, n);
  backend_.copy(v, vPart);
  backend_.gemm(Trans::kNo, Trans::kYes, 1.0f, left, right, 1.0f, s.e);  // E' = E + [A, -P] [V, Q']^T
  Tensor norms = buffer(scratch_.norms, 1, k);
  backend_.columnOp(ops::OpKind::kSquaredL2, s.e, nullptr, norms);
  const Matrix columnNorms = download(norms);
  const double carried = columnNorms.cast<double>().sum();
  // What the best k directions within span(P) carry: the eigenvalues of
  // Q'^T Q' = P^T M M^T P (r x r), largest first.
  const Eigen::MatrixXd gram = qHost.cast<double>().transpose() * qHost.cast<double>();
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(gram, Eigen::EigenvaluesOnly);
  s.captured.assign(eig.eigenvalues().data(), eig.eigenvalues().data() + r);
  std::sort(s.captured.begin(), s.captured.end(), std::greater<>());
  kept += carried;
  whole += carried + qHost.cast<double>().squaredNorm();

  SvMatrix o;
  o.paramId = m.paramId;
  o.biasId = m.biasId;
  o.u = Matrix::Zero(j, r + 1);
  o.vDense = Matrix::Zero(k, r + 1);
  o.core = Matrix::Zero(r + 1, r + 1);
  o.u.leftCols(r) = basis;
  o.vDense.leftCols(r) = qHost;
  for (Eigen::Index i = 0; i < r; ++i) o.core(i, i) = 1.0f;
  if (m.biasId >= 0) {
    // The bias update, exactly: U times the bias coefficients (in bf16, with the
    // rounding error of earlier clocks added and this clock's carried on).
    const Matrix c = withCore ? Matrix(m.biasCoeffs) : Matrix(coeffs);
    Tensor bias = buffer(scratch_.bias, j, 1);
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, u, operand(c, scratch_.biasCoeffs), 0.0f, bias);
    o.u.col(r) = download(bias).col(0);
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
    out.params.push_back({fmt::format("{}{}.e", prefix, p), download(s.e)});
    out.params.push_back({fmt::format("{}{}.q", prefix, p), download(s.q)});
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
    const Matrix& se = state.params[static_cast<size_t>(e)].value;
    const Matrix& sq = state.params[static_cast<size_t>(q)].value;
    ORPHEUS_CHECK_INPUT(sq.rows() == se.cols() && sq.cols() >= 1 && se.size() > 0,
                        "the --sv-rank state of matrix {} holds a {}x{} residual and a {}x{} basis (expected J x K "
                        "and K x r, r >= 1)", p, se.rows(), se.cols(), sq.rows(), sq.cols());
    if (p < shapes.size()) {
      ORPHEUS_CHECK_INPUT(se.rows() == shapes[p].first && se.cols() == shapes[p].second,
                          "the --sv-rank state of matrix {} is {}x{}, but the model's matrix is {}x{}", p, se.rows(),
                          se.cols(), shapes[p].first, shapes[p].second);
    }
    s.e = upload(se);
    s.q = upload(sq);
    if (eb >= 0) {
      const Matrix& bias = state.params[static_cast<size_t>(eb)].value;
      ORPHEUS_CHECK_INPUT(bias.cols() == 1 && bias.rows() == s.e.rows(),
                          "the --sv-rank bias residual of matrix {} is {}x{}, expected {}x1", p, bias.rows(),
                          bias.cols(), se.rows());
      s.eb = bias.col(0);
    }
    state_.push_back(std::move(s));
  }
  ORPHEUS_CHECK_INPUT(state_.empty() || shapes.empty() || state_.size() == shapes.size(),
                      "the --sv-rank state holds {} matrices, the model's update {}", state_.size(), shapes.size());
}

SvBatch LowRankSender::compress(const SvBatch& batch, std::span<const ops::DeviceSvs> onDevice) {
  ORPHEUS_ENFORCE(onDevice.empty() || onDevice.size() == batch.matrices.size(),
                  "--sv-rank: {} matrices on the device for a batch of {}", onDevice.size(), batch.matrices.size());
  if (state_.size() != batch.matrices.size()) {
    state_.clear();
    state_.resize(batch.matrices.size());
  }
  SvBatch out;
  out.header = batch.header;
  out.coeffs = Vector::Ones(rank_ + 1);  // every matrix carries a core
  out.dtype = dtype_;
  double kept = 0.0, whole = 0.0;
  for (size_t p = 0; p < batch.matrices.size(); ++p) {
    out.matrices.push_back(
        compressMatrix(batch.matrices[p], batch.coeffs, onDevice.empty() ? nullptr : &onDevice[p], p, kept, whole));
  }
  lastError_ = whole > 0.0 ? std::sqrt(kept / whole) : 0.0;
  lastWhole_ = whole;
  return out;
}

}  // namespace orpheus::engine
