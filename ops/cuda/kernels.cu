#include "ops/cuda/kernels.h"

#include "ops/elementwise_math.h"

#include <cfloat>

namespace orpheus::ops::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

unsigned gridY(int64_t n) { return static_cast<unsigned>(n < 65535 ? (n > 0 ? n : 1) : 65535); }

__device__ float chainOperand(const ChainArgs& a, const ChainStep& s, int o, const float* reg, int64_t i,
                              int64_t at) {
  if (s.fromStep[o]) return reg[s.index[o]];
  const int k = s.index[o];
  return a.broadcast[k] ? a.input[k][i] : a.input[k][at];
}

// One thread per element, every step of the chain in registers: one pass over memory.
__global__ void chainForward(const ChainArgs a) {
  float reg[kMaxChainSteps];
  const int64_t n = a.rows * a.cols;
  for (int64_t at = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; at < n;
       at += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = at % a.rows;
    for (int k = 0; k < a.steps; ++k) {
      const ChainStep& s = a.step[k];
      reg[k] = isUnary(s.op) ? ew::unary(s.op, chainOperand(a, s, 0, reg, i, at), s.attr)
                             : ew::binary(s.op, chainOperand(a, s, 0, reg, i, at), chainOperand(a, s, 1, reg, i, at));
      a.value[k][at] = reg[k];
    }
  }
}

// Each element's gradients are sent by the one thread that owns the element, so
// accumulating into the input gradients needs no atomics.
__global__ void chainBackward(const ChainArgs a) {
  float reg[kMaxChainSteps];
  float g[kMaxChainSteps];
  const int64_t n = a.rows * a.cols;
  for (int64_t at = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; at < n;
       at += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = at % a.rows;
    for (int k = 0; k < a.steps; ++k) {
      reg[k] = a.value[k][at];
      g[k] = 0.0f;
    }
    g[a.steps - 1] = a.upstream[at];
    for (int k = a.steps - 1; k >= 0; --k) {
      const ChainStep& s = a.step[k];
      float d[2];
      if (isUnary(s.op)) {
        d[0] = g[k] * ew::unaryDerivative(s.op, chainOperand(a, s, 0, reg, i, at), reg[k], s.attr);
      } else {
        ew::binaryGradients(s.op, chainOperand(a, s, 0, reg, i, at), chainOperand(a, s, 1, reg, i, at), g[k], &d[0],
                            &d[1]);
      }
      for (int o = 0; o < (isUnary(s.op) ? 1 : 2); ++o) {
        if (s.fromStep[o]) {
          g[s.index[o]] += d[o];
        } else if (a.inputGrad[s.index[o]] != nullptr) {
          a.inputGrad[s.index[o]][at] += d[o];
        }
      }
    }
  }
}

// Block-wide reductions over kThreads threads (every thread gets the result).
template <typename Combine>
__device__ float blockReduce(float x, float* scratch, Combine combine) {
  scratch[threadIdx.x] = x;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] = combine(scratch[threadIdx.x], scratch[threadIdx.x + half]);
    __syncthreads();
  }
  const float result = scratch[0];
  __syncthreads();
  return result;
}

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// One block per column.
__global__ void softmaxCrossEntropy(const float* z, const float* t, float* p, float* loss, int64_t rows,
                                    int64_t cols) {
  __shared__ float scratch[kThreads];
  for (int64_t j = blockIdx.x; j < cols; j += gridDim.x) {
    const float* zj = z + j * rows;
    const float* tj = t + j * rows;
    float* pj = p + j * rows;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) m = fmaxf(m, zj[i]);
    m = blockReduce(m, scratch, Max());
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
      pj[i] = expf(zj[i] - m);
      sum += pj[i];
    }
    const float inv = 1.0f / blockReduce(sum, scratch, Sum());
    float ce = 0.0f;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
      pj[i] *= inv;
      if (tj[i] != 0.0f) ce += tj[i] * logf(fmaxf(pj[i], FLT_MIN));  // as the host: nonzero t only
    }
    ce = blockReduce(ce, scratch, Sum());
    if (threadIdx.x == 0) loss[j] = -ce;
  }
}

__global__ void softmaxCrossEntropyBackward(const float* p, const float* t, const float* g, float beta, float* dz,
                                            int64_t rows, int64_t cols) {
  __shared__ float scratch[kThreads];
  for (int64_t j = blockIdx.x; j < cols; j += gridDim.x) {
    const float* tj = t + j * rows;
    float mass = 0.0f;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) mass += tj[i];
    mass = blockReduce(mass, scratch, Sum()) * g[j];
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
      const int64_t at = i + j * rows;
      const float d = p[at] * mass - tj[i] * g[j];
      dz[at] = beta == 0.0f ? d : beta * dz[at] + d;
    }
  }
}

// The column operators, one block per column (ops/operators.cc's formulas).
__global__ void columnOpForward(ColumnOp op, const float* a, const float* b, float* out, int64_t rows,
                                int64_t cols) {
  __shared__ float scratch[kThreads];
  for (int64_t j = blockIdx.x; j < cols; j += gridDim.x) {
    const float* aj = a + j * rows;
    const float* bj = b != nullptr ? b + j * rows : nullptr;
    if (op == ColumnOp::kSoftmax || op == ColumnOp::kLogSoftmax) {
      float* oj = out + j * rows;
      float m = -INFINITY;
      for (int64_t i = threadIdx.x; i < rows; i += kThreads) m = fmaxf(m, aj[i]);
      m = blockReduce(m, scratch, Max());
      float sum = 0.0f;
      for (int64_t i = threadIdx.x; i < rows; i += kThreads) sum += expf(aj[i] - m);
      sum = blockReduce(sum, scratch, Sum());
      const float inv = 1.0f / sum, logSum = logf(sum);
      for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
        oj[i] = op == ColumnOp::kSoftmax ? expf(aj[i] - m) * inv : (aj[i] - m) - logSum;
      }
      continue;
    }
    float part = 0.0f;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
      const float x = aj[i];
      switch (op) {
        case ColumnOp::kSquaredL2:
        case ColumnOp::kL2Norm: part += x * x; break;
        case ColumnOp::kL1: part += fabsf(x); break;
        case ColumnOp::kSum: part += x; break;
        case ColumnOp::kCrossEntropy: if (bj[i] != 0.0f) part += bj[i] * logf(fmaxf(x, FLT_MIN)); break;
        case ColumnOp::kDot: part += x * bj[i]; break;
        case ColumnOp::kSquaredDistance: part += (x - bj[i]) * (x - bj[i]); break;
        default: break;
      }
    }
    part = blockReduce(part, scratch, Sum());
    if (threadIdx.x == 0) {
      out[j] = op == ColumnOp::kL2Norm ? sqrtf(part) : (op == ColumnOp::kCrossEntropy ? -part : part);
    }
  }
}

__global__ void columnOpBackward(ColumnOp op, int which, const float* a, const float* b, const float* out,
                                 const float* g, float* dst, int64_t rows, int64_t cols) {
  __shared__ float scratch[kThreads];
  for (int64_t j = blockIdx.x; j < cols; j += gridDim.x) {
    const float* aj = a + j * rows;
    const float* bj = b != nullptr ? b + j * rows : nullptr;
    float* dj = dst + j * rows;
    if (op == ColumnOp::kSoftmax || op == ColumnOp::kLogSoftmax) {
      const float* oj = out + j * rows;
      const float* gj = g + j * rows;
      float part = 0.0f;  // softmax: p . g; log_softmax: the sum of g
      for (int64_t i = threadIdx.x; i < rows; i += kThreads) part += op == ColumnOp::kSoftmax ? oj[i] * gj[i] : gj[i];
      part = blockReduce(part, scratch, Sum());
      for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
        dj[i] = op == ColumnOp::kSoftmax ? oj[i] * (gj[i] - part) : gj[i] - expf(oj[i]) * part;
      }
      continue;
    }
    const float gj = g[j];
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
      const float x = aj[i];
      float d = 0.0f;
      switch (op) {
        case ColumnOp::kSquaredL2: d = x * (2.0f * gj); break;
        case ColumnOp::kL2Norm: d = out[j] > 0.0f ? x * (gj / out[j]) : 0.0f; break;
        case ColumnOp::kL1: d = (x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f)) * gj; break;
        case ColumnOp::kSum: d = gj; break;
        case ColumnOp::kCrossEntropy:
          d = (which == 0 ? bj[i] / fmaxf(x, FLT_MIN) : logf(fmaxf(x, FLT_MIN))) * -gj;
          break;
        case ColumnOp::kDot: d = (which == 0 ? bj[i] : x) * gj; break;
        case ColumnOp::kSquaredDistance: d = (x - bj[i]) * (which == 0 ? 2.0f * gj : -2.0f * gj); break;
        default: break;
      }
      dj[i] = d;
    }
  }
}

// Thread i walks row i across the columns: neighbouring threads read neighbouring addresses.
__global__ void sumColumns(const float* a, float beta, float* out, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t j = 0; j < cols; ++j) s += a[i + j * rows];
    out[i] = beta == 0.0f ? s : beta * out[i] + s;
  }
}

__global__ void sumRows(const float* a, float beta, float* out, int64_t rows, int64_t cols) {
  __shared__ float scratch[kThreads];
  for (int64_t j = blockIdx.x; j < cols; j += gridDim.x) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) s += a[i + j * rows];
    s = blockReduce(s, scratch, Sum());
    if (threadIdx.x == 0) out[j] = beta == 0.0f ? s : beta * out[j] + s;
  }
}

// Threads over the rows of c, blocks (y) over its columns.
__global__ void denseTimesCsc(float alpha, const float* a, int64_t m, const int32_t* outer, const int32_t* inner,
                              const float* values, int64_t n, float beta, float* c) {
  for (int64_t j = blockIdx.y; j < n; j += gridDim.y) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float s = 0.0f;
      for (int32_t q = outer[j]; q < outer[j + 1]; ++q) s += a[i + static_cast<int64_t>(inner[q]) * m] * values[q];
      const int64_t at = i + j * m;
      c[at] = beta == 0.0f ? alpha * s : alpha * s + beta * c[at];
    }
  }
}

// One thread per element, the formulas of ops/optimizer_step.h (nvcc may fuse a
// multiply and an add, so results differ from the CPU's in the last bits).
__global__ void optimizerStep(const OptimizerStep s, int64_t n, const float* g, float* w, float* b0, float* b1) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float d = s.weightDecay != 0.0f ? g[k] + s.weightDecay * w[k] : g[k];
    switch (s.kind) {
      case OptimizerStep::Kind::kSgd:
        w[k] -= s.lr * d;
        break;
      case OptimizerStep::Kind::kMomentum:
      case OptimizerStep::Kind::kNesterov: {
        const float next = s.momentum * b0[k] + d;
        b0[k] = next;
        w[k] -= s.lr * (s.kind == OptimizerStep::Kind::kNesterov ? d + s.momentum * next : next);
        break;
      }
      case OptimizerStep::Kind::kAdagrad: {
        const float sum = b0[k] + d * d;
        b0[k] = sum;
        w[k] -= s.lr * d / (sqrtf(sum) + s.eps);
        break;
      }
      case OptimizerStep::Kind::kAdam: {
        const float m = s.beta1 * b0[k] + (1.0f - s.beta1) * d;
        const float v = s.beta2 * b1[k] + (1.0f - s.beta2) * d * d;
        b0[k] = m;
        b1[k] = v;
        w[k] -= s.adamStepSize * m / (sqrtf(v) / s.adamBc2Sqrt + s.eps);
        break;
      }
    }
  }
}

// As ops/lstm_cell.h's lstmCellForward, element by element.
__global__ void lstmCellForward(const LstmCellKernelArgs b) {
  const int64_t n = b.rows * b.cols;
  for (int64_t at = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; at < n;
       at += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = at % b.rows;
    const float* a = b.gates + (at / b.rows) * 4 * b.rows;
    const float i = ew::unary(EwOp::kSigmoid, a[b.offset[0] + r], 1.0f);
    const float f = ew::unary(EwOp::kSigmoid, a[b.offset[1] + r], 1.0f);
    const float g = ew::unary(EwOp::kTanh, a[b.offset[2] + r], 1.0f);
    const float o = ew::unary(EwOp::kSigmoid, a[b.offset[3] + r], 1.0f);
    const float c = __fadd_rn(__fmul_rn(f, b.cPrev[at]), __fmul_rn(i, g));
    const float t = ew::unary(EwOp::kTanh, c, 1.0f);
    b.act[0][at] = i;
    b.act[1][at] = f;
    b.act[2][at] = g;
    b.act[3][at] = o;
    b.cell[at] = c;
    b.tanhCell[at] = t;
    b.hidden[at] = __fmul_rn(o, t);
  }
}

// As ops/lstm_cell.h's lstmCellBackward; products and sums rounded one by one
// (no fused multiply-add), in its order.
__global__ void lstmCellBackward(const LstmCellKernelArgs b, const float* dHidden, const float* dCell, float* dGates,
                                 float* dCPrev) {
  const int64_t n = b.rows * b.cols;
  for (int64_t at = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; at < n;
       at += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = at % b.rows;
    float* da = dGates + (at / b.rows) * 4 * b.rows;
    const float i = b.act[0][at];
    const float f = b.act[1][at];
    const float g = b.act[2][at];
    const float o = b.act[3][at];
    const float t = b.tanhCell[at];
    const float dh = dHidden ? dHidden[at] : 0.0f;
    const float dOut = __fmul_rn(dh, t);
    float dc = dCell ? dCell[at] : 0.0f;
    dc = __fadd_rn(dc, __fmul_rn(__fmul_rn(dh, o), ew::unaryDerivative(EwOp::kTanh, 0.0f, t, 1.0f)));
    const float dSigI = ew::unaryDerivative(EwOp::kSigmoid, 0.0f, i, 1.0f);
    const float dSigF = ew::unaryDerivative(EwOp::kSigmoid, 0.0f, f, 1.0f);
    const float dTanG = ew::unaryDerivative(EwOp::kTanh, 0.0f, g, 1.0f);
    const float dSigO = ew::unaryDerivative(EwOp::kSigmoid, 0.0f, o, 1.0f);
    da[b.offset[0] + r] = __fadd_rn(da[b.offset[0] + r], __fmul_rn(__fmul_rn(dc, g), dSigI));
    da[b.offset[1] + r] = __fadd_rn(da[b.offset[1] + r], __fmul_rn(__fmul_rn(dc, b.cPrev[at]), dSigF));
    da[b.offset[2] + r] = __fadd_rn(da[b.offset[2] + r], __fmul_rn(__fmul_rn(dc, i), dTanG));
    da[b.offset[3] + r] = __fadd_rn(da[b.offset[3] + r], __fmul_rn(dOut, dSigO));
    if (dCPrev) dCPrev[at] = __fadd_rn(dCPrev[at], __fmul_rn(dc, f));
  }
}

// Backend::copyParts: blockIdx.y is the part; its elements in a grid-stride loop.
__global__ void copyParts(const CopyPartsArgs a) {
  const CopyPartArgs& p = a.part[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.count; i += stride) {
    p.dst[i] = p.scaled ? __fmul_rn(p.scale, p.src[i]) : p.src[i];
  }
}

// Backend::addInOrder: each element summed with its terms in order, by one thread.
__global__ void addInOrder(const AddInOrderArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.count; i += stride) {
    float y = a.y[i];
    for (int k = 0; k < a.terms; ++k) y = __fadd_rn(y, a.term[k][i]);
    a.y[i] = y;
  }
}

}  // namespace

cudaError_t launchChainForward(const ChainArgs& args, cudaStream_t stream) {
  if (args.rows * args.cols == 0) return cudaSuccess;
  chainForward<<<blocksFor(args.rows * args.cols), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launchChainBackward(const ChainArgs& args, cudaStream_t stream) {
  if (args.rows * args.cols == 0) return cudaSuccess;
  chainBackward<<<blocksFor(args.rows * args.cols), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launchSoftmaxCrossEntropy(const float* z, const float* t, float* p, float* loss, int64_t rows,
                                      int64_t cols, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  softmaxCrossEntropy<<<gridY(cols), kThreads, 0, stream>>>(z, t, p, loss, rows, cols);
  return cudaGetLastError();
}

cudaError_t launchSoftmaxCrossEntropyBackward(const float* p, const float* t, const float* g, float beta, float* dz,
                                              int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0 || rows == 0) return cudaSuccess;
  softmaxCrossEntropyBackward<<<gridY(cols), kThreads, 0, stream>>>(p, t, g, beta, dz, rows, cols);
  return cudaGetLastError();
}

cudaError_t launchColumnOp(ColumnOp op, const float* a, const float* b, float* out, int64_t rows, int64_t cols,
                           cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  columnOpForward<<<gridY(cols), kThreads, 0, stream>>>(op, a, b, out, rows, cols);
  return cudaGetLastError();
}

cudaError_t launchColumnOpBackward(ColumnOp op, int which, const float* a, const float* b, const float* out,
                                   const float* g, float* dst, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0 || rows == 0) return cudaSuccess;
  columnOpBackward<<<gridY(cols), kThreads, 0, stream>>>(op, which, a, b, out, g, dst, rows, cols);
  return cudaGetLastError();
}

cudaError_t launchSumColumns(const float* a, float beta, float* out, int64_t rows, int64_t cols,
                             cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  sumColumns<<<blocksFor(rows), kThreads, 0, stream>>>(a, beta, out, rows, cols);
  return cudaGetLastError();
}

cudaError_t launchSumRows(const float* a, float beta, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  sumRows<<<gridY(cols), kThreads, 0, stream>>>(a, beta, out, rows, cols);
  return cudaGetLastError();
}

cudaError_t launchDenseTimesCsc(float alpha, const float* a, int64_t m, const int32_t* outer, const int32_t* inner,
                                const float* values, int64_t n, float beta, float* c, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  denseTimesCsc<<<dim3(blocksFor(m), gridY(n)), kThreads, 0, stream>>>(alpha, a, m, outer, inner, values, n, beta, c);
  return cudaGetLastError();
}

cudaError_t launchLstmCellForward(const LstmCellKernelArgs& args, cudaStream_t stream) {
  if (args.rows * args.cols == 0) return cudaSuccess;
  lstmCellForward<<<blocksFor(args.rows * args.cols), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launchLstmCellBackward(const LstmCellKernelArgs& args, const float* dHidden, const float* dCell,
                                   float* dGates, float* dCPrev, cudaStream_t stream) {
  if (args.rows * args.cols == 0) return cudaSuccess;
  lstmCellBackward<<<blocksFor(args.rows * args.cols), kThreads, 0, stream>>>(args, dHidden, dCell, dGates, dCPrev);
  return cudaGetLastError();
}

cudaError_t launchOptimizerStep(const OptimizerStep& s, int64_t n, const float* g, float* w, float* b0, float* b1,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  optimizerStep<<<blocksFor(n), kThreads, 0, stream>>>(s, n, g, w, b0, b1);
  return cudaGetLastError();
}

cudaError_t launchCopyParts(const CopyPartsArgs& args, cudaStream_t stream) {
  if (args.parts == 0 || args.longest == 0) return cudaSuccess;
  copyParts<<<dim3(blocksFor(args.longest), static_cast<unsigned>(args.parts)), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launchAddInOrder(const AddInOrderArgs& args, cudaStream_t stream) {
  if (args.terms == 0 || args.count == 0) return cudaSuccess;
  addInOrder<<<blocksFor(args.count), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace orpheus::ops::cuda
