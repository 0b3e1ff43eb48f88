// orpheus_bench_step: one rank's training step on a .loss model, without the
// network, for comparing with the same step in PyTorch (step_vs_torch.sh) and for
// instruction counts (valgrind --tool=callgrind; --clocks 1 --warmup 1 keeps the
// run short). Prints one JSON line per mode with the time per clock.
//   dense    what a --sync dense clock computes on one rank: the dense gradient
//            (forward, backward, U V^T per matrix) and W += scale * gradient
//   sv       a --sync sv clock with every SVG kept: compute_svg, the coefficients
//            scaled, and the rebuild of the own batch
//   rebuild  the rebuild alone of --ranks batches of the model's SVs (one clock
//            of a broadcast group of that many ranks)
// Data are random (features x batch, uniform in [0, 1), labels uniform); only
// their shapes matter for the time.
//
// Usage: orpheus_bench_step [--loss FILE] [--features D] [--classes C] [--batch B]
//          [--clocks N] [--warmup N] [--threads T] [--ranks P] [--modes dense,sv,rebuild]
#include "engine/base/log.h"
#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/graph_model.h"
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

namespace orpheus {
namespace {

using BenchClock = std::chrono::steady_clock;

struct StepOptions {
  std::string loss = "examples/mlp_wide.loss";
  int64_t features = 784;
  int64_t classes = 10;
  int64_t batch = 100;
  int clocks = 20;
  int warmup = 3;
  int threads = 1;
  int ranks = 4;
  std::vector<std::string> modes{"dense", "sv", "rebuild"};
};

// Bad flags: one line and exit 2 (--help: exit 0).
StepOptions parseOptions(int argc, char** argv) {
  StepOptions o;
  CLI::App app{"orpheus_bench_step: one rank's training step on a .loss model, without the network"};
  app.add_option("--loss", o.loss, "the .loss model")->check(CLI::ExistingFile);
  app.add_option("--features", o.features)->check(engine::cli::integerIn(1));
  app.add_option("--classes", o.classes)->check(engine::cli::integerIn(1));
  app.add_option("--batch", o.batch)->check(engine::cli::integerIn(1));
  app.add_option("--clocks", o.clocks)->check(engine::cli::integerIn(1));
  app.add_option("--warmup", o.warmup)->check(engine::cli::integerIn(0));
  app.add_option("--threads", o.threads)->check(engine::cli::integerIn(1));
  app.add_option("--ranks", o.ranks, "batches the rebuild mode applies")->check(engine::cli::integerIn(1));
  app.add_option("--modes", o.modes)->delimiter(',')->check(CLI::IsMember({"dense", "sv", "rebuild"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Seconds of each of `clocks` calls after `warmup` untimed ones.
std::vector<double> timeClocks(const StepOptions& o, const std::function<void()>& clock) {
  for (int i = 0; i < o.warmup; ++i) clock();
  std::vector<double> seconds;
  for (int i = 0; i < o.clocks; ++i) {
    const auto t = BenchClock::now();
    clock();
    seconds.push_back(std::chrono::duration<double>(BenchClock::now() - t).count());
  }
  return seconds;
}

void report(const StepOptions& o, const std::string& mode, const std::vector<double>& seconds, double loss) {
  fmt::print("{{\"kind\": \"step\", \"engine\": \"orpheus\", \"mode\": \"{}\", \"loss_file\": \"{}\", \"batch\": {}, "
             "\"threads\": {}, \"ranks\": {}, \"clocks\": {}, \"median_ms\": {:.3f}, \"min_ms\": {:.3f}, "
             "\"last_loss\": {:.6f}}}\n",
             mode, o.loss, o.batch, o.threads, mode == "rebuild" ? o.ranks : 1, seconds.size(),
             1e3 * median(seconds), 1e3 * *std::min_element(seconds.begin(), seconds.end()), loss);
}

}  // namespace
}  // namespace orpheus

int main(int argc, char** argv) {
  using namespace orpheus;
  const StepOptions o = parseOptions(argc, argv);
  setBlasThreads(o.threads);
  const auto model = ops::GraphModel::fromFile(o.loss, {o.features, o.classes}, 7);
  ParamSet w = model->initParams(7);
  std::mt19937_64 gen(20240611);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, static_cast<int>(o.classes) - 1);
  Matrix data(o.features, o.batch);
  for (int64_t i = 0; i < data.size(); ++i) data.data()[i] = unit(gen);
  Eigen::VectorXi labels(o.batch);
  for (int64_t j = 0; j < o.batch; ++j) labels(j) = label(gen);
  ops::ExampleBatch x;
  x.dense = &data;
  x.labels = &labels;
  // A small step, so the parameters stay finite over many clocks.
  const float scale = -1e-4f / static_cast<float>(o.batch);

  for (const std::string& mode : o.modes) {
    double loss = 0.0;
    std::vector<double> seconds;
    if (mode == "dense") {
      seconds = timeClocks(o, [&] {
        const ParamSet grad = model->denseGradient(w, x, &loss);
        for (size_t i = 0; i < w.size(); ++i) w[i].noalias() += scale * grad[i];
      });
    } else if (mode == "sv") {
      seconds = timeClocks(o, [&] {
        SvBatch local = model->computeSvg(w, x, &loss);
        ops::scaleCoefficients(local, scale);
        const SvBatch* one[] = {&local};
        ops::applySvBatches(one, w);
      });
    } else {
      SvBatch local = model->computeSvg(w, x, &loss);
      ops::scaleCoefficients(local, scale / static_cast<float>(o.ranks));
      const std::vector<const SvBatch*> group(static_cast<size_t>(o.ranks), &local);
      seconds = timeClocks(o, [&] { ops::applySvBatches(group, w); });
    }
    report(o, mode, seconds, loss);
  }
  return 0;
}
