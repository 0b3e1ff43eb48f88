// Every operation of the CPU backend against a float64 reference, with a tolerance
// per operation, on random shapes (odd sizes, batch 1, sparse operands).
#include "backend_harness.h"

#include "engine/base/error.h"
#include "ops/backends.h"
#include "ops/graph_exec.h"
#include "ops/operators.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::test;

namespace {

MatD opOf(const MatF& m, Trans t) {
  const MatD d = m.cast<double>();
  return t == Trans::kYes ? MatD(d.transpose()) : d;
}

// The chain evaluated in double, one whole matrix per step.
std::vector<MatD> chainReference(const EwChain& chain, const std::vector<MatD>& in, int64_t rows, int64_t cols) {
  std::vector<MatD> step;
  const auto operand = [&](EwRef r) -> MatD {
    if (r.kind == EwRef::Kind::kStep) return step[static_cast<size_t>(r.index)];
    const MatD& m = in[static_cast<size_t>(r.index)];
    return m.cols() == 1 ? MatD(m.replicate(1, cols)) : m;
  };
  for (const EwStep& s : chain.steps) {
    const MatD a = operand(s.operand[0]);
    MatD out(rows, cols);
    switch (s.op) {
      case EwOp::kSigmoid: out = (1.0 + (-a.array()).exp()).inverse().matrix(); break;
      case EwOp::kTanh: out = a.array().tanh().matrix(); break;
      case EwOp::kRelu: out = a.cwiseMax(0.0); break;
      case EwOp::kExp: out = a.array().exp().matrix(); break;
      case EwOp::kLog: out = a.array().log().matrix(); break;
      case EwOp::kScale: out = static_cast<double>(s.attr) * a; break;
      case EwOp::kAdd: out = a + operand(s.operand[1]); break;
      case EwOp::kSubtract: out = a - operand(s.operand[1]); break;
      case EwOp::kMultiply: out = a.cwiseProduct(operand(s.operand[1])); break;
    }
    step.push_back(out);
  }
  return step;
}

std::vector<MatD> castAll(const std::vector<MatF>& v) {
  std::vector<MatD> d;
  for (const MatF& m : v) d.push_back(m.cast<double>());
  return d;
}

// Softmax + cross-entropy of one column, in double.
double crossEntropyReference(const Eigen::VectorXd& z, const Eigen::VectorXd& t) {
  const Eigen::VectorXd e = (z.array() - z.maxCoeff()).exp().matrix();
  const Eigen::VectorXd p = e / e.sum();
  return -(t.array() * p.array().max(static_cast<double>(std::numeric_limits<float>::min())).log()).sum();
}

MatF oneHotTargets(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  MatF t = MatF::Zero(rows, cols);
  for (int64_t j = 0; j < cols; ++j) t(pick(rng), j) = 1.0f;
  return t;
}

}  // namespace

TEST_CASE("cpu gemm matches float64 for every transpose, alpha and beta", "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(1);
  for (const auto& [m, n] : shapes()) {
    for (int64_t k : {int64_t{1}, int64_t{6}, int64_t{65}}) {
      for (Trans ta : {Trans::kNo, Trans::kYes}) {
        for (Trans tb : {Trans::kNo, Trans::kYes}) {
          for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{1.0f, 1.0f}, std::pair{-0.5f, 2.0f}}) {
            const MatF a = ta == Trans::kNo ? randomMatrix(rng, m, k) : randomMatrix(rng, k, m);
            const MatF x = tb == Trans::kNo ? randomMatrix(rng, k, n) : randomMatrix(rng, n, k);
            const MatF c = randomMatrix(rng, m, n);
            const MatD want = alpha * opOf(a, ta) * opOf(x, tb) + beta * c.cast<double>();
            INFO(m << "x" << n << " k " << k << " alpha " << alpha << " beta " << beta);
            CHECK(relativeError(runGemm(b, ta, tb, alpha, a, x, beta, c), want) < 1e-5);
          }
        }
      }
    }
  }
}

TEST_CASE("cpu gemm with beta 0 never reads the output", "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(2);
  const MatF c = MatF::Constant(5, 3, std::numeric_limits<float>::quiet_NaN());
  const MatF got = runGemm(b, Trans::kNo, Trans::kNo, 1.0f, randomMatrix(rng, 5, 4), randomMatrix(rng, 4, 3), 0.0f, c);
  CHECK(got.allFinite());
}

TEST_CASE("cpu gemm is bitwise the Eigen product the rebuild used", "[ops][backend][rebuild]") {
  cpu::CpuBackend b;
  std::mt19937 rng(3);
  // Small shapes take Eigen's coefficient-wise product, large ones its GEMM kernel.
  for (const auto& [j, k, n] : {std::tuple{1, 1, 1}, std::tuple{3, 4, 2}, std::tuple{10, 784, 100},
                                std::tuple{64, 5, 7}, std::tuple{33, 65, 17}}) {
    const MatF u = randomMatrix(rng, j, n);
    const MatF v = randomMatrix(rng, k, n);
    MatF w = randomMatrix(rng, j, k);
    MatF want = w;
    want.noalias() += u * v.transpose();
    Tensor tw = cpu::view(w);
    b.gemm(Trans::kNo, Trans::kYes, 1.0f, cpu::view(u), cpu::view(v), 1.0f, tw);
    CHECK(w == want);

    const SparseF vs = randomSparse(rng, k, n, 0.3);
    MatF ws = randomMatrix(rng, j, k);
    MatF wantSparse = ws;
    wantSparse.noalias() += (vs * u.transpose()).transpose();
    Tensor tws = cpu::view(ws);
    b.gemmSparse(1.0f, cpu::view(u), cpu::view(vs), Trans::kYes, 1.0f, tws);
    CHECK(ws == wantSparse);
  }
}

TEST_CASE("cpu sparse products match float64 for CSC and CSR, plain and transposed", "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(4);
  for (const auto& [m, n] : shapes()) {
    for (int64_t k : {int64_t{1}, int64_t{9}, int64_t{40}}) {
      for (bool csr : {false, true}) {
        for (double density : {0.0, 0.2, 1.0}) {
          const float alpha = 0.75f;
          const float beta = 0.5f;
          // a * s: s is k x n.  a * s^T: s is n x k.
          const MatF a = randomMatrix(rng, m, k);
          const SparseF s = randomSparse(rng, k, n, density);
          const SparseF st = randomSparse(rng, n, k, density);
          const MatF c = randomMatrix(rng, m, n);
          INFO(m << "x" << n << " k " << k << " csr " << csr << " density " << density);
          const MatD want = alpha * a.cast<double>() * MatD(s.cast<double>()) + beta * c.cast<double>();
          CHECK(relativeError(runGemmSparse(b, alpha, a, s, csr, Trans::kNo, beta, c), want) < 1e-5);
          const MatD wantT = alpha * a.cast<double>() * MatD(st.cast<double>()).transpose() + beta * c.cast<double>();
          CHECK(relativeError(runGemmSparse(b, alpha, a, st, csr, Trans::kYes, beta, c), wantT) < 1e-5);
          const MatF nan = MatF::Constant(m, n, std::numeric_limits<float>::quiet_NaN());
          CHECK(runGemmSparse(b, alpha, a, s, csr, Trans::kNo, 0.0f, nan).allFinite());
        }
      }
    }
  }
}

TEST_CASE("cpu elementwise chain matches float64, forward and backward", "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(5);
  const EwChain chain = everyOpChain();
  for (const auto& [rows, cols] : shapes()) {
    const std::vector<MatF> in{randomMatrix(rng, rows, cols), randomMatrix(rng, rows, 1), randomMatrix(rng, rows, cols)};
    const std::vector<MatF> got = runChain(b, chain, in, rows, cols);
    const std::vector<MatD> want = chainReference(chain, castAll(in), rows, cols);
    REQUIRE(got.size() == want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      INFO(rows << "x" << cols << " step " << k);
      CHECK(relativeError(got[k], want[k]) < 1e-5);
    }

    // Backward: every element depends only on the same element of each input, so a
    // central difference over a whole input at once gives every partial derivative.
    const MatF upstream = randomMatrix(rng, rows, cols);
    const MatF start0 = randomMatrix(rng, rows, cols);
    const MatF start2 = randomMatrix(rng, rows, cols);
    const std::vector<MatF> grads = runChainBackward(b, chain, in, got, upstream, {start0, std::nullopt, start2});
    for (size_t input : {size_t{0}, size_t{2}}) {
      const double h = 1e-6;
      std::vector<MatD> plus = castAll(in);
      std::vector<MatD> minus = castAll(in);
      plus[input].array() += h;
      minus[input].array() -= h;
      const MatD slope =
          (chainReference(chain, plus, rows, cols).back() - chainReference(chain, minus, rows, cols).back()) / (2 * h);
      const MatD wantGrad = (input == 0 ? start0 : start2).cast<double>() + upstream.cast<double>().cwiseProduct(slope);
      INFO(rows << "x" << cols << " gradient of input " << input);
      CHECK(relativeError(grads[input], wantGrad) < 1e-4);
    }
    CHECK(grads[1].size() == 0);
  }
}

TEST_CASE("cpu elementwise refuses a chain that refers to a later step", "[ops][backend]") {
  cpu::CpuBackend b;
  EwChain chain;
  chain.inputs = 1;
  chain.steps = {{EwOp::kAdd, {EwRef{EwRef::Kind::kInput, 0}, EwRef{EwRef::Kind::kStep, 0}}, 1.0f}};
  CHECK_THROWS_AS(runChain(b, chain, {MatF::Ones(2, 2)}, 2, 2), Error);
}

TEST_CASE("cpu softmax cross-entropy matches float64, and its gradient the finite differences", "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(6);
  for (const auto& [rows, cols] : shapes()) {
    for (bool soft : {false, true}) {
      const MatF z = randomMatrix(rng, rows, cols, 3.0f);
      const MatF t = soft ? MatF(randomMatrix(rng, rows, cols).cwiseAbs()) : oneHotTargets(rng, rows, cols);
      const auto [p, loss] = runSoftmaxCrossEntropy(b, z, t);
      MatD wantP(rows, cols);
      MatD wantLoss(1, cols);
      for (int64_t j = 0; j < cols; ++j) {
        const Eigen::VectorXd zj = z.col(j).cast<double>();
        const Eigen::VectorXd e = (zj.array() - zj.maxCoeff()).exp().matrix();
        wantP.col(j) = e / e.sum();
        wantLoss(0, j) = crossEntropyReference(zj, t.col(j).cast<double>());
      }
      INFO(rows << "x" << cols << " soft targets " << soft);
      CHECK(relativeError(p, wantP) < 1e-5);
      CHECK(relativeError(loss, wantLoss) < 1e-5);

      const MatF g = randomMatrix(rng, 1, cols);
      const MatF dz0 = randomMatrix(rng, rows, cols);
      MatD wantDz(rows, cols);
      const double h = 1e-6;
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) {
          Eigen::VectorXd zp = z.col(j).cast<double>();
          Eigen::VectorXd zm = zp;
          zp(i) += h;
          zm(i) -= h;
          const Eigen::VectorXd tj = t.col(j).cast<double>();
          wantDz(i, j) = g(0, j) * (crossEntropyReference(zp, tj) - crossEntropyReference(zm, tj)) / (2 * h);
        }
      }
      CHECK(relativeError(runSoftmaxCrossEntropyBackward(b, p, t, g, 0.0f, MatF::Constant(rows, cols, NAN)), wantDz) <
            1e-5);
      CHECK(relativeError(runSoftmaxCrossEntropyBackward(b, p, t, g, 1.0f, dz0), wantDz + dz0.cast<double>()) < 1e-5);
    }
  }
}

TEST_CASE("cpu reductions, axpy and scale match float64", "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(7);
  for (const auto& [rows, cols] : shapes()) {
    const MatF a = randomMatrix(rng, rows, cols);
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      const MatF col = beta == 0.0f ? MatF::Constant(rows, 1, NAN) : randomMatrix(rng, rows, 1);
      const MatF row = beta == 0.0f ? MatF::Constant(1, cols, NAN) : randomMatrix(rng, 1, cols);
      const MatD keepCol = beta == 0.0f ? MatD::Zero(rows, 1) : MatD(beta * col.cast<double>());
      const MatD keepRow = beta == 0.0f ? MatD::Zero(1, cols) : MatD(beta * row.cast<double>());
      INFO(rows << "x" << cols << " beta " << beta);
      CHECK(relativeError(runSumColumns(b, a, beta, col), keepCol + a.cast<double>().rowwise().sum()) < 1e-5);
      CHECK(relativeError(runSumRows(b, a, beta, row), keepRow + a.cast<double>().colwise().sum()) < 1e-5);
    }
    const MatF y = randomMatrix(rng, rows, cols);
    CHECK(relativeError(runAxpy(b, -1.5f, a, y), y.cast<double>() - 1.5 * a.cast<double>()) < 1e-6);
    CHECK(relativeError(runScale(b, 0.25f, a), 0.25 * a.cast<double>()) < 1e-6);
  }
}

TEST_CASE("sumColumns adds the columns one after another from zero, as the CUDA kernel does", "[ops][backend]") {
  // In float 1 + 1e8 is 1e8: in order (((1 + 1e8) - 1e8) + 1) + 1 = 2, where Eigen's
  // rowwise().sum() pairs the columns, 1 + ((1e8 - 1e8) + (1 + 1)) = 3. A bias update
  // formed on the host must have the bits of one formed on a device (a replay forms
  // on the host what the live clock formed on the device).
  MatF a(16, 5);
  for (Eigen::Index i = 0; i < a.rows(); ++i) a.row(i) << 1.0f, 1e8f, -1e8f, 1.0f, 1.0f;
  CHECK((ops::sumColumnsInOrder(a).array() == 2.0f).all());
  cpu::CpuBackend cpu;
  const auto strict = makeBackend("strict");
  for (Backend* b : {static_cast<Backend*>(&cpu), strict.get()}) {
    INFO(b->name());
    CHECK((runSumColumns(*b, a, 0.0f, MatF::Zero(16, 1)).array() == 2.0f).all());
    CHECK((runSumColumns(*b, a, 1.0f, MatF::Constant(16, 1, 0.5f)).array() == 2.5f).all());
  }
}

TEST_CASE("cpu copyParts copies and scales bit for bit, addInOrder adds term by term, each a launch per table",
          "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(8);
  // More parts and terms than one launch takes: 70 parts of 3 to 5 columns, 20 terms.
  std::vector<MatF> srcs;
  std::vector<std::optional<float>> scales;
  MatF want(13, 0);
  for (int k = 0; k < 70; ++k) {
    MatF src = randomMatrix(rng, 13, 3 + k % 3);
    if (k % 2 == 0) {
      scales.push_back(std::nullopt);
    } else {
      scales.push_back(0.1f * static_cast<float>(k));
    }
    const MatF part = scales.back() ? MatF(*scales.back() * src.array()) : src;
    want.conservativeResize(13, want.cols() + part.cols());
    want.rightCols(part.cols()) = part;
    srcs.push_back(std::move(src));
  }
  uint64_t before = b.launches();
  const MatF got = runCopyParts(b, srcs, scales);
  CHECK(b.launches() - before == 70 + 2 + 1);  // 70 uploads, 2 tables, 1 download
  CHECK(same(got, want));
  std::vector<MatF> terms;
  for (int k = 0; k < 20; ++k) terms.push_back(randomMatrix(rng, 9, 4));
  const MatF y = randomMatrix(rng, 9, 4);
  MatF sum = y;
  for (const MatF& t : terms) sum = runAxpy(b, 1.0f, t, sum);
  before = b.launches();
  CHECK(same(runAddInOrder(b, terms, y), sum));
  CHECK(b.launches() - before == 20 + 1 + 2 + 1);  // 20 terms and y in, 2 tables, y out
  // Destinations must not overlap a source or another destination.
  Tensor t = b.allocate(4, 4);
  std::vector<CopyPart> overlap;
  overlap.push_back(CopyPart{t.middleCols(0, 2), t.middleCols(1, 2)});
  CHECK_THROWS_WITH(b.copyParts(overlap),
                    Catch::Contains("copyParts: the destination of part 0 overlaps the source of part 0"));
  overlap[0] = CopyPart{t.middleCols(0, 1), t.middleCols(2, 1)};
  overlap.push_back(CopyPart{t.middleCols(1, 1), t.middleCols(2, 1)});
  CHECK_THROWS_WITH(b.copyParts(overlap),
                    Catch::Contains("copyParts: the destination of part 0 overlaps the destination of part 1"));
  overlap[1] = CopyPart{t.middleCols(1, 1), t.middleCols(3, 1)};
  b.copyParts(overlap);
  Tensor other = b.allocate(4, 2);
  overlap[1] = CopyPart{t.middleCols(1, 1), other.middleCols(0, 2)};
  CHECK_THROWS_WITH(b.copyParts(overlap), Catch::Contains("copyParts: part 1 copies 4 elements into 8"));
}

TEST_CASE("cpu backend refuses device memory and shape mismatches", "[ops][backend]") {
  cpu::CpuBackend b;
  float x = 1.0f;
  Tensor onGpu = Tensor::view(Device::kCuda, &x, 1, 1);
  Tensor host = b.allocate(1, 1);
  CHECK_THROWS_WITH(b.copy(onGpu, host), "backend cpu does not support copies to or from device memory");
  CHECK_THROWS_AS(b.scale(2.0f, onGpu), Error);
  Tensor c = b.allocate(2, 2);
  CHECK_THROWS_AS(b.gemm(Trans::kNo, Trans::kNo, 1.0f, b.allocate(2, 3), b.allocate(2, 2), 0.0f, c), Error);
}

TEST_CASE("makeBackend gives cpu and strict, and refuses cuda with one line naming --device", "[ops][backend]") {
  CHECK(std::string(makeBackend("cpu")->name()) == "cpu");
  CHECK(std::string(makeBackend("strict")->name()) == "strict");
  CHECK_THROWS_WITH(makeBackend("tpu"), "--device: unknown device 'tpu' (expected cpu, cuda, cuda:N or strict)");
  CHECK_THROWS_AS(makeBackend("cuda:x"), InputError);
  CHECK_THROWS_AS(makeBackend("cuda:"), InputError);
  const bool hasPlugin = !cudaPluginPath().empty();
  try {
    const auto cuda = makeBackend("cuda", 0);
    CHECK(hasPlugin);
    CHECK(std::string(cuda->name()) == "cuda");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find('\n') == std::string::npos);
    if (hasPlugin) {
      // The plugin loads where the CUDA libraries are; on a host without a GPU it says so.
      CHECK((msg.rfind("--device cuda: no CUDA GPU is visible (", 0) == 0 ||
             msg.rfind("--device cuda: cannot load the CUDA backend", 0) == 0));
    } else {
      CHECK(msg.rfind("--device cuda: this build has no CUDA backend (no liborpheus_cuda.so at ", 0) == 0);
    }
  }
}

TEST_CASE("the local rank comes from Open MPI, Slurm or MPICH", "[ops][backend]") {
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  unsetenv("MPI_LOCALRANKID");
  CHECK(localRankFromEnvironment() == 0);
  setenv("MPI_LOCALRANKID", "3", 1);
  CHECK(localRankFromEnvironment() == 3);
  setenv("SLURM_LOCALID", "2", 1);
  CHECK(localRankFromEnvironment() == 2);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  CHECK(localRankFromEnvironment() == 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1);
  CHECK(localRankFromEnvironment() == 2);
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  unsetenv("MPI_LOCALRANKID");
}

TEST_CASE("cpu softmax cross-entropy is bitwise the two operators it fuses", "[ops][backend]") {
  cpu::CpuBackend b;
  std::mt19937 rng(8);
  for (const auto& [rows, cols] : shapes()) {
    const Mat<float> z = randomMatrix(rng, rows, cols, 3.0f);
    const Mat<float> t = randomMatrix(rng, rows, cols).cwiseAbs();
    Operands<float> softmaxIn;
    softmaxIn.a = &z;
    const Mat<float> p = ops::forward<float>(OpKind::kSoftmax, softmaxIn);
    Operands<float> ceIn;
    ceIn.a = &p;
    ceIn.b = &t;
    const Mat<float> loss = ops::forward<float>(OpKind::kCrossEntropy, ceIn);
    const auto [gotP, gotLoss] = runSoftmaxCrossEntropy(b, z, t);
    CHECK(gotP == p);
    CHECK(gotLoss == loss);
  }
}

TEST_CASE("a float executor runs its fused chains through the backend", "[ops][backend][graph]") {
  Graph g;
  const int x = g.input("x", 4);
  const int y = g.label("y", 3);
  const int w = g.param("W", 3, 4, Init{});
  const int b = g.param("b", 3, 1, Init{});
  const int z = g.apply(OpKind::kMatVec, {w, x}, "W * x");
  const int a = g.apply(OpKind::kAdd, {z, b}, "W * x + b");
  const int h = g.apply(OpKind::kTanh, {a}, "tanh(W * x + b)");
  const int s = g.apply(OpKind::kScale, {h}, "2 * tanh(W * x + b)", 2.0);
  const int p = g.apply(OpKind::kSoftmax, {s}, "softmax(...)");
  g.setLoss(g.apply(OpKind::kCrossEntropy, {p, y}, "cross_entropy(...)"));

  std::mt19937 rng(9);
  const Mat<float> wv = randomMatrix(rng, 3, 4);
  const Mat<float> bv = randomMatrix(rng, 3, 1);
  const Mat<float> xv = randomMatrix(rng, 4, 5);
  Eigen::VectorXi labels(5);
  labels << 0, 2, 1, 1, 0;
  GraphInputs<float> in;
  in.dense = &xv;
  in.labels = &labels;
  const std::vector<const Mat<float>*> params{&wv, &bv};

  cpu::CpuBackend backend;
  GraphExecutor<float> fused(g, true, &backend);
  GraphExecutor<float> plain(g, false);
  REQUIRE(std::any_of(fused.plan().begin(), fused.plan().end(),
                      [](const FusedStep& f) { return f.kind == FusedStep::Kind::kElementwise; }));
  CHECK(std::abs(fused.forward(params, in) - plain.forward(params, in)) < 1e-5);
  fused.backward(params, in);
  plain.backward(params, in);
  const auto gf = fused.paramGradients(params, in);
  const auto gp = plain.paramGradients(params, in);
  for (size_t i = 0; i < gf.size(); ++i) CHECK((gf[i] - gp[i]).norm() <= 1e-5 * (1 + gp[i].norm()));
  CHECK((fused.grad(z) - plain.grad(z)).norm() <= 1e-5 * (1 + plain.grad(z).norm()));

  // A backend on another device cannot take the executor's host buffers: it says so.
  struct HostlessBackend : cpu::CpuBackend {
    Device device() const override { return Device::kCuda; }
  };
  HostlessBackend elsewhere;
  GraphExecutor<float> refused(g, true, &elsewhere);
  CHECK_THROWS_AS(refused.forward(params, in), Error);
}
