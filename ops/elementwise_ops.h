// The elementwise operators a fused chain is made of (see ops/backend.h EwChain),
// and the sizes of the tables a GPU launch takes by value. Dependency-free so CUDA
// kernels can include it.
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

// The most parts one Backend::copyParts launch copies, and the most terms one
// Backend::addInOrder launch adds: a call with more takes (and counts in
// Backend::launches, on every backend) one launch per table.
inline constexpr int kCopyPartsPerLaunch = 64;
inline constexpr int kAddTermsPerLaunch = 16;

}  // namespace orpheus::ops
