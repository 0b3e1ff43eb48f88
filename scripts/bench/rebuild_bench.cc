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

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// Times `call` in samples long enough (>= minSampleSeconds) that timer resolution
// and scheduler noise stay small against the work, after one untimed warm-up call
// that faults in pages and lets OpenBLAS allocate its buffers.
template <typename Call>
Timing timeCalls(Call&& call, int samples, double minSampleSeconds) {
  call();
  int calls = 1;
  for (;;) {
    const auto t = BenchClock::now();
    for (int i = 0; i < calls; ++i) call();
    const double s = std::chrono::duration<double>(BenchClock::now() - t).count();
    if (s >= minSampleSeconds || calls >= (1 << 20)) break;
    calls *= 2;
  }
  std::vector<double> perCall;
  perCall.reserve(static_cast<size_t>(samples));
  for (int k = 0; k < samples; ++k) {
    const auto t = BenchClock::now();
    for (int i = 0; i < calls; ++i) call();
    perCall.push_back(std::chrono::duration<double>(BenchClock::now() - t).count() / calls);
  }
  Timing r;
  r.medianSeconds = median(perCall);
  r.minSeconds = *std::min_element(perCall.begin(), perCall.end());
  r.maxSeconds = *std::max_element(perCall.begin(), perCall.end());
  r.samples = samples;
  r.callsPerSample = calls;
  return r;
}

Matrix randomMatrix(int64_t rows, int64_t cols, std::mt19937_64& gen, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(gen);
  return m;
}

void printResult(const std::string& kind, const std::string& shape, int64_t j, int64_t k, int64_t columns,
                 int batches, const Timing& t) {
  const double flops = 2.0 * static_cast<double>(j) * static_cast<double>(k) * static_cast<double>(columns);
  fmt::print(
      "{{\"kind\": \"{}\", \"shape\": \"{}\", \"rows\": {}, \"cols\": {}, \"columns\": {}, \"batches\": {}, "
      "\"flops\": {:.6g}, \"median_seconds\": {:.6g}, \"min_seconds\": {:.6g}, \"max_seconds\": {:.6g}, "
      "\"gflops\": {:.6g}, \"gflops_best\": {:.6g}, \"samples\": {}, \"calls_per_sample\": {}}}\n",
      kind, shape, j, k, columns, batches, flops, t.medianSeconds, t.minSeconds, t.maxSeconds,
      flops / t.medianSeconds / 1e9, flops / t.minSeconds / 1e9, t.samples, t.callsPerSample);
  std::fflush(stdout);
}

void benchPeak(const BenchOptions& o, std::mt19937_64& gen) {
  const int64_t n = o.peakSize;
  const Matrix a = randomMatrix(n, n, gen, 1.0f);
  const Matrix b = randomMatrix(n, n, gen, 1.0f);
  Matrix c(n, n);
  const Timing t = timeCalls([&] { c.noalias() = a * b; }, o.quick ? 3 : 7, 0.2);
  printResult("peak", fmt::format("{0}x{0} * {0}x{0}", n), n, n, n, 1, t);
}

// One clock's rebuild at `ranks` ranks for a J x K parameter with bias: the update
// every replica applies after receiving all batches.
void benchRebuild(const BenchOptions& o, const std::string& shape, int64_t j, int64_t k, std::mt19937_64& gen) {
  const int64_t n = o.columns;
  const int64_t total = n * o.ranks;
  // Small values keep W finite over the many repeated applications.
  constexpr float kScale = 1e-3f;

  std::vector<SvBatch> batches(static_cast<size_t>(o.ranks));
  for (int r = 0; r < o.ranks; ++r) {
    SvBatch& b = batches[static_cast<size_t>(r)];
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
  std::vector<const SvBatch*> pointers;
  for (const SvBatch& b : batches) pointers.push_back(&b);

  ParamSet w;
  w.params.push_back({"W", Matrix::Zero(j, k)});
  w.params.push_back({"b", Matrix::Zero(j, 1)});

  const int samples = o.quick ? 5 : 15;
  const Timing rebuild = timeCalls([&] { ops::applySvBatches(pointers, w); }, samples, 0.05);

  // The same product with the operands already weighted and concatenated.
  const Matrix u = randomMatrix(j, total, gen, kScale);
  const Matrix v = randomMatrix(k, total, gen, 1.0f);
  Matrix target = Matrix::Zero(j, k);
  const Timing gemm = timeCalls([&] { target.noalias() += u * v.transpose(); }, samples, 0.05);

  printResult("gemm", shape, j, k, total, 1, gemm);
  printResult("rebuild", shape, j, k, total, o.ranks, rebuild);
}

BenchOptions parseOptions(int argc, char** argv) {
  BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--ranks" && hasValue) {
      o.ranks = std::atoi(argv[++i]);
    } else if (arg == "--columns" && hasValue) {
      o.columns = std::atoll(argv[++i]);
    } else if (arg == "--peak-size" && hasValue) {
      o.peakSize = std::atoll(argv[++i]);
    } else if (arg == "--quick") {
      o.quick = true;
    } else {
      fmt::print(stderr, "usage: {} [--ranks P] [--columns n] [--peak-size N] [--quick]\n", argv[0]);
      std::exit(2);
    }
  }
  if (o.ranks < 1 || o.columns < 1 || o.peakSize < 1) {
    fmt::print(stderr, "--ranks, --columns and --peak-size must be positive\n");
    std::exit(2);
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
  benchPeak(options, gen);
  benchRebuild(options, "2048x2048", 2048, 2048, gen);
  benchRebuild(options, "10x784 (MLR)", 10, 784, gen);
  return 0;
}
