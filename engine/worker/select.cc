#include "engine/worker/select.h"

#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"

#include <Eigen/Dense>
#include <Eigen/QR>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

namespace orpheus::engine {
namespace {

using Clock = std::chrono::steady_clock;
using VectorD = Eigen::VectorXd;
using MatrixD = Eigen::MatrixXd;
using SparseD = Eigen::SparseMatrix<double, Eigen::ColMajor, int32_t>;

// A column's residual counts as zero once its squared norm is below this fraction
// of the column's own: float SVs that are combinations of others leave about 1e-14
// after projection, and a direction this small changes the update by 1e-5 of the
// column at most.
constexpr double kInSpanTolerance = 1e-10;
// The same from a float Gram matrix (kJmcssGram): G_ii - ||W_i||^2 is known to about
// 1e-7 of the column's squared norm there, so a direction is taken only well above
// that (1e-5 of the squared norm: 0.3% of the column's norm).
constexpr double kGramInSpanTolerance = 1e-5;

bool hasCore(const SvMatrix& m) { return m.core.size() > 0; }

// The large buffers of one Residual. They are kept per thread across calls: a
// worker selects from batches of the same shapes every clock, and fresh
// multi-megabyte buffers would page-fault each time, which costs about as much as
// the selection itself.
struct ResidualScratch {
  MatrixD dense;   // X in double (dense X only)
  MatrixD basis;   // rows x (capacity or more)
  MatrixD coords;  // (capacity or more) x n
};

std::vector<ResidualScratch>& scratchFor(size_t count) {
  thread_local std::vector<ResidualScratch> scratch;
  if (scratch.size() < count) scratch.resize(count);
  return scratch;
}

// One matrix X^(p) of Algorithm 2 (the U or the V of a site) as its residual shrinks.
// Works in double: the residual norms are differences of squares, and float would
// blur the line between "in the span" and "a small new direction".
class Residual {
 public:
  Residual(const Matrix& x, int64_t capacity, ResidualScratch& scratch)
      : dense_(scratch.dense), basis_(scratch.basis), coords_(scratch.coords) {
    dense_ = x.cast<double>();  // reuses the buffer when the shape is unchanged
    init(dense_.colwise().squaredNorm().transpose(), dense_.rows(), capacity);
  }
  Residual(const SparseMatrix& x, int64_t capacity, ResidualScratch& scratch)
      : dense_(scratch.dense), sparse_(x.cast<double>()), isSparse_(true), basis_(scratch.basis),
        coords_(scratch.coords) {
    VectorD norms(sparse_.cols());
    for (int64_t j = 0; j < sparse_.cols(); ++j) norms[j] = sparse_.col(j).squaredNorm();
    init(norms, sparse_.rows(), capacity);
  }

  // From X's Gram matrix G = X^T X (kJmcssGram): no basis; a new direction's
  // coordinates come from G (select.h). G is symmetrized in double first.
  struct FromGram {};
  Residual(FromGram, const Matrix& gram, int64_t capacity, ResidualScratch& scratch)
      : dense_(scratch.dense), fromGram_(true), tolerance_(kGramInSpanTolerance), basis_(scratch.basis),
        coords_(scratch.coords) {
    dense_ = gram.cast<double>();
    dense_ = (0.5 * (dense_ + dense_.transpose())).eval();
    init(dense_.diagonal(), 0, capacity);
  }

  int64_t rank() const { return rank_; }
  // The rank once the first `picks` added columns were in: the basis of a prefix
  // of the selection is a prefix of the basis (Gram-Schmidt is sequential).
  int64_t rankAfter(size_t picks) const {
    if (picks == 0 || ranks_.empty()) return 0;
    return ranks_[std::min(picks, ranks_.size()) - 1];
  }
  // X^T X, B x B.
  MatrixD gram() const {
    if (fromGram_) return dense_;
    if (isSparse_) return MatrixD(sparse_.transpose() * sparse_);
    MatrixD g = MatrixD::Zero(dense_.cols(), dense_.cols());
    g.selfadjointView<Eigen::Lower>().rankUpdate(dense_.transpose());
    return MatrixD(g.selfadjointView<Eigen::Lower>());
  }
  // No column adds a direction any more.
  bool exhausted() const { return exhausted_; }
  // Squared residual norm of every column, zero where the column lies in the span.
  const VectorD& residuals() const { return effective_; }
  // Squared norms of the columns themselves.
  const VectorD& norms() const { return norms_; }
  double totalResidual() const { return total_; }
  // Coordinates of every column in the basis, Q^T X: rank x n.
  auto coordinates() const { return coords_.topRows(rank_); }

  // Moves column i into the selected set: extends the basis by its residual
  // direction (unless it has none) and shrinks every column's residual norm.
  void add(int64_t i) {
    if (fromGram_) {
      addFromGram(i);
    } else if (effective_[i] > 0.0) {
      VectorD r = column(i);
      if (rank_ > 0) {
        // Classical Gram-Schmidt; the first pass's Q^T x_i is column i of Q^T X,
        // known already. A second pass ("twice is enough") removes what rounding left
        // of the basis directions when the first cancelled much of x_i.
        const auto q = basis_.leftCols(rank_);
        r.noalias() -= q * coords_.col(i).head(rank_);
        if (r.squaredNorm() < 0.5 * norms_[i]) {
          const VectorD h = q.transpose() * r;
          r.noalias() -= q * h;
        }
      }
      const double r2 = r.squaredNorm();
      if (r2 > tolerance_ * norms_[i]) {
        basis_.col(rank_) = r / std::sqrt(r2);
        const VectorD w = project(basis_.col(rank_));
        coords_.row(rank_) = w.transpose();
        ++rank_;
        residual_ -= w.cwiseAbs2();
      }
    }
    residual_[i] = 0.0;
    ranks_.push_back(rank_);
    refresh();
  }

 private:
  // add(i) from G: the pivot ||r_i||^2 = G_ii - ||W_i||^2 and the new coordinate row
  // (G_i - W^T W_i) / ||r_i||, a step of the pivoted Cholesky factorization.
  void addFromGram(int64_t i) {
    if (effective_[i] <= 0.0) return;
    const auto w = coords_.topRows(rank_);
    const double r2 = dense_(i, i) - w.col(i).squaredNorm();
    if (!(r2 > tolerance_ * norms_[i])) return;
    VectorD row = dense_.col(i);
    if (rank_ > 0) row.noalias() -= w.transpose() * w.col(i);
    row /= std::sqrt(r2);
    coords_.row(rank_) = row.transpose();
    ++rank_;
    residual_ -= row.cwiseAbs2();
  }

  void init(const VectorD& norms, int64_t rows, int64_t capacity) {
    norms_ = norms;
    residual_ = norms;
    // Grow only, so that a different C on the next call reuses the memory.
    if (basis_.rows() != rows || basis_.cols() < capacity) basis_.resize(rows, capacity);
    if (coords_.cols() != norms.size() || coords_.rows() < capacity) coords_.resize(capacity, norms.size());
    refresh();
  }

  VectorD column(int64_t i) const { return isSparse_ ? VectorD(sparse_.col(i)) : VectorD(dense_.col(i)); }

  // X^T q.
  VectorD project(const Eigen::Ref<const VectorD>& q) const {
    if (isSparse_) return sparse_.transpose() * q;
    return dense_.transpose() * q;
  }

  void refresh() {
    effective_.resize(residual_.size());
    total_ = 0.0;
    for (int64_t j = 0; j < residual_.size(); ++j) {
      residual_[j] = std::max(residual_[j], 0.0);  // rounding can take a spent column below zero
      effective_[j] = residual_[j] > tolerance_ * norms_[j] ? residual_[j] : 0.0;
      total_ += effective_[j];
    }
    exhausted_ = total_ == 0.0;
  }

  MatrixD& dense_;  // X in double, or its Gram matrix (fromGram_)
  SparseD sparse_;
  bool isSparse_ = false;
  bool fromGram_ = false;
  double tolerance_ = kInSpanTolerance;
  VectorD norms_;      // squared column norms of X
  VectorD residual_;   // squared column norms of the residual, updated incrementally
  VectorD effective_;  // residual_ with columns in the span set to zero
  double total_ = 0.0;
  bool exhausted_ = false;
  MatrixD& basis_;   // the first rank_ columns are orthonormal
  MatrixD& coords_;  // the first rank_ rows are Q^T X
  int64_t rank_ = 0;
  std::vector<int64_t> ranks_;  // rank_ after each add
};

void checkShapes(const SvBatch& full) {
  const int64_t n = full.numColumns();
  for (size_t p = 0; p < full.matrices.size(); ++p) {
    const SvMatrix& m = full.matrices[p];
    ORPHEUS_ENFORCE(m.u.cols() == n && m.vCols() == n,
                    "SV matrix {} has U with {} and V with {} columns, batch has {}", p, m.u.cols(), m.vCols(), n);
    if (hasCore(m)) {
      ORPHEUS_ENFORCE(m.core.rows() == n && m.core.cols() == n,
                      "SV matrix {} has a {}x{} core, batch has {} columns", p, m.core.rows(), m.core.cols(), n);
      ORPHEUS_ENFORCE(m.biasId < 0 || m.biasCoeffs.size() == n,
                      "SV matrix {} has a core and a bias but {} bias coefficients", p, m.biasCoeffs.size());
    }
  }
}

SparseMatrix gatherColumns(const SparseMatrix& s, std::span<const int64_t> columns) {
  int64_t nnz = 0;
  for (int64_t j : columns) nnz += s.col(j).nonZeros();
  SparseMatrix out(s.rows(), static_cast<Eigen::Index>(columns.size()));
  out.reserve(nnz);
  for (size_t t = 0; t < columns.size(); ++t) {
    out.startVec(static_cast<Eigen::Index>(t));
    for (SparseMatrix::InnerIterator it(s, columns[t]); it; ++it) {
      out.insertBack(it.row(), static_cast<Eigen::Index>(t)) = it.value();
    }
  }
  out.finalize();
  return out;
}

// The SVs of the selected columns, without coefficients.
SvMatrix gatherSvs(const SvMatrix& m, std::span<const int64_t> columns) {
  SvMatrix out;
  out.paramId = m.paramId;
  out.biasId = m.biasId;
  out.u = m.u(Eigen::all, columns);
  out.sparseV = m.sparseV;
  if (m.sparseV) {
    out.vSparse = gatherColumns(m.vSparse, columns);
  } else {
    out.vDense = m.vDense(Eigen::all, columns);
  }
  return out;
}

// Fills out.core (and out.biasCoeffs) with the least-squares fit of m's update on
// the selected columns. With Q_U^T U = W_U (r_U x n) and S_U = Q_U R_U, where
// R_U = W_U[:, S] (r_U x k, full row rank):
//     S_U^+ = R_U^+ Q_U^T,  so  A = R_U^+ (W_U D W_V^T) (R_V^+)^T,  b = R_U^+ W_U c,
// with D = diag(c) or m's own core. The complete orthogonal decomposition gives the
// minimum-norm solution when a selected column added no direction (r < k).
void fitCore(const SvMatrix& m, const Vector& coeffs, const Residual& u, const Residual& v,
             std::span<const int64_t> columns, SvMatrix& out) {
  const auto k = static_cast<Eigen::Index>(columns.size());
  MatrixD core = MatrixD::Zero(k, k);
  VectorD bias = VectorD::Zero(k);
  if (u.rank() > 0) {
    const MatrixD wu = u.coordinates();
    const MatrixD ru = wu(Eigen::all, columns);
    const Eigen::CompleteOrthogonalDecomposition<MatrixD> codU(ru);
    if (v.rank() > 0) {
      const MatrixD wv = v.coordinates();
      const MatrixD rv = wv(Eigen::all, columns);
      MatrixD middle;  // r_U x r_V: Q_U^T (U D V^T) Q_V
      if (hasCore(m)) {
        middle.noalias() = wu * m.core.cast<double>() * wv.transpose();
      } else {
        middle.noalias() = (wu * coeffs.cast<double>().asDiagonal()) * wv.transpose();
      }
      const MatrixD left = codU.solve(middle);  // k x r_V
      const Eigen::CompleteOrthogonalDecomposition<MatrixD> codV(rv);
      core = codV.solve(left.transpose()).transpose();
    }
    if (m.biasId >= 0) {
      // The exact bias update is U c, or U biasCoeffs for a batch that has cores already.
      const VectorD weights = hasCore(m) ? m.biasCoeffs.cast<double>() : coeffs.cast<double>();
      bias = codU.solve(VectorD(wu * weights));
    }
  }
  out.core = core.cast<float>();
  if (m.biasId >= 0) out.biasCoeffs = bias.cast<float>();
}

// Per matrix of `full`, its U and its V, in that order.
std::vector<Residual> residualsOf(const SvBatch& full, int64_t capacity) {
  std::vector<ResidualScratch>& scratch = scratchFor(2 * full.matrices.size());
  std::vector<Residual> res;
  res.reserve(2 * full.matrices.size());
  for (const SvMatrix& m : full.matrices) {
    res.emplace_back(m.u, capacity, scratch[res.size()]);
    if (m.sparseV) {
      res.emplace_back(m.vSparse, capacity, scratch[res.size()]);
    } else {
      res.emplace_back(m.vDense, capacity, scratch[res.size()]);
    }
  }
  return res;
}

// The same from the matrices' Gram matrices (svGrams's order).
std::vector<Residual> residualsOfGrams(const SvBatch& full, std::span<const Matrix> grams, int64_t capacity) {
  const int64_t n = full.numColumns();
  ORPHEUS_ENFORCE(grams.size() == 2 * full.matrices.size(), "{} Gram matrices for a batch of {} SV matrices",
                  grams.size(), full.matrices.size());
  for (const Matrix& g : grams) {
    ORPHEUS_ENFORCE(g.rows() == n && g.cols() == n, "a {}x{} Gram matrix for a batch of {} columns", g.rows(),
                    g.cols(), n);
  }
  std::vector<ResidualScratch>& scratch = scratchFor(grams.size());
  std::vector<Residual> res;
  res.reserve(grams.size());
  for (const Matrix& g : grams) res.emplace_back(Residual::FromGram{}, g, capacity, scratch[res.size()]);
  return res;
}

SvBatch assembleWithCores(const SvBatch& full, const std::vector<Residual>& res, std::span<const int64_t> columns) {
  SvBatch out;
  out.header = full.header;
  out.coeffs = Vector::Ones(static_cast<Eigen::Index>(columns.size()));  // unused: every matrix has a core
  out.matrices.reserve(full.matrices.size());
  for (size_t p = 0; p < full.matrices.size(); ++p) {
    const SvMatrix& m = full.matrices[p];
    SvMatrix sel = gatherSvs(m, columns);
    // With no column kept there is nothing to combine: an empty core means "per column".
    if (!columns.empty()) fitCore(m, full.coeffs, res[2 * p], res[2 * p + 1], columns, sel);
    out.matrices.push_back(std::move(sel));
  }
  return out;
}

// Draws an index with probability proportional to weights (non-negative, positive sum).
int64_t drawWeighted(const Eigen::ArrayXd& weights, double total, CounterRng& rng) {
  const double target = rng.uniform() * total;
  double acc = 0.0;
  int64_t last = -1;
  for (int64_t j = 0; j < weights.size(); ++j) {
    if (weights[j] <= 0.0) continue;
    acc += weights[j];
    last = j;
    if (target < acc) return j;
  }
  return last;  // rounding left target at the very end
}

// The factor a matrix contributes to a column's sampling weight (see select.h).
const VectorD& factors(const Residual& r) { return r.exhausted() ? r.norms() : r.residuals(); }

// Sampling weights of Algorithm 2: the product over the matrices of their factors,
// zero for taken columns. Each matrix's factors are scaled by their largest, which
// does not change the distribution and keeps products of small norms away from
// underflow; should a product underflow anyway, the weights are formed from logs.
// All weights are zero when every column has some factor of zero.
void productWeights(const std::vector<Residual>& res, const std::vector<char>& taken, Eigen::ArrayXd& weights) {
  const auto n = static_cast<int64_t>(taken.size());
  weights.setOnes(n);
  for (const Residual& r : res) {
    const VectorD& f = factors(r);
    const double top = f.maxCoeff();
    if (top > 0.0) {
      weights *= f.array() / top;
    } else {
      weights.setZero();
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    if (taken[static_cast<size_t>(j)]) weights[j] = 0.0;
  }
  if (weights.maxCoeff() > 0.0) return;

  weights.setZero();  // log 0 = -inf marks a zero factor
  for (const Residual& r : res) weights += factors(r).array().log();
  for (int64_t j = 0; j < n; ++j) {
    if (taken[static_cast<size_t>(j)]) weights[j] = -std::numeric_limits<double>::infinity();
  }
  const double top = weights.maxCoeff();
  if (std::isfinite(top)) {
    weights = (weights - top).exp();
  } else {
    weights.setZero();
  }
}

// Algorithm 2: returns the drawn columns, in order; res ends up holding the bases.
std::vector<int64_t> drawJmcss(std::vector<Residual>& res, int64_t n, int64_t c, CounterRng& rng) {
  std::vector<int64_t> picks;
  picks.reserve(static_cast<size_t>(c));
  std::vector<char> taken(static_cast<size_t>(n), 0);
  Eigen::ArrayXd weights(n);
  while (static_cast<int64_t>(picks.size()) < c) {
    bool active = false;
    for (const Residual& r : res) active = active || !r.exhausted();
    if (!active) break;  // the selected columns span every matrix: the fit is exact
    productWeights(res, taken, weights);
    if (!(weights.maxCoeff() > 0.0)) {
      // Every column has a zero factor, yet some matrix has residual left.
      weights.setZero();
      for (const Residual& r : res) {
        if (!r.exhausted()) weights += r.residuals().array() / r.totalResidual();
      }
      for (int64_t j = 0; j < n; ++j) {
        if (taken[static_cast<size_t>(j)]) weights[j] = 0.0;
      }
    }
    const double total = weights.sum();
    if (!(total > 0.0)) break;
    const int64_t i = drawWeighted(weights, total, rng);
    taken[static_cast<size_t>(i)] = 1;
    picks.push_back(i);
    for (Residual& r : res) r.add(i);
  }
  return picks;
}

std::vector<int64_t> drawUniform(int64_t n, int64_t c, CounterRng& rng) {
  // A partial Fisher-Yates shuffle: the first c entries are a uniform c-subset.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (int64_t t = 0; t < c; ++t) {
    const auto j = t + static_cast<int64_t>(rng.uniformInt(static_cast<uint64_t>(n - t)));
    std::swap(order[static_cast<size_t>(t)], order[static_cast<size_t>(j)]);
  }
  order.resize(static_cast<size_t>(c));
  return order;
}

SvBatch assembleUniform(const SvBatch& full, std::span<const int64_t> columns) {
  SvBatch out;
  out.header = full.header;
  const double scale = static_cast<double>(full.numColumns()) / static_cast<double>(columns.size());
  out.coeffs.resize(static_cast<Eigen::Index>(columns.size()));
  for (size_t t = 0; t < columns.size(); ++t) {
    out.coeffs[static_cast<Eigen::Index>(t)] = static_cast<float>(full.coeffs[columns[t]] * scale);
  }
  for (const SvMatrix& m : full.matrices) out.matrices.push_back(gatherSvs(m, columns));
  return out;
}

// Squared Frobenius norms of one matrix's update U D V^T (D = diag(c), or its core)
// and of its bias update U w, whole and as kept by the first k picks of a draw.
class KeptNorms {
 public:
  KeptNorms(const SvMatrix& m, const Vector& coeffs, const Residual& u, const Residual& v) : u_(u), v_(v) {
    const MatrixD gu = u.gram();
    const MatrixD gv = v.gram();
    const MatrixD wu = u.coordinates();
    const MatrixD wv = v.coordinates();
    // An empty basis (nothing drawn: every count sends the whole batch; or U or V all
    // zero) keeps nothing: its products would hand BLAS a leading dimension of 0,
    // which it refuses with a line on stdout.
    const bool drawn = wu.rows() > 0 && wv.rows() > 0;
    if (!drawn) middle_.setZero(wu.rows(), wv.rows());
    if (hasCore(m)) {
      const MatrixD a = m.core.cast<double>();
      // ||U A V^T||^2 = trace(A^T G_U A G_V).
      whole_ = ((a.transpose() * gu * a).array() * gv.array()).sum();
      if (drawn) middle_.noalias() = wu * a * wv.transpose();
    } else {
      const VectorD d = coeffs.cast<double>();
      whole_ = d.dot((gu.array() * gv.array()).matrix() * d);
      if (drawn) middle_.noalias() = (wu * d.asDiagonal()) * wv.transpose();
    }
    if (m.biasId >= 0) {
      const VectorD w = hasCore(m) ? VectorD(m.biasCoeffs.cast<double>()) : VectorD(coeffs.cast<double>());
      whole_ += w.dot(gu * w);
      if (wu.rows() > 0) bias_ = wu * w;
    }
  }

  double whole() const { return whole_; }

  // ||P_U dW P_V||^2 + ||P_U U w||^2 with P onto the first `picks` picks: the leading
  // block of Q_U^T dW Q_V and the leading part of Q_U^T U w.
  double kept(size_t picks) const {
    const int64_t ru = u_.rankAfter(picks);
    const int64_t rv = v_.rankAfter(picks);
    double sum = middle_.topLeftCorner(ru, rv).squaredNorm();
    if (bias_.size() > 0) sum += bias_.head(ru).squaredNorm();
    return sum;
  }

 private:
  const Residual& u_;
  const Residual& v_;
  double whole_ = 0.0;
  MatrixD middle_;  // r_U x r_V
  VectorD bias_;    // r_U, or empty without a bias
};

}  // namespace

std::string toString(SelectionMethod method) {
  switch (method) {
    case SelectionMethod::kJmcss: return "jmcss";
    case SelectionMethod::kUniform: return "uniform";
    case SelectionMethod::kJmcssGram: return "jmcss-gram";
  }
  return "unknown";
}

SelectionMethod parseSelectionMethod(const std::string& name) {
  for (const auto m : {SelectionMethod::kJmcss, SelectionMethod::kJmcssGram, SelectionMethod::kUniform}) {
    if (name == toString(m)) return m;
  }
  throw InputError(fmt::format("unknown selection method '{}' (choose jmcss, jmcss-gram or uniform)", name));
}

SelectionMethod selectionMethodFromLog(uint32_t number) {
  if (number > static_cast<uint32_t>(SelectionMethod::kJmcssGram)) {
    throw InputError(fmt::format("a batch reference names selection method {}, which no version has", number));
  }
  return static_cast<SelectionMethod>(number);
}

std::vector<Matrix> svGrams(const SvBatch& full, const GramSource& source) {
  ORPHEUS_ENFORCE(source.backend != nullptr, "jmcss-gram needs a backend to form its Gram matrices on");
  checkShapes(full);
  ops::Backend& b = *source.backend;
  const int64_t n = full.numColumns();
  const size_t count = 2 * full.matrices.size();
  std::vector<Matrix> grams(count);
  // The dense matrices as the backend reads them: where a pass left them, in host
  // memory on the CPU backend, or copied in.
  const bool host = b.device() == ops::Device::kCpu;
  ORPHEUS_ENFORCE(host || (source.operand != nullptr && source.grams != nullptr),
                  "jmcss-gram on {} needs device buffers", b.name());
  ops::Tensor all;
  if (!host) all = ops::deviceBuffer(b, *source.grams, n, n * static_cast<int64_t>(count));
  for (size_t p = 0; p < full.matrices.size(); ++p) {
    const SvMatrix& m = full.matrices[p];
    const ops::DeviceSvs* dev = nullptr;
    for (const ops::DeviceSvs& d : source.onDevice) {
      if (d.hostU == m.u.data()) dev = &d;
    }
    for (size_t side = 0; side < 2; ++side) {
      const size_t k = 2 * p + side;
      if (side == 1 && m.sparseV) {
        grams[k] = SparseMatrix(m.vSparse.transpose() * m.vSparse).toDense();
        continue;
      }
      const Matrix& x = side == 0 ? m.u : m.vDense;
      const ops::Tensor* there = dev == nullptr ? nullptr : side == 0 ? dev->u : dev->vDense;
      ORPHEUS_ENFORCE(there == nullptr || (there->rows() == x.rows() && there->cols() == x.cols()),
                      "the device copy of a {}x{} SV matrix has another shape", x.rows(), x.cols());
      if (host) {
        grams[k].resize(n, n);
        ops::Tensor g = ops::cpu::view(grams[k]);
        b.gemm(ops::Trans::kYes, ops::Trans::kNo, 1.0f, ops::cpu::view(x), ops::cpu::view(x), 0.0f, g);
        continue;
      }
      const ops::Tensor in =
          there != nullptr ? there->middleCols(0, n) : ops::uploaded(b, *source.operand, ops::cpu::view(x));
      ops::Tensor g = all.middleCols(static_cast<int64_t>(k) * n, n);
      b.gemm(ops::Trans::kYes, ops::Trans::kNo, 1.0f, in, in, 0.0f, g);
    }
  }
  if (!host && n > 0) {
    Matrix back(n, n * static_cast<int64_t>(count));
    ops::Tensor to = ops::cpu::view(back);
    b.copy(all, to);
    for (size_t k = 0; k < count; ++k) {
      if (grams[k].size() == 0) grams[k] = back.middleCols(static_cast<int64_t>(k) * n, n);
    }
  }
  return grams;
}

SvBatch selectSvgs(const SvBatch& full, int64_t c, SelectionMethod method, CounterRng& rng, SelectionStats* stats,
                   std::span<const Matrix> grams) {
  const auto start = Clock::now();
  ORPHEUS_ENFORCE(c >= 1, "SV selection asked for {} SVGs; at least 1 is needed", c);
  checkShapes(full);
  const int64_t n = full.numColumns();
  SvBatch out;
  std::vector<int64_t> columns;
  if (c >= n) {
    out = full;
    columns.resize(static_cast<size_t>(n));
    std::iota(columns.begin(), columns.end(), int64_t{0});
  } else if (method == SelectionMethod::kUniform) {
    for (const SvMatrix& m : full.matrices) {
      ORPHEUS_ENFORCE(!hasCore(m), "uniform SV selection needs per-column coefficients, matrix {} has a core",
                      m.paramId);
    }
    columns = drawUniform(n, c, rng);
    out = assembleUniform(full, columns);
  } else {
    std::vector<Residual> res =
        method == SelectionMethod::kJmcssGram ? residualsOfGrams(full, grams, c) : residualsOf(full, c);
    columns = drawJmcss(res, n, c, rng);
    out = assembleWithCores(full, res, columns);
  }
  if (stats != nullptr) {
    stats->requested = c;
    stats->selected = static_cast<int64_t>(columns.size());
    stats->indices = std::move(columns);
    stats->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return out;
}

SvBatch projectOntoColumns(const SvBatch& full, std::span<const int64_t> columns) {
  checkShapes(full);
  const int64_t n = full.numColumns();
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int64_t j : columns) {
    ORPHEUS_ENFORCE(j >= 0 && j < n, "column {} is out of range for a batch of {} columns", j, n);
    ORPHEUS_ENFORCE(!seen[static_cast<size_t>(j)], "column {} is listed twice", j);
    seen[static_cast<size_t>(j)] = 1;
  }
  std::vector<Residual> res = residualsOf(full, static_cast<int64_t>(columns.size()));
  for (int64_t j : columns) {
    for (Residual& r : res) r.add(j);
  }
  return assembleWithCores(full, res, columns);
}

std::optional<SvBatch> selectForPeers(const SvBatch& local, int64_t select, SelectionMethod method, uint64_t seed,
                                      uint64_t clock, int rank, const GramSource& source) {
  if (select <= 0 || select >= local.numColumns()) return std::nullopt;
  CounterRng rng(seed, RngPurpose::kSelect, clock, static_cast<uint64_t>(rank));
  std::vector<Matrix> grams;
  if (method == SelectionMethod::kJmcssGram) grams = svGrams(local, source);
  return selectSvgs(local, select, method, rng, nullptr, grams);
}

std::vector<double> selectionErrors(const SvBatch& local, std::span<const int64_t> counts, uint64_t seed,
                                    uint64_t clock, int rank) {
  checkShapes(local);
  const int64_t n = local.numColumns();
  int64_t most = 0;
  for (const int64_t c : counts) {
    ORPHEUS_ENFORCE(c >= 0, "a selection error was asked for {} SVGs", c);
    if (c < n) most = std::max(most, c);  // c >= n sends everything: no draw needed
  }
  // An empty minibatch (a rank --balance left no example): nothing to lose, and no
  // product of empty matrices handed to BLAS, which refuses their leading dimension.
  if (n == 0) return std::vector<double>(counts.size(), 0.0);
  std::vector<Residual> res = residualsOf(local, std::max<int64_t>(1, most));
  if (most > 0) {
    CounterRng rng(seed, RngPurpose::kSelect, clock, static_cast<uint64_t>(rank));
    drawJmcss(res, n, most, rng);  // leaves the bases and each prefix's rank in res
  }
  std::vector<KeptNorms> norms;
  norms.reserve(local.matrices.size());
  double whole = 0.0;
  for (size_t p = 0; p < local.matrices.size(); ++p) {
    norms.emplace_back(local.matrices[p], local.coeffs, res[2 * p], res[2 * p + 1]);
    whole += norms.back().whole();
  }
  std::vector<double> errors(counts.size(), 0.0);
  if (!(whole > 0.0)) return errors;  // no update: nothing to lose
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t c = counts[i];
    if (c >= n) continue;  // everything is sent
    double kept = 0.0;
    if (c > 0) {
      for (const KeptNorms& k : norms) kept += k.kept(static_cast<size_t>(c));
    }
    // An orthogonal projection: what is lost is the whole less what is kept.
    errors[i] = std::sqrt(std::max(0.0, whole - kept) / whole);
  }
  return errors;
}

}  // namespace orpheus::engine
