// The elementwise work of one LSTM cell step (ops/graph.h, LstmCellRoles) in one
// pass over the 4H x B gate block, forward and backward, on host memory
// (column-major, leading dimension = rows). The forward evaluates each gate's column
// as the sigmoid and tanh operators do (ops::forward: Eigen's vectorised exp and
// tanh, where the scalar rules of ops/elementwise_math.h call libm once an element);
// the backward follows those rules (it needs no transcendental function) and sums
// the unfused graph's terms, up to the order of the cell gradient's two
// contributions, so fused and unfused agree to rounding.
#pragma once

#include "ops/elementwise_math.h"

#include <Eigen/Core>

#include <cstdint>

namespace orpheus::ops {

template <typename S>
struct LstmCellBuffers {
  int64_t rows = 0;  // H
  int64_t cols = 0;    // B
  const S* gates = nullptr;  // 4H x B pre-activations
  int64_t offset[4] = {0, 0, 0, 0};  // first row of each gate (input, forget, candidate, output)
  const S* cPrev = nullptr;  // H x B
  // H x B each. Forward writes them; backward reads them.
  S* act[4] = {nullptr, nullptr, nullptr, nullptr};  // sigmoid, sigmoid, tanh, sigmoid of the gates
  S* cell = nullptr;      // f * cPrev + i * g
  S* tanhCell = nullptr;  // tanh(cell)
  S* hidden = nullptr;   // o * tanh(cell)
};

template <typename S>
void lstmCellForward(const LstmCellBuffers<S>& b) {
  using Column = Eigen::Array<S, Eigen::Dynamic, 1>;
  using In = Eigen::Map<const Column>;
  using Out = Eigen::Map<Column>;
  const int64_t h = b.rows;
  // 1 / (1 + e^-x), as the sigmoid operator: saturates instead of giving inf / inf.
  const auto sigmoid = [h](const S* x) { return (S(1) + (-In(x, h)).exp()).inverse(); };
  for (int64_t j = 0; j < b.cols; ++j) {
    const S* a = b.gates + j * 4 * h;
    const int64_t at = j * h;
    Out i(b.act[0] + at, h), f(b.act[1] + at, h), g(b.act[2] + at, h), o(b.act[3] + at, h);
    Out cell(b.cell + at, h), t(b.tanhCell + at, h);
    i = sigmoid(a + b.offset[0]);
    f = sigmoid(a + b.offset[1]);
    g = In(a + b.offset[2], h).tanh();
    o = sigmoid(a + b.offset[3]);
    cell = f * In(b.cPrev + at, h) + i * g;
    t = cell.tanh();
    Out(b.hidden + at, h) = o * t;
  }
}

// Adds d loss / d gates to `dGates` (4H x B) and, when not null, d loss / d cPrev to
// `dCPrev`, from the gradients of the step's outputs (null: zero).
template <typename S>
void lstmCellBackward(const LstmCellBuffers<S>& b, const S* dHidden, const S* dCell, S* dGates, S* dCPrev) {
  const int64_t h = b.rows;
  for (int64_t j = 0; j < b.cols; ++j) {
    S* da = dGates + j * 4 * h;
    const int64_t at = j * h;
    for (int64_t r = 0; r < h; ++r) {
      const S i = b.act[0][at + r];
      const S f = b.act[1][at + r];
      const S g = b.act[2][at + r];
      const S o = b.act[3][at + r];
      const S t = b.tanhCell[at + r];
      const S dh = dHidden ? dHidden[at + r] : S(0);
      const S dOut = dh * t;
      S dc = dCell ? dCell[at + r] : S(0);
      dc += dh * o * ew::unaryDerivative(EwOp::kTanh, S(0), t, S(1));
      da[b.offset[0] + r] += dc * g * ew::unaryDerivative(EwOp::kSigmoid, S(0), i, S(1));
      da[b.offset[1] + r] += dc * b.cPrev[at + r] * ew::unaryDerivative(EwOp::kSigmoid, S(0), f, S(1));
      da[b.offset[2] + r] += dc * i * ew::unaryDerivative(EwOp::kTanh, S(0), g, S(1));
      da[b.offset[3] + r] += dOut * ew::unaryDerivative(EwOp::kSigmoid, S(0), o, S(1));
      if (dCPrev) dCPrev[at + r] += dc * f;
    }
  }
}

}  // namespace orpheus::ops
