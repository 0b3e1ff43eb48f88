// Rebuilding parameter updates from SVs. The update of a clock is applied as one
// GEMM per parameter matrix over the columns of every batch of that clock:
//     W += [U_1 C_1, U_2 C_2, ...] * [V_1, V_2, ...]^T
// where C_i is diag(coeffs_i) or the batch's n x n core. Never a loop of rank-1 updates.
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"

#include <span>

namespace orpheus::ops {

// Applies all batches to `w`. Matrix and bias ids index into `w`; shapes must match
// (checked: Error on mismatch, since received batches were validated on decode).
void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w);

// Scales every batch column's coefficient (or core and bias coefficients) by `factor`.
void scaleCoefficients(SvBatch& batch, float factor);

}  // namespace orpheus::ops
