#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "ops/backends.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/mlr.h"
#include "ops/rebuild.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

using namespace orpheus;

namespace {

Matrix randomMatrix(int64_t rows, int64_t cols, uint64_t key) {
  CounterRng rng(7, RngPurpose::kTest, key, 0);
  Matrix m(rows, cols);
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) m(i, j) = static_cast<float>(rng.normal());
  return m;
}

SparseMatrix randomSparse(int64_t rows, int64_t cols, double density, uint64_t key) {
  CounterRng rng(7, RngPurpose::kTest, key, 1);
  std::vector<Eigen::Triplet<float, int32_t>> t;
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i)
      if (rng.uniform() < density) t.emplace_back(i, j, static_cast<float>(rng.normal()));
  SparseMatrix s(rows, cols);
  s.setFromTriplets(t.begin(), t.end());
  return s;
}

// The reference: a loop of rank-1 updates in double precision.
void applyNaive(const SvBatch& b, std::vector<Eigen::MatrixXd>& w) {
  for (const auto& m : b.matrices) {
    const Eigen::MatrixXd u = m.u.cast<double>();
    const Eigen::MatrixXd v = m.sparseV ? Eigen::MatrixXd(m.vSparse.cast<double>()) : Eigen::MatrixXd(m.vDense.cast<double>());
    const int64_t n = u.cols();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double c = 0;
        if (m.core.size() > 0) {
          c = m.core(i, j);
        } else if (i == j) {
          c = b.coeffs(i);
        }
        if (c == 0) continue;
        w[m.paramId] += c * u.col(i) * v.col(j).transpose();
        if (m.biasId >= 0 && m.core.size() == 0) w[m.biasId].col(0) += c * u.col(i);
      }
      // A core's bias update has coefficients of its own.
      if (m.biasId >= 0 && m.core.size() > 0) w[m.biasId].col(0) += m.biasCoeffs(i) * u.col(i);
    }
  }
}

}  // namespace

TEST_CASE("rebuild GEMM equals the sum of rank-1 updates", "[ops][rebuild]") {
  ParamSet w;
  w.params.push_back({"A", randomMatrix(6, 9, 1)});
  w.params.push_back({"a", randomMatrix(6, 1, 2)});
  w.params.push_back({"B", randomMatrix(5, 12, 3)});
  std::vector<Eigen::MatrixXd> ref;
  for (const auto& p : w.params) ref.push_back(p.value.cast<double>());

  std::vector<SvBatch> batches(3);
  for (size_t k = 0; k < batches.size(); ++k) {
    SvBatch& b = batches[k];
    const int64_t n = 4 + static_cast<int64_t>(k);
    b.coeffs = randomMatrix(n, 1, 10 + k).col(0);
    SvMatrix dense;
    dense.paramId = 0;
    dense.biasId = 1;
    dense.u = randomMatrix(6, n, 20 + k);
    dense.vDense = randomMatrix(9, n, 30 + k);
    SvMatrix sparse;
    sparse.paramId = 2;
    sparse.u = randomMatrix(5, n, 40 + k);
    sparse.sparseV = true;
    sparse.vSparse = randomSparse(12, n, 0.3, 50 + k);
    if (k == 2) sparse.core = randomMatrix(n, n, 60);  // a selected batch carries a core
    b.matrices = {dense, sparse};
  }
  std::vector<const SvBatch*> ptrs;
  for (const auto& b : batches) {
    ptrs.push_back(&b);
    applyNaive(b, ref);
  }
  ops::applySvBatches(ptrs, w);
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = (w[i].cast<double>() - ref[i]).norm() / ref[i].norm();
    INFO("parameter " << w.params[i].name);
    CHECK(err < 1e-6);
  }
}

TEST_CASE("rebuild applies a core's bias coefficients", "[ops][rebuild]") {
  ParamSet w;
  w.params.push_back({"A", randomMatrix(6, 9, 71)});
  w.params.push_back({"a", randomMatrix(6, 1, 72)});
  w.params.push_back({"B", randomMatrix(5, 12, 73)});
  w.params.push_back({"b", randomMatrix(5, 1, 74)});
  std::vector<Eigen::MatrixXd> ref;
  for (const auto& p : w.params) ref.push_back(p.value.cast<double>());

  // One selected batch (cores, dense and sparse V, both with a bias) and one plain batch.
  std::vector<SvBatch> batches(2);
  for (size_t k = 0; k < batches.size(); ++k) {
    SvBatch& b = batches[k];
    const int64_t n = 3 + static_cast<int64_t>(k);
    b.coeffs = randomMatrix(n, 1, 80 + k).col(0);
    SvMatrix dense;
    dense.paramId = 0;
    dense.biasId = 1;
    dense.u = randomMatrix(6, n, 82 + k);
    dense.vDense = randomMatrix(9, n, 84 + k);
    SvMatrix sparse;
    sparse.paramId = 2;
    sparse.biasId = 3;
    sparse.u = randomMatrix(5, n, 86 + k);
    sparse.sparseV = true;
    sparse.vSparse = randomSparse(12, n, 0.4, 88 + k);
    if (k == 0) {
      for (SvMatrix* m : {&dense, &sparse}) {
        m->core = randomMatrix(n, n, 90 + m->paramId);
        m->biasCoeffs = randomMatrix(n, 1, 92 + m->paramId).col(0);
      }
    }
    b.matrices = {dense, sparse};
  }
  std::vector<const SvBatch*> ptrs;
  for (const auto& b : batches) {
    ptrs.push_back(&b);
    applyNaive(b, ref);
  }
  ops::applySvBatches(ptrs, w);
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = (w[i].cast<double>() - ref[i]).norm() / ref[i].norm();
    INFO("parameter " << w.params[i].name);
    CHECK(err < 1e-6);
  }

  // Scaling reaches the bias coefficients with the core.
  SvBatch scaled = batches[0];
  ops::scaleCoefficients(scaled, -0.5f);
  CHECK(scaled.matrices[0].biasCoeffs.isApprox(-0.5f * batches[0].matrices[0].biasCoeffs));
  CHECK(scaled.matrices[1].core.isApprox(-0.5f * batches[0].matrices[1].core));

  // A core with a bias but no bias coefficients is a bug upstream, not a zero bias update.
  SvBatch missing = batches[0];
  missing.matrices[1].biasCoeffs.resize(0);
  const SvBatch* one[] = {&missing};
  CHECK_THROWS_AS(ops::applySvBatches(one, w), Error);
}

TEST_CASE("rebuild forms a bias update by adding its columns in order, as a device does", "[ops][rebuild]") {
  // Five columns whose sum depends on the order: in order 2, paired up (Eigen's
  // rowwise().sum()) 3. The device's sumColumns adds in order, so must the host, or
  // a replay on the host misses the live replica whose clock formed it on the device.
  ParamSet w;
  w.params.push_back({"W", Matrix::Zero(16, 3)});
  w.params.push_back({"b", Matrix::Constant(16, 1, 0.5f)});
  SvBatch batch;
  batch.coeffs = Vector::Ones(5);
  SvMatrix m;
  m.paramId = 0;
  m.biasId = 1;
  m.u.resize(16, 5);  // 16 rows: whole SIMD packets, where Eigen pairs the columns
  for (Eigen::Index i = 0; i < 16; ++i) m.u.row(i) << 1.0f, 1e8f, -1e8f, 1.0f, 1.0f;
  m.vDense = Matrix::Zero(3, 5);
  batch.matrices.push_back(m);
  const SvBatch* one[] = {&batch};
  ops::applySvBatches(one, w);
  CHECK((w[1].array() == 2.5f).all());
}

TEST_CASE("rebuild refuses SVs that do not fit the parameter", "[ops][rebuild]") {
  ParamSet w;
  w.params.push_back({"W", Matrix::Zero(3, 4)});
  SvBatch b;
  b.coeffs = Vector::Ones(2);
  SvMatrix m;
  m.u = Matrix::Ones(3, 2);
  m.vDense = Matrix::Ones(5, 2);
  b.matrices.push_back(m);
  const SvBatch* one[] = {&b};
  CHECK_THROWS_WITH(ops::applySvBatches(one, w), Catch::Contains("3x5") && Catch::Contains("3x4"));
}

TEST_CASE("MLR SVs are the gradient of the summed loss", "[ops][mlr]") {
  const int64_t d = 7, k = 4, n = 5;
  ops::MultinomialLogisticRegression model(d, k, 0.5f);
  ParamSet w = model.initParams(3);
  w[1] = randomMatrix(k, 1, 5) * 0.1f;
  const Matrix x = randomMatrix(d, n, 6);
  Eigen::VectorXi labels(n);
  labels << 0, 3, 1, 2, 3;
  ops::ExampleBatch batch;
  batch.dense = &x;
  batch.labels = &labels;

  double mean = 0;
  const SvBatch svg = model.computeSvg(w, batch, &mean);
  REQUIRE(svg.matrices.size() == 1);
  CHECK(svg.matrices[0].u.cols() == n);
  CHECK(svg.matrices[0].vDense.isApprox(x));  // v = x
  const ParamSet grad = model.denseGradient(w, batch, nullptr);

  // u = p - onehot(t): each column sums to zero.
  CHECK(svg.matrices[0].u.colwise().sum().cwiseAbs().maxCoeff() < 1e-6);

  auto summedLoss = [&](const ParamSet& p) {
    const ops::EvalSums s = model.evaluate(p, batch);
    return s.lossSum;
  };
  CHECK(std::abs(summedLoss(w) / n - mean) < 1e-5);
  for (int param = 0; param < 2; ++param) {
    for (int64_t i = 0; i < w[param].size(); i += 3) {
      ParamSet plus = w, minus = w;
      const float h = 1e-2f;
      plus[param].data()[i] += h;
      minus[param].data()[i] -= h;
      const double fd = (summedLoss(plus) - summedLoss(minus)) / (2 * h);
      INFO("param " << param << " element " << i);
      CHECK(std::abs(fd - grad[param].data()[i]) < 2e-3 * std::max(1.0, std::abs(fd)));
    }
  }
}

TEST_CASE("MLR handles sparse examples like dense ones", "[ops][mlr]") {
  const int64_t d = 20, k = 3, n = 6;
  ops::MultinomialLogisticRegression model(d, k);
  const ParamSet w = model.initParams(11);
  const SparseMatrix xs = randomSparse(d, n, 0.25, 9);
  const Matrix xd = Matrix(xs);
  Eigen::VectorXi labels(n);
  labels << 0, 1, 2, 2, 1, 0;
  ops::ExampleBatch sparse{nullptr, &xs, &labels};
  ops::ExampleBatch dense{&xd, nullptr, &labels};
  const ParamSet gs = model.denseGradient(w, sparse, nullptr);
  const ParamSet gd = model.denseGradient(w, dense, nullptr);
  CHECK(relativeDifference(gs, gd) < 1e-6);
}

TEST_CASE("MLR refuses bad shapes and labels", "[ops][mlr]") {
  CHECK_THROWS_AS(ops::MultinomialLogisticRegression(0, 3), InputError);
  CHECK_THROWS_AS(ops::MultinomialLogisticRegression(4, 1), InputError);
  ops::MultinomialLogisticRegression model(4, 3);
  const ParamSet w = model.initParams(1);
  const Matrix x = Matrix::Ones(5, 2);
  Eigen::VectorXi labels(2);
  labels << 0, 1;
  ops::ExampleBatch b{&x, nullptr, &labels};
  CHECK_THROWS_WITH(model.computeSvg(w, b, nullptr), Catch::Contains("5 features") && Catch::Contains("expects 4"));
  const Matrix x4 = Matrix::Ones(4, 2);
  labels << 0, 3;
  ops::ExampleBatch b4{&x4, nullptr, &labels};
  CHECK_THROWS_WITH(model.computeSvg(w, b4, nullptr), Catch::Contains("label 3"));
}

TEST_CASE("rebuild on the strict device: bitwise the cpu rebuild, device buffers kept from clock to clock",
          "[ops][rebuild][strict]") {
  const auto strict = ops::makeBackend("strict");
  const auto cpu = ops::makeBackend("cpu");
  ParamSet onCpu;
  onCpu.params.push_back({"A", randomMatrix(6, 9, 101)});
  onCpu.params.push_back({"a", randomMatrix(6, 1, 102)});
  onCpu.params.push_back({"B", randomMatrix(5, 12, 103)});
  ParamSet onStrict = onCpu;
  ops::RebuildBuffers cpuBuffers;
  ops::RebuildBuffers strictBuffers;
  std::vector<const float*> deviceW;
  for (int clock = 0; clock < 3; ++clock) {
    // Two batches per clock: dense V with a bias, sparse V, one of them with cores.
    std::vector<SvBatch> batches(2);
    for (size_t k = 0; k < batches.size(); ++k) {
      SvBatch& b = batches[k];
      const int64_t n = 4 - static_cast<int64_t>(k);
      const uint64_t key = 200 + 20 * static_cast<uint64_t>(clock) + 10 * k;
      b.coeffs = randomMatrix(n, 1, key).col(0);
      SvMatrix dense;
      dense.paramId = 0;
      dense.biasId = 1;
      dense.u = randomMatrix(6, n, key + 1);
      dense.vDense = randomMatrix(9, n, key + 2);
      SvMatrix sparse;
      sparse.paramId = 2;
      sparse.u = randomMatrix(5, n, key + 3);
      sparse.sparseV = true;
      sparse.vSparse = randomSparse(12, n, 0.3, key + 4);
      if (k == 1) {
        for (SvMatrix* m : {&dense, &sparse}) m->core = randomMatrix(n, n, key + 5 + m->paramId);
        dense.biasCoeffs = randomMatrix(n, 1, key + 8).col(0);
      }
      b.matrices = {dense, sparse};
    }
    std::vector<SvBatchView> views;
    for (const SvBatch& b : batches) views.push_back(viewOf(b));
    std::vector<const SvBatchView*> ptrs;
    for (const SvBatchView& v : views) ptrs.push_back(&v);
    ops::applySvBatches(ptrs, onCpu, *cpu, cpuBuffers);
    ops::applySvBatches(ptrs, onStrict, *strict, strictBuffers);
    for (size_t i = 0; i < onCpu.size(); ++i) {
      INFO("clock " << clock << ", parameter " << onCpu.params[i].name);
      CHECK(std::memcmp(onCpu[i].data(), onStrict[i].data(), static_cast<size_t>(onCpu[i].size()) * sizeof(float)) ==
            0);
    }
    // The device's W buffers are made once, at the first clock.
    std::vector<const float*> now;
    for (const ops::Tensor& t : strictBuffers.device.w) now.push_back(t.data());
    if (clock == 0) deviceW = now;
    CHECK(now == deviceW);
    CHECK(cpuBuffers.device.w.empty());
  }
}

TEST_CASE("the dense gradient on the strict device is bitwise the cpu one", "[ops][rebuild][strict]") {
  ops::MultinomialLogisticRegression model(12, 4);
  const ParamSet w = model.initParams(5);
  const Matrix x = randomMatrix(12, 7, 301);
  Eigen::VectorXi labels(7);
  labels << 0, 1, 2, 3, 0, 1, 2;
  ops::ExampleBatch batch;
  batch.dense = &x;
  batch.labels = &labels;
  const auto strict = ops::makeBackend("strict");
  ops::RebuildBuffers buffers;
  const ParamSet onStrict = model.denseGradient(w, batch, nullptr, *strict, buffers);
  const ParamSet onCpu = model.denseGradient(w, batch, nullptr);
  for (size_t i = 0; i < onCpu.size(); ++i) {
    CHECK(std::memcmp(onCpu[i].data(), onStrict[i].data(), static_cast<size_t>(onCpu[i].size()) * sizeof(float)) == 0);
  }
}

TEST_CASE("a clock's sparse V reuses its device copy's storage while it fits", "[ops][rebuild][strict]") {
  const auto strict = ops::makeBackend("strict");
  ParamSet onCpu;
  onCpu.params.push_back({"W", randomMatrix(5, 12, 400)});
  ops::Tensor onStrict = strict->allocate(5, 12);
  strict->copy(ops::Tensor::host(onCpu[0].data(), 5, 12), onStrict);
  ops::RebuildBuffers cpuBuffers, strictBuffers;
  const SparseMatrix first = randomSparse(12, 6, 0.5, 401);
  SparseMatrix fewer = first;
  fewer.prune([](int64_t row, int64_t, float) { return row % 2 == 0; });
  const SparseMatrix more = randomSparse(12, 9, 0.9, 402);
  const void* storage = nullptr;
  int clock = 0;
  const SparseMatrix* clocks[] = {&first, &fewer, &more};
  for (const SparseMatrix* v : clocks) {
    INFO("clock " << clock);
    SvBatch b;
    b.coeffs = randomMatrix(v->cols(), 1, 410 + clock).col(0);
    SvMatrix m;
    m.u = randomMatrix(5, v->cols(), 420 + clock);
    m.sparseV = true;
    m.vSparse = *v;
    m.vSparse.makeCompressed();
    b.matrices = {m};
    const SvBatchView view = viewOf(b);
    const SvBatchView* one[] = {&view};
    ops::applySvBatches(one, onCpu, cpuBuffers);
    ops::applySvBatches(one, std::span<ops::Tensor>(&onStrict, 1), *strict, strictBuffers);
    Matrix back(5, 12);
    ops::Tensor host = ops::Tensor::host(back.data(), 5, 12);
    strict->copy(onStrict, host);
    CHECK(std::memcmp(back.data(), onCpu[0].data(), sizeof(float) * 60) == 0);
    // Made at the first clock, kept at the second (fewer nonzeros), grown at the third.
    const void* now = strictBuffers.device.sparseV.storage.get();
    CHECK((clock == 1) == (now == storage));
    storage = now;
    ++clock;
  }
}

TEST_CASE("staged uploads on the strict device: bitwise the blocking copies, the same bytes, buffers reused",
          "[ops][rebuild][strict]") {
  ParamSet onCpu;
  onCpu.params.push_back({"A", randomMatrix(6, 9, 501)});
  onCpu.params.push_back({"a", randomMatrix(6, 1, 502)});
  onCpu.params.push_back({"B", randomMatrix(5, 12, 503)});
  // Each rebuild on a strict device of its own, its parameters resident there.
  struct OnStrict {
    std::unique_ptr<ops::Backend> backend = ops::makeBackend("strict");
    std::vector<ops::Tensor> w;
    ops::RebuildBuffers buffers;
  };
  OnStrict staged, sync;
  staged.buffers.device.staged = true;
  // Resident on the cpu backend, asked to stage: there is nothing to stage, so the
  // products read the operands where they lie.
  OnStrict cpuStaged;
  cpuStaged.backend = ops::makeBackend("cpu");
  cpuStaged.buffers.device.staged = true;
  for (OnStrict* s : {&staged, &sync, &cpuStaged}) {
    for (const Param& p : onCpu.params) {
      s->w.push_back(s->backend->allocate(p.value.rows(), p.value.cols()));
      s->backend->copy(ops::Tensor::host(p.value.data(), p.value.rows(), p.value.cols()), s->w.back());
    }
  }
  ops::RebuildBuffers cpuBuffers;
  const std::byte* staging = nullptr;
  std::vector<const float*> stagedU;
  for (int clock = 0; clock < 3; ++clock) {
    // A received batch (dense V with a bias, sparse V with a core) and a local one
    // whose U and dense V also lie on the device, its coefficients one value (its
    // U C and its bias update formed on the device).
    std::vector<SvBatch> batches(2);
    const uint64_t key = 600 + 20 * static_cast<uint64_t>(clock);
    SvBatch& peer = batches[0];
    peer.coeffs = randomMatrix(4, 1, key).col(0);
    SvMatrix dense;
    dense.paramId = 0;
    dense.biasId = 1;
    dense.u = randomMatrix(6, 4, key + 1);
    dense.vDense = randomMatrix(9, 4, key + 2);
    SvMatrix sparse;
    sparse.paramId = 2;
    sparse.u = randomMatrix(5, 4, key + 3);
    sparse.sparseV = true;
    sparse.vSparse = randomSparse(12, 4, 0.3, key + 4);
    sparse.core = randomMatrix(4, 4, key + 5);
    peer.matrices = {dense, sparse};
    SvBatch& local = batches[1];
    local.coeffs = Vector::Constant(3, 0.25f);
    SvMatrix mine;
    mine.paramId = 0;
    mine.biasId = 1;
    mine.u = randomMatrix(6, 3, key + 6);
    mine.vDense = randomMatrix(9, 3, key + 7);
    SvMatrix mineB;
    mineB.paramId = 2;
    mineB.u = randomMatrix(5, 3, key + 8);
    mineB.vDense = randomMatrix(12, 3, key + 9);
    local.matrices = {mine, mineB};
    std::vector<SvBatchView> views;
    for (const SvBatch& b : batches) views.push_back(viewOf(b));
    std::vector<const SvBatchView*> ptrs;
    for (const SvBatchView& v : views) ptrs.push_back(&v);
    ops::applySvBatches(ptrs, onCpu, cpuBuffers);
    for (OnStrict* s : {&staged, &sync, &cpuStaged}) {
      ops::Backend& b = *s->backend;
      std::vector<ops::Tensor> held;
      for (const SvMatrix& m : local.matrices) {
        held.push_back(b.allocate(m.u.rows(), m.u.cols()));
        b.copy(ops::Tensor::host(m.u.data(), m.u.rows(), m.u.cols()), held.back());
        held.push_back(b.allocate(m.vDense.rows(), m.vDense.cols()));
        b.copy(ops::Tensor::host(m.vDense.data(), m.vDense.rows(), m.vDense.cols()), held.back());
      }
      const std::vector<ops::DeviceSvs> onDevice = {{local.matrices[0].u.data(), &held[0], &held[1]},
                                                    {local.matrices[1].u.data(), &held[2], &held[3]}};
      ops::applySvBatches(ptrs, s->w, b, s->buffers, onDevice);
    }
    INFO("clock " << clock);
    CHECK(staged.backend->transfers().toDevice == sync.backend->transfers().toDevice);
    for (size_t i = 0; i < onCpu.size(); ++i) {
      INFO("parameter " << onCpu.params[i].name);
      for (OnStrict* s : {&staged, &sync, &cpuStaged}) {
        Matrix back(onCpu[i].rows(), onCpu[i].cols());
        ops::Tensor host = ops::Tensor::host(back.data(), back.rows(), back.cols());
        s->backend->copy(s->w[i], host);
        CHECK(std::memcmp(back.data(), onCpu[i].data(), static_cast<size_t>(back.size()) * sizeof(float)) == 0);
      }
    }
    // The host operands went through the staging buffer, which (like the device
    // buffers) is made at the first clock and reused; the blocking path has none.
    CHECK(staged.buffers.device.staging.bytes() > 0);
    CHECK(sync.buffers.device.staging.bytes() == 0);
    std::vector<const float*> now;
    for (const ops::Tensor& t : staged.buffers.device.stagedU) now.push_back(t.data());
    if (clock == 0) {
      staging = staged.buffers.device.staging.data();
      stagedU = now;
    }
    CHECK(staged.buffers.device.staging.data() == staging);
    CHECK(now == stagedU);
  }
}

TEST_CASE("a staged np-4 rebuild on the strict device: bitwise the cpu's, in one copy per run and one gather per "
          "parameter",
          "[ops][rebuild][strict]") {
  // Two layers with biases; four batches, the one at `own` also on the device
  // (its coefficients one value), the others received (in host memory).
  for (size_t own : {size_t{0}, size_t{1}}) {
    INFO("this rank's batch at " << own);
    ParamSet onCpu;
    onCpu.params.push_back({"W0", randomMatrix(6, 9, 701)});
    onCpu.params.push_back({"b0", randomMatrix(6, 1, 702)});
    onCpu.params.push_back({"W1", randomMatrix(5, 12, 703)});
    onCpu.params.push_back({"b1", randomMatrix(5, 1, 704)});
    std::vector<SvBatch> batches(4);
    for (size_t b = 0; b < batches.size(); ++b) {
      const uint64_t key = 710 + 10 * b;
      batches[b].coeffs = b == own ? Vector::Constant(3, 0.125f) : Vector(randomMatrix(3, 1, key).col(0));
      for (uint32_t layer = 0; layer < 2; ++layer) {
        SvMatrix m;
        m.paramId = 2 * layer;
        m.biasId = static_cast<int32_t>(2 * layer + 1);
        m.u = randomMatrix(layer == 0 ? 6 : 5, 3, key + 1 + layer);
        m.vDense = randomMatrix(layer == 0 ? 9 : 12, 3, key + 3 + layer);
        batches[b].matrices.push_back(std::move(m));
      }
    }
    std::vector<SvBatchView> views;
    for (const SvBatch& b : batches) views.push_back(viewOf(b));
    std::vector<const SvBatchView*> ptrs;
    for (const SvBatchView& v : views) ptrs.push_back(&v);
    ops::RebuildBuffers cpuBuffers;
    ops::applySvBatches(ptrs, onCpu, cpuBuffers);

    const auto strict = ops::makeBackend("strict");
    std::vector<ops::Tensor> w, held;
    for (const Param& p : onCpu.params) w.push_back(strict->allocate(p.value.rows(), p.value.cols()));
    ParamSet start;
    start.params.push_back({"W0", randomMatrix(6, 9, 701)});
    start.params.push_back({"b0", randomMatrix(6, 1, 702)});
    start.params.push_back({"W1", randomMatrix(5, 12, 703)});
    start.params.push_back({"b1", randomMatrix(5, 1, 704)});
    for (size_t i = 0; i < w.size(); ++i) {
      strict->copy(ops::Tensor::host(start[i].data(), start[i].rows(), start[i].cols()), w[i]);
    }
    for (const SvMatrix& m : batches[own].matrices) {
      held.push_back(strict->allocate(m.u.rows(), m.u.cols()));
      strict->copy(ops::Tensor::host(m.u.data(), m.u.rows(), m.u.cols()), held.back());
      held.push_back(strict->allocate(m.vDense.rows(), m.vDense.cols()));
      strict->copy(ops::Tensor::host(m.vDense.data(), m.vDense.rows(), m.vDense.cols()), held.back());
    }
    const std::vector<ops::DeviceSvs> onDevice = {{batches[own].matrices[0].u.data(), &held[0], &held[1]},
                                                  {batches[own].matrices[1].u.data(), &held[2], &held[3]}};
    ops::RebuildBuffers buffers;
    buffers.device.staged = true;
    const uint64_t before = strict->launches();
    ops::applySvBatches(ptrs, w, *strict, buffers, onDevice);
    // The host's bias updates in one copy; per parameter one copy per run of
    // received batches' V and of their U C (one run each when this rank's batch
    // comes first, two when it splits them), one copyParts for this rank's V and
    // scaled U, one GEMM; per bias the row sums of this rank's scaled U and one
    // addInOrder of the four updates. (Before copyParts and addInOrder: 29 at own 1.)
    const uint64_t runs = own == 0 ? 1 : 2;
    CHECK(strict->launches() - before == 1 + 2 * (2 * runs + 1 + 1) + 2 * (1 + 1));
    for (size_t i = 0; i < w.size(); ++i) {
      INFO("parameter " << onCpu.params[i].name);
      Matrix back(onCpu[i].rows(), onCpu[i].cols());
      ops::Tensor host = ops::Tensor::host(back.data(), back.rows(), back.cols());
      strict->copy(w[i], host);
      CHECK(std::memcmp(back.data(), onCpu[i].data(), static_cast<size_t>(back.size()) * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("a product by column tiles sums each element as the whole product does, bit for bit", "[ops][rebuild]") {
  // Whether this machine's BLAS sums a column the same in any tile of the grain: where
  // it does not, no product is done by tiles (the callers rebuild whole).
  bool exact = false;
#ifdef EIGEN_USE_BLAS
  {
    const Matrix a = randomMatrix(64, 24, 75), b = randomMatrix(200, 24, 76);
    Matrix whole = randomMatrix(64, 200, 77), tiled = whole;
    ops::Tensor wholeT = ops::cpu::view(whole), tiledT = ops::cpu::view(tiled);
    ops::cpu::CpuBackend().gemm(ops::Trans::kNo, ops::Trans::kYes, 1.0f, ops::cpu::view(a), ops::cpu::view(b), 1.0f,
                                wholeT);
    exact = ops::cpu::gemmByColumnTiles(ops::cpu::view(a), ops::cpu::view(b), tiledT, 48, [](int64_t, int64_t) {});
    CHECK(exact == (ops::cpu::columnGrain() > 0));
    if (exact) CHECK(whole == tiled);
    if (!exact) WARN("this machine's BLAS sums a column by another order in another tile: products by tiles are off");
  }
#endif
  ops::cpu::CpuBackend cpu;
  const struct { int64_t m, n, k; } shapes[] = {{2048, 784, 8}, {40, 1500, 5}, {300, 97, 40}, {64, 2048, 100}};
  for (const auto& s : shapes) {
    const Matrix a = randomMatrix(s.m, s.k, 70), b = randomMatrix(s.n, s.k, 71), c0 = randomMatrix(s.m, s.n, 72);
    Matrix whole = c0;
    ops::Tensor wholeT = ops::cpu::view(whole);
    cpu.gemm(ops::Trans::kNo, ops::Trans::kYes, 1.0f, ops::cpu::view(a), ops::cpu::view(b), 1.0f, wholeT);
    for (const int64_t tile : {16, 17, 64, 100, 5000}) {
      INFO(s.m << "x" << s.n << " by " << s.k << ", tiles of " << tile);
      Matrix tiled = c0;
      ops::Tensor tiledT = ops::cpu::view(tiled);
      std::vector<std::pair<int64_t, int64_t>> seen;
      const bool done = ops::cpu::gemmByColumnTiles(ops::cpu::view(a), ops::cpu::view(b), tiledT, tile,
                                                    [&](int64_t first, int64_t cols) {
                                                      // A tile is final when it is handed over.
                                                      CHECK(tiled.middleCols(first, cols) == whole.middleCols(first, cols));
                                                      seen.emplace_back(first, cols);
                                                    });
      REQUIRE(done == exact);
      if (!done) {
        CHECK(tiled == c0);  // nothing done
        continue;
      }
      CHECK(std::memcmp(tiled.data(), whole.data(), sizeof(float) * static_cast<size_t>(whole.size())) == 0);
      // The tiles cover the columns in order, each starting on a multiple of the grain,
      // none narrower than 16 unless the product is.
      int64_t next = 0;
      for (const auto& [first, cols] : seen) {
        CHECK(first == next);
        CHECK(first % ops::cpu::columnGrain() == 0);
        CHECK(cols >= std::min<int64_t>(16, s.n));
        next += cols;
      }
      CHECK(next == s.n);
    }
  }
  // Too small to run as one sgemm: refused, nothing written.
  const Matrix a = randomMatrix(2, 1, 73), b = randomMatrix(3, 1, 74);
  Matrix c = Matrix::Zero(2, 3);
  ops::Tensor ct = ops::cpu::view(c);
  CHECK_FALSE(ops::cpu::gemmByColumnTiles(ops::cpu::view(a), ops::cpu::view(b), ct, 16, [](int64_t, int64_t) {}));
  CHECK(c.isZero());
}
