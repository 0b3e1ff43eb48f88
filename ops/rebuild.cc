#include "ops/rebuild.h"

#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"

#include <vector>

namespace orpheus::ops {
namespace {

// One matrix's SVs from one batch, with its column weights applied to U.
struct Piece {
  Matrix weightedU;            // J x n: U diag(c) or U core
  const Matrix* vDense = nullptr;
  const SparseMatrix* vSparse = nullptr;
};

Matrix weightedColumns(const SvMatrix& m, const Vector& coeffs) {
  if (m.core.size() > 0) return m.u * m.core;
  return m.u * coeffs.asDiagonal();
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
// the sparse ones. Concatenating costs O((J+K) n) copies against the O(J K n) product.
void applyToParam(const std::vector<Piece>& pieces, Matrix& w, Backend& backend) {
  int64_t denseCols = 0;
  int64_t sparseCols = 0;
  for (const auto& p : pieces) (p.vDense ? denseCols : sparseCols) += p.weightedU.cols();
  const int64_t rows = w.rows();
  Tensor target = staged(backend, cpu::view(w));
  if (denseCols > 0) {
    Matrix u(rows, denseCols);
    Matrix v(w.cols(), denseCols);
    int64_t at = 0;
    for (const auto& p : pieces) {
      if (!p.vDense) continue;
      const int64_t n = p.weightedU.cols();
      u.middleCols(at, n) = p.weightedU;
      v.middleCols(at, n) = *p.vDense;
      at += n;
    }
    backend.gemm(Trans::kNo, Trans::kYes, 1.0f, staged(backend, cpu::view(u)), staged(backend, cpu::view(v)), 1.0f,
                 target);
  }
  if (sparseCols > 0) {
    Matrix u(rows, sparseCols);
    SparseMatrix v(w.cols(), sparseCols);
    int64_t nnz = 0;
    for (const auto& p : pieces) {
      if (p.vSparse) nnz += p.vSparse->nonZeros();
    }
    v.reserve(nnz);
    int64_t at = 0;
    for (const auto& p : pieces) {
      if (!p.vSparse) continue;
      const int64_t n = p.weightedU.cols();
      u.middleCols(at, n) = p.weightedU;
      for (int64_t j = 0; j < n; ++j) {
        v.startVec(static_cast<int32_t>(at + j));
        for (SparseMatrix::InnerIterator it(*p.vSparse, j); it; ++it) {
          v.insertBack(it.row(), at + j) = it.value();
        }
      }
      at += n;
    }
    v.finalize();
    v.makeCompressed();
    const SparseCopy sv = staged(backend, cpu::view(v));
    backend.gemmSparse(1.0f, staged(backend, cpu::view(u)), sv.view, Trans::kYes, 1.0f, target);
  }
  if (backend.device() != Device::kCpu) {
    Tensor host = cpu::view(w);
    backend.copy(target, host);
  }
}

}  // namespace

void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w) {
  cpu::CpuBackend backend;
  applySvBatches(batches, w, backend);
}

void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w, Backend& backend) {
  std::vector<std::vector<Piece>> byParam(w.size());
  for (const SvBatch* b : batches) {
    for (const SvMatrix& m : b->matrices) {
      ORPHEUS_ENFORCE(m.paramId < w.size(), "SV matrix refers to parameter {} of {}", m.paramId, w.size());
      Matrix& target = w[m.paramId];
      ORPHEUS_ENFORCE(m.u.rows() == target.rows() && m.vRows() == target.cols(),
                      "SVs of shape {}x{} do not fit parameter '{}' of shape {}x{}", m.u.rows(), m.vRows(),
                      w.params[m.paramId].name, target.rows(), target.cols());
      Piece piece;
      piece.weightedU = weightedColumns(m, b->coeffs);
      if (m.sparseV) {
        piece.vSparse = &m.vSparse;
      } else {
        piece.vDense = &m.vDense;
      }
      if (m.biasId >= 0) {
        ORPHEUS_ENFORCE(static_cast<size_t>(m.biasId) < w.size() && w[m.biasId].rows() == m.u.rows() &&
                            w[m.biasId].cols() == 1,
                        "bias {} does not fit SVs with {} rows", m.biasId, m.u.rows());
        if (m.core.size() > 0) {
          // With a core the bias is not U core 1: selection fits the bias update on its own.
          ORPHEUS_ENFORCE(m.biasCoeffs.size() == m.u.cols(),
                          "SV matrix for parameter '{}' has a core and bias {} but {} bias coefficients for {} columns",
                          w.params[m.paramId].name, m.biasId, m.biasCoeffs.size(), m.u.cols());
          w[m.biasId].col(0).noalias() += m.u * m.biasCoeffs;
        } else {
          w[m.biasId].col(0) += piece.weightedU.rowwise().sum();
        }
      }
      byParam[m.paramId].push_back(std::move(piece));
    }
  }
  for (size_t i = 0; i < byParam.size(); ++i) {
    if (!byParam[i].empty()) applyToParam(byParam[i], w[i], backend);
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
