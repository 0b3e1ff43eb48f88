// The CUDA backend against the CPU backend, op by op, with a tolerance per
// operation (float on both sides; GPU sums run in another order). Exits 77, which
// ctest reports as skipped, when this build has no CUDA backend or no GPU is
// visible, and says which.
#define CATCH_CONFIG_RUNNER
#include "gpu_main.h"
#include "backend_harness.h"

#include "engine/base/error.h"
#include "ops/backends.h"
#include "ops/rebuild.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <limits>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::test;

namespace {

double relativeError(const MatF& got, const MatF& want) { return test::relativeError(got, want.cast<double>()); }

}  // namespace

TEST_CASE("cuda gemm matches cpu", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(11);
  for (const auto& [m, n] : shapes()) {
    for (int64_t k : {int64_t{1}, int64_t{6}, int64_t{65}}) {
      for (Trans ta : {Trans::kNo, Trans::kYes}) {
        for (Trans tb : {Trans::kNo, Trans::kYes}) {
          const MatF a = ta == Trans::kNo ? randomMatrix(rng, m, k) : randomMatrix(rng, k, m);
          const MatF x = tb == Trans::kNo ? randomMatrix(rng, k, n) : randomMatrix(rng, n, k);
          const MatF c = randomMatrix(rng, m, n);
          INFO(m << "x" << n << " k " << k);
          CHECK(relativeError(runGemm(*gpu, ta, tb, -0.5f, a, x, 2.0f, c), runGemm(cpu, ta, tb, -0.5f, a, x, 2.0f, c)) <
                1e-5);
          const MatF nan = MatF::Constant(m, n, std::numeric_limits<float>::quiet_NaN());
          CHECK(runGemm(*gpu, ta, tb, 1.0f, a, x, 0.0f, nan).allFinite());
        }
      }
    }
  }
}

TEST_CASE("cuda sparse products match cpu", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(12);
  for (const auto& [m, n] : shapes()) {
    for (bool csr : {false, true}) {
      for (double density : {0.0, 0.2, 1.0}) {
        const MatF a = randomMatrix(rng, m, 9);
        const SparseF s = randomSparse(rng, 9, n, density);
        const SparseF st = randomSparse(rng, n, 9, density);
        const MatF c = randomMatrix(rng, m, n);
        INFO(m << "x" << n << " csr " << csr << " density " << density);
        CHECK(relativeError(runGemmSparse(*gpu, 0.75f, a, s, csr, Trans::kNo, 0.5f, c),
                            runGemmSparse(cpu, 0.75f, a, s, csr, Trans::kNo, 0.5f, c)) < 1e-5);
        CHECK(relativeError(runGemmSparse(*gpu, 0.75f, a, st, csr, Trans::kYes, 0.5f, c),
                            runGemmSparse(cpu, 0.75f, a, st, csr, Trans::kYes, 0.5f, c)) < 1e-5);
      }
    }
  }
}

TEST_CASE("cuda elementwise chain matches cpu, forward and backward", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(13);
  const EwChain chain = everyOpChain();
  for (const auto& [rows, cols] : shapes()) {
    const std::vector<MatF> in{randomMatrix(rng, rows, cols), randomMatrix(rng, rows, 1), randomMatrix(rng, rows, cols)};
    const std::vector<MatF> got = runChain(*gpu, chain, in, rows, cols);
    const std::vector<MatF> want = runChain(cpu, chain, in, rows, cols);
    for (size_t k = 0; k < got.size(); ++k) {
      INFO(rows << "x" << cols << " step " << k);
      CHECK(relativeError(got[k], want[k]) < 1e-5);
    }
    const MatF upstream = randomMatrix(rng, rows, cols);
    const std::vector<std::optional<MatF>> start{randomMatrix(rng, rows, cols), std::nullopt,
                                                 randomMatrix(rng, rows, cols)};
    const auto gotGrads = runChainBackward(*gpu, chain, in, want, upstream, start);
    const auto wantGrads = runChainBackward(cpu, chain, in, want, upstream, start);
    CHECK(relativeError(gotGrads[0], wantGrads[0]) < 1e-5);
    CHECK(relativeError(gotGrads[2], wantGrads[2]) < 1e-5);
  }
}

TEST_CASE("cuda refuses chains longer than one launch takes", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  EwChain chain;
  chain.inputs = 1;
  chain.steps.push_back({EwOp::kExp, {EwRef{EwRef::Kind::kInput, 0}, {}}, 1.0f});
  for (int k = 1; k < 17; ++k) chain.steps.push_back({EwOp::kTanh, {EwRef{EwRef::Kind::kStep, k - 1}, {}}, 1.0f});
  CHECK_THROWS_WITH(runChain(*gpu, chain, {MatF::Ones(2, 2)}, 2, 2),
                    Catch::Matchers::StartsWith("backend cuda does not support elementwise chains"));
}

TEST_CASE("cuda softmax cross-entropy matches cpu", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(14);
  for (const auto& [rows, cols] : shapes()) {
    const MatF z = randomMatrix(rng, rows, cols, 3.0f);
    const MatF t = randomMatrix(rng, rows, cols).cwiseAbs();
    const auto [p, loss] = runSoftmaxCrossEntropy(*gpu, z, t);
    const auto [wantP, wantLoss] = runSoftmaxCrossEntropy(cpu, z, t);
    INFO(rows << "x" << cols);
    CHECK(relativeError(p, wantP) < 1e-5);
    CHECK(relativeError(loss, wantLoss) < 1e-5);
    const MatF g = randomMatrix(rng, 1, cols);
    const MatF dz = randomMatrix(rng, rows, cols);
    for (float beta : {0.0f, 1.0f}) {
      CHECK(relativeError(runSoftmaxCrossEntropyBackward(*gpu, wantP, t, g, beta, dz),
                          runSoftmaxCrossEntropyBackward(cpu, wantP, t, g, beta, dz)) < 1e-5);
    }
  }
}

TEST_CASE("cuda column operators match cpu, forward and backward, past one grid", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(15);
  std::vector<std::pair<int64_t, int64_t>> sizes = shapes();
  sizes.emplace_back(5000, 3);   // a column longer than a block
  sizes.emplace_back(3, 70000);  // more columns than blocks
  for (const OpKind op : {OpKind::kSquaredL2, OpKind::kL2Norm, OpKind::kL1, OpKind::kSum, OpKind::kSoftmax,
                          OpKind::kLogSoftmax, OpKind::kCrossEntropy, OpKind::kDot, OpKind::kSquaredDistance}) {
    for (const auto& [rows, cols] : sizes) {
      INFO(opName(op) << " " << rows << "x" << cols);
      // cross_entropy's first operand is a probability: positive.
      const MatF a = op == OpKind::kCrossEntropy ? MatF(randomMatrix(rng, rows, cols).cwiseAbs())
                                                 : randomMatrix(rng, rows, cols, 2.0f);
      const MatF b = randomMatrix(rng, rows, cols);
      const MatF* second = arity(op) == 2 ? &b : nullptr;
      const MatF want = runColumnOp(cpu, op, a, second);
      CHECK(relativeError(runColumnOp(*gpu, op, a, second), want) < 1e-5);
      const MatF g = randomMatrix(rng, want.rows(), want.cols());
      for (int which = 0; which < arity(op); ++which) {
        CHECK(relativeError(runColumnOpBackward(*gpu, op, which, a, second, want, g),
                            runColumnOpBackward(cpu, op, which, a, second, want, g)) < 1e-5);
      }
    }
  }
}

TEST_CASE("cuda row copies and LSTM cell steps match cpu", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(15);
  for (const auto& [rows, cols] : shapes()) {
    INFO(rows << "x" << cols);
    const MatF tall = randomMatrix(rng, rows + 3, cols);
    const MatF into = randomMatrix(rng, rows + 1, cols);
    CHECK(runCopyRows(*gpu, tall, 2, into, 1, rows) == runCopyRows(cpu, tall, 2, into, 1, rows));
    const MatF gates = randomMatrix(rng, 4 * rows, cols, 2.0f);
    const MatF cPrev = randomMatrix(rng, rows, cols);
    const MatF dHidden = randomMatrix(rng, rows, cols);
    const MatF dCell = randomMatrix(rng, rows, cols);
    const MatF dGates = randomMatrix(rng, 4 * rows, cols);
    const MatF dCPrev = randomMatrix(rng, rows, cols);
    const std::vector<MatF> got = runLstmCell(*gpu, gates, cPrev, dHidden, dCell, dGates, dCPrev);
    const std::vector<MatF> want = runLstmCell(cpu, gates, cPrev, dHidden, dCell, dGates, dCPrev);
    for (size_t k = 0; k < got.size(); ++k) {
      INFO("output " << k);
      CHECK(relativeError(got[k], want[k]) < 1e-5);
    }
    // Deterministic: no atomics, the same bits run after run.
    const std::vector<MatF> again = runLstmCell(*gpu, gates, cPrev, dHidden, dCell, dGates, dCPrev);
    for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == again[k]);
  }
}

TEST_CASE("cuda reductions, axpy and scale match cpu", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(15);
  for (const auto& [rows, cols] : shapes()) {
    const MatF a = randomMatrix(rng, rows, cols);
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      const MatF col = randomMatrix(rng, rows, 1);
      const MatF row = randomMatrix(rng, 1, cols);
      INFO(rows << "x" << cols << " beta " << beta);
      CHECK(relativeError(runSumColumns(*gpu, a, beta, col), runSumColumns(cpu, a, beta, col)) < 1e-5);
      CHECK(relativeError(runSumRows(*gpu, a, beta, row), runSumRows(cpu, a, beta, row)) < 1e-5);
    }
    // Summed in the same order (ops/operators.h, sumColumnsInOrder): the same bits.
    CHECK(runSumColumns(*gpu, a, 0.0f, MatF::Zero(rows, 1)) == runSumColumns(cpu, a, 0.0f, MatF::Zero(rows, 1)));
    const MatF y = randomMatrix(rng, rows, cols);
    CHECK(relativeError(runAxpy(*gpu, -1.5f, a, y), runAxpy(cpu, -1.5f, a, y)) < 1e-6);
    CHECK(relativeError(runScale(*gpu, 0.25f, a), runScale(cpu, 0.25f, a)) < 1e-6);
  }
}

TEST_CASE("cuda copyParts and addInOrder are bitwise the cpu's, past one table and one grid", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(16);
  // 70 parts (two tables), one of them longer than 65535 blocks of 256 threads.
  std::vector<MatF> srcs;
  std::vector<std::optional<float>> scales;
  for (int k = 0; k < 70; ++k) {
    srcs.push_back(randomMatrix(rng, 2048, k == 3 ? 8400 : 1 + k % 4));
    scales.push_back(k % 2 == 0 ? std::nullopt : std::optional<float>(0.01f * static_cast<float>(k)));
  }
  const uint64_t before = gpu->launches();
  CHECK(same(runCopyParts(*gpu, srcs, scales), runCopyParts(cpu, srcs, scales)));
  CHECK(gpu->launches() - before == 70 + 2 + 1);
  std::vector<MatF> terms;
  for (int k = 0; k < 20; ++k) terms.push_back(randomMatrix(rng, 2048, 4100));
  const MatF y = randomMatrix(rng, 2048, 4100);
  CHECK(same(runAddInOrder(*gpu, terms, y), runAddInOrder(cpu, terms, y)));
}

TEST_CASE("cuda backend refuses host operands outside copy", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  MatF host = MatF::Ones(2, 2);
  Tensor t = cpu::view(host);
  CHECK_THROWS_AS(gpu->scale(2.0f, t), Error);
}

TEST_CASE("cuda asynchronous copies deliver the data, in order, timed", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  std::mt19937 rng(13);
  // Large enough that the copies take measurable time behind a queued product.
  const MatF a = randomMatrix(rng, 2048, 784);
  const MatF b = randomMatrix(rng, 784, 400);
  const Tensor da = upload(*gpu, a);
  const Tensor db = upload(*gpu, b);
  Tensor c = gpu->allocate(2048, 400);
  HostBuffer staging = gpu->allocateHost(static_cast<size_t>(a.size() + c.size()) * sizeof(float));
  // The product is queued on the compute stream; the copy of c waits for it.
  gpu->gemm(Trans::kNo, Trans::kNo, 1.0f, da, db, 0.0f, c);
  const AsyncCopy ca = gpu->copyToHostAsync(da, staging, 0);
  const AsyncCopy cc = gpu->copyToHostAsync(c, staging, static_cast<size_t>(a.size()) * sizeof(float));
  const Event computed = gpu->record();
  gpu->wait(cc.done);
  CHECK(gpu->ready(ca.done));
  const Tensor hostA = staging.floats(0, a.rows(), a.cols());
  CHECK(std::memcmp(hostA.data(), a.data(), static_cast<size_t>(a.size()) * sizeof(float)) == 0);
  const Tensor hostC = staging.floats(static_cast<size_t>(a.size()) * sizeof(float), c.rows(), c.cols());
  const MatF product = Eigen::Map<const MatF>(hostC.data(), c.rows(), c.cols());
  CHECK(relativeError(product, download(*gpu, c)) == 0.0);
  gpu->wait(computed);
  CHECK(gpu->secondsBetween(ca.started, ca.done) > 0.0);
  CHECK(gpu->secondsBetween(ca.done, cc.started) >= 0.0);  // in order on the copy stream
  // And back: an operation after waitOnDevice reads what landed.
  Tensor back = gpu->allocate(a.rows(), a.cols());
  const AsyncCopy up = gpu->copyToDeviceAsync(staging, 0, back);
  gpu->waitOnDevice(up.done);
  gpu->scale(2.0f, back);
  const MatF twice = 2.0f * a;
  CHECK(relativeError(download(*gpu, back), twice) == 0.0);
  // Events of another backend are refused.
  cpu::CpuBackend cpu;
  CHECK_THROWS_AS(cpu.wait(up.done), Error);
}

namespace {

// Batches of `n` columns each for W (rows x cols): dense V, or sparse V at ~5% density.
std::vector<SvBatch> trainingBatches(std::mt19937& rng, int count, int64_t rows, int64_t cols, int64_t n, bool sparse) {
  std::vector<SvBatch> batches(static_cast<size_t>(count));
  for (SvBatch& b : batches) {
    b.coeffs = randomMatrix(rng, n, 1).col(0) * 0.01f;
    SvMatrix m;
    m.paramId = 0;
    m.u = randomMatrix(rng, rows, n);
    m.sparseV = sparse;
    if (sparse) {
      m.vSparse = randomSparse(rng, cols, n, 0.05);
    } else {
      m.vDense = randomMatrix(rng, cols, n);
    }
    b.matrices = {m};
  }
  return batches;
}

ParamSet rebuildOn(Backend& backend, const std::vector<SvBatch>& batches, const MatF& w0, RebuildBuffers& buffers) {
  ParamSet w;
  w.params.push_back({"W", w0});
  std::vector<SvBatchView> views;
  for (const SvBatch& b : batches) views.push_back(viewOf(b));
  std::vector<const SvBatchView*> ptrs;
  for (const SvBatchView& v : views) ptrs.push_back(&v);
  applySvBatches(ptrs, w, backend, buffers);
  return w;
}

}  // namespace

TEST_CASE("cuda rebuild at training shapes matches cpu, is deterministic, and keeps its buffers", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(31);
  for (bool sparse : {false, true}) {
    INFO((sparse ? "sparse V" : "dense V"));
    // An np-4 clock of an MLP's first layer: W 2048 x 784, 4 batches of 100 columns.
    const auto batches = trainingBatches(rng, 4, 2048, 784, 100, sparse);
    const MatF w0 = randomMatrix(rng, 2048, 784);
    RebuildBuffers gpuBuffers, cpuBuffers;
    const ParamSet onGpu = rebuildOn(*gpu, batches, w0, gpuBuffers);
    const ParamSet onCpu = rebuildOn(cpu, batches, w0, cpuBuffers);
    CHECK(relativeError(onGpu[0], onCpu[0]) < 1e-5);
    const float* deviceW = gpuBuffers.device.w.at(0).data();
    const ParamSet again = rebuildOn(*gpu, batches, w0, gpuBuffers);
    CHECK(std::memcmp(again[0].data(), onGpu[0].data(), static_cast<size_t>(w0.size()) * sizeof(float)) == 0);
    CHECK(gpuBuffers.device.w.at(0).data() == deviceW);  // no allocation at the second clock
  }
}

TEST_CASE("cuda elementwise chains and reductions run past one grid", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(32);
  // 4096 x 4200 = 17.2 M elements: more than 65535 blocks of 256 threads.
  const MatF x = randomMatrix(rng, 4096, 4200);
  const MatF bias = randomMatrix(rng, 4096, 1);
  const MatF y = randomMatrix(rng, 4096, 4200);
  const EwChain chain = everyOpChain();
  const std::vector<MatF> g = runChain(*gpu, chain, {x, bias, y}, 4096, 4200);
  const std::vector<MatF> c = runChain(cpu, chain, {x, bias, y}, 4096, 4200);
  for (size_t k = 0; k < g.size(); ++k) CHECK(relativeError(g[k], c[k]) < 1e-5);
  const MatF tall = randomMatrix(rng, 17000000, 1);
  CHECK(relativeError(runScale(*gpu, 0.5f, tall), MatF(0.5f * tall)) < 1e-6);
}

TEST_CASE("cuda optimizer steps match cpu", "[gpu]") {
  const auto gpu = makeBackend("cuda", 0);
  cpu::CpuBackend cpu;
  std::mt19937 rng(33);
  std::vector<std::pair<int64_t, int64_t>> sizes = shapes();
  sizes.emplace_back(300, 77);
  sizes.emplace_back(4096, 4200);  // more than 65535 blocks of 256 threads
  for (const OptimizerStep::Kind kind : {OptimizerStep::Kind::kSgd, OptimizerStep::Kind::kMomentum,
                                         OptimizerStep::Kind::kNesterov, OptimizerStep::Kind::kAdagrad,
                                         OptimizerStep::Kind::kAdam}) {
    for (const float wd : {0.0f, 0.01f}) {
      std::vector<OptimizerStep> steps;
      for (int t = 1; t <= 3; ++t) steps.push_back(optimizerSettings(kind, wd, t));
      for (const auto& [rows, cols] : sizes) {
        if (rows * cols > 1000000 && kind != OptimizerStep::Kind::kAdam) continue;  // the grid-stride loop, once
        std::vector<MatF> gradients;
        for (size_t t = 0; t < steps.size(); ++t) gradients.push_back(randomMatrix(rng, rows, cols));
        const OptimizerState start{randomMatrix(rng, rows, cols), MatF(), MatF()};
        const OptimizerState got = runOptimizerSteps(*gpu, steps, gradients, start);
        const OptimizerState want = runOptimizerSteps(cpu, steps, gradients, start);
        INFO("kind " << static_cast<int>(kind) << " wd " << wd << " " << rows << "x" << cols);
        CHECK(relativeError(got.param, want.param) < 1e-6);
        CHECK(relativeError(got.buffer0, want.buffer0) < 1e-6);
        CHECK(relativeError(got.buffer1, want.buffer1) < 1e-6);
      }
    }
  }
}

int main(int argc, char** argv) { return orpheus::ops::test::runGpuTests(argc, argv); }
