// The CPU backend: Eigen on host memory, single-threaded, everything finished
// before an operation returns. Its GEMMs are the same Eigen expressions the
// engine used before the seam existed, so results are bitwise unchanged.
#pragma once

#include "ops/backend.h"

#include <Eigen/Dense>
#include <Eigen/SparseCore>

#include <functional>

namespace orpheus::ops::cpu {

class CpuBackend : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }

  Tensor allocate(int64_t rows, int64_t cols) override;
  void copy(const Tensor& src, Tensor& dst) override;
  using Backend::copySparse;
  void copySparse(const SparseTensor& src, SparseCopy& dst) override;
  void synchronize() override {}

  void gemm(Trans ta, Trans tb, float alpha, const Tensor& a, const Tensor& b, float beta, Tensor& c) override;
  void gemmSparse(float alpha, const Tensor& a, const SparseTensor& s, Trans ts, float beta, Tensor& c) override;
  void elementwise(const EwChain& chain, std::span<const Tensor* const> inputs,
                   std::span<Tensor* const> outputs) override;
  void elementwiseBackward(const EwChain& chain, std::span<const Tensor* const> inputs,
                           std::span<const Tensor* const> values, const Tensor& upstream,
                           std::span<Tensor* const> inputGrads) override;
  void softmaxCrossEntropy(const Tensor& z, const Tensor& t, Tensor& p, Tensor& loss) override;
  void softmaxCrossEntropyBackward(const Tensor& p, const Tensor& t, const Tensor& upstream, float beta,
                                   Tensor& dz) override;
  void copyRows(const Tensor& src, int64_t srcRow, Tensor& dst, int64_t dstRow, int64_t rows) override;
  // ops/lstm_cell.h's loops, as the host executor runs them.
  void lstmCellForward(const LstmCellArgs& a) override;
  void lstmCellBackward(const LstmCellArgs& a, const Tensor* dHidden, const Tensor* dCell, Tensor& dGates,
                        Tensor* dCPrev) override;
  void columnOp(OpKind op, const Tensor& a, const Tensor* b, Tensor& out) override;
  void columnOpBackward(OpKind op, int which, const Tensor& a, const Tensor* b, const Tensor& out,
                        const Tensor& upstream, Tensor& dst) override;
  void sumColumns(const Tensor& a, float beta, Tensor& out) override;
  void sumRows(const Tensor& a, float beta, Tensor& out) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void scale(float alpha, Tensor& x) override;
  void copyParts(std::span<const CopyPart> parts) override;
  void addInOrder(std::span<const Tensor* const> terms, Tensor& y) override;
  void optimizerStep(const OptimizerStep& s, const Tensor& gradient, Tensor& param, Tensor* buffer0,
                     Tensor* buffer1) override;
};

using MatrixMap = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>>;
using SparseMap = Eigen::Map<const Eigen::SparseMatrix<float, Eigen::ColMajor, int32_t>>;

// Eigen's view of a host tensor.
inline MatrixMap map(const Tensor& t) { return MatrixMap(t.data(), t.rows(), t.cols()); }

// Views of Eigen objects as tensors (no copies). The matrix must stay alive and
// unresized while the view is used; a sparse matrix must be compressed.
template <typename Derived>
Tensor view(Eigen::PlainObjectBase<Derived>& m) {
  return Tensor::host(m.data(), m.rows(), m.cols());
}
template <typename Derived>
Tensor view(const Eigen::PlainObjectBase<Derived>& m) {
  return Tensor::host(m.data(), m.rows(), m.cols());
}
SparseTensor view(const Eigen::SparseMatrix<float, Eigen::ColMajor, int32_t>& s);

// c += a b^T (host tensors: a m x k, b n x k, c m x n), one tile of about `tileCols`
// (a multiple of columnGrain()) of c's columns after another, calling tileDone(first,
// cols) as soon as a tile holds its final sums: what CpuBackend::gemm(kNo, kYes, 1,
// a, b, 1, c) gives, bit for bit. Done only where that product and every tile run as
// one BLAS sgemm on one thread, and where this machine's BLAS has a grain; false, and
// nothing done, elsewhere (tests/ops/rebuild_test.cc).
bool gemmByColumnTiles(const Tensor& a, const Tensor& b, Tensor& c, int64_t tileCols,
                       const std::function<void(int64_t first, int64_t cols)>& tileDone);
// The fewest columns (of 4, 8, 12, 16, 24, 48) such that tiles starting on their
// multiples sum each element as this machine's BLAS's whole product does, found once
// on small products; 0: none (or no BLAS). OpenBLAS's sgemm walks c's columns in
// blocks of three times its kernel's column unroll (12 for its Haswell and Zen
// kernels), each width of block running its own code, whose sums may round
// differently: a tile that starts on a multiple of every such block keeps each column
// in the block it has in the whole product (tiles of 16 columns do not, there).
int64_t columnGrain();

}  // namespace orpheus::ops::cpu
