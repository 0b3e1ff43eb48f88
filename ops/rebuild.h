// Rebuilding parameter updates from SVs. The update of a clock is applied as one
// GEMM per parameter matrix over the columns of every batch of that clock:
//     W += [U_1 C_1, U_2 C_2, ...] * [V_1, V_2, ...]^T
// where C_i is diag(coeffs_i) or the batch's n x n core. Never a loop of rank-1 updates.
// The products go through the compute seam (ops/backend.h).
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/backend.h"

#include <span>
#include <vector>

namespace orpheus::ops {

// One matrix's SVs of one batch, viewed where they lie; its weighted columns are at
// `at` in its parameter's concatenation.
struct RebuildPiece {
  const SvMatrixView* m = nullptr;
  int64_t at = 0;
};

// What a rebuild works in, kept by a caller that rebuilds every clock so the
// operands of its GEMMs are allocated once, not per clock.
struct RebuildBuffers {
  std::vector<Matrix> u;  // per parameter: the weighted columns U C of every batch
  Matrix v;               // the gathered dense V's of one parameter
  std::vector<std::vector<RebuildPiece>> pieces;
  std::vector<int64_t> denseCols;
  std::vector<int64_t> denseAt;
  std::vector<int64_t> sparseAt;
};

// Applies all batches to `w`. Matrix and bias ids index into `w`; shapes must match
// (checked: Error on mismatch, since received batches were validated on decode).
void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w);
// The same with the GEMMs run by `backend`. The parameters stay in host memory: a
// backend on another device gets copies of W and the SVs and copies W back, so
// this is correct on every backend and fast only on the CPU one. The weighting
// U C and the bias updates (O(J n) each) run on the host in Eigen.
void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w, Backend& backend);
// The same on views: a received batch is read in its receive buffer. Bitwise the
// result of the SvBatch calls on the same batches.
void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, RebuildBuffers& buffers);
void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, Backend& backend,
                    RebuildBuffers& buffers);

// Scales every batch column's coefficient (or core and bias coefficients) by `factor`.
void scaleCoefficients(SvBatch& batch, float factor);

}  // namespace orpheus::ops
