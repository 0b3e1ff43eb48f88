// Rank-r SV batches with error feedback (--sv-rank R): what a worker sends its peers
// is, per parameter matrix, the best rank-R approximation of the update its batch
// (full or selected) carries, plus what earlier clocks left out.
//
// A matrix's update is U C V^T (C the per-column coefficients, or the least-squares
// core of a selected batch), B columns. With the residual R_u R_v^T the earlier
// truncations left, the update to send is
//     G = [U R_u] blockdiag(C, I) [V R_v]^T.
// Its rank-R truncation comes from orthonormal bases of the two factors (from their
// m x m Gram matrices, one GEMM each) and an SVD of the small core, never from a
// J x K matrix:
//     [U R_u] = Q_u T_u,  [V R_v] = Q_v T_v,  T_u blockdiag(C, I) T_v^T = X S Y^T,
//     sent:      (Q_u X_R S_R) (Q_v Y_R)^T
//     residual:  (Q_u X_M S_M) (Q_v Y_M)^T, the next kResidualRank singular triplets
// (the rest of the spectrum is dropped). This is PowerSGD's error feedback (Vogels et
// al., 2019) with the exact SVD of a batch instead of a power iteration on a dense
// gradient: the factors are already there.
//
// On the wire a compressed matrix is an ordinary SvMatrix of R + 1 columns with a
// core: U' = [Q_u X_R S_R, Δb], V' = [Q_v Y_R, 0], core diag(1, ..., 1, 0), and, for
// a matrix with a bias, biasCoeffs e_{R+1}, so the bias update Δb = U c travels
// exactly. Receivers, the rebuild and the log need nothing new; the sender's own
// replica still applies its whole batch.
//
// The residual is the sender's memory: not in the log, so after --resume it starts
// at zero (the job says so; the resumed run is then not bitwise the uninterrupted one).
#pragma once

#include "engine/base/sv_batch.h"

#include <cstdint>
#include <vector>

namespace orpheus::engine {

class LowRankSender {
 public:
  // Singular triplets kept as the residual, beyond the R sent.
  static constexpr int64_t kResidualRank = 32;

  explicit LowRankSender(int64_t rank) : rank_(rank) {}

  // The rank-R form of `batch` plus the residual; updates the residual. Every
  // matrix must have a dense V (checked: Error).
  SvBatch compress(const SvBatch& batch);

  // The relative Frobenius error of the last compress(): ||sent - G|| / ||G||, over
  // every matrix (0 when G is 0).
  double lastError() const { return lastError_; }
  // Forgets the residual.
  void reset() { residual_.clear(); }

 private:
  struct Residual {
    Matrix u;  // J x m
    Matrix v;  // K x m
  };
  int64_t rank_;
  std::vector<Residual> residual_;  // one per matrix of the batch
  double lastError_ = 0.0;
};

}  // namespace orpheus::engine
