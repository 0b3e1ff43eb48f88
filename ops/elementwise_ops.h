// The elementwise operators a fused chain is made of (see ops/backend.h EwChain).
// Dependency-free so CUDA kernels can include it.
#pragma once

#include <cstdint>

namespace orpheus::ops {

enum class EwOp : uint8_t { kSigmoid, kTanh, kRelu, kExp, kLog, kScale, kAdd, kSubtract, kMultiply };

constexpr bool isUnary(EwOp op) { return op <= EwOp::kScale; }

// The longest chain a backend runs as one pass (Backend::chainLimits): the fusion
// plan (ops/graph.h Graph::fusionPlan) splits longer runs into several chains.
struct ChainLimits {
  int steps = 1 << 30;
  int inputs = 1 << 30;
};
// A GPU kernel's: its steps' values and inputs' pointers travel as launch arguments.
inline constexpr ChainLimits kDeviceChainLimits{16, 8};

}  // namespace orpheus::ops
