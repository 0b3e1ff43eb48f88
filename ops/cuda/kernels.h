// Launchers of the CUDA backend's own kernels. Each enqueues its work on `stream`
// and returns the launch status (cudaGetLastError); none of them synchronises.
// All pointers are device pointers; matrices are column-major and contiguous.
// Included by kernels.cu: nothing here may pull in fmt (its consteval format
// strings do not compile under nvcc).
#pragma once

#include "ops/elementwise_ops.h"
#include "ops/optimizer_step.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace orpheus::ops::cuda {

// Longest chain and most inputs one kernel launch takes (the arguments travel by
// value in the launch's parameter space): the limits CudaBackend::chainLimits()
// promises, which the shared chain check enforces before any launch.
constexpr int kMaxChainSteps = kDeviceChainLimits.steps;
constexpr int kMaxChainInputs = kDeviceChainLimits.inputs;

struct ChainStep {
  EwOp op;
  uint8_t fromStep[2];  // 1: operand is an earlier step's value, 0: an input
  int index[2];
  float attr;
};

struct ChainArgs {
  int steps = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  ChainStep step[kMaxChainSteps];
  const float* input[kMaxChainInputs];
  bool broadcast[kMaxChainInputs];  // rows x 1, repeated across the columns
  float* value[kMaxChainSteps];     // forward: written; backward: read
  const float* upstream = nullptr;  // backward: gradient of the last step
  float* inputGrad[kMaxChainInputs];  // backward: accumulated into where non-null
};

cudaError_t launchChainForward(const ChainArgs& args, cudaStream_t stream);
cudaError_t launchChainBackward(const ChainArgs& args, cudaStream_t stream);

// p = softmax(z) per column; loss_j = -sum_i t_ij log max(p_ij, FLT_MIN).
cudaError_t launchSoftmaxCrossEntropy(const float* z, const float* t, float* p, float* loss, int64_t rows,
                                      int64_t cols, cudaStream_t stream);
// dz = beta dz + (p sum_i t_ij - t) g_j.
cudaError_t launchSoftmaxCrossEntropyBackward(const float* p, const float* t, const float* g, float beta, float* dz,
                                              int64_t rows, int64_t cols, cudaStream_t stream);

// The column operators (ops/operators.h's isColumnOp), one block per column, its
// reductions a fixed tree (the same bits run after run).
enum class ColumnOp : int { kSquaredL2, kL2Norm, kL1, kSum, kSoftmax, kLogSoftmax, kCrossEntropy, kDot, kSquaredDistance };
// out = op(a[, b]): 1 x cols for a reduction, rows x cols for a softmax.
cudaError_t launchColumnOp(ColumnOp op, const float* a, const float* b, float* out, int64_t rows, int64_t cols,
                           cudaStream_t stream);
// dst (rows x cols, overwritten) = d sum(g . out) / d operand `which` (0: a, 1: b).
cudaError_t launchColumnOpBackward(ColumnOp op, int which, const float* a, const float* b, const float* out,
                                   const float* g, float* dst, int64_t rows, int64_t cols, cudaStream_t stream);

// out (rows) = beta out + sum over columns; out (cols) = beta out + sum over rows.
cudaError_t launchSumColumns(const float* a, float beta, float* out, int64_t rows, int64_t cols, cudaStream_t stream);
cudaError_t launchSumRows(const float* a, float beta, float* out, int64_t rows, int64_t cols, cudaStream_t stream);

// c (m x n) = alpha a (m x k) s + beta c, s a k x n CSC matrix.
cudaError_t launchDenseTimesCsc(float alpha, const float* a, int64_t m, const int32_t* outer, const int32_t* inner,
                                const float* values, int64_t n, float beta, float* c, cudaStream_t stream);

// One LSTM cell step (ops/lstm_cell.h) over an h x cols state: one thread per
// element, the gates at rows offset[k] + r of the 4h-row gate block. Forward writes
// act[0..3], cell, tanhCell, hidden; backward adds to dGates (each element's four
// gate rows written by its own thread: no atomics) and, when not null, to dCPrev.
struct LstmCellKernelArgs {
  int64_t rows = 0;  // h
  int64_t cols = 0;
  const float* gates = nullptr;
  int64_t offset[4] = {0, 0, 0, 0};
  const float* cPrev = nullptr;
  float* act[4] = {nullptr, nullptr, nullptr, nullptr};
  float* cell = nullptr;
  float* tanhCell = nullptr;
  float* hidden = nullptr;
};
cudaError_t launchLstmCellForward(const LstmCellKernelArgs& args, cudaStream_t stream);
cudaError_t launchLstmCellBackward(const LstmCellKernelArgs& args, const float* dHidden, const float* dCell,
                                   float* dGates, float* dCPrev, cudaStream_t stream);

// Backend::copyParts, up to kCopyPartsPerLaunch parts a launch: blockIdx.y picks
// the part, a grid-stride loop over its elements.
struct CopyPartArgs {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t count = 0;
  float scale = 1.0f;
  int scaled = 0;
};
struct CopyPartsArgs {
  int parts = 0;
  int64_t longest = 0;  // the most elements of any part
  CopyPartArgs part[kCopyPartsPerLaunch];
};
cudaError_t launchCopyParts(const CopyPartsArgs& args, cudaStream_t stream);

// Backend::addInOrder, up to kAddTermsPerLaunch terms a launch: each element of y
// summed with its terms in order by one thread.
struct AddInOrderArgs {
  int terms = 0;
  int64_t count = 0;
  const float* term[kAddTermsPerLaunch];
  float* y = nullptr;
};
cudaError_t launchAddInOrder(const AddInOrderArgs& args, cudaStream_t stream);

// One optimizer step on n elements (ops/optimizer_step.h): w, b0 and b1 updated
// in place; the buffers s.kind does not use may be null.
cudaError_t launchOptimizerStep(const OptimizerStep& s, int64_t n, const float* g, float* w, float* b0, float* b1,
                                cudaStream_t stream);

}  // namespace orpheus::ops::cuda
