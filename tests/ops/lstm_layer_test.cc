// The host side of the cuDNN comparison (lstm_layer.h), without a GPU: the float64
// reference against finite differences, the layer through the CPU backend's
// operations against the reference, and the map into cuDNN's weight space against
// a forward pass written in cuDNN's own terms.
#include "lstm_layer.h"

#include "engine/base/error.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::test;

namespace {

// examples/lstm.loss's gate order, and one that is not cuDNN's.
constexpr std::array<int64_t, 4> kInOrder{0, 1, 2, 3};
constexpr std::array<int64_t, 4> kShuffled{1, 3, 2, 0};

std::array<int64_t, 4> offsets(std::array<int64_t, 4> blocks, int64_t hidden) {
  for (int64_t& b : blocks) b *= hidden;
  return blocks;
}

// The loss whose gradient the layers compute: sum_t <dy_t, h_t>.
double upstreamLoss(const LstmProblem& p) {
  const LstmResult r = referenceLstm(p);
  double sum = 0.0;
  for (size_t t = 0; t < r.h.size(); ++t) sum += (p.dy[t].cast<double>().array() * r.h[t].array()).sum();
  return sum;
}

// Central differences of upstreamLoss in each entry of `m` (a float of p), divided
// by the perturbation the float entries really took.
MatD finiteDifferences(LstmProblem p, MatF LstmProblem::*member) {
  MatF& m = p.*member;
  MatD grad(m.rows(), m.cols());
  for (int64_t k = 0; k < m.size(); ++k) {
    const float keep = m.data()[k];
    const float up = keep + 1e-2f;
    const float down = keep - 1e-2f;
    m.data()[k] = up;
    const double lossUp = upstreamLoss(p);
    m.data()[k] = down;
    const double lossDown = upstreamLoss(p);
    m.data()[k] = keep;
    grad.data()[k] = (lossUp - lossDown) / (static_cast<double>(up) - static_cast<double>(down));
  }
  return grad;
}

}  // namespace

TEST_CASE("the float64 LSTM reference's gradients match finite differences", "[ops][lstm]") {
  std::mt19937 rng(61);
  for (const auto& order : {kInOrder, kShuffled}) {
    const LstmProblem p = randomLstmProblem(rng, 3, 4, 2, 3, offsets(order, 4));
    const LstmResult r = referenceLstm(p);
    INFO("gate blocks " << order[0] << order[1] << order[2] << order[3]);
    // Central differences with a step of 1e-2: exact up to O(1e-4) relative.
    CHECK(relativeFrobenius(r.dw, finiteDifferences(p, &LstmProblem::w)) < 1e-3);
    CHECK(relativeFrobenius(r.db, finiteDifferences(p, &LstmProblem::b)) < 1e-3);
    CHECK(relativeFrobenius(r.dh0, finiteDifferences(p, &LstmProblem::h0)) < 1e-3);
    CHECK(relativeFrobenius(r.dc0, finiteDifferences(p, &LstmProblem::c0)) < 1e-3);
  }
}

TEST_CASE("the LSTM layer through the cpu and strict backends' operations matches the float64 reference",
          "[ops][lstm]") {
  cpu::CpuBackend cpu;
  const auto strict = strict::makeStrictBackend();
  std::mt19937 rng(62);
  for (const auto& order : {kInOrder, kShuffled}) {
    const LstmProblem p = randomLstmProblem(rng, 9, 16, 5, 7, offsets(order, 16));
    const LstmResult want = referenceLstm(p);
    const LstmResult got = runLstmLayer(cpu, p);
    INFO("gate blocks " << order[0] << order[1] << order[2] << order[3]);
    CHECK(relativeFrobenius(stacked(got.h), stacked(want.h)) < 1e-5);
    CHECK(relativeFrobenius(got.dw, want.dw) < 1e-5);
    CHECK(relativeFrobenius(got.db, want.db) < 1e-5);
    CHECK(relativeFrobenius(got.dh0, want.dh0) < 1e-5);
    CHECK(relativeFrobenius(got.dc0, want.dc0) < 1e-5);
    // Every operation on device memory: the strict device runs it too, to the same bits.
    const LstmResult onStrict = runLstmLayer(*strict, p);
    CHECK(stacked(onStrict.h) == stacked(got.h));
    CHECK(onStrict.dw == got.dw);
  }
}

TEST_CASE("our LSTM weights packed into cuDNN's weight space give cuDNN's equations our outputs", "[ops][lstm]") {
  std::mt19937 rng(63);
  const int64_t e = 5;
  const int64_t h = 6;
  // The documented layout, and one with column-major matrices and the blocks in
  // reverse: the packing follows the strides and offsets it is given.
  CudnnLstmLayout reversed;
  int64_t next = 0;
  for (int k = 7; k >= 0; --k) {
    const int64_t cols = k < 4 ? e : h;
    reversed.bias[static_cast<size_t>(k)] = {next, h, 1, 1, 1};
    next += h;
    reversed.matrix[static_cast<size_t>(k)] = {next, h, cols, 1, h};
    next += h * cols;
  }
  reversed.floats = next;
  for (const CudnnLstmLayout& layout : {packedLayout(e, h), reversed}) {
    for (const auto& order : {kInOrder, kShuffled}) {
      const LstmProblem p = randomLstmProblem(rng, e, h, 3, 4, offsets(order, h));
      const std::vector<float> space = packCudnnWeights(p, layout);
      INFO("gate blocks " << order[0] << order[1] << order[2] << order[3] << ", first block at "
                          << layout.matrix[0].offset);
      CHECK(relativeFrobenius(stacked(cudnnStyleForward(space, layout, p)), stacked(referenceLstm(p).h)) < 1e-12);
      // Forget gate, input column 2 of row 4; candidate gate, recurrent column 1 of row 3.
      CHECK(space[static_cast<size_t>(at(layout.matrix[1], 4, 2))] == p.w(p.offset[1] + 4, 2));
      CHECK(space[static_cast<size_t>(at(layout.matrix[6], 3, 1))] == p.w(p.offset[2] + 3, e + 1));
      // A weight space read back as a gradient gives W and b again, and the recurrent biases' zeros.
      MatD dw, db, dbRecurrent;
      unpackCudnnGradients(space, layout, p, dw, db, dbRecurrent);
      CHECK(dw == p.w.cast<double>());
      CHECK(db == p.b.cast<double>());
      CHECK(dbRecurrent.isZero(0.0));
    }
  }
  LstmProblem p = randomLstmProblem(rng, e, h, 3, 4, offsets(kInOrder, h));
  CudnnLstmLayout wrong = packedLayout(e, h);
  wrong.matrix[5].cols = e;
  CHECK_THROWS_WITH(packCudnnWeights(p, wrong),
                    Catch::Matchers::Contains("cuDNN linear layer 5: matrix 6x5, bias 6x1; expected 6x6 and 6x1"));
  wrong = packedLayout(e, h);
  wrong.floats -= 1;
  CHECK_THROWS_WITH(packCudnnWeights(p, wrong), Catch::Matchers::Contains("outside the weight space"));
}

TEST_CASE("cuDNN's sequence-major packed data is our step matrices back to back", "[ops][lstm]") {
  std::mt19937 rng(64);
  std::vector<MatF> steps{randomMatrix(rng, 4, 3), randomMatrix(rng, 4, 3)};
  const std::vector<float> data = seqMajor(steps);
  // Element (t, b, k): vector b of step t, entry k.
  CHECK(data[static_cast<size_t>((1 * 3 + 2) * 4 + 1)] == steps[1](1, 2));
  const std::vector<MatD> back = fromSeqMajor(data, 4, 3, 2);
  CHECK(back[0] == steps[0].cast<double>());
  CHECK(back[1] == steps[1].cast<double>());
  CHECK_THROWS_WITH(fromSeqMajor(data, 4, 3, 3), Catch::Matchers::Contains("24 floats for 3 steps of 4x3"));
}
