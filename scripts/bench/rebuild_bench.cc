// orpheus_bench_rebuild: how close the SV rebuild (ops::applySvBatches) comes to
// the machine's single-core GEMM rate. Prints one JSON line per measurement:
//   peak     a plain square Eigen product (OpenBLAS sgemm under EIGEN_USE_BLAS)
//   gemm     a plain product of the rebuild's own shape, W += U V^T with U J x N,
//            V K x N, N the columns of all batches: the best the rebuild can do
//   rebuild  applySvBatches on one SvBatch per simulated rank, dense V, with bias
// Rates are 2 J K N / median time; the rebuild's bias update, U diag(c) scaling and
// column concatenation count as overhead, not flops, so its rate is comparable to
// the GEMM's. Run with one BLAS thread: the engine gives each rank one core.
//
// Usage: orpheus_bench_rebuild [--ranks P] [--columns n] [--peak-size N] [--quick]
#include "engine/base/log.h"
#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/rebuild.h"

#include "engine/cli/flags.h"
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

extern "C" char* openblas_get_config() __attribute__((weak));

namespace orpheus {
namespace {

using BenchClock = std::chrono::steady_clock;

struct BenchOptions {
  int ranks = 4;
  int64_t columns = 100;
  int64_t peakSize = 2048;
  bool quick = false;
};

struct Timing {
  double medianSeconds = 0.0;  // per call
  double minSeconds = 0.0;
  double maxSeconds = 0.0;
  int samples = 0;
  int callsPerSample = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// One timed operation. Samples repeat the call enough times (>= minSampleSeconds)
// that timer resolution stays small against the work.
struct BenchCase {
  std::string kind;
  std::string shape;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t columns = 0;
  int batches = 1;
  double minSampleSeconds = 0.05;
  std::function<void()> call;
  int calls = 1;
  std::vector<double> perCall;

  void calibrate() {
    call();  // faults in pages and lets OpenBLAS allocate its buffers
    for (;;) {
      const double s = sampleSeconds() * calls;
      if (s >= minSampleSeconds || calls >= (1 << 20)) break;
      calls *= 2;
    }
  }
  double sampleSeconds() {
    const auto t = BenchClock::now();
    for (int i = 0; i < calls; ++i) call();
    return std::chrono::duration<double>(BenchClock::now() - t).count() / calls;
  }
  Timing timing() const {
    Timing r;
    r.medianSeconds = median(perCall);
    r.minSeconds = *std::min_element(perCall.begin(), perCall.end());
    r.maxSeconds = *std::max_element(perCall.begin(), perCall.end());
    r.samples = static_cast<int>(perCall.size());
    r.callsPerSample = calls;
    return r;
  }
};

// Samples every case in turn, round after round, so a change in the machine's
// speed during the run (another process, clock scaling) hits the peak and the
// rebuild alike instead of skewing their ratio.
void runInterleaved(std::vector<BenchCase>& cases, int rounds) {
  for (BenchCase& c : cases) c.calibrate();
  for (int round = 0; round < rounds; ++round) {
    for (BenchCase& c : cases) c.perCall.push_back(c.sampleSeconds());
  }
}

Matrix randomMatrix(int64_t rows, int64_t cols, std::mt19937_64& gen, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(gen);
  return m;
}

void printResult(const BenchCase& c) {
  const Timing t = c.timing();
  const double flops =
      2.0 * static_cast<double>(c.rows) * static_cast<double>(c.cols) * static_cast<double>(c.columns);
  fmt::print(
      "{{\"kind\": \"{}\", \"shape\": \"{}\", \"rows\": {}, \"cols\": {}, \"columns\": {}, \"batches\": {}, "
      "\"flops\": {:.6g}, \"median_seconds\": {:.6g}, \"min_seconds\": {:.6g}, \"max_seconds\": {:.6g}, "
      "\"gflops\": {:.6g}, \"gflops_best\": {:.6g}, \"samples\": {}, \"calls_per_sample\": {}}}\n",
      c.kind, c.shape, c.rows, c.cols, c.columns, c.batches, flops, t.medianSeconds, t.minSeconds, t.maxSeconds,
      flops / t.medianSeconds / 1e9, flops / t.minSeconds / 1e9, t.samples, t.callsPerSample);
  std::fflush(stdout);
}

// Operands of the benchmarks; they outlive the cases that refer to them.
struct SquareProblem {
  Matrix a, b, c;
};

struct RebuildProblem {
  std::vector<SvBatch> batches;
  std::vector<const SvBatch*> pointers;
  ParamSet w;
  Matrix u, v, target;  // the same product, operands already weighted and concatenated
};

BenchCase peakCase(int64_t n, SquareProblem& p, std::mt19937_64& gen) {
  p.a = randomMatrix(n, n, gen, 1.0f);
  p.b = randomMatrix(n, n, gen, 1.0f);
  p.c.resize(n, n);
  BenchCase c;
  c.kind = "peak";
  c.shape = fmt::format("{0}x{0} * {0}x{0}", n);
  c.rows = c.cols = c.columns = n;
  c.minSampleSeconds = 0.15;
  c.call = [&p] { p.c.noalias() = p.a * p.b; };
  return c;
}

// One clock's rebuild at `ranks` ranks for a J x K parameter with bias: the update
// every replica applies after receiving all batches; plus the bare GEMM of that shape.
std::vector<BenchCase> rebuildCases(const BenchOptions& o, const std::string& shape, int64_t j, int64_t k,
                                    RebuildProblem& p, std::mt19937_64& gen) {
  const int64_t n = o.columns;
  const int64_t total = n * o.ranks;
  // Small values keep W finite over the many repeated applications.
  constexpr float kScale = 1e-3f;

  p.batches.resize(static_cast<size_t>(o.ranks));
  for (int r = 0; r < o.ranks; ++r) {
    SvBatch& b = p.batches[static_cast<size_t>(r)];
    b.header.sender = static_cast<uint32_t>(r);
    b.header.replica = static_cast<uint32_t>(r);
    b.header.clock = 1;
    b.coeffs = randomMatrix(n, 1, gen, kScale);
    SvMatrix m;
    m.paramId = 0;
    m.biasId = 1;
    m.u = randomMatrix(j, n, gen, 1.0f);
    m.vDense = randomMatrix(k, n, gen, 1.0f);
    b.matrices.push_back(std::move(m));
  }
  for (const SvBatch& b : p.batches) p.pointers.push_back(&b);
  p.w.params.push_back({"W", Matrix::Zero(j, k)});
  p.w.params.push_back({"b", Matrix::Zero(j, 1)});
  p.u = randomMatrix(j, total, gen, kScale);
  p.v = randomMatrix(k, total, gen, 1.0f);
  p.target = Matrix::Zero(j, k);

  BenchCase gemm;
  gemm.kind = "gemm";
  gemm.shape = shape;
  gemm.rows = j;
  gemm.cols = k;
  gemm.columns = total;
  gemm.call = [&p] { p.target.noalias() += p.u * p.v.transpose(); };

  BenchCase rebuild = gemm;
  rebuild.kind = "rebuild";
  rebuild.batches = o.ranks;
  rebuild.call = [&p] { ops::applySvBatches(p.pointers, p.w); };
  return {std::move(gemm), std::move(rebuild)};
}

// Bad flags: one line and exit 2 (--help: exit 0).
BenchOptions parseOptions(int argc, char** argv) {
  BenchOptions o;
  CLI::App app{"orpheus_bench_rebuild: the rebuild against plain GEMMs of the same products"};
  app.add_option("--ranks", o.ranks, "batches a clock rebuilds from")->check(engine::cli::integerIn(1));
  app.add_option("--columns", o.columns, "columns per batch")->check(engine::cli::integerIn(1));
  app.add_option("--peak-size", o.peakSize, "N of the square N x N x N product that measures the peak")
      ->check(engine::cli::integerIn(1));
  app.add_flag("--quick", o.quick, "3 repetitions of each case, not 9");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return o;
}

}  // namespace
}  // namespace orpheus

int main(int argc, char** argv) {
  using namespace orpheus;
  const BenchOptions options = parseOptions(argc, argv);
  setBlasThreads(1);
  std::mt19937_64 gen(20240611);
  const char* blas = openblas_get_config != nullptr ? openblas_get_config() : "none";
  fmt::print("{{\"kind\": \"info\", \"blas\": \"{}\", \"ranks\": {}, \"columns_per_rank\": {}}}\n", blas,
             options.ranks, options.columns);

  SquareProblem square;
  RebuildProblem large;
  RebuildProblem mlr;
  std::vector<BenchCase> cases;
  cases.push_back(peakCase(options.peakSize, square, gen));
  for (BenchCase& c : rebuildCases(options, "2048x2048", 2048, 2048, large, gen)) cases.push_back(std::move(c));
  for (BenchCase& c : rebuildCases(options, "10x784 (MLR)", 10, 784, mlr, gen)) cases.push_back(std::move(c));
  runInterleaved(cases, options.quick ? 3 : 9);
  for (const BenchCase& c : cases) printResult(c);
  return 0;
}
