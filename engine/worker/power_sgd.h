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
// The products run on the job's backend (--device): E and each factor live on its
// device next to a resident replica's gradient, so only the factors (and the
// uncompressed gradients) cross to the host for the all-reduces, never G or E.
// Gram-Schmidt runs on the host, on the factors it has there anyway. On the CPU
// backend and on the strict device the same operations give the same bits.
//
// E and Q are each rank's memory, in no checkpoint: the job takes no --ckpt.
#pragma once

#include "comm/transport.h"
#include "engine/base/params.h"
#include "ops/backend.h"
#include "ops/staging.h"

#include <cstdint>
#include <span>
#include <vector>

namespace orpheus::engine {

class PowerSgdReducer {
 public:
  // torch's PowerSGDState default: compress only where it saves at least half.
  static constexpr int64_t kMinCompressionRate = 2;

  // `rank` >= 1; `seed` the job's (the same on every rank). `minCompressionRate` 0
  // compresses every matrix (the tests' full-rank case). The work runs on `backend`,
  // which must outlive the reducer.
  PowerSgdReducer(ops::Backend& backend, int64_t rank, uint64_t seed,
                  int64_t minCompressionRate = kMinCompressionRate)
      : backend_(backend), rank_(rank), seed_(seed), minCompressionRate_(minCompressionRate) {}

  // Replaces this rank's summed gradient by the sum every replica applies this clock
  // (collective: every rank calls it with gradients of the same shapes). `gradient`:
  // one tensor per parameter on the backend's device (host memory on the CPU backend).
  void reduce(std::span<ops::Tensor> gradient, comm::Transport& transport, uint64_t clock);
  // The same for a gradient in host memory (copied in and out on a device).
  void reduce(ParamSet& gradient, comm::Transport& transport, uint64_t clock);

  // The rank a rows x cols parameter is compressed to (0: summed whole).
  int64_t compressedRank(int64_t rows, int64_t cols) const {
    return compressedRank(rows, cols, rank_, minCompressionRate_);
  }
  static int64_t compressedRank(int64_t rows, int64_t cols, int64_t rank,
                                int64_t minCompressionRate = kMinCompressionRate);
  int64_t compressedRank(const Matrix& param) const { return compressedRank(param.rows(), param.cols()); }
  // Parameter p's residual E, copied from the device (empty where it is not
  // compressed or before its first clock).
  Matrix residual(size_t p) const;

  // The clocks that sum every gradient whole before compression starts.
  static constexpr uint64_t kPlainClocks = 2;

 private:
  struct MatrixState {
    int64_t r = 0;   // 0: summed whole
    ops::Tensor e;   // J x K, on the device
    ops::Tensor q;   // K x r, on the device
    ops::Tensor p;   // J x r, on the device
    Matrix qHost;    // Q as the last all-reduce left it (or as drawn), orthonormalized on the host
  };
  void start(std::span<const ops::Tensor> gradient);
  // A clock's copies cross through one staging run (ops/staging.h), in which the
  // all-reduces also sum: to the host, read after one wait before each all-reduce;
  // to the device, which the device waits for and the host does not. So the host
  // waits for the device twice a clock, not at every copy. Offsets in floats.
  size_t reserve(size_t floats);  // the next `floats` of the run, at this float
  float* staged(size_t at) const { return staging_.floats(at * sizeof(float)); }
  void get(const ops::Tensor& src, size_t at);  // queued to the host
  void put(size_t at, ops::Tensor& dst);        // queued to the device

  ops::Backend& backend_;
  int64_t rank_;
  uint64_t seed_;
  int64_t minCompressionRate_;
  std::vector<MatrixState> state_;  // one per parameter
  ops::Staging staging_;
  std::vector<ops::Tensor> hostGradient_;       // reduce(ParamSet&) on a device: the gradient copied in
};

// Orthonormal columns in place by Gram-Schmidt, as torch's hook does for rank <= 2.
void orthonormalizeColumns(Matrix& m);

}  // namespace orpheus::engine
