#include "engine/worker/low_rank.h"

#include "engine/base/error.h"

#include <Eigen/Cholesky>
#include <Eigen/SVD>

#include <algorithm>
#include <cmath>
#include <vector>

namespace orpheus::engine {
namespace {

using MatD = Eigen::MatrixXd;
using VecD = Eigen::VectorXd;

// x (rows x m) = Q T with Q's columns orthonormal, from the m x m Gram matrix x^T x
// (one GEMM, in double) by a Cholesky factorization with diagonal pivoting,
// x^T x = P^T L D L^T P: T = D^1/2 L^T P and Q = x P^T L^-T D^-1/2. Pivots below
// 1e-10 of the largest (directions of singular values below 1e-5 of the top, which
// the Gram cannot resolve) are dropped with their rows of T and columns of B. Returns T (k x m) and the map B (m x k)
// with Q = x B, so Q itself is never formed: only Q times a few columns.
void gramFactor(const Matrix& x, MatD& t, MatD& toQ) {
  const Eigen::Index m = x.cols();
  const MatD xd = x.cast<double>();
  const MatD gram = xd.transpose() * xd;
  const Eigen::LDLT<MatD> ldlt(gram);
  const VecD d = ldlt.vectorD();
  const double top = m > 0 ? d.maxCoeff() : 0.0;
  std::vector<Eigen::Index> keep;
  for (Eigen::Index i = 0; i < m; ++i) {
    if (top > 0.0 && d(i) > 1e-10 * top) keep.push_back(i);
  }
  const MatD perm = ldlt.transpositionsP() * MatD::Identity(m, m);  // gram = P^T L D L^T P
  const MatD lt = MatD(ldlt.matrixU());                              // L^T, unit upper triangular
  const MatD ltP = lt * perm;
  const MatD inv = perm.transpose() * lt.triangularView<Eigen::Upper>().solve(MatD::Identity(m, m));
  const auto k = static_cast<Eigen::Index>(keep.size());
  t.resize(k, m);
  toQ.resize(m, k);
  for (Eigen::Index i = 0; i < k; ++i) {
    const double root = std::sqrt(d(keep[static_cast<size_t>(i)]));
    t.row(i) = root * ltP.row(keep[static_cast<size_t>(i)]);
    toQ.col(i) = inv.col(keep[static_cast<size_t>(i)]) / root;
  }
}

}  // namespace

SvBatch LowRankSender::compress(const SvBatch& batch) {
  const int64_t r = rank_;
  const int64_t n = batch.numColumns();
  if (residual_.size() != batch.matrices.size()) residual_.assign(batch.matrices.size(), Residual{});
  SvBatch out;
  out.header = batch.header;
  out.coeffs = Vector::Ones(r + 1);  // every matrix carries a core
  double lost = 0.0, whole = 0.0;
  for (size_t p = 0; p < batch.matrices.size(); ++p) {
    const SvMatrix& m = batch.matrices[p];
    ORPHEUS_ENFORCE(!m.sparseV, "--sv-rank needs a dense V (matrix {} has a sparse one)", m.paramId);
    Residual& res = residual_[p];
    const Eigen::Index j = m.u.rows(), k = m.vDense.rows();
    if (res.u.rows() != j || res.v.rows() != k) res = Residual{Matrix(j, 0), Matrix(k, 0)};
    const Eigen::Index kept = res.u.cols();
    const Eigen::Index cols = n + kept;
    // G = [U R_u] blockdiag(C, I) [V R_v]^T.
    Matrix uc(j, cols), vc(k, cols);
    uc << m.u, res.u;
    vc << m.vDense, res.v;
    MatD c = MatD::Zero(cols, cols);
    if (m.core.size() > 0) {
      c.topLeftCorner(n, n) = m.core.cast<double>();
    } else {
      c.topLeftCorner(n, n) = batch.coeffs.cast<double>().asDiagonal();
    }
    c.bottomRightCorner(kept, kept).setIdentity();
    MatD tu, toQu, tv, toQv;
    gramFactor(uc, tu, toQu);
    gramFactor(vc, tv, toQv);
    // An update of rank 0 (U or V all zero) leaves nothing to send or keep.
    MatD x(cols, 0), y(cols, 0);
    VecD s(0);
    if (tu.rows() > 0 && tv.rows() > 0) {
      const Eigen::BDCSVD<MatD> svd(tu * c * tv.transpose(), Eigen::ComputeThinU | Eigen::ComputeThinV);
      s = svd.singularValues();
      x = toQu * svd.matrixU();
      y = toQv * svd.matrixV();
    }
    const Eigen::Index sent = std::min<Eigen::Index>(r, s.size());
    const Eigen::Index next = std::min<Eigen::Index>(kResidualRank, s.size() - sent);
    whole += s.squaredNorm();
    lost += s.tail(s.size() - sent).squaredNorm();
    // Q_u X S and Q_v Y for the sent and the kept triplets, as [U R_u] times m x (sent + next).
    const Eigen::Index both = sent + next;
    const Matrix left = (x.leftCols(both) * s.head(both).asDiagonal()).cast<float>();
    const Matrix right = y.leftCols(both).cast<float>();
    const Matrix uOut = uc * left;
    const Matrix vOut = vc * right;

    SvMatrix o;
    o.paramId = m.paramId;
    o.biasId = m.biasId;
    o.sparseV = false;
    o.u = Matrix::Zero(j, r + 1);
    o.vDense = Matrix::Zero(k, r + 1);
    o.core = Matrix::Zero(r + 1, r + 1);
    o.u.leftCols(sent) = uOut.leftCols(sent);
    o.vDense.leftCols(sent) = vOut.leftCols(sent);
    for (Eigen::Index i = 0; i < sent; ++i) o.core(i, i) = 1.0f;
    if (m.biasId >= 0) {
      // The bias update, exactly: U times the bias coefficients.
      const Vector& bc = m.core.size() > 0 ? m.biasCoeffs : batch.coeffs;
      o.u.col(r) = m.u * bc;
      o.biasCoeffs = Vector::Zero(r + 1);
      o.biasCoeffs(r) = 1.0f;
    }
    res.u = uOut.rightCols(next);
    res.v = vOut.rightCols(next);
    out.matrices.push_back(std::move(o));
  }
  lastError_ = whole > 0.0 ? std::sqrt(lost / whole) : 0.0;
  return out;
}

}  // namespace orpheus::engine
