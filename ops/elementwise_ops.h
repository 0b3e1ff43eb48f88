// The elementwise operators a fused chain is made of (see ops/backend.h EwChain).
// Dependency-free so CUDA kernels can include it.
#pragma once

#include <cstdint>

namespace orpheus::ops {

enum class EwOp : uint8_t { kSigmoid, kTanh, kRelu, kExp, kLog, kScale, kAdd, kSubtract, kMultiply };

constexpr bool isUnary(EwOp op) { return op <= EwOp::kScale; }

}  // namespace orpheus::ops
