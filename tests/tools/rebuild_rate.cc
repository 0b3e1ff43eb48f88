// rebuild_rate: how fast the rebuild runs on a device, against what that device's
// SGEMM and device-to-device copies reach in the same run (scripts/bench/gpu.sh).
//
//   rebuild_rate [--device D] [--shape JxK[,JxK...]] [--ranks P] [--columns N] [--reps R]
//                [--transfer staged|sync]
//
// The shapes are one clock of a model's parameter matrices (default MLP-2048's:
// 2048x784, 2048x2048, 10x2048), each rebuilt from P batches of N columns (default 4 of
// 100: an np-4 clock), into W resident on the device, as a resident replica does:
//   device    the batches' U and V already on the device (ops::DeviceSvs, as this
//             rank's own batch is read where the pass left it): the rebuild's own work;
//   received  the batches in host memory, as received: their U C and V copied in first
//             (--transfer staged, as a job's default: through one page-locked buffer,
//             one asynchronous copy per run of columns; sync: one blocking copy each).
// Each is timed over R clocks on the device's timer (Backend::secondsBetween). The
// reference rates: SGEMM at 4096^3 and a copy of 256 MiB within the device; and, as
// the best a rebuild of this shape can do, `gemm`: the same products as plain SGEMMs
// (W += U V^T, one per matrix, U and V already concatenated to P N columns).
// The bound for one clock is max(FLOPs / SGEMM rate, bytes / copy rate), with FLOPs =
// 2 J K P N per matrix and bytes = W read and written plus U and V read; the
// efficiency is the bound over the measured time (the goal is >= 0.7).
// Prints one JSON line. Exit 0, or 2 with one line on bad flags or a device that
// cannot be used.
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "ops/backends.h"
#include "ops/rebuild.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace orpheus;
using orpheus::ops::Backend;
using orpheus::ops::Tensor;
using orpheus::ops::Trans;

struct Options {
  std::string device = "cpu";
  std::vector<std::pair<int64_t, int64_t>> shapes{{2048, 784}, {2048, 2048}, {10, 2048}};
  int ranks = 4;
  int64_t columns = 100;
  int reps = 20;
  bool staged = true;
};

int64_t positive(const std::string& flag, const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v <= 0 || v > (1LL << 20)) {
    throw InputError(fmt::format("{} {}: expected a whole number from 1 to 1048576", flag, text));
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw InputError(fmt::format("{}: missing its value", flag));
    const std::string value = argv[++i];
    if (flag == "--device") {
      o.device = value;
    } else if (flag == "--shape") {
      o.shapes.clear();
      size_t at = 0;
      while (at <= value.size()) {
        const size_t comma = std::min(value.find(',', at), value.size());
        const std::string one = value.substr(at, comma - at);
        const size_t x = one.find('x');
        if (x == std::string::npos) throw InputError(fmt::format("--shape {}: expected JxK[,JxK...]", value));
        o.shapes.emplace_back(positive("--shape", one.substr(0, x)), positive("--shape", one.substr(x + 1)));
        at = comma + 1;
      }
    } else if (flag == "--ranks") {
      o.ranks = static_cast<int>(positive(flag, value));
    } else if (flag == "--columns") {
      o.columns = positive(flag, value);
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(positive(flag, value));
    } else if (flag == "--transfer") {
      if (value != "staged" && value != "sync") throw InputError(fmt::format("--transfer {}: staged or sync", value));
      o.staged = value == "staged";
    } else {
      throw InputError(fmt::format("unknown flag {} (--device, --shape, --ranks, --columns, --reps, --transfer)", flag));
    }
  }
  return o;
}

Tensor upload(Backend& b, const Matrix& m) {
  Tensor t = b.allocate(m.rows(), m.cols());
  b.copy(Tensor::host(m.data(), m.rows(), m.cols()), t);
  return t;
}

// Seconds per repetition of `body` on the device's timer, after one warm-up.
template <typename Body>
double timed(Backend& b, int reps, Body body) {
  body();
  b.synchronize();
  const ops::Event from = b.record();
  for (int r = 0; r < reps; ++r) body();
  const ops::Event to = b.record();
  b.wait(to);
  return b.secondsBetween(from, to) / reps;
}

int run(const Options& o) {
  auto backend = ops::makeBackend(o.device, 0);
  Backend& b = *backend;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t rows, int64_t cols) {
    Matrix m(rows, cols);
    for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
    return m;
  };

  // The reference rates, measured here and now.
  const int64_t g = o.device == "cpu" || o.device == "strict" ? 1024 : 4096;
  Tensor ga = upload(b, random(g, g)), gb = upload(b, random(g, g)), gc = b.allocate(g, g);
  const double sgemmSeconds = timed(b, 5, [&] { b.gemm(Trans::kNo, Trans::kNo, 1.0f, ga, gb, 0.0f, gc); });
  const double sgemmRate = 2.0 * g * g * g / sgemmSeconds;
  const int64_t copyFloats = g * g * 4;  // 256 MiB on a GPU
  Tensor from = b.allocate(copyFloats, 1), to = b.allocate(copyFloats, 1);
  b.scale(0.0f, from);
  const double copySeconds = timed(b, 5, [&] { b.copy(from, to); });
  const double copyRate = 2.0 * 4.0 * static_cast<double>(copyFloats) / copySeconds;  // read + write

  // One clock's batches: P of N columns, every matrix, one coefficient value.
  std::vector<SvBatch> batches(static_cast<size_t>(o.ranks));
  for (SvBatch& batch : batches) {
    batch.coeffs = Vector::Constant(o.columns, 0.001f);
    for (size_t p = 0; p < o.shapes.size(); ++p) {
      SvMatrix m;
      m.paramId = static_cast<uint32_t>(p);
      m.u = random(o.shapes[p].first, o.columns);
      m.vDense = random(o.shapes[p].second, o.columns);
      batch.matrices.push_back(std::move(m));
    }
  }
  std::vector<SvBatchView> views;
  for (const SvBatch& batch : batches) views.push_back(viewOf(batch));
  std::vector<const SvBatchView*> ptrs;
  for (const SvBatchView& v : views) ptrs.push_back(&v);
  std::vector<Tensor> w;
  double flops = 0.0, bytes = 0.0;
  for (const auto& [rows, cols] : o.shapes) {
    w.push_back(upload(b, random(rows, cols)));
    const double n = static_cast<double>(o.ranks * o.columns);
    flops += 2.0 * rows * cols * n;
    bytes += 4.0 * (2.0 * rows * cols + (rows + cols) * n);
  }
  // The same batches' U and V on the device.
  std::vector<Tensor> deviceU, deviceV;
  std::vector<ops::DeviceSvs> onDevice;
  for (const SvBatch& batch : batches) {
    for (const SvMatrix& m : batch.matrices) {
      deviceU.push_back(upload(b, m.u));
      deviceV.push_back(upload(b, m.vDense));
    }
  }
  for (size_t i = 0, k = 0; i < batches.size(); ++i) {
    for (size_t p = 0; p < batches[i].matrices.size(); ++p, ++k) {
      onDevice.push_back({views[i].matrices[p].u, &deviceU[k], &deviceV[k]});
    }
  }
  ops::RebuildBuffers buffers;
  buffers.device.staged = o.staged;
  const uint64_t inBefore = b.transfers().toDevice;
  const uint64_t launchesBefore = b.launches();
  const double deviceSeconds = timed(b, o.reps, [&] { ops::applySvBatches(ptrs, w, b, buffers, onDevice); });
  const uint64_t deviceIn = (b.transfers().toDevice - inBefore) / static_cast<uint64_t>(o.reps + 1);
  const uint64_t deviceLaunches = (b.launches() - launchesBefore) / static_cast<uint64_t>(o.reps + 1);
  const double receivedSeconds = timed(b, o.reps, [&] { ops::applySvBatches(ptrs, w, b, buffers); });
  // The same products as plain SGEMMs on operands already concatenated.
  std::vector<Tensor> joinedU, joinedV;
  const int64_t all = o.ranks * o.columns;
  for (const auto& [rows, cols] : o.shapes) {
    joinedU.push_back(upload(b, random(rows, all)));
    joinedV.push_back(upload(b, random(cols, all)));
  }
  const double gemmSeconds = timed(b, o.reps, [&] {
    for (size_t p = 0; p < w.size(); ++p) b.gemm(Trans::kNo, Trans::kYes, 0.001f, joinedU[p], joinedV[p], 1.0f, w[p]);
  });

  std::string shapes;
  for (const auto& [rows, cols] : o.shapes) shapes += fmt::format("{}{}x{}", shapes.empty() ? "" : ",", rows, cols);
  const double bound = std::max(flops / sgemmRate, bytes / copyRate);
  std::printf(
      "{\"device\": \"%s\", \"transfer\": \"%s\", \"shapes\": \"%s\", \"ranks\": %d, \"columns\": %lld, \"reps\": %d, "
      "\"sgemm_flops\": %.4g, \"copy_bytes_per_second\": %.4g, \"rebuild_flops\": %.4g, \"rebuild_bytes\": %.4g, "
      "\"device_seconds\": %.4g, \"device_flops\": %.4g, \"device_bytes_per_second\": %.4g, "
      "\"device_h2d_bytes\": %llu, \"device_launches\": %llu, \"bound\": \"%s\", \"efficiency\": %.3f, "
      "\"received_seconds\": %.4g, \"received_flops\": %.4g, \"gemm_seconds\": %.4g, \"gemm_flops\": %.4g, "
      "\"of_gemm\": %.3f}\n",
      b.describe().c_str(), o.staged ? "staged" : "sync", shapes.c_str(),
      o.ranks, static_cast<long long>(o.columns), o.reps, sgemmRate, copyRate, flops, bytes, deviceSeconds,
      flops / deviceSeconds, bytes / deviceSeconds, static_cast<unsigned long long>(deviceIn), static_cast<unsigned long long>(deviceLaunches),
      flops / sgemmRate >= bytes / copyRate ? "sgemm" : "copy", bound / deviceSeconds, receivedSeconds,
      flops / receivedSeconds, gemmSeconds, flops / gemmSeconds, gemmSeconds / deviceSeconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rebuild_rate: %s\n", e.what());
    return 2;
  }
}
