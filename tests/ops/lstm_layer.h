// One LSTM layer over T steps, three ways, for checking the CUDA backend against
// cuDNN's LSTM (lstm_cudnn_test.cc):
//  - referenceLstm: float64, plain Eigen, the textbook equations;
//  - runLstmLayer: float, through a Backend's operations as the device executor
//    runs examples/lstm.loss (the input products of all steps as one GEMM, then per
//    step the recurrent GEMM and the fused cell step; backward per step the fused
//    cell step and the recurrent GEMM, the weight gradients as one GEMM each);
//  - the map between our weights and cuDNN's weight space (one matrix and bias per
//    gate and input, cudnnGetRNNWeightParams), with cudnnStyleForward, a float64
//    forward written in cuDNN's terms from the packed weights.
// Host-side and CUDA-free, so lstm_layer_test.cc checks all of it on the CPU
// backend; only the cuDNN calls themselves need a GPU.
//
// Our layout: W (4H x (E+H)) multiplies [x_t; h_{t-1}], b (4H) is added; gate k's
// rows start at offset[k], k in LstmCellRoles' order (input, forget, candidate,
// output), which is also cuDNN's gate order (i, f, c', o).
#pragma once

#include "backend_harness.h"

#include <array>
#include <vector>

namespace orpheus::ops::test {

struct LstmProblem {
  int64_t input = 0;   // E
  int64_t hidden = 0;  // H
  int64_t batch = 0;   // B
  int64_t steps = 0;   // T
  std::array<int64_t, 4> offset{};
  MatF w;                // 4H x (E+H)
  MatF b;                // 4H x 1
  std::vector<MatF> x;   // T of E x B
  MatF h0, c0;           // H x B
  std::vector<MatF> dy;  // T of H x B: the upstream gradient of each step's output
};

struct LstmResult {
  std::vector<MatD> h;  // T of H x B: each step's output
  MatD dw;              // 4H x (E+H), summed over batch and time
  MatD db;              // 4H x 1
  MatD dh0, dc0;        // H x B
};

// Random weights, inputs, initial states and upstream gradients; the gates' row
// blocks in the order `offset` gives (examples/lstm.loss's: 0, H, 2H, 3H).
inline LstmProblem randomLstmProblem(std::mt19937& rng, int64_t input, int64_t hidden, int64_t batch, int64_t steps,
                                     std::array<int64_t, 4> offset) {
  LstmProblem p;
  p.input = input;
  p.hidden = hidden;
  p.batch = batch;
  p.steps = steps;
  p.offset = offset;
  // Pre-activations of order one: the gates neither saturate nor stay linear.
  const float scale = 1.0f / std::sqrt(static_cast<float>(input + hidden));
  p.w = randomMatrix(rng, 4 * hidden, input + hidden, scale);
  p.b = randomMatrix(rng, 4 * hidden, 1, 0.5f);
  for (int64_t t = 0; t < steps; ++t) {
    p.x.push_back(randomMatrix(rng, input, batch));
    p.dy.push_back(randomMatrix(rng, hidden, batch));
  }
  p.h0 = randomMatrix(rng, hidden, batch, 0.5f);
  p.c0 = randomMatrix(rng, hidden, batch, 0.5f);
  return p;
}

inline double relativeFrobenius(const MatD& got, const MatD& want) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) return 1e300;
  return (got - want).norm() / std::max(want.norm(), 1e-300);
}

// The T outputs side by side (H x TB), for one relative difference over all steps.
inline MatD stacked(const std::vector<MatD>& steps) {
  if (steps.empty()) return MatD();
  MatD all(steps[0].rows(), steps[0].cols() * static_cast<int64_t>(steps.size()));
  for (size_t t = 0; t < steps.size(); ++t) {
    all.middleCols(static_cast<int64_t>(t) * steps[t].cols(), steps[t].cols()) = steps[t];
  }
  return all;
}

namespace lstm_detail {

inline MatD sigmoid(const MatD& a) { return (1.0 + (-a.array()).exp()).inverse().matrix(); }

}  // namespace lstm_detail

inline LstmResult referenceLstm(const LstmProblem& p) {
  using lstm_detail::sigmoid;
  const int64_t e = p.input;
  const int64_t h = p.hidden;
  const MatD w = p.w.cast<double>();
  const MatD b = p.b.cast<double>();
  std::vector<MatD> hs{p.h0.cast<double>()}, cs{p.c0.cast<double>()};
  std::vector<std::array<MatD, 4>> gates;  // i, f, g, o
  std::vector<MatD> tanhC;
  LstmResult r;
  for (int64_t t = 0; t < p.steps; ++t) {
    MatD in(e + h, p.batch);
    in << p.x[static_cast<size_t>(t)].cast<double>(), hs.back();
    const MatD a = (w * in).colwise() + b.col(0);
    const auto block = [&](int k) { return a.middleRows(p.offset[static_cast<size_t>(k)], h); };
    std::array<MatD, 4> g{sigmoid(block(0)), sigmoid(block(1)), block(2).array().tanh().matrix(), sigmoid(block(3))};
    const MatD c = (g[1].array() * cs.back().array() + g[0].array() * g[2].array()).matrix();
    tanhC.push_back(c.array().tanh().matrix());
    hs.push_back((g[3].array() * tanhC.back().array()).matrix());
    cs.push_back(c);
    gates.push_back(g);
    r.h.push_back(hs.back());
  }
  r.dw = MatD::Zero(4 * h, e + h);
  r.db = MatD::Zero(4 * h, 1);
  MatD dhNext = MatD::Zero(h, p.batch);
  MatD dcNext = MatD::Zero(h, p.batch);
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    const size_t s = static_cast<size_t>(t);
    const auto& [i, f, g, o] = gates[s];
    const MatD dh = p.dy[s].cast<double>() + dhNext;
    const MatD dc = dcNext + (dh.array() * o.array() * (1.0 - tanhC[s].array().square())).matrix();
    MatD da(4 * h, p.batch);
    const auto put = [&](int k, const MatD& v) { da.middleRows(p.offset[static_cast<size_t>(k)], h) = v; };
    put(0, (dc.array() * g.array() * i.array() * (1.0 - i.array())).matrix());
    put(1, (dc.array() * cs[s].array() * f.array() * (1.0 - f.array())).matrix());
    put(2, (dc.array() * i.array() * (1.0 - g.array().square())).matrix());
    put(3, (dh.array() * tanhC[s].array() * o.array() * (1.0 - o.array())).matrix());
    MatD in(e + h, p.batch);
    in << p.x[s].cast<double>(), hs[s];
    r.dw += da * in.transpose();
    r.db += da.rowwise().sum();
    dhNext = w.rightCols(h).transpose() * da;
    dcNext = (dc.array() * f.array()).matrix();
  }
  r.dh0 = dhNext;
  r.dc0 = dcNext;
  return r;
}

// The layer through `backend`'s operations, in float; the results come back to the host.
inline LstmResult runLstmLayer(Backend& backend, const LstmProblem& p) {
  const int64_t e = p.input;
  const int64_t h = p.hidden;
  const int64_t n = p.batch;
  const int64_t steps = p.steps;
  const auto zeros = [&](int64_t rows, int64_t cols) { return upload(backend, MatF::Zero(rows, cols)); };
  const Tensor w = upload(backend, p.w);
  const Tensor wx = w.middleCols(0, e);
  const Tensor wh = w.middleCols(e, h);
  const Tensor bias = upload(backend, p.b);
  const Tensor ones = upload(backend, MatF::Ones(1, n * steps));
  MatF xHost(e, n * steps);
  for (int64_t t = 0; t < steps; ++t) xHost.middleCols(t * n, n) = p.x[static_cast<size_t>(t)];
  const Tensor x = upload(backend, xHost);
  // hidden: h0 and every step's output side by side, so the recurrent weights'
  // gradient is one GEMM over the first T blocks.
  Tensor hidden = backend.allocate(h, n * (steps + 1));
  Tensor h0 = hidden.middleCols(0, n);
  backend.copy(cpu::view(p.h0), h0);
  const Tensor c0 = upload(backend, p.c0);
  // The input products and the bias of all steps at once, then per step the recurrent product.
  Tensor gates = backend.allocate(4 * h, n * steps);
  backend.gemm(Trans::kNo, Trans::kNo, 1.0f, wx, x, 0.0f, gates);
  backend.gemm(Trans::kNo, Trans::kNo, 1.0f, bias, ones, 1.0f, gates);
  struct Step {
    Tensor act[4], cell, tanhCell;
  };
  std::vector<Step> saved(static_cast<size_t>(steps));
  std::vector<LstmCellArgs> args(static_cast<size_t>(steps));
  std::vector<Tensor> gateViews, hiddenViews;
  for (int64_t t = 0; t < steps; ++t) {
    gateViews.push_back(gates.middleCols(t * n, n));
    hiddenViews.push_back(hidden.middleCols((t + 1) * n, n));
  }
  for (int64_t t = 0; t < steps; ++t) {
    const size_t s = static_cast<size_t>(t);
    Step& st = saved[s];
    for (Tensor& a : st.act) a = backend.allocate(h, n);
    st.cell = backend.allocate(h, n);
    st.tanhCell = backend.allocate(h, n);
    const Tensor hPrev = hidden.middleCols(t * n, n);
    backend.gemm(Trans::kNo, Trans::kNo, 1.0f, wh, hPrev, 1.0f, gateViews[s]);
    LstmCellArgs& a = args[s];
    a.gates = &gateViews[s];
    a.offset = p.offset;
    a.cPrev = t == 0 ? &c0 : &saved[s - 1].cell;
    for (size_t k = 0; k < 4; ++k) a.act[k] = &st.act[k];
    a.cell = &st.cell;
    a.tanhCell = &st.tanhCell;
    a.hidden = &hiddenViews[s];
    backend.lstmCellForward(a);
  }
  // Backward: the cell steps add into dGates, zeroed once; dc into a zeroed buffer per step.
  Tensor dGates = zeros(4 * h, n * steps);
  Tensor dh = backend.allocate(h, n);
  Tensor dhNext = zeros(h, n);
  Tensor dcNext = zeros(h, n);
  Tensor dcPrev = backend.allocate(h, n);
  const Tensor zeroState = zeros(h, n);
  for (int64_t t = steps - 1; t >= 0; --t) {
    const size_t s = static_cast<size_t>(t);
    backend.copy(cpu::view(p.dy[s]), dh);
    backend.axpy(1.0f, dhNext, dh);
    backend.copy(zeroState, dcPrev);
    Tensor dg = dGates.middleCols(t * n, n);
    backend.lstmCellBackward(args[s], &dh, &dcNext, dg, &dcPrev);
    backend.gemm(Trans::kYes, Trans::kNo, 1.0f, wh, dg, 0.0f, dhNext);
    std::swap(dcNext, dcPrev);
  }
  Tensor dw = backend.allocate(4 * h, e + h);
  Tensor dwx = dw.middleCols(0, e);
  Tensor dwh = dw.middleCols(e, h);
  backend.gemm(Trans::kNo, Trans::kYes, 1.0f, dGates, x, 0.0f, dwx);
  backend.gemm(Trans::kNo, Trans::kYes, 1.0f, dGates, hidden.middleCols(0, n * steps), 0.0f, dwh);
  Tensor db = backend.allocate(4 * h, 1);
  backend.sumColumns(dGates, 0.0f, db);
  LstmResult r;
  for (const Tensor& out : hiddenViews) r.h.push_back(download(backend, out).cast<double>());
  r.dw = download(backend, dw).cast<double>();
  r.db = download(backend, db).cast<double>();
  r.dh0 = download(backend, dhNext).cast<double>();
  r.dc0 = download(backend, dcNext).cast<double>();
  return r;
}

// One gate's matrix or bias in cuDNN's weight space, as cudnnGetRNNWeightParams
// gives it: the float offset of element (0, 0) and the strides of rows and columns.
struct CudnnBlock {
  int64_t offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t rowStride = 0;
  int64_t colStride = 0;
};

// cuDNN's LSTM linear layers (linLayerID): 0-3 the input matrices of gates i, f,
// c', o (H x E), 4-7 the recurrent ones (H x H); each with a bias (H).
struct CudnnLstmLayout {
  std::array<CudnnBlock, 8> matrix;
  std::array<CudnnBlock, 8> bias;
  int64_t floats = 0;  // the weight space's size
};

// The layout cuDNN documents (and PyTorch's flat weights follow): the eight
// matrices row-major one after another, then the eight biases. For the CPU test;
// the GPU test reads the real one from cuDNN.
inline CudnnLstmLayout packedLayout(int64_t input, int64_t hidden) {
  CudnnLstmLayout l;
  int64_t at = 0;
  for (int k = 0; k < 8; ++k) {
    const int64_t cols = k < 4 ? input : hidden;
    l.matrix[static_cast<size_t>(k)] = {at, hidden, cols, cols, 1};
    at += hidden * cols;
  }
  for (int k = 0; k < 8; ++k) {
    l.bias[static_cast<size_t>(k)] = {at, hidden, 1, 1, 1};
    at += hidden;
  }
  l.floats = at;
  return l;
}

inline int64_t at(const CudnnBlock& b, int64_t r, int64_t c) { return b.offset + r * b.rowStride + c * b.colStride; }

// Error unless every block has the shape an LSTM of these sizes needs and lies inside the space.
inline void checkLayout(const CudnnLstmLayout& l, int64_t input, int64_t hidden) {
  for (int k = 0; k < 8; ++k) {
    const CudnnBlock& m = l.matrix[static_cast<size_t>(k)];
    const CudnnBlock& b = l.bias[static_cast<size_t>(k)];
    const int64_t cols = k < 4 ? input : hidden;
    ORPHEUS_ENFORCE(m.rows == hidden && m.cols == cols && b.rows == hidden && b.cols == 1,
                    "cuDNN linear layer {}: matrix {}x{}, bias {}x{}; expected {}x{} and {}x1", k, m.rows, m.cols,
                    b.rows, b.cols, hidden, cols, hidden);
    ORPHEUS_ENFORCE(m.offset >= 0 && at(m, hidden - 1, cols - 1) < l.floats && b.offset >= 0 &&
                        at(b, hidden - 1, 0) < l.floats,
                    "cuDNN linear layer {} lies outside the weight space of {} floats", k, l.floats);
  }
}

// Our W and b in cuDNN's weight space: gate k's input matrix is W's rows
// offset[k].. over the first E columns, its recurrent matrix the same rows over
// the last H; b goes into the input biases, zeros into the recurrent ones.
inline std::vector<float> packCudnnWeights(const LstmProblem& p, const CudnnLstmLayout& l) {
  checkLayout(l, p.input, p.hidden);
  std::vector<float> space(static_cast<size_t>(l.floats), 0.0f);
  for (int k = 0; k < 4; ++k) {
    const int64_t row0 = p.offset[static_cast<size_t>(k)];
    const CudnnBlock& in = l.matrix[static_cast<size_t>(k)];
    const CudnnBlock& rec = l.matrix[static_cast<size_t>(k + 4)];
    for (int64_t r = 0; r < p.hidden; ++r) {
      for (int64_t c = 0; c < p.input; ++c) space[static_cast<size_t>(at(in, r, c))] = p.w(row0 + r, c);
      for (int64_t c = 0; c < p.hidden; ++c) space[static_cast<size_t>(at(rec, r, c))] = p.w(row0 + r, p.input + c);
      space[static_cast<size_t>(at(l.bias[static_cast<size_t>(k)], r, 0))] = p.b(row0 + r, 0);
      space[static_cast<size_t>(at(l.bias[static_cast<size_t>(k + 4)], r, 0))] = 0.0f;
    }
  }
  return space;
}

// The gradient in cuDNN's weight space back in our layout. dbRecurrent: the
// recurrent biases' gradient (cuDNN gives each bias the gates' summed gradient,
// so it equals db).
inline void unpackCudnnGradients(const std::vector<float>& space, const CudnnLstmLayout& l, const LstmProblem& p,
                                 MatD& dw, MatD& db, MatD& dbRecurrent) {
  checkLayout(l, p.input, p.hidden);
  ORPHEUS_ENFORCE(static_cast<int64_t>(space.size()) == l.floats, "a weight space of {} floats, expected {}",
                  space.size(), l.floats);
  dw.resize(4 * p.hidden, p.input + p.hidden);
  db.resize(4 * p.hidden, 1);
  dbRecurrent.resize(4 * p.hidden, 1);
  for (int k = 0; k < 4; ++k) {
    const int64_t row0 = p.offset[static_cast<size_t>(k)];
    for (int64_t r = 0; r < p.hidden; ++r) {
      for (int64_t c = 0; c < p.input; ++c) {
        dw(row0 + r, c) = space[static_cast<size_t>(at(l.matrix[static_cast<size_t>(k)], r, c))];
      }
      for (int64_t c = 0; c < p.hidden; ++c) {
        dw(row0 + r, p.input + c) = space[static_cast<size_t>(at(l.matrix[static_cast<size_t>(k + 4)], r, c))];
      }
      db(row0 + r, 0) = space[static_cast<size_t>(at(l.bias[static_cast<size_t>(k)], r, 0))];
      dbRecurrent(row0 + r, 0) = space[static_cast<size_t>(at(l.bias[static_cast<size_t>(k + 4)], r, 0))];
    }
  }
}

// cuDNN's RNN data in CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED with every sequence
// T long: step t's B vectors one after another, each vector contiguous, which is
// our E x B column-major step matrices back to back.
inline std::vector<float> seqMajor(const std::vector<MatF>& steps) {
  std::vector<float> out;
  for (const MatF& m : steps) out.insert(out.end(), m.data(), m.data() + m.size());
  return out;
}

inline std::vector<MatD> fromSeqMajor(const std::vector<float>& data, int64_t rows, int64_t batch, int64_t steps) {
  ORPHEUS_ENFORCE(static_cast<int64_t>(data.size()) == rows * batch * steps, "{} floats for {} steps of {}x{}",
                  data.size(), steps, rows, batch);
  std::vector<MatD> out;
  for (int64_t t = 0; t < steps; ++t) {
    out.push_back(Eigen::Map<const MatF>(data.data() + t * rows * batch, rows, batch).cast<double>());
  }
  return out;
}

// The forward pass as cuDNN's documentation writes it, from a packed weight space:
//   i = sigmoid(W_i x + R_i h + bW_i + bR_i), f, o alike, c' = tanh(...),
//   c = f c_prev + i c', h = o tanh(c).
// In float64; checks the packing against referenceLstm without a GPU.
inline std::vector<MatD> cudnnStyleForward(const std::vector<float>& space, const CudnnLstmLayout& l,
                                           const LstmProblem& p) {
  using lstm_detail::sigmoid;
  const auto matrix = [&](const CudnnBlock& b) {
    MatD m(b.rows, b.cols);
    for (int64_t r = 0; r < b.rows; ++r)
      for (int64_t c = 0; c < b.cols; ++c) m(r, c) = space[static_cast<size_t>(at(b, r, c))];
    return m;
  };
  MatD h = p.h0.cast<double>();
  MatD c = p.c0.cast<double>();
  std::vector<MatD> out;
  for (int64_t t = 0; t < p.steps; ++t) {
    std::array<MatD, 4> pre;
    for (size_t k = 0; k < 4; ++k) {
      pre[k] = matrix(l.matrix[k]) * p.x[static_cast<size_t>(t)].cast<double>() + matrix(l.matrix[k + 4]) * h;
      pre[k].colwise() += matrix(l.bias[k]).col(0) + matrix(l.bias[k + 4]).col(0);
    }
    const MatD i = sigmoid(pre[0]);
    const MatD f = sigmoid(pre[1]);
    const MatD g = pre[2].array().tanh().matrix();
    const MatD o = sigmoid(pre[3]);
    c = (f.array() * c.array() + i.array() * g.array()).matrix();
    h = (o.array() * c.array().tanh()).matrix();
    out.push_back(h);
  }
  return out;
}

}  // namespace orpheus::ops::test
