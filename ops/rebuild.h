// Rebuilding parameter updates from SVs. The update of a clock is applied as one
// GEMM per parameter matrix over the columns of every batch of that clock:
//     W += [U_1 C_1, U_2 C_2, ...] * [V_1, V_2, ...]^T
// where C_i is diag(coeffs_i) or the batch's n x n core. Never a loop of rank-1 updates.
// The products go through the compute seam (ops/backend.h).
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/backend.h"
#include "ops/staging.h"

#include <functional>
#include <span>
#include <vector>

namespace orpheus::ops {

// The U and V of one SV matrix that also lie on the rebuild's device, where a
// device pass left them (Model::lastDeviceSvs): the rebuild reads them there
// instead of copying the host's in. `hostU`, the host copy's U, names the matrix
// among a rebuild's batches; the device U is unweighted (its columns are scaled
// there when the batch's coefficients are all one value, else the host's U C is
// copied in); a null tensor is copied from the host as usual.
struct DeviceSvs {
  const float* hostU = nullptr;
  const Tensor* u = nullptr;       // J x n
  const Tensor* vDense = nullptr;  // K x n, when V is dense
};

// One matrix's SVs of one batch, viewed where they lie; its weighted columns are at
// `at` in its parameter's concatenation. `coeffs`: the batch's; `onDevice`: its
// device copy, or null.
struct RebuildPiece {
  const SvMatrixView* m = nullptr;
  int64_t at = 0;
  const float* coeffs = nullptr;
  const DeviceSvs* onDevice = nullptr;
};

// A rebuild's operands on a backend's device (not used on the CPU backend, which
// reads them where they lie): each parameter's W, and U and V in buffers that grow
// to the largest clock seen and are reused, so a clock allocates nothing on the
// device (the sparse V's copy too, unless it has more nonzeros than any before).
//
// Staged uploads (`staged`, which the caller sets: a resident replica under
// --transfer staged). The host operands of a rebuild, the weighted columns U C and
// the dense V's not already on the device, cross through one page-locked buffer
// (`staging`, ops/staging.h) with Backend::copyToDeviceAsync: every
// parameter's copies are queued before the first product, into device buffers of
// that parameter's own (`stagedU`, `stagedV`), and each parameter's products are
// ordered after its copies with waitOnDevice, so the copies run beside the
// products of the parameters before and the host never waits for them. The
// staging buffer is written again only once the copies that read it have landed;
// it and the device buffers grow to the largest rebuild and are reused. The
// sparse V's cross through the same buffer (stageSparse) into
// each parameter's `stagedSparseV`, and the bias updates formed on the host, all
// of a rebuild's back to back, into `stagedBias`: each bias update is added in
// batch order after them (`biasOps`), those formed on the device among them.
// Not staged: one blocking copy per operand into `u` and `v`, which the
// parameters share, and per sparse V and bias update. The same operands either
// way, so the same bits.
struct DeviceOperands {
  // A bias update of a staged rebuild, in batch order: `count` floats at `at` of
  // `biasHost` (formed on the host), or (`fromDevice`) the row sums of the `count`
  // weighted columns at `at` of parameter `uParam`'s U in `stagedU` (a piece whose
  // U lies on the device, weighted there).
  struct BiasOp {
    size_t param = 0;
    bool fromDevice = false;
    size_t uParam = 0;
    size_t at = 0;
    int64_t count = 0;
  };
  std::vector<Tensor> w;  // per parameter, its shape
  Tensor u;               // flat, at least the largest U of a clock
  Tensor v;               // flat, at least the largest dense V of a clock
  Tensor bias;            // a bias update, when the parameters live on the device
  Tensor biasU;           // a piece's U C on the device, summed into its bias update; staged: those sums
  std::vector<CopyPart> parts;  // one copyParts's parts (reused storage)
  SparseCopy sparseV;     // the sparse V's of a clock, its storage reused (Backend::copySparse)
  bool staged = false;
  Staging staging;                       // the host operands of one rebuild, back to back
  std::vector<Tensor> stagedU, stagedV;  // per parameter: flat, its U C (dense pieces' columns first) and dense V
  std::vector<StagedSparse> stagedSparseV;  // per parameter: its sparse pieces' V, compressed
  std::vector<Event> landed;             // per parameter: its last staged copy of this rebuild
  std::vector<BiasOp> biasOps;           // this rebuild's bias updates, in order
  std::vector<float> biasHost;           // their host-formed deltas, back to back
  Tensor stagedBias;                     // the same on the device
  Event biasLanded;                      // their copy
};

// What a rebuild works in, kept by a caller that rebuilds every clock so the
// operands of its GEMMs are allocated once, not per clock.
struct RebuildBuffers {
  DeviceOperands device;
  std::vector<Matrix> u;  // per parameter: the weighted columns U C of every batch
  Matrix v;               // the gathered dense V's of one parameter
  std::vector<std::vector<RebuildPiece>> pieces;
  std::vector<int64_t> denseCols;
  std::vector<int64_t> denseAt;
  std::vector<int64_t> sparseAt;
  Vector biasDelta;  // one bias update (U C 1, or U times the bias coefficients), added to the bias
};

// Applies all batches to `w`. Matrix and bias ids index into `w`; shapes must match
// (checked: Error on mismatch, since received batches were validated on decode).
void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w);
// The same with the GEMMs run by `backend`: the job's backend (ops/backends.h).
// The parameters stay in host memory: a backend on another device gets W, the
// weighted U and the V's in its persistent buffers (buffers.device), runs the
// products there and copies W back: the same operations as on the CPU backend, so
// the strict device (ops/strict) gives the CPU's bits.
// The weighting U C and the bias updates (O(J n) each) run on the host in Eigen.
void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w, Backend& backend);
// The same on views: a received batch is read in its receive buffer. Bitwise the
// result of the SvBatch calls on the same batches.
void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, RebuildBuffers& buffers);
void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, Backend& backend,
                    RebuildBuffers& buffers);
// The same into `gradient`, each parameter's columns handed to `step` as soon as they
// hold their final sums, so that an optimizer step reads them while they are still
// in cache (a clock's last group: ReplicaUpdater::applyLastGroup). On the CPU
// backend a parameter whose V's are all dense is rebuilt one tile of about
// `tileFloats` floats of columns after another (cpu::gemmByColumnTiles), step(i,
// offset, count) called on each tile's floats, and `stepped[i]` set; every other
// parameter is rebuilt whole and left to the caller (stepped[i] false). Bitwise the
// gradient of the call above.
using GradientStep = std::function<void(size_t param, int64_t offset, int64_t count)>;
void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& gradient, Backend& backend,
                    RebuildBuffers& buffers, int64_t tileFloats, const GradientStep& step,
                    std::vector<bool>& stepped);
// The same into parameters that live on the backend's device (a resident replica,
// engine/worker/device_replica.h): `w` in parameter order, each of its parameter's
// shape. The products run where W lies; each bias update is summed on the host, as
// above, and added on the device (y += 1 x): bitwise the host's result on the
// strict device. Matrices named in `onDevice` are read where they lie on the
// device (their U and dense V not copied in again): the same result, bit for bit.
void applySvBatches(std::span<const SvBatchView* const> batches, std::span<Tensor> w, Backend& backend,
                    RebuildBuffers& buffers, std::span<const DeviceSvs> onDevice = {});

// target = U V^T (V dense or sparse, K x n; the old contents of target are never
// read) on `backend`: one parameter's dense gradient from its SVs. On a device,
// the operands go through `device`'s buffers, target's W slot being `param`'s.
void outerProduct(Backend& backend, DeviceOperands& device, size_t param, const Matrix& u, const Matrix* vDense,
                  const SparseMatrix* vSparse, Matrix& target);

// `store` as a rows x cols tensor on the backend's device, grown when too small (a
// view of its first rows * cols floats): buffers reused clock after clock.
Tensor deviceBuffer(Backend& backend, Tensor& store, int64_t rows, int64_t cols);
// `host` copied into `store` (grown as deviceBuffer does), as a tensor of its shape.
Tensor uploaded(Backend& backend, Tensor& store, const Tensor& host);

// dst = c src on the backend's device in one pass (a chain of one scale step: the
// host's src * c bit for bit), not a copy and then a scaling.
void scaledCopy(Backend& backend, const Tensor& src, float c, Tensor& dst);

// Scales every batch column's coefficient (or core and bias coefficients) by `factor`.
void scaleCoefficients(SvBatch& batch, float factor);

// Whether the `n` coefficients at `c` are one value, bit for bit: a piece of a
// batch so weighted, its U on the device, is weighted there (its host U unread).
bool oneCoefficient(const float* c, int64_t n);

}  // namespace orpheus::ops
