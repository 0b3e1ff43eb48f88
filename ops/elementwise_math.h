// The scalar rules of the elementwise operators, shared by the host chain
// interpreter (ops/cpu/elementwise_chain.h, float and double) and the CUDA
// kernels, so every backend evaluates an element by the same formula. Included
// by .cu files: no Eigen, no fmt, no exceptions.
#pragma once

#include "ops/elementwise_ops.h"

#include <cmath>

#if defined(__CUDACC__)
#define ORPHEUS_HOST_DEVICE __host__ __device__
#else
#define ORPHEUS_HOST_DEVICE
#endif

namespace orpheus::ops::ew {

template <typename S>
ORPHEUS_HOST_DEVICE S unary(EwOp op, S x, S attr) {
  switch (op) {
    // 1 / (1 + e^-x) saturates to exactly 0 or 1 for large |x| instead of inf / inf.
    case EwOp::kSigmoid: return S(1) / (S(1) + std::exp(-x));
    case EwOp::kTanh: return std::tanh(x);
    case EwOp::kRelu: return x > S(0) ? x : S(0);
    case EwOp::kExp: return std::exp(x);
    case EwOp::kLog: return std::log(x);
    case EwOp::kScale: return attr * x;
    default: return x;
  }
}

template <typename S>
ORPHEUS_HOST_DEVICE S binary(EwOp op, S a, S b) {
  switch (op) {
    case EwOp::kAdd: return a + b;
    case EwOp::kSubtract: return a - b;
    default: return a * b;
  }
}

// d out / d x of a unary operator, from its input x and output y.
template <typename S>
ORPHEUS_HOST_DEVICE S unaryDerivative(EwOp op, S x, S y, S attr) {
  switch (op) {
    case EwOp::kSigmoid: return y * (S(1) - y);
    case EwOp::kTanh: return S(1) - y * y;
    case EwOp::kRelu: return x > S(0) ? S(1) : S(0);
    case EwOp::kExp: return y;
    case EwOp::kLog: return S(1) / x;
    case EwOp::kScale: return attr;
    default: return S(1);
  }
}

// The gradients a binary operator sends to its operands a and b, given the
// gradient g of its output.
template <typename S>
ORPHEUS_HOST_DEVICE void binaryGradients(EwOp op, S a, S b, S g, S* da, S* db) {
  switch (op) {
    case EwOp::kAdd: *da = g; *db = g; break;
    case EwOp::kSubtract: *da = g; *db = -g; break;
    default: *da = g * b; *db = g * a; break;
  }
}

}  // namespace orpheus::ops::ew
