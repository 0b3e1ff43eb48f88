#include "ops/rebuild.h"

#include "engine/base/error.h"

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

void applyToParam(const std::vector<Piece>& pieces, Matrix& w) {
  int64_t denseCols = 0;
  int64_t sparseCols = 0;
  for (const auto& p : pieces) (p.vDense ? denseCols : sparseCols) += p.weightedU.cols();
  const int64_t rows = w.rows();
  if (denseCols > 0) {
    // Concatenate, then a single GEMM: the copies are O((J+K) n), the product O(J K n).
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
    w.noalias() += u * v.transpose();
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
    // (V U^T)^T keeps the sparse operand on the left, where Eigen's kernel is fastest.
    w.noalias() += (v * u.transpose()).transpose();
  }
}

}  // namespace

void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w) {
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
    if (!byParam[i].empty()) applyToParam(byParam[i], w[i]);
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
