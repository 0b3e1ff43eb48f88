// The host interpreter of elementwise chains (ops/backend.h EwChain), for any
// scalar: the CPU backend runs it in float, GraphExecutor<double> in double (the
// backends are float-only), so both precisions evaluate a chain the same way.
// Each element's steps run in registers: one pass over memory.
#pragma once

#include "ops/backend.h"
#include "ops/elementwise_math.h"

#include <algorithm>
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

template <typename S>
void runChainForward(const EwChain& chain, const ChainBuffers<S>& b) {
  const size_t len = chain.steps.size();
  std::vector<S> reg(len);
  for (int64_t j = 0; j < b.cols; ++j) {
    for (int64_t i = 0; i < b.rows; ++i) {
      const int64_t at = i + j * b.rows;
      for (size_t k = 0; k < len; ++k) {
        const EwStep& s = chain.steps[k];
        const auto operand = [&](size_t o) {
          const EwRef r = s.operand[o];
          const auto x = static_cast<size_t>(r.index);
          if (r.kind == EwRef::Kind::kStep) return reg[x];
          return b.inputs[x][b.broadcast[x] ? i : at];
        };
        reg[k] = isUnary(s.op) ? ew::unary<S>(s.op, operand(0), static_cast<S>(s.attr))
                               : ew::binary<S>(s.op, operand(0), operand(1));
        b.values[k][at] = reg[k];
      }
    }
  }
}

template <typename S>
void runChainBackward(const EwChain& chain, const ChainBuffers<S>& b) {
  const size_t len = chain.steps.size();
  std::vector<S> g(len);
  for (int64_t j = 0; j < b.cols; ++j) {
    for (int64_t i = 0; i < b.rows; ++i) {
      const int64_t at = i + j * b.rows;
      std::fill(g.begin(), g.end(), S(0));
      g[len - 1] = b.upstream[at];
      for (size_t k = len; k-- > 0;) {
        const EwStep& s = chain.steps[k];
        const auto operand = [&](size_t o) {
          const EwRef r = s.operand[o];
          const auto x = static_cast<size_t>(r.index);
          if (r.kind == EwRef::Kind::kStep) return b.values[x][at];
          return b.inputs[x][b.broadcast[x] ? i : at];
        };
        const auto send = [&](size_t o, S d) {
          const EwRef r = s.operand[o];
          const auto x = static_cast<size_t>(r.index);
          if (r.kind == EwRef::Kind::kStep) {
            g[x] += d;
          } else if (b.inputGrads[x] != nullptr) {
            b.inputGrads[x][at] += d;
          }
        };
        const S gk = g[k];
        if (isUnary(s.op)) {
          send(0, gk * ew::unaryDerivative<S>(s.op, operand(0), b.values[k][at], static_cast<S>(s.attr)));
        } else {
          S da = S(0);
          S db = S(0);
          ew::binaryGradients<S>(s.op, operand(0), operand(1), gk, &da, &db);
          send(0, da);
          send(1, db);
        }
      }
    }
  }
}

}  // namespace orpheus::ops::cpu
