// --sync powersgd R: PowerSGD (Vogels et al., 2019) as the data-parallel baseline
// runs it, step for step what PyTorch's powerSGD_hook does with error feedback and
// warm start (scripts/bench/peers.py has the same algorithm in Python).
//
// Each clock, every rank has its summed gradient G (the dense path's) and, per
// compressed matrix, its own error-feedback residual E:
//     M = G + E
//     P = M orth(Q)                 all-reduced (summed), then orthonormalized
//     Q = M^T P                     all-reduced (summed)
//     update = P Q^T,   E = M - P Q^T / W     (W ranks)
// P Q^T is the sum over the ranks of P P^T M, so the step, scaled by lr / (B W) as
// the dense path scales its summed gradient, is torch's step on the mean gradient,
// and E is torch's residual in the same units as G. Every replica applies the same
// update, so the replicas stay equal (BSP only). Q starts as a Gaussian matrix
// drawn from the job's seed, the same on every rank, and is carried from clock to
// clock (warm start).
//
// Which matrices are compressed: as the hook decides, a J x K parameter at rank
// r = min(J, K, R) only where (J + K) r * 2 < J K; the others (the biases, vectors)
// are summed whole in the same all-reduce as the P factors. The first two clocks
// sum every gradient whole (the hook's least start_powerSGD_iter with error
// feedback, and peers.py's default).
//
// Communication per clock: two all-reduces, of sum_m J_m r_m + the uncompressed
// floats, then of sum_m K_m r_m.
//
// E and Q are each rank's memory, in no checkpoint: the job takes no --ckpt.
#pragma once

#include "comm/transport.h"
#include "engine/base/params.h"

#include <cstdint>
#include <vector>

namespace orpheus::engine {

class PowerSgdReducer {
 public:
  // torch's PowerSGDState default: compress only where it saves at least half.
  static constexpr int64_t kMinCompressionRate = 2;

  // `rank` >= 1; `seed` the job's (the same on every rank). `minCompressionRate` 0
  // compresses every matrix (the tests' full-rank case).
  PowerSgdReducer(int64_t rank, uint64_t seed, int64_t minCompressionRate = kMinCompressionRate)
      : rank_(rank), seed_(seed), minCompressionRate_(minCompressionRate) {}

  // Replaces this rank's summed gradient by the sum every replica applies this clock
  // (collective: every rank calls it with gradients of the same shapes).
  void reduce(ParamSet& gradient, comm::Transport& transport, uint64_t clock);

  // The rank parameter `p` is compressed to (0: summed whole).
  int64_t compressedRank(const Matrix& param) const;
  // Parameter p's residual E (empty where it is not compressed or before its first clock).
  const Matrix& residual(size_t p) const { return state_.at(p).e; }

  // The clocks that sum every gradient whole before compression starts.
  static constexpr uint64_t kPlainClocks = 2;

 private:
  struct MatrixState {
    int64_t r = 0;  // 0: summed whole
    Matrix e;       // J x K
    Matrix q;       // K x r
    Matrix p;       // J x r
  };
  void start(const ParamSet& gradient);
  static void sumWhole(ParamSet& gradient, comm::Transport& transport, uint64_t clock);

  int64_t rank_;
  uint64_t seed_;
  int64_t minCompressionRate_;
  std::vector<MatrixState> state_;  // one per parameter
};

// Orthonormal columns in place by Gram-Schmidt, as torch's hook does for rank <= 2.
void orthonormalizeColumns(Matrix& m);

}  // namespace orpheus::engine
