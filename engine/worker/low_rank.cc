#include "engine/worker/low_rank.h"

#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/operators.h"

#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
// out = alpha op(E) x for the r columns of x. On the CPU (and the strict device, which
// keeps its bits) E (J x K) is read once per column, as a matrix-vector product: one
// GEMM of r << J, K columns would first pack all of E, which costs about twice the r
// reads. A GPU reads E in place: one GEMM there.
void productWithColumns(ops::Backend& backend, ops::Trans te, float alpha, const ops::Tensor& e, const ops::Tensor& x,
                        ops::Tensor& out) {
  if (backend.device() == ops::Device::kCuda) {
    backend.gemm(te, ops::Trans::kNo, alpha, e, x, 0.0f, out);
    return;
  }
  for (int64_t c = 0; c < x.cols(); ++c) {
    ops::Tensor column = out.middleCols(c, 1);
    backend.gemm(te, ops::Trans::kNo, alpha, e, x.middleCols(c, 1), 0.0f, column);
  }
}
// The sites of one parameter matrix (a recurrent model's steps each have one) are
// compressed as one matrix: each parameter's whole update goes at rank R, not each
// step's, and E is kept once per parameter. Groups by (parameter, bias), in the
// order of their first site.
std::vector<std::vector<size_t>> siteGroups(const SvBatch& batch) {
  std::vector<std::vector<size_t>> groups;
  std::vector<std::pair<uint32_t, int32_t>> keys;
  for (size_t i = 0; i < batch.matrices.size(); ++i) {
    const std::pair<uint32_t, int32_t> key{batch.matrices[i].paramId, batch.matrices[i].biasId};
    const auto at = std::find(keys.begin(), keys.end(), key);
    if (at == keys.end()) {
      keys.push_back(key);
      groups.push_back({i});
    } else {
      groups[static_cast<size_t>(at - keys.begin())].push_back(i);
    }
  }
  return groups;
}

// One matrix for the sites `sites` of a parameter: U = [U_1 diag(c), ..., U_T diag(c)]
// (each entry u * c, as the GEMM with diag(c) forms it), V = [V_1, ..., V_T] (sparse
// when every site's is: an embedding's one-hot tokens), and ones for its coefficients.
SvMatrix mergeSites(const SvBatch& batch, const std::vector<size_t>& sites, Vector& coeffs) {
  const SvMatrix& first = batch.matrices[sites.front()];
  const int64_t j = first.u.rows(), k = first.vRows(), n = batch.numColumns();
  const auto t = static_cast<int64_t>(sites.size());
  bool sparse = true;
  int64_t nonZeros = 0;
  for (const size_t site : sites) {
    const SvMatrix& m = batch.matrices[site];
    ORPHEUS_ENFORCE(m.core.size() == 0 && m.u.rows() == j && m.vRows() == k && m.u.cols() == n,
                    "--sv-rank: the sites of matrix {} differ in shape or carry cores", m.paramId);
    sparse = sparse && m.sparseV;
    if (m.sparseV) nonZeros += m.vSparse.nonZeros();
  }
  SvMatrix out;
  out.paramId = first.paramId;
  out.biasId = first.biasId;
  out.sparseV = sparse;
  out.u.resize(j, t * n);
  if (sparse) {
    out.vSparse.resize(k, t * n);
    out.vSparse.reserve(nonZeros);
  } else {
    out.vDense.resize(k, t * n);
  }
  for (int64_t s = 0; s < t; ++s) {
    const SvMatrix& m = batch.matrices[sites[static_cast<size_t>(s)]];
    out.u.middleCols(s * n, n) = m.u * batch.coeffs.asDiagonal();
    if (sparse) {
      for (int64_t c = 0; c < n; ++c) {
        out.vSparse.startVec(s * n + c);
        for (SparseMatrix::InnerIterator it(m.vSparse, c); it; ++it) {
          out.vSparse.insertBack(it.row(), s * n + c) = it.value();
        }
      }
    } else if (m.sparseV) {
      out.vDense.middleCols(s * n, n) = m.vSparse.toDense();
    } else {
      out.vDense.middleCols(s * n, n) = m.vDense;
    }
  }
  if (sparse) out.vSparse.finalize();
  coeffs = Vector::Ones(t * n);
  return out;
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> LowRankSender::stateShapes(
    std::span<const std::pair<uint32_t, int32_t>> sites, std::span<const std::pair<int64_t, int64_t>> params) {
  SvBatch keys;
  for (const auto& [param, bias] : sites) {
    SvMatrix m;
    m.paramId = param;
    m.biasId = bias;
    keys.matrices.push_back(std::move(m));
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const std::vector<size_t>& g : siteGroups(keys)) out.push_back(params[sites[g.front()].first]);
  return out;
}

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

ops::Tensor LowRankSender::operand(const Matrix& m, ops::Tensor& store) {
  if (backend_.device() == ops::Device::kCpu) return ops::Tensor::host(m.data(), m.rows(), m.cols());
  ops::Tensor to = ops::deviceBuffer(backend_, store, m.rows(), m.cols());
  put(m, to);
  return to;
}

void LowRankSender::put(const Matrix& m, ops::Tensor& dst) {
  if (backend_.device() == ops::Device::kCpu) {
    backend_.copy(ops::Tensor::host(m.data(), m.rows(), m.cols()), dst);
    return;
  }
  backend_.waitOnDevice(staging_.up(m.data(), dst));
}

void LowRankSender::beginStaging(const SvBatch& batch) {
  // What a clock can cross, per matrix: U and V (when not on the device), the core
  // (or the coefficients as one, n x n), the bias coefficients, -P and bf16 Q' up;
  // M Q, Q', E's column norms and the bias update down.
  int64_t floats = 0;
  const int64_t r = rank_;
  for (const SvMatrix& m : batch.matrices) {
    const int64_t j = m.u.rows(), k = m.vRows(), n = m.u.cols();
    floats += j * n + k * n + n * n + std::max(n, r + 1) + 2 * (j * r + k * r) + k + j + r * r;
  }
  size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  // A sparse V crosses compressed (merged sites' take no more than the sites' own).
  for (const SvMatrix& m : batch.matrices) {
    if (m.sparseV) bytes += ops::stagedSparseBytes(backend_, m.vSparse) + 2 * sizeof(float);
  }
  staging_.begin(backend_, bytes);
}

Matrix LowRankSender::staged(size_t at, int64_t rows, int64_t cols) const {
  const ops::Tensor t = staging_.floats(at, rows, cols);
  return Eigen::Map<const Matrix>(t.data(), rows, cols);
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

// M = E + U C V^T is never formed on its own: with A = U C,
//   M Q = E Q + A (V^T Q),   M^T P = E^T P + V (A^T P),   E' = E + [A, -P] [V, Q']^T,
// two reads of E and one update in place. ||M||^2 = ||E'||^2 + ||Q'||^2, as P P^T M is
// an orthogonal projection of M. Each phase is queued for every matrix before the host
// reads any of its results, and every copy crosses asynchronously through the staging
// buffer (low_rank.h), so the host waits for the device's work twice a clock (three
// times in bf16: Q' is rounded before E's update), not once per matrix, step and copy.

void LowRankSender::queueRange(Work& w) {
  using ops::Tensor;
  using ops::Trans;
  const SvMatrix& m = *w.m;
  const int64_t r = rank_;
  MatrixState& s = state_[w.p];
  const int64_t j = m.u.rows(), k = m.vRows(), n = m.u.cols();
  if (s.e.rows() != j || s.e.cols() != k) {
    s.e = upload(Matrix::Zero(j, k));
    std::mt19937_64 gen(seed_ ^ (0x9e3779b97f4a7c15ULL * (w.p + 1)));
    std::normal_distribution<float> normal;
    Matrix q(k, r);
    for (Eigen::Index i = 0; i < q.size(); ++i) q.data()[i] = normal(gen);
    s.q = upload(q);
  } else if (s.q.cols() != r) {
    // The rank moved (--adapt): keep the first r columns, or draw the new ones.
    Matrix q = download(s.q);
    const Eigen::Index had = q.cols();
    q.conservativeResize(k, r);
    if (r > had) drawColumns(q, had, r, seed_, w.p);
    s.q = upload(q);
  }
  Buffers& b = s.buffers;
  const auto where = [](const Tensor& t) { return Tensor::view(t.device(), t.data(), t.rows(), t.cols()); };
  w.u = w.onDevice != nullptr && w.onDevice->u != nullptr ? where(*w.onDevice->u) : operand(m.u, b.u);
  w.sparse = m.sparseV;
  if (w.sparse) {
    // One-hot token columns (an embedding's V; K a vocabulary): every product with V
    // is a sparse one, and V^T's are taken as transposes, (Q^T V)^T and (S V^T)^T, with
    // I_R forming the transposes (a GEMM with I_R is exact: one product per entry).
    const SparseMatrix* v = &m.vSparse;
    if (!v->isCompressed()) {
      w.vCompressed = *v;
      w.vCompressed.makeCompressed();
      v = &w.vCompressed;
    }
    if (backend_.device() == ops::Device::kCpu) {
      w.vs = ops::cpu::view(*v);  // read in place
    } else {
      backend_.waitOnDevice(ops::stageSparse(backend_, *v, staging_, b.vSparse));
      w.vs = b.vSparse.view;
    }
    w.eyeHost = Matrix::Identity(r, r);  // viewed in place on the CPU: it lives as long as w
    w.eye = operand(w.eyeHost, b.eye);
    w.transposed = ops::deviceBuffer(backend_, b.transposed, r, k);
  } else {
    w.v = w.onDevice != nullptr && w.onDevice->vDense != nullptr ? where(*w.onDevice->vDense)
                                                                 : operand(m.vDense, b.v);
  }
  w.left = ops::deviceBuffer(backend_, b.left, j, n + r);
  w.right = ops::deviceBuffer(backend_, b.right, k, w.sparse ? r : n + r);
  w.small = w.sparse ? ops::deviceBuffer(backend_, b.small, r, n) : ops::deviceBuffer(backend_, b.small, n, r);
  w.mq = ops::deviceBuffer(backend_, b.mq, j, r);
  Tensor a = w.left.middleCols(0, n);
  const Vector& coeffs = *w.coeffs;
  const bool uniform = !w.withCore() && n > 0 && (coeffs.array() == coeffs(0)).all();
  if (uniform) {
    ops::scaledCopy(backend_, w.u, coeffs(0), a);  // U c, u * c bit for bit
  } else {
    // U core, or U diag(c): each entry one product plus zeros, u * c bit for bit.
    const Matrix core = w.withCore() ? m.core : Matrix(coeffs.asDiagonal());
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, w.u, operand(core, b.core), 0.0f, a);
  }
  if (w.sparse) {
    backend_.gemm(Trans::kNo, Trans::kYes, 1.0f, w.eye, s.q, 0.0f, w.transposed);         // Q^T
    backend_.gemmSparse(1.0f, w.transposed, w.vs, Trans::kNo, 0.0f, w.small);              // (V^T Q)^T
    productWithColumns(backend_, Trans::kNo, 1.0f, s.e, s.q, w.mq);                        // E Q
    backend_.gemm(Trans::kNo, Trans::kYes, 1.0f, a, w.small, 1.0f, w.mq);                 // + A V^T Q
    return;
  }
  backend_.gemm(Trans::kYes, Trans::kNo, 1.0f, w.v, s.q, 0.0f, w.small);  // V^T Q
  productWithColumns(backend_, Trans::kNo, 1.0f, s.e, s.q, w.mq);          // E Q
  backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, a, w.small, 1.0f, w.mq);    // + A V^T Q
}

// P, an orthonormal basis of M Q's range, is formed on the host (J x R); then
// Q' = M^T P = -(E^T (-P)) - V (A^T (-P)): negations are exact, so this is E^T P + V A^T P.
void LowRankSender::queueProjection(Work& w) {
  using ops::Tensor;
  using ops::Trans;
  const int64_t r = rank_, j = w.m->u.rows(), n = w.m->u.cols();
  const Eigen::HouseholderQR<Matrix> qr(staged(w.mqAt, j, r));
  w.basis = qr.householderQ() * Matrix::Identity(j, r);
  if (dtype_ == SvDtype::kBf16) roundAllToBf16(w.basis);
  Tensor minusP = w.left.middleCols(n, r);
  put(-w.basis, minusP);
  Tensor q = w.projected();
  productWithColumns(backend_, Trans::kYes, -1.0f, state_[w.p].e, minusP, q);
  if (w.sparse) {
    backend_.gemm(Trans::kYes, Trans::kNo, -1.0f, minusP, w.left.middleCols(0, n), 0.0f, w.small);  // (A^T P)^T
    backend_.gemmSparse(1.0f, w.small, w.vs, Trans::kYes, 0.0f, w.transposed);                      // (V A^T P)^T
    backend_.gemm(Trans::kYes, Trans::kNo, 1.0f, w.transposed, w.eye, 1.0f, q);
    return;
  }
  backend_.gemm(Trans::kYes, Trans::kNo, -1.0f, w.left.middleCols(0, n), minusP, 0.0f, w.small);
  backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, w.v, w.small, 1.0f, q);
}

// Q' in bf16 (the value sent, so E carries its rounding error too), before E's update.
void LowRankSender::roundProjection(Work& w) {
  const int64_t r = rank_, k = w.m->vRows();
  ops::Tensor q = w.projected();
  w.q = staged(w.qAt, k, r);
  roundAllToBf16(w.q);
  put(w.q, q);
}

// Q becomes Q', E becomes E - P Q'^T + A V^T, and E's column norms and the bias
// update U c are formed for the host.
void LowRankSender::queueUpdate(Work& w) {
  using ops::Tensor;
  using ops::Trans;
  const int64_t r = rank_, j = w.m->u.rows(), k = w.m->vRows(), n = w.m->u.cols();
  MatrixState& s = state_[w.p];
  Buffers& b = s.buffers;
  if (s.q.cols() != r || s.q.rows() != k) s.q = backend_.allocate(k, r);
  backend_.copy(w.projected(), s.q);
  if (w.sparse) {
    backend_.gemmSparse(1.0f, w.left.middleCols(0, n), w.vs, Trans::kYes, 1.0f, s.e);      // E + A V^T
    backend_.gemm(Trans::kNo, Trans::kYes, 1.0f, w.left.middleCols(n, r), w.right, 1.0f, s.e);  // - P Q'^T
  } else {
    Tensor vPart = w.right.middleCols(0, n);
    backend_.copy(w.v, vPart);
    backend_.gemm(Trans::kNo, Trans::kYes, 1.0f, w.left, w.right, 1.0f, s.e);  // E' = E + [A, -P] [V, Q']^T
  }
  w.norms = ops::deviceBuffer(backend_, b.norms, 1, k);
  backend_.columnOp(ops::OpKind::kSquaredL2, s.e, nullptr, w.norms);
  if (w.m->biasId >= 0) {
    const Matrix c = w.withCore() ? Matrix(w.m->biasCoeffs) : Matrix(*w.coeffs);
    w.bias = ops::deviceBuffer(backend_, b.bias, j, 1);
    backend_.gemm(Trans::kNo, Trans::kNo, 1.0f, w.u, operand(c, b.biasCoeffs), 0.0f, w.bias);
  }
}

SvMatrix LowRankSender::finish(Work& w, double& kept, double& whole) {
  const int64_t r = rank_, j = w.m->u.rows(), k = w.m->vRows();
  MatrixState& s = state_[w.p];
  if (w.q.size() == 0) w.q = staged(w.qAt, k, r);
  const double carried = staged(w.normsAt, 1, k).cast<double>().sum();
  // What the best k directions within span(P) carry: the eigenvalues of
  // Q'^T Q' = P^T M M^T P (r x r), largest first.
  const Eigen::MatrixXd gram = w.q.cast<double>().transpose() * w.q.cast<double>();
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(gram, Eigen::EigenvaluesOnly);
  s.captured.assign(eig.eigenvalues().data(), eig.eigenvalues().data() + r);
  std::sort(s.captured.begin(), s.captured.end(), std::greater<>());
  kept += carried;
  whole += carried + w.q.cast<double>().squaredNorm();

  SvMatrix o;
  o.paramId = w.m->paramId;
  o.biasId = w.m->biasId;
  o.u = Matrix::Zero(j, r + 1);
  o.vDense = Matrix::Zero(k, r + 1);
  o.core = Matrix::Zero(r + 1, r + 1);
  o.u.leftCols(r) = w.basis;
  o.vDense.leftCols(r) = w.q;
  for (Eigen::Index i = 0; i < r; ++i) o.core(i, i) = 1.0f;
  if (w.m->biasId >= 0) {
    // The bias update, exactly: U times the bias coefficients (in bf16, with the
    // rounding error of earlier clocks added and this clock's carried on).
    o.u.col(r) = staged(w.biasAt, j, 1).col(0);
    if (dtype_ == SvDtype::kBf16) {
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
    // What a run's residual and basis can hold: finite, and small enough that their
    // squared norms stay finite in float (no run that trains reaches 1e15).
    constexpr float kMost = 1e15f;
    for (const auto& [m, what] : {std::pair<const Matrix*, const char*>{&se, "residual"}, {&sq, "basis"}}) {
      ORPHEUS_CHECK_INPUT(m->allFinite() && m->cwiseAbs().maxCoeff() <= kMost,
                          "the --sv-rank {} of matrix {} holds {}, beyond the {:g} any run's reaches", what, p,
                          m->cwiseAbs().maxCoeff(), kMost);
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
  const std::vector<std::vector<size_t>> groups = siteGroups(batch);
  if (state_.size() != groups.size()) {
    state_.clear();
    state_.resize(groups.size());
  }
  SvBatch out;
  out.header = batch.header;
  out.coeffs = Vector::Ones(rank_ + 1);  // every matrix carries a core
  out.dtype = dtype_;
  std::vector<Work> work(groups.size());
  std::vector<SvMatrix> merged(groups.size());
  std::vector<Vector> mergedCoeffs(groups.size());
  beginStaging(batch);  // what the sites need covers what their merged matrices do
  for (size_t p = 0; p < work.size(); ++p) {
    const size_t site = groups[p].front();
    if (groups[p].size() == 1) {
      work[p].m = &batch.matrices[site];
      work[p].coeffs = &batch.coeffs;
      work[p].onDevice = onDevice.empty() ? nullptr : &onDevice[site];
    } else {
      merged[p] = mergeSites(batch, groups[p], mergedCoeffs[p]);
      work[p].m = &merged[p];
      work[p].coeffs = &mergedCoeffs[p];
    }
    work[p].p = p;
    queueRange(work[p]);
  }
  for (Work& w : work) w.mqAt = staging_.down(w.mq);
  staging_.wait();  // every M Q
  for (Work& w : work) queueProjection(w);
  if (dtype_ == SvDtype::kBf16) {
    for (Work& w : work) w.qAt = staging_.down(w.projected());
    staging_.wait();  // every Q'
    for (Work& w : work) roundProjection(w);
  }
  for (Work& w : work) queueUpdate(w);
  for (Work& w : work) {
    if (dtype_ != SvDtype::kBf16) w.qAt = staging_.down(w.projected());
    w.normsAt = staging_.down(w.norms);
    if (w.m->biasId >= 0) w.biasAt = staging_.down(w.bias);
  }
  staging_.wait();  // the rest
  double kept = 0.0, whole = 0.0;
  for (Work& w : work) out.matrices.push_back(finish(w, kept, whole));
  lastError_ = whole > 0.0 ? std::sqrt(kept / whole) : 0.0;
  lastWhole_ = whole;
  return out;
}

}  // namespace orpheus::engine
