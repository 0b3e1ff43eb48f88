#include "engine/worker/select.h"

#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/rebuild.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

using namespace orpheus;
using engine::SelectionMethod;
using engine::SelectionStats;

namespace {

using MatrixD = Eigen::MatrixXd;
using VectorD = Eigen::VectorXd;

Matrix randomMatrix(CounterRng& rng, int64_t rows, int64_t cols) {
  Matrix m(rows, cols);
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) m(i, j) = static_cast<float>(rng.normal());
  return m;
}

// A matrix whose singular values decay like decay^k: what SVs of a trained model
// look like (a few dominant directions), unlike white noise.
Matrix decayingMatrix(CounterRng& rng, int64_t rows, int64_t cols, double decay) {
  const int64_t r = std::min(rows, cols);
  Matrix a = randomMatrix(rng, rows, r);
  const Matrix b = randomMatrix(rng, r, cols);
  for (int64_t k = 0; k < r; ++k) a.col(k) *= static_cast<float>(std::pow(decay, static_cast<double>(k)));
  return a * b;
}

SparseMatrix toSparse(const Matrix& dense, CounterRng& rng, double density) {
  std::vector<Eigen::Triplet<float, int32_t>> t;
  for (int64_t j = 0; j < dense.cols(); ++j)
    for (int64_t i = 0; i < dense.rows(); ++i)
      if (rng.uniform() < density) t.emplace_back(static_cast<int32_t>(i), static_cast<int32_t>(j), dense(i, j));
  SparseMatrix s(dense.rows(), dense.cols());
  s.setFromTriplets(t.begin(), t.end());
  return s;
}

// Params: 0 W0 (8x12) with bias 1, dense V; 2 W1 (6x20) with bias 3, sparse V;
// 4 W2 (3x7), dense V, no bias, and U with columns summing to zero (rank 2, like
// the U = p - onehot(t) of a softmax layer).
ParamSet zeroParams() {
  ParamSet w;
  w.params.push_back({"W0", Matrix::Zero(8, 12)});
  w.params.push_back({"b0", Matrix::Zero(8, 1)});
  w.params.push_back({"W1", Matrix::Zero(6, 20)});
  w.params.push_back({"b1", Matrix::Zero(6, 1)});
  w.params.push_back({"W2", Matrix::Zero(3, 7)});
  return w;
}

// decay 0: plain Gaussian SVs; otherwise SVs with decaying spectra.
SvBatch makeBatch(uint64_t key, int64_t n, double decay = 0.0) {
  CounterRng rng(11, RngPurpose::kTest, key, 0);
  auto make = [&](int64_t rows, int64_t cols) {
    return decay > 0.0 ? decayingMatrix(rng, rows, cols, decay) : randomMatrix(rng, rows, cols);
  };
  SvBatch b;
  b.header = {.jobId = 5, .sender = 2, .replica = 1, .clock = 9, .epoch = 3};
  b.coeffs.resize(n);
  for (int64_t j = 0; j < n; ++j) b.coeffs[j] = static_cast<float>(0.5 + rng.uniform());

  SvMatrix m0;
  m0.paramId = 0;
  m0.biasId = 1;
  m0.u = make(8, n);
  m0.vDense = make(12, n);

  SvMatrix m1;
  m1.paramId = 2;
  m1.biasId = 3;
  m1.u = make(6, n);
  m1.sparseV = true;
  m1.vSparse = toSparse(make(20, n), rng, 0.4);

  SvMatrix m2;
  m2.paramId = 4;
  m2.u = make(3, n);
  m2.u.rowwise() -= m2.u.colwise().mean();
  m2.vDense = make(7, n);
  b.matrices = {m0, m1, m2};
  return b;
}

MatrixD denseV(const SvMatrix& m) {
  return m.sparseV ? MatrixD(m.vSparse.cast<double>()) : MatrixD(m.vDense.cast<double>());
}

MatrixD pinv(const MatrixD& s) { return Eigen::CompleteOrthogonalDecomposition<MatrixD>(s).pseudoInverse(); }

// The update a batch stands for, applied to zero parameters.
ParamSet rebuilt(const SvBatch& b) {
  ParamSet w = zeroParams();
  const SvBatch* one[] = {&b};
  ops::applySvBatches(one, w);
  return w;
}

double relativeError(const SvBatch& approx, const SvBatch& full) {
  return relativeDifference(rebuilt(approx), rebuilt(full));
}

std::vector<std::byte> bytesOf(const SvBatch& b) { return encode(b); }

bool sameColumn(const SvMatrix& a, int64_t ja, const SvMatrix& b, int64_t jb) {
  if (a.u.col(ja) != b.u.col(jb)) return false;
  return denseV(a).col(ja) == denseV(b).col(jb);
}

// A batch whose every matrix's columns are combinations of 3 columns: 3 SVGs say everything.
SvBatch spannedByThree() {
  SvBatch full = makeBatch(7, 12);
  CounterRng rng(12, RngPurpose::kTest, 0, 0);
  const Matrix mix = randomMatrix(rng, 3, 12);
  for (SvMatrix& m : full.matrices) {
    m.u = randomMatrix(rng, m.u.rows(), 3) * mix;
    const Matrix v = randomMatrix(rng, m.vRows(), 3) * mix;
    if (m.sparseV) {
      m.vSparse = v.sparseView();
    } else {
      m.vDense = v;
    }
  }
  return full;
}

}  // namespace

TEST_CASE("JMCSS core is the projection of the update onto the selected spans", "[select]") {
  for (int64_t c : {3, 5, 8}) {
    for (uint64_t key = 0; key < 4; ++key) {
      const SvBatch full = makeBatch(key, 16);
      CounterRng rng(1, RngPurpose::kSelect, key, 0);
      SelectionStats stats;
      const SvBatch sel = engine::selectSvgs(full, c, SelectionMethod::kJmcss, rng, &stats);
      REQUIRE(stats.selected == c);
      REQUIRE(sel.numColumns() == c);
      const std::vector<int64_t>& idx = stats.indices;
      INFO("C = " << c << ", key " << key);
      for (size_t p = 0; p < full.matrices.size(); ++p) {
        const SvMatrix& m = full.matrices[p];
        const SvMatrix& s = sel.matrices[p];
        INFO("matrix " << p);
        REQUIRE(s.core.rows() == c);
        REQUIRE(s.core.cols() == c);
        const MatrixD u = m.u.cast<double>();
        const MatrixD v = denseV(m);
        const VectorD coeffs = full.coeffs.cast<double>();
        const MatrixD update = u * coeffs.asDiagonal() * v.transpose();
        const MatrixD su = u(Eigen::all, idx);
        const MatrixD sv = v(Eigen::all, idx);
        const MatrixD pu = su * pinv(su);
        const MatrixD pv = sv * pinv(sv);
        const MatrixD expected = pu * update * pv;
        const MatrixD got = su * s.core.cast<double>() * sv.transpose();
        CHECK((got - expected).norm() <= 1e-5 * update.norm());
        // The core itself is S_U^+ M (S_V^+)^T where the selected columns are
        // independent (C below both dimensions and no rank-2 U).
        if (c < std::min(m.u.rows(), v.rows()) && p != 2) {
          const MatrixD a = pinv(su) * update * pinv(sv).transpose();
          CHECK((s.core.cast<double>() - a).norm() <= 1e-4 * a.norm());
        }
        if (m.biasId >= 0) {
          REQUIRE(s.biasCoeffs.size() == c);
          const VectorD exact = u * coeffs;
          CHECK((su * s.biasCoeffs.cast<double>() - pu * exact).norm() <= 1e-5 * exact.norm());
        } else {
          CHECK(s.biasCoeffs.size() == 0);
        }
      }
      CHECK(sel.coeffs == Vector::Ones(c));
    }
  }
}

TEST_CASE("selecting every SVG reproduces the update", "[select]") {
  const SvBatch full = makeBatch(3, 10);
  // All columns through the core path, in a scrambled order.
  const std::vector<int64_t> all = {4, 0, 9, 2, 7, 1, 8, 3, 6, 5};
  const SvBatch proj = engine::projectOntoColumns(full, all);
  CHECK(relativeError(proj, full) < 1e-5);

  // c >= n is the "selection off" path: the batch itself, bit for bit.
  for (SelectionMethod method : {SelectionMethod::kJmcss, SelectionMethod::kUniform}) {
    for (int64_t c : {10, 11, 100}) {
      CounterRng rng(1, RngPurpose::kSelect, 0, 0);
      SelectionStats stats;
      const SvBatch same = engine::selectSvgs(full, c, method, rng, &stats);
      CHECK(bytesOf(same) == bytesOf(full));
      CHECK(stats.selected == 10);
      CHECK(same.matrices[0].core.size() == 0);
    }
  }
}

TEST_CASE("selected indices are distinct and the same for every matrix", "[select]") {
  const SvBatch full = makeBatch(5, 30, 0.6);
  for (SelectionMethod method : {SelectionMethod::kJmcss, SelectionMethod::kUniform}) {
    for (uint64_t key = 0; key < 5; ++key) {
      CounterRng rng(2, RngPurpose::kSelect, key, 0);
      SelectionStats stats;
      const SvBatch sel = engine::selectSvgs(full, 7, method, rng, &stats);
      INFO(engine::toString(method) << " key " << key);
      REQUIRE(stats.indices.size() == 7);
      REQUIRE(stats.requested == 7);
      CHECK(stats.seconds >= 0.0);
      CHECK(std::set<int64_t>(stats.indices.begin(), stats.indices.end()).size() == 7);
      for (int64_t i : stats.indices) CHECK((i >= 0 && i < 30));
      for (size_t p = 0; p < full.matrices.size(); ++p) {
        CHECK(sel.matrices[p].sparseV == full.matrices[p].sparseV);
        CHECK(sel.matrices[p].paramId == full.matrices[p].paramId);
        CHECK(sel.matrices[p].biasId == full.matrices[p].biasId);
        for (int64_t t = 0; t < 7; ++t) CHECK(sameColumn(sel.matrices[p], t, full.matrices[p], stats.indices[t]));
      }
      CHECK(sel.header.clock == full.header.clock);
      CHECK(sel.header.sender == full.header.sender);
      CHECK(sel.header.replica == full.header.replica);
      CHECK(sel.header.epoch == full.header.epoch);
      CHECK(sel.header.jobId == full.header.jobId);
    }
  }
}

TEST_CASE("selection is determined by the random stream", "[select]") {
  const SvBatch full = makeBatch(6, 40, 0.7);
  for (SelectionMethod method : {SelectionMethod::kJmcss, SelectionMethod::kUniform}) {
    CounterRng a(3, RngPurpose::kSelect, 12, 1);
    CounterRng b(3, RngPurpose::kSelect, 12, 1);
    SelectionStats sa, sb;
    const SvBatch x = engine::selectSvgs(full, 10, method, a, &sa);
    const SvBatch y = engine::selectSvgs(full, 10, method, b, &sb);
    CHECK(sa.indices == sb.indices);
    CHECK(bytesOf(x) == bytesOf(y));
    // Another clock's stream picks other SVGs (almost surely for 10 of 40).
    CounterRng other(3, RngPurpose::kSelect, 13, 1);
    SelectionStats so;
    engine::selectSvgs(full, 10, method, other, &so);
    CHECK(so.indices != sa.indices);
  }
}

TEST_CASE("JMCSS with cores approximates better than uniform selection", "[select]") {
  double jmcss = 0.0, uniform = 0.0;
  int jmcssWins = 0;
  const int trials = 30;
  for (int t = 0; t < trials; ++t) {
    const SvBatch full = makeBatch(100 + static_cast<uint64_t>(t), 40, 0.7);
    CounterRng r1(4, RngPurpose::kSelect, static_cast<uint64_t>(t), 0);
    CounterRng r2(4, RngPurpose::kSelect, static_cast<uint64_t>(t), 1);
    const double ej = relativeError(engine::selectSvgs(full, 5, SelectionMethod::kJmcss, r1), full);
    const double eu = relativeError(engine::selectSvgs(full, 5, SelectionMethod::kUniform, r2), full);
    jmcss += ej / trials;
    uniform += eu / trials;
    jmcssWins += ej <= eu;
  }
  INFO("mean relative error: JMCSS " << jmcss << ", uniform " << uniform);
  CHECK(jmcss < uniform);
  CHECK(jmcss < 1.0);  // better than sending nothing
  CHECK(jmcssWins >= trials * 3 / 4);
}

TEST_CASE("JMCSS stops once the selected SVGs span the batch", "[select]") {
  SvBatch full = spannedByThree();
  CounterRng sel(1, RngPurpose::kSelect, 0, 0);
  SelectionStats stats;
  const SvBatch out = engine::selectSvgs(full, 5, SelectionMethod::kJmcss, sel, &stats);
  CHECK(stats.requested == 5);
  CHECK(stats.selected == 3);
  CHECK(out.numColumns() == 3);
  CHECK(relativeError(out, full) < 1e-5);
  CHECK_NOTHROW(decode(encode(out)));

  // A batch with nothing in it selects nothing, and says so exactly.
  SvBatch zero = full;
  for (SvMatrix& m : zero.matrices) {
    m.u.setZero();
    m.vDense.setZero();
    m.vSparse.setZero();
  }
  SelectionStats none;
  const SvBatch empty = engine::selectSvgs(zero, 5, SelectionMethod::kJmcss, sel, &none);
  CHECK(none.selected == 0);
  CHECK(empty.numColumns() == 0);
  CHECK(rebuilt(empty).numElements() == zeroParams().numElements());
  CHECK(decode(encode(empty)).numColumns() == 0);
}

TEST_CASE("a low-rank matrix does not end selection at its rank", "[select]") {
  // The third matrix's U has rank 2; the others have room for 10 SVGs.
  const SvBatch full = makeBatch(8, 20);
  CounterRng rng(1, RngPurpose::kSelect, 0, 0);
  SelectionStats stats;
  const SvBatch sel = engine::selectSvgs(full, 10, SelectionMethod::kJmcss, rng, &stats);
  CHECK(stats.selected == 10);
  // ... and the projection is still the one onto the selected spans.
  const SvBatch proj = engine::projectOntoColumns(full, stats.indices);
  CHECK(bytesOf(proj) == bytesOf(sel));
}

TEST_CASE("a selected batch round-trips through the wire format", "[select]") {
  const SvBatch full = makeBatch(9, 25, 0.8);
  CounterRng rng(1, RngPurpose::kSelect, 0, 0);
  const SvBatch sel = engine::selectSvgs(full, 6, SelectionMethod::kJmcss, rng);
  const std::vector<std::byte> bytes = encode(sel);
  CHECK(bytes.size() == encodedSize(sel));
  SvBatchExpectation expect;
  expect.sender = 2;
  expect.clock = 9;
  expect.paramShapes = {{8, 12}, {8, 1}, {6, 20}, {6, 1}, {3, 7}};
  const SvBatch back = decode(bytes, expect);
  REQUIRE(back.matrices.size() == 3);
  for (size_t p = 0; p < 3; ++p) {
    const SvMatrix& a = sel.matrices[p];
    const SvMatrix& b = back.matrices[p];
    CHECK(std::memcmp(a.core.data(), b.core.data(), sizeof(float) * 36) == 0);
    CHECK(b.biasCoeffs.size() == a.biasCoeffs.size());
    CHECK(b.biasCoeffs == a.biasCoeffs);
  }
  CHECK(encode(back) == bytes);
  CHECK(relativeDifference(rebuilt(back), rebuilt(sel)) == 0.0);
}

TEST_CASE("applying a selected batch adds S_U A S_V^T and S_U biasCoeffs", "[select]") {
  const SvBatch full = makeBatch(10, 18, 0.7);
  CounterRng rng(1, RngPurpose::kSelect, 0, 0);
  const SvBatch sel = engine::selectSvgs(full, 6, SelectionMethod::kJmcss, rng);
  ParamSet w = zeroParams();
  CounterRng init(2, RngPurpose::kTest, 0, 0);
  for (auto& p : w.params) p.value = randomMatrix(init, p.value.rows(), p.value.cols());
  std::vector<MatrixD> expected;
  for (const auto& p : w.params) expected.push_back(p.value.cast<double>());
  for (const SvMatrix& m : sel.matrices) {
    const MatrixD u = m.u.cast<double>();
    expected[m.paramId] += u * m.core.cast<double>() * denseV(m).transpose();
    if (m.biasId >= 0) expected[static_cast<size_t>(m.biasId)] += u * m.biasCoeffs.cast<double>();
  }
  const SvBatch* one[] = {&sel};
  ops::applySvBatches(one, w);
  for (size_t i = 0; i < w.size(); ++i) {
    INFO("parameter " << w.params[i].name);
    CHECK((w[i].cast<double>() - expected[i]).norm() <= 1e-5 * expected[i].norm());
  }
}

TEST_CASE("uniform selection rescales by B/C and draws every SVG alike", "[select]") {
  const SvBatch full = makeBatch(11, 10);
  std::vector<int> hits(10, 0);
  const int draws = 3000;
  for (int d = 0; d < draws; ++d) {
    CounterRng rng(5, RngPurpose::kSelect, static_cast<uint64_t>(d), 0);
    SelectionStats stats;
    const SvBatch sel = engine::selectSvgs(full, 4, SelectionMethod::kUniform, rng, &stats);
    REQUIRE(stats.selected == 4);
    for (int64_t t = 0; t < 4; ++t) {
      ++hits[static_cast<size_t>(stats.indices[t])];
      if (d == 0) CHECK(sel.coeffs[t] == Approx(full.coeffs[stats.indices[t]] * 2.5f));
    }
    if (d == 0) {
      for (const SvMatrix& m : sel.matrices) {
        CHECK(m.core.size() == 0);
        CHECK(m.biasCoeffs.size() == 0);
      }
    }
  }
  for (int h : hits) CHECK(std::abs(h / static_cast<double>(draws) - 0.4) < 0.04);
}

TEST_CASE("selection from a batch that already carries cores fits that update", "[select]") {
  const SvBatch full = makeBatch(12, 15, 0.8);
  CounterRng rng(1, RngPurpose::kSelect, 0, 0);
  const SvBatch once = engine::selectSvgs(full, 8, SelectionMethod::kJmcss, rng);
  // Keeping every column of a cored batch reproduces it.
  const std::vector<int64_t> all = {7, 6, 5, 4, 3, 2, 1, 0};
  CHECK(relativeDifference(rebuilt(engine::projectOntoColumns(once, all)), rebuilt(once)) < 1e-5);
  // Selecting again never does better than the first, larger selection.
  const SvBatch twice = engine::selectSvgs(once, 4, SelectionMethod::kJmcss, rng);
  CHECK(relativeError(twice, full) >= relativeError(once, full) - 1e-6);
  CHECK_THROWS_AS(engine::selectSvgs(once, 4, SelectionMethod::kUniform, rng), Error);
}

TEST_CASE("selection refuses bad requests", "[select]") {
  const SvBatch full = makeBatch(13, 6);
  CounterRng rng(1, RngPurpose::kSelect, 0, 0);
  CHECK_THROWS_AS(engine::selectSvgs(full, 0, SelectionMethod::kJmcss, rng), Error);
  const std::vector<int64_t> twice = {1, 1};
  CHECK_THROWS_AS(engine::projectOntoColumns(full, twice), Error);
  const std::vector<int64_t> outside = {6};
  CHECK_THROWS_AS(engine::projectOntoColumns(full, outside), Error);
  CHECK(engine::parseSelectionMethod("jmcss") == SelectionMethod::kJmcss);
  CHECK(engine::parseSelectionMethod("uniform") == SelectionMethod::kUniform);
  CHECK_THROWS_AS(engine::parseSelectionMethod("best"), InputError);
}

TEST_CASE("selectionErrors is the error of the selection selectForPeers would send", "[select]") {
  const uint64_t seed = 21, clock = 7;
  const int rank = 2;
  for (const double decay : {0.0, 0.7}) {
    const SvBatch full = makeBatch(30 + static_cast<uint64_t>(10 * decay), 24, decay);
    const std::vector<int64_t> counts = {0, 1, 3, 6, 12, 23, 24, 30};
    const std::vector<double> errors = engine::selectionErrors(full, counts, seed, clock, rank);
    REQUIRE(errors.size() == counts.size());
    for (size_t i = 0; i < counts.size(); ++i) {
      const int64_t c = counts[i];
      INFO("decay " << decay << ", C = " << c << ": " << errors[i]);
      double expected = 1.0;  // nothing sent
      if (c > 0) {
        const std::optional<SvBatch> sent =
            engine::selectForPeers(full, c, SelectionMethod::kJmcss, seed, clock, rank);
        expected = sent ? relativeError(*sent, full) : 0.0;
      }
      CHECK(errors[i] == Approx(expected).margin(5e-5));
    }
    // Sending more never loses more (nested selections, orthogonal projections).
    for (size_t i = 1; i < counts.size(); ++i) CHECK(errors[i] <= errors[i - 1] + 1e-12);
    CHECK(errors[1] > 0.05);  // one SVG of 24 does lose something
    CHECK(errors.back() == 0.0);
  }
  // The same from a batch that carries cores: the error against that batch's update.
  const SvBatch full = makeBatch(44, 15, 0.8);
  const std::optional<SvBatch> once = engine::selectForPeers(full, 9, SelectionMethod::kJmcss, 3, 4, 0);
  REQUIRE(once);
  const std::vector<int64_t> counts = {2, 5};
  const std::vector<double> errors = engine::selectionErrors(*once, counts, 3, 5, 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::optional<SvBatch> again = engine::selectForPeers(*once, counts[i], SelectionMethod::kJmcss, 3, 5, 1);
    CHECK(errors[i] == Approx(relativeError(*again, *once)).margin(5e-5));
  }
}

TEST_CASE("selectionErrors of a minibatch of no or one example hands BLAS no empty matrix", "[select]") {
  // A rank --balance leaves with no example, or one, measures a batch of 0 or 1
  // columns: no draw, so an empty basis. Before, products with its 0-row coordinates
  // reached BLAS, which refused their leading dimension of 0 with a line each on
  // stdout ("On entry to DGEMV parameter number 6 had an illegal value"): what
  // stdout and stderr receive during the call is captured here.
  for (const int64_t n : {0, 1}) {
    INFO("a batch of " << n << " columns");
    const SvBatch small = makeBatch(3, n);
    std::fflush(stdout);
    std::fflush(stderr);
    std::FILE* capture = std::tmpfile();
    REQUIRE(capture != nullptr);
    const int savedOut = ::dup(1), savedErr = ::dup(2);
    ::dup2(::fileno(capture), 1);
    ::dup2(::fileno(capture), 2);
    const std::vector<int64_t> counts = {1, 5};  // everything sent: nothing lost
    const std::vector<double> errors = engine::selectionErrors(small, counts, 4, 2, 1);
    std::fflush(stdout);
    std::fflush(stderr);
    ::dup2(savedOut, 1);
    ::dup2(savedErr, 2);
    ::close(savedOut);
    ::close(savedErr);
    std::fseek(capture, 0, SEEK_END);
    const long printed = std::ftell(capture);
    std::fclose(capture);
    CHECK(printed == 0);
    CHECK(errors == std::vector<double>(counts.size(), 0.0));
  }
  // One column, none sent: all of it is lost.
  CHECK(engine::selectionErrors(makeBatch(3, 1), std::vector<int64_t>{0}, 4, 2, 1) == std::vector<double>{1.0});
}

TEST_CASE("a JMCSS selection of c is the first c picks of a larger one", "[select]") {
  // What makes one draw measure every smaller C (selectionErrors).
  const SvBatch full = makeBatch(9, 30, 0.6);
  CounterRng big(5, RngPurpose::kSelect, 3, 1);
  SelectionStats most;
  engine::selectSvgs(full, 16, SelectionMethod::kJmcss, big, &most);
  for (int64_t c : {1, 4, 8, 15}) {
    CounterRng rng(5, RngPurpose::kSelect, 3, 1);
    SelectionStats fewer;
    engine::selectSvgs(full, c, SelectionMethod::kJmcss, rng, &fewer);
    CHECK(fewer.indices == std::vector<int64_t>(most.indices.begin(), most.indices.begin() + c));
  }
}

// --- jmcss-gram: the same draw from the Gram matrices X^T X -------------------

namespace {

std::vector<Matrix> cpuGrams(const SvBatch& full) {
  ops::cpu::CpuBackend cpu;
  return engine::svGrams(full, engine::GramSource{&cpu, {}, nullptr, nullptr});
}

}  // namespace

TEST_CASE("svGrams are X^T X of every U and V, the same bits on the strict device", "[select][strict]") {
  const SvBatch full = makeBatch(21, 16, 0.8);
  const std::vector<Matrix> grams = cpuGrams(full);
  REQUIRE(grams.size() == 2 * full.matrices.size());
  for (size_t p = 0; p < full.matrices.size(); ++p) {
    const MatrixD u = full.matrices[p].u.cast<double>();
    const MatrixD v = denseV(full.matrices[p]);
    for (const auto& [g, exact] : {std::pair{&grams[2 * p], MatrixD(u.transpose() * u)},
                                   std::pair{&grams[2 * p + 1], MatrixD(v.transpose() * v)}}) {
      CHECK((g->cast<double>() - exact).norm() <= 1e-5 * exact.norm());
    }
  }
  // Strict: the matrices copied in, or read where a "pass" left them.
  const auto strict = ops::strict::makeStrictBackend();
  ops::Tensor operand, all;
  std::vector<ops::Tensor> tensors;
  std::vector<ops::DeviceSvs> svs;
  for (const SvMatrix& m : full.matrices) {
    tensors.push_back(strict->allocate(m.u.rows(), m.u.cols()));
    strict->copy(ops::Tensor::host(m.u.data(), m.u.rows(), m.u.cols()), tensors.back());
  }
  for (size_t p = 0; p < full.matrices.size(); ++p) svs.push_back({full.matrices[p].u.data(), &tensors[p], nullptr});
  for (const std::span<const ops::DeviceSvs> onDevice : {std::span<const ops::DeviceSvs>{}, std::span<const ops::DeviceSvs>(svs)}) {
    const std::vector<Matrix> there = engine::svGrams(full, engine::GramSource{strict.get(), onDevice, &operand, &all});
    REQUIRE(there.size() == grams.size());
    for (size_t k = 0; k < grams.size(); ++k) CHECK(there[k] == grams[k]);
  }
  // The CPU backend needs no buffers; a device does, and a backend at all.
  CHECK_THROWS_AS(engine::svGrams(full, engine::GramSource{strict.get(), {}, nullptr, nullptr}), Error);
  CHECK_THROWS_AS(engine::svGrams(full, engine::GramSource{}), Error);
}

TEST_CASE("jmcss-gram draws as jmcss does, to the same projection", "[select]") {
  // Well-conditioned SVs: the two methods draw the same columns from the same
  // stream, and both send the projection onto the selected spans.
  for (uint64_t key = 0; key < 6; ++key) {
    const SvBatch full = makeBatch(30 + key, 20);
    const std::vector<Matrix> grams = cpuGrams(full);
    for (const int64_t c : {1, 4, 10}) {
      CounterRng r1(3, RngPurpose::kSelect, key, 0), r2(3, RngPurpose::kSelect, key, 0);
      SelectionStats direct, gram;
      const SvBatch a = engine::selectSvgs(full, c, SelectionMethod::kJmcss, r1, &direct);
      const SvBatch b = engine::selectSvgs(full, c, SelectionMethod::kJmcssGram, r2, &gram, grams);
      CHECK(gram.indices == direct.indices);
      CHECK(relativeDifference(rebuilt(b), rebuilt(a)) < 1e-4);
    }
  }
  // Decaying spectra (a trained model's SVs): the same error, within rounding of the draw.
  double ej = 0.0, eg = 0.0;
  for (uint64_t key = 0; key < 8; ++key) {
    const SvBatch full = makeBatch(50 + key, 30, 0.7);
    CounterRng r1(4, RngPurpose::kSelect, key, 0), r2(4, RngPurpose::kSelect, key, 0);
    ej += relativeError(engine::selectSvgs(full, 6, SelectionMethod::kJmcss, r1), full);
    eg += relativeError(engine::selectSvgs(full, 6, SelectionMethod::kJmcssGram, r2, nullptr, cpuGrams(full)), full);
  }
  CHECK(eg <= 1.1 * ej);
  // Without its Gram matrices, or with the wrong ones, it is refused.
  const SvBatch full = makeBatch(40, 12);
  CounterRng rng(1, RngPurpose::kSelect, 0, 0);
  CHECK_THROWS_AS(engine::selectSvgs(full, 4, SelectionMethod::kJmcssGram, rng), Error);
  std::vector<Matrix> wrong = cpuGrams(makeBatch(40, 11));
  CHECK_THROWS_AS(engine::selectSvgs(full, 4, SelectionMethod::kJmcssGram, rng, nullptr, wrong), Error);
}

TEST_CASE("jmcss-gram stops once the selected SVGs span the batch, and past a low rank", "[select]") {
  const SvBatch full = spannedByThree();
  CounterRng sel(1, RngPurpose::kSelect, 0, 0);
  SelectionStats stats;
  const SvBatch out = engine::selectSvgs(full, 5, SelectionMethod::kJmcssGram, sel, &stats, cpuGrams(full));
  CHECK(stats.selected == 3);
  CHECK(relativeError(out, full) < 1e-4);
  // The third matrix's U has rank 2: selection goes on past it.
  const SvBatch wide = makeBatch(8, 20);
  CounterRng r(1, RngPurpose::kSelect, 0, 0);
  SelectionStats s2;
  engine::selectSvgs(wide, 10, SelectionMethod::kJmcssGram, r, &s2, cpuGrams(wide));
  CHECK(s2.selected == 10);
  // The replay's selectForPeers forms them itself from its source.
  ops::cpu::CpuBackend cpu;
  const std::optional<SvBatch> viaPeers =
      engine::selectForPeers(wide, 10, SelectionMethod::kJmcssGram, 1, 2, 3, engine::GramSource{&cpu, {}, nullptr, nullptr});
  CounterRng same(1, RngPurpose::kSelect, 2, 3);
  REQUIRE(viaPeers);
  CHECK(bytesOf(*viaPeers) ==
        bytesOf(engine::selectSvgs(wide, 10, SelectionMethod::kJmcssGram, same, nullptr, cpuGrams(wide))));
}

TEST_CASE("a log's selection method number is one the engine has", "[select]") {
  CHECK(engine::selectionMethodFromLog(0) == SelectionMethod::kJmcss);
  CHECK(engine::selectionMethodFromLog(1) == SelectionMethod::kUniform);
  CHECK(engine::selectionMethodFromLog(2) == SelectionMethod::kJmcssGram);
  CHECK_THROWS_AS(engine::selectionMethodFromLog(3), InputError);
  CHECK_THROWS_AS(engine::selectionMethodFromLog(0xffffffffu), InputError);
  CHECK(engine::parseSelectionMethod("jmcss-gram") == SelectionMethod::kJmcssGram);
  CHECK(engine::toString(SelectionMethod::kJmcssGram) == "jmcss-gram");
}
