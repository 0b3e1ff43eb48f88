#include "ops/cpu/cpu_backend.h"

#include "engine/base/log.h"
#include "ops/backend_checks.h"
#include "ops/cpu/elementwise_chain.h"
#include "ops/cpu/optimizer_step.h"
#include "ops/lstm_cell.h"
#include "ops/operators.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

namespace orpheus::ops::cpu {
namespace {

// c = alpha * (l * r) + beta * c. alpha == 1, beta == 1 is exactly `c.noalias() += l * r`
// (the rebuild's expression), so Eigen picks the same kernel as before the seam.
template <typename L, typename R>
void product(const L& l, const R& r, float alpha, float beta, MatrixMap& c) {
  if (beta == 0.0f) {
    if (alpha == 1.0f) {
      c.noalias() = l * r;
    } else {
      c.noalias() = alpha * (l * r);
    }
    return;
  }
  if (beta != 1.0f) c *= beta;
  if (alpha == 1.0f) {
    c.noalias() += l * r;
  } else {
    c.noalias() += alpha * (l * r);
  }
}

#ifdef EIGEN_USE_BLAS
// Eigen hands a product to BLAS's sgemm only when it is large enough and neither
// side of the result is a vector (GeneralMatrixMatrix.h: m + n + k >= 20, else its
// coefficient-wise kernel; m == 1 or n == 1: GEMV). For those shapes sgemm is
// called here directly, with alpha and beta: the same sums as through Eigen, which
// first zeroes (beta == 0) or scales C in a pass of its own. Other shapes keep
// Eigen's kernels and so their rounding.
bool runsAsBlasGemm(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMaxBlasDim = std::numeric_limits<int>::max();
  return m > 1 && n > 1 && k > 0 && m + n + k >= 20 && m <= kMaxBlasDim && n <= kMaxBlasDim && k <= kMaxBlasDim;
}

void sgemm(Trans ta, Trans tb, float alpha, const Tensor& a, const Tensor& b, float beta, Tensor& c, int64_t depth) {
  const char transA = ta == Trans::kNo ? 'N' : 'T';
  const char transB = tb == Trans::kNo ? 'N' : 'T';
  const int m = static_cast<int>(c.rows());
  const int n = static_cast<int>(c.cols());
  const int k = static_cast<int>(depth);
  const int lda = static_cast<int>(std::max<int64_t>(1, a.rows()));
  const int ldb = static_cast<int>(std::max<int64_t>(1, b.rows()));
  const int ldc = m;
  sgemm_(&transA, &transB, &m, &n, &k, &alpha, a.data(), &lda, b.data(), &ldb, &beta, c.data(), &ldc);
}
#endif

template <typename Ptrs>
ChainBuffers<float> buffers(std::span<const Tensor* const> inputs, checks::ChainShape shape, const Ptrs& values) {
  ChainBuffers<float> b;
  b.rows = shape.rows;
  b.cols = shape.cols;
  for (const Tensor* in : inputs) {
    b.inputs.push_back(in->data());
    b.broadcast.push_back(in->cols() == 1 && shape.cols != 1);
  }
  for (const Tensor* v : values) b.values.push_back(v->data());
  return b;
}

}  // namespace

SparseTensor view(const Eigen::SparseMatrix<float, Eigen::ColMajor, int32_t>& s) {
  ORPHEUS_ENFORCE(s.isCompressed(), "a sparse view needs a compressed matrix");
  SparseTensor t;
  t.device = Device::kCpu;
  t.layout = SparseTensor::Layout::kCsc;
  t.rows = s.rows();
  t.cols = s.cols();
  t.nonZeros = s.nonZeros();
  t.outer = s.outerIndexPtr();
  t.inner = s.innerIndexPtr();
  t.values = s.valuePtr();
  return t;
}

Tensor CpuBackend::allocate(int64_t rows, int64_t cols) {
  ORPHEUS_ENFORCE(rows >= 0 && cols >= 0, "allocate: shape {}x{}", rows, cols);
  auto* p = static_cast<float*>(Eigen::internal::aligned_malloc(static_cast<size_t>(rows * cols) * sizeof(float)));
  return Tensor(Device::kCpu, p, rows, cols, [](float* q) { Eigen::internal::aligned_free(q); });
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  countLaunch();
  if (src.device() != Device::kCpu || dst.device() != Device::kCpu) unsupported("copies to or from device memory");
  checks::sameShape("copy", src, dst);
  if (src.size() > 0 && src.data() != dst.data()) {
    std::memmove(dst.data(), src.data(), static_cast<size_t>(src.size()) * sizeof(float));
  }
}

namespace {

struct SparseArrays {
  std::vector<int32_t> outer, inner;
  std::vector<float> values;
};

}  // namespace

void CpuBackend::copySparse(const SparseTensor& src, SparseCopy& dst) {
  countLaunch();
  if (src.device != Device::kCpu) unsupported("copies from device memory");
  const int64_t outerSize = (src.layout == SparseTensor::Layout::kCsc ? src.cols : src.rows) + 1;
  const size_t bytes = static_cast<size_t>(outerSize + 2 * src.nonZeros) * sizeof(float);
  // The arrays grow in place: a copy into storage of this backend allocates only when it outgrows it.
  if (!dst.storage || dst.view.device != Device::kCpu || dst.capacity == 0) {
    dst.storage = std::make_shared<SparseArrays>();
    dst.capacity = 0;
  }
  auto* arrays = static_cast<SparseArrays*>(dst.storage.get());
  arrays->outer.assign(src.outer, src.outer + outerSize);
  arrays->inner.assign(src.inner, src.inner + src.nonZeros);
  arrays->values.assign(src.values, src.values + src.nonZeros);
  dst.capacity = std::max(dst.capacity, bytes);
  dst.view = src;
  dst.view.outer = arrays->outer.data();
  dst.view.inner = arrays->inner.data();
  dst.view.values = arrays->values.data();
}

void CpuBackend::gemm(Trans ta, Trans tb, float alpha, const Tensor& a, const Tensor& b, float beta, Tensor& c) {
  countLaunch();
  checks::onDevice(*this, "gemm", a);
  checks::onDevice(*this, "gemm", b);
  checks::onDevice(*this, "gemm", c);
  checks::gemm(ta, tb, a, b, c);
#ifdef EIGEN_USE_BLAS
  const int64_t depth = ta == Trans::kNo ? a.cols() : a.rows();
  if (runsAsBlasGemm(c.rows(), c.cols(), depth)) {
    sgemm(ta, tb, alpha, a, b, beta, c, depth);
    return;
  }
#endif
  const MatrixMap am = map(a);
  const MatrixMap bm = map(b);
  MatrixMap cm = map(c);
  if (ta == Trans::kNo && tb == Trans::kNo) product(am, bm, alpha, beta, cm);
  if (ta == Trans::kNo && tb == Trans::kYes) product(am, bm.transpose(), alpha, beta, cm);
  if (ta == Trans::kYes && tb == Trans::kNo) product(am.transpose(), bm, alpha, beta, cm);
  if (ta == Trans::kYes && tb == Trans::kYes) product(am.transpose(), bm.transpose(), alpha, beta, cm);
}

#ifdef EIGEN_USE_BLAS
namespace {

// c[:, first, first + cols) += a b[first, first + cols)^T by one sgemm (column-major,
// c m x n, a m x k, b n x k).
void sgemmColumns(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, int64_t first,
                  int64_t cols) {
  const char transA = 'N', transB = 'T';
  const float one = 1.0f;
  const int mi = static_cast<int>(m), ni = static_cast<int>(cols), ki = static_cast<int>(k);
  const int lda = static_cast<int>(m), ldb = static_cast<int>(n), ldc = static_cast<int>(m);
  sgemm_(&transA, &transB, &mi, &ni, &ki, &one, a, &lda, b + first, &ldb, &one, c + first * m, &ldc);
}

// Whether tiles of `grain` columns (and of twice that) give the whole product bit for
// bit on small products of fixed values.
bool tilesOfGrainSumAsWhole(int64_t grain) {
  const struct { int64_t m, n, k; } probes[] = {{64, 200, 24}, {37, 301, 40}, {130, 150, 8}};
  for (const auto& p : probes) {
    for (const int64_t tile : {grain, 2 * grain}) {
      std::vector<float> a(static_cast<size_t>(p.m * p.k)), b(static_cast<size_t>(p.n * p.k));
      std::vector<float> whole(static_cast<size_t>(p.m * p.n));
      uint32_t state = 12345;
      const auto next = [&] {
        state = state * 1664525u + 1013904223u;
        return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
      };
      for (float& v : a) v = next();
      for (float& v : b) v = next();
      for (float& v : whole) v = next();
      std::vector<float> tiled = whole;
      sgemmColumns(a.data(), b.data(), whole.data(), p.m, p.n, p.k, 0, p.n);
      for (int64_t first = 0; first < p.n; first += tile) {
        sgemmColumns(a.data(), b.data(), tiled.data(), p.m, p.n, p.k, first, std::min(tile, p.n - first));
      }
      if (std::memcmp(whole.data(), tiled.data(), whole.size() * sizeof(float)) != 0) return false;
    }
  }
  return true;
}

}  // namespace
#endif

int64_t columnGrain() {
#ifdef EIGEN_USE_BLAS
  // Tried once (about a millisecond), with the BLAS threads of the first call.
  static const int64_t grain = [] {
    for (const int64_t g : {4, 8, 12, 16, 24, 48}) {
      if (tilesOfGrainSumAsWhole(g)) return g;
    }
    return int64_t{0};
  }();
  return grain;
#else
  return 0;
#endif
}

bool gemmByColumnTiles(const Tensor& a, const Tensor& b, Tensor& c, int64_t tileCols,
                       const std::function<void(int64_t first, int64_t cols)>& tileDone) {
#ifdef EIGEN_USE_BLAS
  const int64_t m = c.rows(), n = c.cols(), k = a.cols();
  if (a.rows() != m || b.rows() != n || b.cols() != k) return false;
  // Threaded, the BLAS splits c's columns among its threads where it likes.
  const int64_t grain = blasThreads() > 1 ? 0 : columnGrain();
  if (grain == 0) return false;
  // Tiles of a multiple of the grain, at least 16 columns; a rest of fewer than 16
  // joins the last whole tile (every tile starts on a multiple of the grain).
  const int64_t tile = std::max((16 + grain - 1) / grain * grain, tileCols / grain * grain);
  const int64_t full = n / tile, rest = n % tile;
  const int64_t last = full == 0 ? n : (rest == 0 ? tile : (rest >= 16 ? rest : tile + rest));
  if (!runsAsBlasGemm(m, n, k) || !runsAsBlasGemm(m, std::min(tile, n), k) || !runsAsBlasGemm(m, last, k)) {
    return false;
  }
  for (int64_t first = 0; first < n;) {
    const int64_t cols = n - first == last ? last : tile;
    sgemmColumns(a.data(), b.data(), c.data(), m, n, k, first, cols);
    tileDone(first, cols);
    first += cols;
  }
  return true;
#else
  (void)a, (void)b, (void)c, (void)tileCols, (void)tileDone;
  return false;
#endif
}

void CpuBackend::gemmSparse(float alpha, const Tensor& a, const SparseTensor& s, Trans ts, float beta, Tensor& c) {
  countLaunch();
  checks::onDevice(*this, "gemmSparse", a);
  checks::onDevice(*this, "gemmSparse", c);
  ORPHEUS_ENFORCE(s.device == Device::kCpu, "backend cpu: the sparse operand lives in {} memory",
                  deviceName(s.device));
  // CSR of s is CSC of s^T: one layout, with the transpose flipped.
  const checks::CscOperand o = checks::gemmSparse(a, s, ts, c);
  const SparseMap sm(o.rows, o.cols, s.nonZeros, s.outer, s.inner, s.values);
  const bool transposed = o.transposed;
  const MatrixMap am = map(a);
  MatrixMap cm = map(c);
  if (beta == 0.0f) {
    cm.setZero();
  } else if (beta != 1.0f) {
    cm *= beta;
  }
  if (transposed) {
    // (S A^T)^T keeps the sparse operand on the left, where Eigen's kernel is fastest.
    if (alpha == 1.0f) {
      cm.noalias() += (sm * am.transpose()).transpose();
    } else {
      cm.noalias() += alpha * (sm * am.transpose()).transpose();
    }
  } else if (alpha == 1.0f) {
    cm.noalias() += am * sm;
  } else {
    cm.noalias() += alpha * (am * sm);
  }
}

void CpuBackend::elementwise(const EwChain& chain, std::span<const Tensor* const> inputs,
                             std::span<Tensor* const> outputs) {
  countLaunch();
  const checks::ChainShape shape = checks::forward(*this, chain, inputs, outputs);
  runChainForward<float>(chain, buffers(inputs, shape, outputs));
}

void CpuBackend::elementwiseBackward(const EwChain& chain, std::span<const Tensor* const> inputs,
                                     std::span<const Tensor* const> values, const Tensor& upstream,
                                     std::span<Tensor* const> inputGrads) {
  countLaunch();
  const checks::ChainShape shape = checks::backward(*this, chain, inputs, values, upstream, inputGrads);
  ChainBuffers<float> b = buffers(inputs, shape, values);
  b.upstream = upstream.data();
  for (const Tensor* grad : inputGrads) b.inputGrads.push_back(grad ? grad->data() : nullptr);
  runChainBackward<float>(chain, b);
}

void CpuBackend::softmaxCrossEntropy(const Tensor& z, const Tensor& t, Tensor& p, Tensor& loss) {
  countLaunch();
  for (const Tensor* x : std::initializer_list<const Tensor*>{&z, &t, &p, &loss}) checks::onDevice(*this, "softmaxCrossEntropy", *x);
  checks::sameShape("softmaxCrossEntropy", z, t);
  checks::sameShape("softmaxCrossEntropy", z, p);
  ORPHEUS_ENFORCE(loss.rows() == 1 && loss.cols() == z.cols(), "softmaxCrossEntropy: loss must be 1x{}", z.cols());
  const MatrixMap zm = map(z);
  const MatrixMap tm = map(t);
  MatrixMap pm = map(p);
  MatrixMap lm = map(loss);
  // The expressions of ops::forward's kSoftmax and kCrossEntropy, so the fused pair
  // gives bitwise the values of the two operators run one after the other.
  for (int64_t j = 0; j < z.cols() && z.rows() > 0; ++j) {
    // Subtracting the column's max keeps exp from overflowing.
    pm.col(j) = (zm.col(j).array() - zm.col(j).maxCoeff()).exp().matrix();
    pm.col(j) *= 1.0f / pm.col(j).sum();
  }
  crossEntropyColumns(pm, tm, lm);
}

void CpuBackend::softmaxCrossEntropyBackward(const Tensor& p, const Tensor& t, const Tensor& upstream, float beta,
                                             Tensor& dz) {
  countLaunch();
  for (const Tensor* x : std::initializer_list<const Tensor*>{&p, &t, &upstream, &dz}) checks::onDevice(*this, "softmaxCrossEntropyBackward", *x);
  checks::sameShape("softmaxCrossEntropyBackward", p, t);
  checks::sameShape("softmaxCrossEntropyBackward", p, dz);
  ORPHEUS_ENFORCE(upstream.rows() == 1 && upstream.cols() == p.cols(),
                  "softmaxCrossEntropyBackward: upstream must be 1x{}", p.cols());
  const MatrixMap pm = map(p);
  const MatrixMap tm = map(t);
  const Eigen::Array<float, 1, Eigen::Dynamic> g = map(upstream).row(0).array();
  const Eigen::Array<float, 1, Eigen::Dynamic> mass = tm.colwise().sum().array() * g;
  MatrixMap dm = map(dz);
  if (beta == 0.0f) {
    dm = (pm.array().rowwise() * mass - tm.array().rowwise() * g).matrix();
    return;
  }
  if (beta != 1.0f) dm *= beta;
  dm += (pm.array().rowwise() * mass - tm.array().rowwise() * g).matrix();
}

// ops::forward and ops::backward themselves, on copies of the operands: bitwise the
// host executor's values (these operators are O(r B); the copies cost as much).
void CpuBackend::columnOp(OpKind op, const Tensor& a, const Tensor* b, Tensor& out) {
  checks::columnOp(*this, "columnOp", op, a, b, out);
  countLaunch();
  // A reduction reads its operand where it lies (no copy of a J x K operand).
  if (MatrixMap o = map(out); b == nullptr && reduceColumns(op, map(a), o)) return;
  const Mat<float> am = map(a);
  const Mat<float> bm = b != nullptr ? Mat<float>(map(*b)) : Mat<float>();
  Operands<float> in;
  in.a = &am;
  in.b = b != nullptr ? &bm : nullptr;
  Mat<float> result;
  forwardInto<float>(op, in, result);
  map(out) = result;
}

void CpuBackend::columnOpBackward(OpKind op, int which, const Tensor& a, const Tensor* b, const Tensor& out,
                                  const Tensor& upstream, Tensor& dst) {
  checks::columnOpBackward(*this, op, which, a, b, out, upstream, dst);
  countLaunch();
  const Mat<float> am = map(a);
  const Mat<float> bm = b != nullptr ? Mat<float>(map(*b)) : Mat<float>();
  const Mat<float> outm = map(out);
  const Mat<float> gm = map(upstream);
  Operands<float> in;
  in.a = &am;
  in.b = b != nullptr ? &bm : nullptr;
  Mat<float> result;
  backwardInto<float>(op, which, in, outm, gm, result);
  map(dst) = result;
}

void CpuBackend::copyRows(const Tensor& src, int64_t srcRow, Tensor& dst, int64_t dstRow, int64_t rows) {
  countLaunch();
  checks::copyRows(*this, src, srcRow, dst, dstRow, rows);
  map(dst).middleRows(dstRow, rows) = map(src).middleRows(srcRow, rows);
}

namespace {

LstmCellBuffers<float> lstmBuffers(const LstmCellArgs& a, int64_t h) {
  LstmCellBuffers<float> b;
  b.rows = h;
  b.cols = a.cPrev->cols();
  b.gates = a.gates->data();
  for (int k = 0; k < 4; ++k) {
    b.offset[k] = a.offset[static_cast<size_t>(k)];
    b.act[k] = a.act[static_cast<size_t>(k)]->data();
  }
  b.cPrev = a.cPrev->data();
  b.cell = a.cell ? a.cell->data() : nullptr;
  b.tanhCell = a.tanhCell->data();
  b.hidden = a.hidden ? a.hidden->data() : nullptr;
  return b;
}

}  // namespace

void CpuBackend::lstmCellForward(const LstmCellArgs& a) {
  countLaunch();
  const int64_t h = checks::lstmCell(*this, "lstmCellForward", a, true);
  ops::lstmCellForward(lstmBuffers(a, h));
}

void CpuBackend::lstmCellBackward(const LstmCellArgs& a, const Tensor* dHidden, const Tensor* dCell, Tensor& dGates,
                                  Tensor* dCPrev) {
  countLaunch();
  const int64_t h = checks::lstmCellBackward(*this, a, dHidden, dCell, dGates, dCPrev);
  ops::lstmCellBackward(lstmBuffers(a, h), dHidden ? dHidden->data() : nullptr, dCell ? dCell->data() : nullptr,
                        dGates.data(), dCPrev ? dCPrev->data() : nullptr);
}

void CpuBackend::sumColumns(const Tensor& a, float beta, Tensor& out) {
  countLaunch();
  checks::onDevice(*this, "sumColumns", a);
  checks::onDevice(*this, "sumColumns", out);
  ORPHEUS_ENFORCE(out.rows() == a.rows() && out.cols() == 1, "sumColumns: out must be {}x1", a.rows());
  MatrixMap om = map(out);
  if (beta == 0.0f) {
    om.col(0) = sumColumnsInOrder(map(a));
    return;
  }
  if (beta != 1.0f) om *= beta;
  om.col(0) += sumColumnsInOrder(map(a));
}

void CpuBackend::sumRows(const Tensor& a, float beta, Tensor& out) {
  countLaunch();
  checks::onDevice(*this, "sumRows", a);
  checks::onDevice(*this, "sumRows", out);
  ORPHEUS_ENFORCE(out.rows() == 1 && out.cols() == a.cols(), "sumRows: out must be 1x{}", a.cols());
  MatrixMap om = map(out);
  if (beta == 0.0f) {
    om.row(0) = map(a).colwise().sum();
    return;
  }
  if (beta != 1.0f) om *= beta;
  om.row(0) += map(a).colwise().sum();
}

void CpuBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  countLaunch();
  checks::onDevice(*this, "axpy", x);
  checks::onDevice(*this, "axpy", y);
  checks::sameShape("axpy", x, y);
  map(y) += alpha * map(x);
}

void CpuBackend::scale(float alpha, Tensor& x) {
  countLaunch();
  checks::onDevice(*this, "scale", x);
  map(x) *= alpha;
}

void CpuBackend::copyParts(std::span<const CopyPart> parts) {
  countLaunches(parts.size(), kCopyPartsPerLaunch);
  checks::copyParts(*this, parts);
  for (const CopyPart& p : parts) {
    const float* src = p.src.data();
    float* dst = p.dst.data();
    const int64_t n = p.dst.size();
    if (!p.scaled) {
      if (n > 0) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
      continue;
    }
    for (int64_t i = 0; i < n; ++i) dst[i] = p.scale * src[i];
  }
}

void CpuBackend::addInOrder(std::span<const Tensor* const> terms, Tensor& y) {
  countLaunches(terms.size(), kAddTermsPerLaunch);
  checks::addInOrder(*this, terms, y);
  for (const Tensor* t : terms) map(y) += map(*t);
}

void CpuBackend::optimizerStep(const OptimizerStep& s, const Tensor& gradient, Tensor& param, Tensor* buffer0,
                               Tensor* buffer1) {
  countLaunch();
  const auto [b0, b1] = checks::optimizerStep(*this, s, gradient, param, buffer0, buffer1);
  applyOptimizerStep(s, param.size(), gradient.data(), param.data(), b0 ? b0->data() : nullptr,
                     b1 ? b1->data() : nullptr);
}

}  // namespace orpheus::ops::cpu
