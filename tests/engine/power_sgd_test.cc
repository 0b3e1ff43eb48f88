// --sync powersgd (engine/worker/power_sgd.h): at full rank the all-reduced update
// is the dense sum; error feedback loses nothing (what a rank's share of the update
// plus its new residual equals its gradient plus its old residual); the matrices
// the hook would not compress go whole; the replicas of a job stay equal.
#include "comm/loopback/loopback_transport.h"
#include "engine/worker/power_sgd.h"
#include "ops/backends.h"
#include "ops/cpu/cpu_backend.h"

#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <thread>

using namespace orpheus;
using comm::loopback::LoopbackHub;
using comm::loopback::LoopbackTransport;
using engine::PowerSgdReducer;

namespace {

Matrix randomMatrix(Eigen::Index rows, Eigen::Index cols, std::mt19937& gen) {
  std::normal_distribution<float> normal;
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m(i) = normal(gen);
  return m;
}

// A 12 x 9 weight, its 12 x 1 bias and a 7 x 20 weight, drawn for (rank, clock).
ParamSet gradientOf(int rank, uint64_t clock) {
  std::mt19937 gen(static_cast<unsigned>(1000 * clock + static_cast<uint64_t>(rank)));
  ParamSet g;
  g.params = {{"w", randomMatrix(12, 9, gen)}, {"b", randomMatrix(12, 1, gen)}, {"v", randomMatrix(7, 20, gen)}};
  return g;
}

struct RankRun {
  std::vector<ParamSet> updates;    // per clock, what reduce() left
  std::vector<ParamSet> residuals;  // per clock, E after it (compressed matrices; others empty)
  std::vector<uint64_t> blocking;   // per clock, the copies of reduce() that made the host wait
};

// `clocks` clocks of reduce() on `ranks` threads over loopback, on `device`.
std::vector<RankRun> reduceClocks(int ranks, int64_t rank, int64_t minRate, uint64_t clocks,
                                  const std::string& device = "cpu") {
  auto hub = std::make_shared<LoopbackHub>(ranks);
  std::vector<RankRun> out(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport t(hub, r);
      const auto backend = ops::makeBackend(device);  // one backend per thread, as per worker
      PowerSgdReducer reducer(*backend, rank, 7, minRate);
      for (uint64_t c = 1; c <= clocks; ++c) {
        ParamSet g = gradientOf(r, c);
        const uint64_t before = backend->transfers().blocking;
        reducer.reduce(g, t, c);
        out[static_cast<size_t>(r)].blocking.push_back(backend->transfers().blocking - before);
        out[static_cast<size_t>(r)].updates.push_back(g);
        ParamSet e = g;
        for (size_t p = 0; p < e.size(); ++p) {
          e[p] = reducer.compressedRank(g[p]) > 0 ? reducer.residual(p) : Matrix();
        }
        out[static_cast<size_t>(r)].residuals.push_back(e);
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

double relative(const Matrix& a, const Matrix& b) { return (a - b).norm() / b.norm(); }

}  // namespace

TEST_CASE("PowerSGD at full rank all-reduces exactly the dense sum (np 2)", "[powersgd]") {
  // Rank 9 >= min(12, 9) and min(7, 20): every matrix compressed, nothing lost.
  const auto runs = reduceClocks(2, 9, 0, 6);
  for (uint64_t c = 1; c <= 6; ++c) {
    const ParamSet a = gradientOf(0, c), b = gradientOf(1, c);
    for (size_t p = 0; p < a.size(); ++p) {
      INFO("clock " << c << ", parameter " << p);
      CHECK(relative(runs[0].updates[c - 1][p], a[p] + b[p]) < 1e-5);
      CHECK(runs[0].updates[c - 1][p] == runs[1].updates[c - 1][p]);  // every replica the same update
    }
  }
}

TEST_CASE("PowerSGD's error feedback conserves: update / W + E = G + old E", "[powersgd]") {
  const int ranks = 3;
  const auto runs = reduceClocks(ranks, 1, PowerSgdReducer::kMinCompressionRate, 8);
  ops::cpu::CpuBackend cpu;
  PowerSgdReducer probe(cpu, 1, 7);
  const ParamSet shapes = gradientOf(0, 1);
  CHECK(probe.compressedRank(shapes[0]) == 1);  // (12 + 9) * 2 < 108
  CHECK(probe.compressedRank(shapes[1]) == 0);  // a vector goes whole
  CHECK(probe.compressedRank(shapes[2]) == 1);
  for (int r = 0; r < ranks; ++r) {
    const RankRun& run = runs[static_cast<size_t>(r)];
    for (uint64_t c = PowerSgdReducer::kPlainClocks + 1; c <= 8; ++c) {
      const ParamSet g = gradientOf(r, c);
      for (size_t p : {size_t{0}, size_t{2}}) {
        INFO("rank " << r << ", clock " << c << ", parameter " << p);
        const Matrix& update = run.updates[c - 1][p];
        const Matrix& oldE = run.residuals[c - 2][p];
        const Matrix& newE = run.residuals[c - 1][p];
        CHECK(relative(update / static_cast<float>(ranks) + newE, g[p] + oldE) < 1e-5);
        // The update has rank 1 and is not the dense sum.
        Eigen::JacobiSVD<Eigen::MatrixXd> svd(update.cast<double>());
        CHECK(svd.singularValues()(1) < 1e-4 * svd.singularValues()(0));
      }
      // The bias: the dense sum.
      Matrix sum = Matrix::Zero(12, 1);
      for (int q = 0; q < ranks; ++q) sum += gradientOf(q, c)[1];
      CHECK(relative(run.updates[c - 1][1], sum) < 1e-6);
    }
    // The plain clocks: the dense sum, no residual.
    CHECK(run.residuals[PowerSgdReducer::kPlainClocks - 1][0].norm() == 0.0f);
  }
}

TEST_CASE("PowerSGD on the strict device: the CPU's bits, and no copy within a clock blocks the host",
          "[powersgd][strict]") {
  const auto cpu = reduceClocks(2, 1, PowerSgdReducer::kMinCompressionRate, 6);
  const auto strict = reduceClocks(2, 1, PowerSgdReducer::kMinCompressionRate, 6, "strict");
  for (size_t r = 0; r < 2; ++r) {
    for (size_t c = 0; c < 6; ++c) {
      INFO("rank " << r << ", clock " << c + 1);
      for (size_t p = 0; p < 3; ++p) {
        CHECK(strict[r].updates[c][p] == cpu[r].updates[c][p]);
        CHECK(strict[r].residuals[c][p] == cpu[r].residuals[c][p]);
      }
      // Only the gradient's copies in and out (reduce of a ParamSet on a device),
      // and at the first clock the zeros of the two compressed matrices' E: the
      // factors, the bias and the plain clocks' sums cross asynchronously through
      // the staging buffer (it was 6 more a plain clock and 12 more a compressed
      // one, each a wait).
      CHECK(strict[r].blocking[c] == 2 * 3 + (c == 0 ? 2 : 0));
    }
  }
}

TEST_CASE("Gram-Schmidt leaves orthonormal columns", "[powersgd]") {
  std::mt19937 gen(3);
  Matrix m = randomMatrix(10, 3, gen);
  engine::orthonormalizeColumns(m);
  CHECK((m.transpose() * m - Matrix::Identity(3, 3)).norm() < 1e-5);
}
