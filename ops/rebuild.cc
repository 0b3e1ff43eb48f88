#include "ops/rebuild.h"

#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"

#include <vector>

namespace orpheus::ops {
namespace {

using Piece = RebuildPiece;

// dst = U diag(c) or U core.
template <class Dst>
void weightColumns(const SvMatrixView& m, const float* coeffs, Dst&& dst) {
  if (m.withCore) {
    dst.noalias() = m.uMap() * m.coreMap();
  } else {
    dst.noalias() = m.uMap() * Eigen::Map<const Vector>(coeffs, m.columns).asDiagonal();
  }
}

// A host operand as the backend sees it: a view on the CPU, a device copy elsewhere.
Tensor staged(Backend& backend, const Tensor& host) {
  if (backend.device() == Device::kCpu) return Tensor::view(Device::kCpu, host.data(), host.rows(), host.cols());
  Tensor t = backend.allocate(host.rows(), host.cols());
  backend.copy(host, t);
  return t;
}

SparseCopy staged(Backend& backend, const SparseTensor& host) {
  if (backend.device() == Device::kCpu) return SparseCopy{host, nullptr};
  return backend.copySparse(host);
}

// W += [U_1 C_1, ...] [V_1, ...]^T: one GEMM for the dense V's, one sparse product for
// the sparse ones. `u` holds the weighted columns, the dense pieces' first. Gathering
// the V's costs O(K n) copies against the O(J K n) product; a single dense piece's V
// is used where it lies.
void applyToParam(const std::vector<Piece>& pieces, const Matrix& u, int64_t denseCols, Matrix& w, Backend& backend,
                  Matrix& gathered) {
  int64_t densePieces = 0;
  for (const auto& p : pieces) densePieces += p.m->sparseV ? 0 : 1;
  const int64_t sparseCols = u.cols() - denseCols;
  const int64_t rows = w.rows();
  Tensor target = staged(backend, cpu::view(w));
  const auto uPart = [&](int64_t first, int64_t cols) {
    return Tensor::host(u.data() + rows * first, rows, cols);
  };
  if (denseCols > 0) {
    Tensor v;
    if (densePieces == 1) {
      for (const auto& p : pieces) {
        if (!p.m->sparseV) v = Tensor::host(p.m->vDense, w.cols(), denseCols);
      }
    } else {
      gathered.resize(w.cols(), denseCols);
      for (const auto& p : pieces) {
        if (!p.m->sparseV) gathered.middleCols(p.at, p.m->columns) = p.m->vDenseMap();
      }
      v = cpu::view(gathered);
    }
    backend.gemm(Trans::kNo, Trans::kYes, 1.0f, staged(backend, uPart(0, denseCols)), staged(backend, v), 1.0f,
                 target);
  }
  if (sparseCols > 0) {
    SparseMatrix v(w.cols(), sparseCols);
    int64_t nnz = 0;
    for (const auto& p : pieces) {
      if (p.m->sparseV) nnz += p.m->vSparseMap().nonZeros();
    }
    v.reserve(nnz);
    for (const auto& p : pieces) {
      if (!p.m->sparseV) continue;
      const int64_t at = p.at - denseCols;
      const Eigen::Map<const SparseMatrix> pv = p.m->vSparseMap();
      for (int64_t j = 0; j < p.m->columns; ++j) {
        v.startVec(static_cast<int32_t>(at + j));
        for (Eigen::Map<const SparseMatrix>::InnerIterator it(pv, j); it; ++it) {
          v.insertBack(it.row(), at + j) = it.value();
        }
      }
    }
    v.finalize();
    v.makeCompressed();
    const SparseCopy sv = staged(backend, cpu::view(v));
    backend.gemmSparse(1.0f, staged(backend, uPart(denseCols, sparseCols)), sv.view, Trans::kYes, 1.0f, target);
  }
  if (backend.device() != Device::kCpu) {
    Tensor host = cpu::view(w);
    backend.copy(target, host);
  }
}

std::vector<SvBatchView> viewsOf(std::span<const SvBatch* const> batches, std::vector<const SvBatchView*>& pointers) {
  std::vector<SvBatchView> views;
  views.reserve(batches.size());
  for (const SvBatch* b : batches) views.push_back(viewOf(*b));
  for (const SvBatchView& v : views) pointers.push_back(&v);
  return views;
}

}  // namespace

void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w) {
  cpu::CpuBackend backend;
  applySvBatches(batches, w, backend);
}

void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w, Backend& backend) {
  std::vector<const SvBatchView*> pointers;
  const std::vector<SvBatchView> views = viewsOf(batches, pointers);
  RebuildBuffers buffers;
  applySvBatches(pointers, w, backend, buffers);
}

void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, RebuildBuffers& buffers) {
  cpu::CpuBackend backend;
  applySvBatches(batches, w, backend, buffers);
}

void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, Backend& backend,
                    RebuildBuffers& buffers) {
  const size_t params = w.size();
  std::vector<std::vector<Piece>>& byParam = buffers.pieces;
  byParam.resize(params);
  for (auto& pieces : byParam) pieces.clear();
  // Each parameter's columns: the dense V's first, then the sparse ones.
  std::vector<int64_t>& denseCols = buffers.denseCols;
  std::vector<int64_t>& sparseAt = buffers.sparseAt;
  denseCols.assign(params, 0);
  sparseAt.assign(params, 0);
  for (const SvBatchView* b : batches) {
    for (const SvMatrixView& m : b->matrices) {
      ORPHEUS_ENFORCE(m.paramId < params, "SV matrix refers to parameter {} of {}", m.paramId, params);
      const Matrix& target = w[m.paramId];
      ORPHEUS_ENFORCE(m.rows == target.rows() && m.vRows == target.cols(),
                      "SVs of shape {}x{} do not fit parameter '{}' of shape {}x{}", m.rows, m.vRows,
                      w.params[m.paramId].name, target.rows(), target.cols());
      (m.sparseV ? sparseAt : denseCols)[m.paramId] += m.columns;
    }
  }
  buffers.u.resize(params);
  for (size_t i = 0; i < params; ++i) {
    buffers.u[i].resize(w[i].rows(), denseCols[i] + sparseAt[i]);
    sparseAt[i] = denseCols[i];
  }
  std::vector<int64_t>& denseAt = buffers.denseAt;
  denseAt.assign(params, 0);
  // In batch order, as the bias updates are summed.
  for (const SvBatchView* b : batches) {
    for (const SvMatrixView& m : b->matrices) {
      int64_t& at = (m.sparseV ? sparseAt : denseAt)[m.paramId];
      auto weighted = buffers.u[m.paramId].middleCols(at, m.columns);
      weightColumns(m, b->coeffs, weighted);
      if (m.biasId >= 0) {
        ORPHEUS_ENFORCE(static_cast<size_t>(m.biasId) < params && w[m.biasId].rows() == m.rows &&
                            w[m.biasId].cols() == 1,
                        "bias {} does not fit SVs with {} rows", m.biasId, m.rows);
        if (m.withCore) {
          // With a core the bias is not U core 1: selection fits the bias update on its own.
          ORPHEUS_ENFORCE(m.biasCoeffs != nullptr,
                          "SV matrix for parameter '{}' has a core and bias {} but no bias coefficients for {} columns",
                          w.params[m.paramId].name, m.biasId, m.columns);
          w[m.biasId].col(0).noalias() += m.uMap() * m.biasCoeffsMap();
        } else {
          w[m.biasId].col(0) += weighted.rowwise().sum();
        }
      }
      byParam[m.paramId].push_back(Piece{&m, at});
      at += m.columns;
    }
  }
  for (size_t i = 0; i < params; ++i) {
    if (!byParam[i].empty()) applyToParam(byParam[i], buffers.u[i], denseCols[i], w[i], backend, buffers.v);
  }
}

void scaleCoefficients(SvBatch& batch, float factor) {
  batch.coeffs *= factor;
  for (auto& m : batch.matrices) {
    if (m.core.size() > 0) m.core *= factor;
    m.biasCoeffs *= factor;  // empty unless a core is present
  }
}

}  // namespace orpheus::ops
