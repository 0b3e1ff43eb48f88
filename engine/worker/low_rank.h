// Rank-R SV batches with error feedback (--sv-rank R): what a worker sends, per
// parameter matrix, is a rank-R form of its clock's update plus what earlier clocks
// left out, and every replica (the sender's own included) applies exactly that.
//
// Per matrix the sender keeps E, the part of its updates no replica has applied yet
// (J x K, like an optimizer's momentum), and Q, a K x R basis carried from clock to
// clock. A clock with update U C V^T (B columns) does one warm-started power iteration:
//     M = E + U C V^T,   P = orth(M Q),   Q = M^T P,   sent = P Q^T,   E = M - P Q^T.
// This is PowerSGD (Vogels et al., 2019) applied per worker: the power iteration of a
// worker's own update, not of the all-reduced mean, so the P ranks' batches together
// carry rank up to P R. Because the sender applies what it sends, replicas that apply
// the same batches stay equal (BSP, full broadcast): nothing the peers did not get is
// on any replica; it is in E and leaves in later clocks. Nothing is dropped: what the
// clocks sent plus E equals what their batches carried.
//
// On the wire a compressed matrix is an ordinary SvMatrix of R + 1 columns with a
// core: U' = [P, Δb], V' = [Q, 0], core diag(1, ..., 1, 0), and, for a matrix with a
// bias, biasCoeffs e_{R+1}, so the bias update Δb = U c travels exactly. Receivers,
// the rebuild and the log need nothing new; the log holds what every replica applied,
// so restore(T) stays bitwise.
//
// With bf16 SVs (--sv-dtype bf16) P, Q and the bias column are rounded before E is
// updated, so E also carries the rounding error: E = M - round(P) round(Q)^T, and the
// bias's rounding error is carried to the next clock's bias column.
//
// The power iteration runs on the job's backend (--device): E and Q live on its
// device, and where the backward pass left the batch's U and V there (a resident
// replica) they are read where they lie. Only the small pieces cross to the host:
// M Q (J x R) for its orthonormal basis, which the host forms (a Householder QR, as
// on the CPU), Q' (K x R) and the bias column for the wire, and E's column norms.
// On the CPU backend and on the strict device the same operations run in the same
// order, so both give the same bits.
//
// E and Q are the sender's memory, not in the log: the checkpoint keeps them as the
// rank's carried state (state() and restore()), so --resume compresses exactly as the
// uninterrupted run would.
//
// The rank may change between clocks (--adapt moves r): Q keeps its first r columns
// when r falls, and gains Gaussian columns drawn from the seed, the matrix's place
// and the column's when r rises, so the same sequence of ranks gives the same batches.
#pragma once

#include "engine/base/sv_batch.h"

#include "engine/base/params.h"
#include "ops/backend.h"
#include "ops/rebuild.h"
#include "ops/staging.h"

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::engine {

class LowRankSender {
 public:
  // Q starts as a Gaussian matrix drawn from `seed` and the matrix's place. The
  // work runs on `backend` (which must outlive the sender), E and Q on its device.
  LowRankSender(ops::Backend& backend, int64_t rank, uint64_t seed, SvDtype dtype = SvDtype::kF32)
      : backend_(backend), rank_(rank), seed_(seed), dtype_(dtype) {}

  // The rank-R batch to send and to apply here for `batch` (full, coefficients or
  // cores); updates E and Q. The sites of one parameter (a recurrent model's steps)
  // go as one matrix, [U_1 diag(c) ... U_T diag(c)] by [V_1 ... V_T]: one rank-R
  // update per parameter. A sparse V (one-hot tokens) stays sparse: its products
  // are sparse ones, so a vocabulary-wide V is never formed.
  // `onDevice`: matrix i's U and V on the backend's device (the model's
  // lastDeviceSvs(), the same values as the batch's), read there instead of copying
  // the batch's in; empty: none are.
  SvBatch compress(const SvBatch& batch, std::span<const ops::DeviceSvs> onDevice = {});
  // The width of P and Q from the next compress() on (--adapt-bf16 may switch it).
  void setDtype(SvDtype dtype) { dtype_ = dtype; }
  // The rank from the next compress() on (--adapt may move it); >= 1.
  void setRank(int64_t rank);
  int64_t rank() const { return rank_; }

  // The J x K of each matrix state() holds, for a batch whose sites update the
  // (parameter, bias) pairs `sites` in this order, of the shapes `params` (by
  // parameter id): the sites of one parameter share one (a recurrent model's steps).
  static std::vector<std::pair<int64_t, int64_t>> stateShapes(
      std::span<const std::pair<uint32_t, int32_t>> sites, std::span<const std::pair<int64_t, int64_t>> params);

  // E, Q and the bias residual of every matrix, named `prefix`<p>.e, .q and .eb (an
  // .eb only where there is one), for the checkpoint: a resumed job that restores
  // them compresses exactly as the uninterrupted one (nothing before the first
  // clock: the state starts empty).
  ParamSet state(const std::string& prefix) const;
  // Takes back what state() gave (the entries named `prefix`...; none: empty state).
  // `shapes`: each matrix's J x K in batch order (empty: not checked). InputError when
  // the entries are incomplete (an .e without its .q), of the wrong shapes, or more
  // than the matrices: a damaged or foreign checkpoint, never silently restarted.
  void restore(const ParamSet& state, const std::string& prefix,
               std::span<const std::pair<int64_t, int64_t>> shapes = {});

  // ||E|| / ||M|| after the last compress(), over every matrix: the share of the
  // update carried to later clocks (0 when M is 0).
  double lastError() const { return lastError_; }
  // What lastError() would have been at each rank k of `ranks` (k <= the rank in
  // force; 0: nothing sent, 1): from the same power iteration, keeping the best k
  // directions of span(P) (the top k eigenvalues of P^T M M^T P). e(rank) is lastError().
  std::vector<double> errorsAt(std::span<const int64_t> ranks) const;
  // The part of matrix p's updates not sent yet (J x K; empty before its first
  // clock), copied from the device; p counts the parameters of the batch's sites.
  Matrix carried(size_t p) const;
  // The part of matrix p's bias updates not sent yet (bf16 rounding; empty otherwise).
  Vector carriedBias(size_t p) const { return p < state_.size() ? state_[p].eb : Vector(); }

 private:
  // A matrix's buffers on the device, grown to its largest clock and reused: a clock
  // allocates nothing.
  struct Buffers {
    ops::Tensor left, right;  // [U C, -P] (J x (n + R)) and [V, Q'] (K x (n + R); Q' alone, K x R, for a sparse V)
    ops::Tensor mq, small, norms, bias, core, biasCoeffs, u, v;
    ops::Tensor eye, transposed;  // for a sparse V: I_R and an R x K transpose (Q^T, then (V A^T P)^T)
    ops::StagedSparse vSparse;    // a sparse V on the device
  };
  struct MatrixState {
    ops::Tensor e;  // J x K, on the backend's device
    ops::Tensor q;  // K x R, on the backend's device
    Vector eb;      // J: the bias's rounding error (bf16)
    std::vector<double> captured;  // eigenvalues of P^T M M^T P of the last clock, largest first
    Buffers buffers;
  };
  // One matrix's part of a compress(): its operands, views of its buffers, and
  // what has come to the host.
  struct Work {
    const SvMatrix* m = nullptr;
    const Vector* coeffs = nullptr;
    const ops::DeviceSvs* onDevice = nullptr;
    size_t p = 0;
    ops::Tensor u, v, left, right, small, mq, norms, bias;
    bool sparse = false;   // V one-hot: its products through gemmSparse, `small` kept as R x n
    ops::SparseTensor vs;  // V then, where the backend reads it
    SparseMatrix vCompressed;  // V compressed, when the batch's is not
    Matrix eyeHost;            // I_R
    ops::Tensor eye, transposed;
    Matrix basis, q;  // P and Q' on the host
    size_t mqAt = 0, qAt = 0, normsAt = 0, biasAt = 0;  // where their downloads land in the staging buffer
    bool withCore() const { return m->core.size() > 0; }
    // Q' (K x R): right's last R columns.
    ops::Tensor projected() const {
      const int64_t from = sparse ? 0 : m->u.cols();
      return right.middleCols(from, right.cols() - from);
    }
  };
  // compress(), in the order the device runs it (low_rank.cc).
  void queueRange(Work& w);
  void queueProjection(Work& w);
  void roundProjection(Work& w);
  void queueUpdate(Work& w);
  SvMatrix finish(Work& w, double& kept, double& whole);
  // A host matrix on the device: a view on the CPU backend, else staged into `store`.
  ops::Tensor operand(const Matrix& m, ops::Tensor& store);
  // `m` into `dst` on the device: copied on the CPU backend, else staged.
  void put(const Matrix& m, ops::Tensor& dst);
  ops::Tensor upload(const Matrix& m);
  Matrix download(const ops::Tensor& t) const;  // blocks until it is on the host

  // The copies of a compress() go through one staging run (ops/staging.h), back
  // to back in the order they are queued, so that the host waits for the device
  // only where it needs a result (twice a clock, three times in bf16), not at
  // every copy: uploads cross and the device waits for them (waitOnDevice), the
  // host not at all; downloads are read after staging_.wait().
  void beginStaging(const SvBatch& batch);  // sized for the batch's copies
  Matrix staged(size_t at, int64_t rows, int64_t cols) const;  // what a download brought

  ops::Backend& backend_;
  int64_t rank_;
  uint64_t seed_;
  SvDtype dtype_;
  std::vector<MatrixState> state_;  // one per matrix of the batch
  ops::Staging staging_;
  double lastError_ = 0.0;
  double lastWhole_ = 0.0;  // ||M||^2 of the last compress(), over every matrix
};

}  // namespace orpheus::engine
