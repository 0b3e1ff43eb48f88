// The host interpreter of elementwise chains (ops/backend.h EwChain), for any
// scalar: the CPU backend runs it in float, GraphExecutor<double> in double (the
// backends are float-only), so both precisions evaluate a chain the same way.
// Elements are taken in tiles of a column: every step runs over the whole tile
// before the next one, with the operator chosen once per tile, so the inner loops
// are plain loops the compiler vectorises, and a tile's step values are still in
// L1 when later steps (forward) or the gradients (backward) read them. Each
// element goes through exactly the operations, in the order, of a one-element-
// at-a-time evaluation, so the results do not depend on the tiling.
#pragma once

#include "ops/backend.h"
#include "ops/elementwise_math.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace orpheus::ops::cpu {

// Host pointers to a chain's operands, all rows x cols column-major, except
// inputs marked broadcast (rows x 1, repeated across the columns).
template <typename S>
struct ChainBuffers {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<const S*> inputs;
  std::vector<bool> broadcast;
  std::vector<S*> values;          // one per step: written forward, read backward
  const S* upstream = nullptr;     // backward: gradient of the last step
  std::vector<S*> inputGrads;      // backward: accumulated into where non-null
};

namespace chain {

// Elements per tile: the values of a few steps stay in L1.
inline constexpr int64_t kTile = 512;

// Runs f(EwOp constant) with the operator as a compile-time constant, so the
// switch inside ew::unary and friends folds away in the inner loops.
template <typename F>
void withOp(EwOp op, F&& f) {
  switch (op) {
    case EwOp::kSigmoid: f(std::integral_constant<EwOp, EwOp::kSigmoid>{}); break;
    case EwOp::kTanh: f(std::integral_constant<EwOp, EwOp::kTanh>{}); break;
    case EwOp::kRelu: f(std::integral_constant<EwOp, EwOp::kRelu>{}); break;
    case EwOp::kExp: f(std::integral_constant<EwOp, EwOp::kExp>{}); break;
    case EwOp::kLog: f(std::integral_constant<EwOp, EwOp::kLog>{}); break;
    case EwOp::kScale: f(std::integral_constant<EwOp, EwOp::kScale>{}); break;
    case EwOp::kAdd: f(std::integral_constant<EwOp, EwOp::kAdd>{}); break;
    case EwOp::kSubtract: f(std::integral_constant<EwOp, EwOp::kSubtract>{}); break;
    case EwOp::kMultiply: f(std::integral_constant<EwOp, EwOp::kMultiply>{}); break;
  }
}

// The tile's elements of an operand: a step's values or an input (a broadcast
// input by row).
template <typename S>
const S* operandTile(const ChainBuffers<S>& b, EwRef r, int64_t row, int64_t at) {
  const auto x = static_cast<size_t>(r.index);
  if (r.kind == EwRef::Kind::kStep) return b.values[x] + at;
  return b.inputs[x] + (b.broadcast[x] ? row : at);
}

}  // namespace chain

template <typename S>
void runChainForward(const EwChain& chain, const ChainBuffers<S>& b) {
  for (int64_t j = 0; j < b.cols; ++j) {
    for (int64_t row = 0; row < b.rows; row += chain::kTile) {
      const int64_t n = std::min(chain::kTile, b.rows - row);
      const int64_t at = row + j * b.rows;
      for (size_t k = 0; k < chain.steps.size(); ++k) {
        const EwStep& s = chain.steps[k];
        S* out = b.values[k] + at;
        const S* x = chain::operandTile(b, s.operand[0], row, at);
        if (isUnary(s.op)) {
          const S attr = static_cast<S>(s.attr);
          chain::withOp(s.op, [&](auto op) {
            for (int64_t t = 0; t < n; ++t) out[t] = ew::unary<S>(op, x[t], attr);
          });
        } else {
          const S* y = chain::operandTile(b, s.operand[1], row, at);
          chain::withOp(s.op, [&](auto op) {
            for (int64_t t = 0; t < n; ++t) out[t] = ew::binary<S>(op, x[t], y[t]);
          });
        }
      }
    }
  }
}

template <typename S>
void runChainBackward(const EwChain& chain, const ChainBuffers<S>& b) {
  const size_t len = chain.steps.size();
  // g[k * kTile + t]: the gradient of step k's value at the tile's element t.
  std::vector<S> g(len * static_cast<size_t>(chain::kTile));
  for (int64_t j = 0; j < b.cols; ++j) {
    for (int64_t row = 0; row < b.rows; row += chain::kTile) {
      const int64_t n = std::min(chain::kTile, b.rows - row);
      const int64_t at = row + j * b.rows;
      std::fill(g.begin(), g.end(), S(0));
      std::copy(b.upstream + at, b.upstream + at + n, g.begin() + static_cast<long>((len - 1) * chain::kTile));
      for (size_t k = len; k-- > 0;) {
        const EwStep& s = chain.steps[k];
        const S* gk = g.data() + k * chain::kTile;
        // Adds d to the gradient of operand o: a step's, or an input's where wanted.
        const auto sendTo = [&](size_t o) -> S* {
          const EwRef r = s.operand[o];
          const auto x = static_cast<size_t>(r.index);
          if (r.kind == EwRef::Kind::kStep) return g.data() + x * chain::kTile;
          return b.inputGrads[x] != nullptr ? b.inputGrads[x] + at : nullptr;
        };
        const S* x = chain::operandTile(b, s.operand[0], row, at);
        if (isUnary(s.op)) {
          S* dx = sendTo(0);
          if (dx == nullptr) continue;
          const S* y = b.values[k] + at;
          const S attr = static_cast<S>(s.attr);
          chain::withOp(s.op, [&](auto op) {
            for (int64_t t = 0; t < n; ++t) dx[t] += gk[t] * ew::unaryDerivative<S>(op, x[t], y[t], attr);
          });
          continue;
        }
        const S* y = chain::operandTile(b, s.operand[1], row, at);
        S* dx = sendTo(0);
        S* dy = sendTo(1);
        chain::withOp(s.op, [&](auto op) {
          for (int64_t t = 0; t < n; ++t) {
            S da = S(0);
            S db = S(0);
            ew::binaryGradients<S>(op, x[t], y[t], gk[t], &da, &db);
            if (dx != nullptr) dx[t] += da;
            if (dy != nullptr) dy[t] += db;
          }
        });
      }
    }
  }
}

}  // namespace orpheus::ops::cpu
