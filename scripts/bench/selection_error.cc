// orpheus_bench_selection: how well C selected SVGs stand for the update of a
// batch of B, on real updates of trained models, and what selecting costs.
//
// For each model (MLR, and the MLP of examples/mlp.loss) it trains `--steps` SGD
// steps in-process (one worker, batch B, learning rate lr: computeSvg, scale by
// -lr/B, rebuild), then takes `--batches` further minibatches and, for every C,
// measures the relative Frobenius error ||rebuilt - full||_F / ||full||_F of the
// update against the full batch update, for
//   jmcss+core     engine::selectSvgs(kJmcss): the columns Algorithm 2 draws, with
//                  least-squares cores
//   jmcss x B/C    the same columns with per-column coefficients scaled by B/C
//   uniform x B/C  engine::selectSvgs(kUniform)
//   jmcss-gram     engine::selectSvgs(kJmcssGram): the same draw from the Gram
//                  matrices (engine::svGrams on the CPU backend, timed with it), from
//                  the same random stream as jmcss: how often it draws the same columns
// "all" is the error over every weight matrix together (biases excluded, as in the
// float64 reference of FACTS.md); then each parameter, biases included. Means over
// the batches. Selection time is reported against computeSvg's time for the batch
// (the compute of a clock before any communication). Prints markdown.
//
// Usage: orpheus_bench_selection [--train path] [--mlp path] [--steps N]
//          [--batches N] [--batch B] [--lr x] [--c 5,10,25,50] [--seed s] [--models mlr,mlp]
#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "engine/data/dataset.h"
#include "engine/data/sampler.h"
#include "engine/worker/select.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/graph_model.h"
#include "ops/mlr.h"
#include "ops/rebuild.h"

#include "engine/cli/flags.h"
#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace orpheus {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU time of the calling thread: steadier than wall time on a shared machine, and
// the same thing for both sides of the ratio (run with one BLAS thread).
double threadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Options {
  std::string train = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  std::string mlp = "examples/mlp.loss";
  int64_t steps = 300;
  int64_t batches = 20;
  int64_t batch = 100;
  double lr = 0.1;
  std::vector<int64_t> cs = {5, 10, 25, 50};
  uint64_t seed = 1;
  std::vector<std::string> models = {"mlr", "mlp"};
};

// Bad flags: one line and exit 2 (--help: exit 0).
Options parseOptions(int argc, char** argv) {
  Options o;
  CLI::App app{"orpheus_bench_selection: how well C selected SVGs stand for the update of a batch of B"};
  app.add_option("--train", o.train)->check(CLI::ExistingFile);
  app.add_option("--mlp", o.mlp, "the MLP's .loss model")->check(CLI::ExistingFile);
  app.add_option("--steps", o.steps)->check(engine::cli::integerIn(1));
  app.add_option("--batches", o.batches)->check(engine::cli::integerIn(1));
  app.add_option("--batch", o.batch)->check(engine::cli::integerIn(1));
  app.add_option("--lr", o.lr)->check(engine::cli::numberIn(0.0, 1e6, true));
  app.add_option("--seed", o.seed);
  app.add_option("--c", o.cs, "the columns kept, C,C,...")->delimiter(',')->check(engine::cli::integerIn(1));
  app.add_option("--models", o.models)->delimiter(',')->check(CLI::IsMember({"mlr", "mlp"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return o;
}

ops::ExampleBatch view(const data::Batch& b) {
  ops::ExampleBatch x;
  if (b.sparse) {
    x.sparse = &b.sparseX;
  } else {
    x.dense = &b.dense;
  }
  x.labels = &b.labels;
  x.indices = &b.indices;
  return x;
}

// The update a batch stands for, on zero parameters.
ParamSet updateOf(const ops::Model& model, const SvBatch& b) {
  ParamSet w = model.zeroParams();
  const SvBatch* one[] = {&b};
  model.computeUpdate(one, w);
  return w;
}

// Per-column baseline: the given columns of `full`, coefficients scaled by B/C.
SvBatch rescaledColumns(const SvBatch& full, const std::vector<int64_t>& columns) {
  SvBatch out;
  out.header = full.header;
  const float scale = static_cast<float>(full.numColumns()) / static_cast<float>(columns.size());
  out.coeffs = full.coeffs(columns) * scale;
  for (const SvMatrix& m : full.matrices) {
    SvMatrix s;
    s.paramId = m.paramId;
    s.biasId = m.biasId;
    s.u = m.u(Eigen::all, columns);
    s.sparseV = m.sparseV;
    if (m.sparseV) {
      // Dense round trip: the bench's V are dense (images); sparse is here for completeness.
      const Matrix dense = Matrix(m.vSparse)(Eigen::all, columns);
      s.vSparse = dense.sparseView();
    } else {
      s.vDense = m.vDense(Eigen::all, columns);
    }
    out.matrices.push_back(std::move(s));
  }
  return out;
}

// Squared error and squared norm per parameter, summed into the running means.
struct ErrorSums {
  std::vector<double> relative;  // per parameter, summed over batches
  double all = 0.0;              // weights together, summed over batches
};

void accumulate(const ParamSet& approx, const ParamSet& full, const std::vector<bool>& isWeight, ErrorSums& sums) {
  if (sums.relative.empty()) sums.relative.assign(full.size(), 0.0);
  double err2 = 0.0, norm2 = 0.0;
  for (size_t i = 0; i < full.size(); ++i) {
    const double e = (approx[i].cast<double>() - full[i].cast<double>()).squaredNorm();
    const double f = full[i].cast<double>().squaredNorm();
    sums.relative[i] += f > 0.0 ? std::sqrt(e / f) : 0.0;
    if (isWeight[i]) {
      err2 += e;
      norm2 += f;
    }
  }
  sums.all += norm2 > 0.0 ? std::sqrt(err2 / norm2) : 0.0;
}

void runModel(const std::string& name, const ops::Model& model, const data::Dataset& train, const Options& o) {
  std::cerr << fmt::format("selection_error: {}: training {} steps\n", name, o.steps);
  ParamSet w = model.initParams(o.seed);
  data::MinibatchSampler sampler(train.size(), o.batch, o.seed, 0);
  const float stepScale = static_cast<float>(-o.lr / static_cast<double>(o.batch));
  double loss = 0.0;
  for (int64_t step = 0; step < o.steps; ++step) {
    const data::Batch b = data::gather(train, sampler.next());
    SvBatch svg = model.computeSvg(w, view(b), &loss);
    ORPHEUS_ENFORCE(std::isfinite(loss), "{} diverged at step {}", name, step);
    ops::scaleCoefficients(svg, stepScale);
    const SvBatch* one[] = {&svg};
    model.computeUpdate(one, w);
  }
  std::cerr << fmt::format("selection_error: {}: loss {:.4f} after {} steps; measuring {} batches\n", name, loss,
                           o.steps, o.batches);

  const std::vector<ops::ParamSpec> specs = model.paramSpecs();
  std::vector<bool> isWeight(specs.size(), false);
  // [c][method] -> sums
  std::map<int64_t, std::vector<ErrorSums>> sums;
  std::map<int64_t, double> selectSeconds;  // wall
  std::map<int64_t, double> selectCpu;
  std::map<int64_t, double> selectedCount;
  std::map<int64_t, double> gramSeconds, gramCpu, gramSame;  // jmcss-gram: wall, CPU, draws equal to jmcss's
  ops::cpu::CpuBackend backend;
  double computeSeconds = 0.0;
  double computeCpu = 0.0;
  for (int64_t k = 0; k < o.batches; ++k) {
    const data::Batch b = data::gather(train, sampler.next());
    const auto t = Clock::now();
    const double cpu = threadCpuSeconds();
    SvBatch full = model.computeSvg(w, view(b), &loss);
    computeCpu += threadCpuSeconds() - cpu;
    computeSeconds += secondsSince(t);
    ops::scaleCoefficients(full, stepScale);
    for (const SvMatrix& m : full.matrices) isWeight[m.paramId] = true;
    const ParamSet exact = updateOf(model, full);
    for (int64_t c : o.cs) {
      auto& row = sums[c];
      row.resize(4);
      CounterRng gramRng(o.seed, RngPurpose::kSelect, static_cast<uint64_t>(k), static_cast<uint64_t>(c));
      CounterRng rng(o.seed, RngPurpose::kSelect, static_cast<uint64_t>(k), static_cast<uint64_t>(c));
      engine::SelectionStats stats;
      const double before = threadCpuSeconds();
      const SvBatch jmcss = engine::selectSvgs(full, c, engine::SelectionMethod::kJmcss, rng, &stats);
      selectCpu[c] += threadCpuSeconds() - before;
      selectSeconds[c] += stats.seconds;
      selectedCount[c] += static_cast<double>(stats.selected);
      accumulate(updateOf(model, jmcss), exact, isWeight, row[0]);
      accumulate(updateOf(model, rescaledColumns(full, stats.indices)), exact, isWeight, row[1]);
      const SvBatch uniform = engine::selectSvgs(full, c, engine::SelectionMethod::kUniform, rng);
      accumulate(updateOf(model, uniform), exact, isWeight, row[2]);
      engine::SelectionStats gramStats;
      const auto gramStart = Clock::now();
      const double gramBefore = threadCpuSeconds();
      const std::vector<Matrix> grams = engine::svGrams(full, engine::GramSource{&backend, {}, nullptr, nullptr});
      const SvBatch gram =
          engine::selectSvgs(full, c, engine::SelectionMethod::kJmcssGram, gramRng, &gramStats, grams);
      gramCpu[c] += threadCpuSeconds() - gramBefore;
      gramSeconds[c] += secondsSince(gramStart);
      gramSame[c] += gramStats.indices == stats.indices ? 1.0 : 0.0;
      accumulate(updateOf(model, gram), exact, isWeight, row[3]);
    }
  }
  const double n = static_cast<double>(o.batches);

  std::cout << fmt::format("\n### {} ({}), B = {}, after {} steps (lr {}), mean of {} batches\n\n", name,
                           model.spec(), o.batch, o.steps, o.lr, o.batches);
  std::cout << "Relative Frobenius error of the rebuilt update, all weight matrices together:\n\n";
  std::cout << "| C | selected | jmcss + core | jmcss, columns x B/C | uniform, x B/C | jmcss-gram + core | "
               "jmcss-gram draws = jmcss's |\n"
               "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (int64_t c : o.cs) {
    const auto& row = sums[c];
    std::cout << fmt::format("| {} | {:.1f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.0f}% |\n", c,
                             selectedCount[c] / n, row[0].all / n, row[1].all / n, row[2].all / n, row[3].all / n,
                             100.0 * gramSame[c] / n);
  }
  std::cout << "\nPer parameter (jmcss + core / jmcss x B/C / uniform x B/C):\n\n| C |";
  for (const auto& s : specs) std::cout << fmt::format(" {} ({}x{}) |", s.name, s.rows, s.cols);
  std::cout << "\n| --- |";
  for (size_t i = 0; i < specs.size(); ++i) std::cout << " --- |";
  std::cout << "\n";
  for (int64_t c : o.cs) {
    const auto& row = sums[c];
    std::cout << fmt::format("| {} |", c);
    for (size_t i = 0; i < specs.size(); ++i) {
      std::cout << fmt::format(" {:.3f} / {:.3f} / {:.3f} |", row[0].relative[i] / n, row[1].relative[i] / n,
                               row[2].relative[i] / n);
    }
    std::cout << "\n";
  }
  std::cout << fmt::format(
      "\nSelection time (JMCSS with cores) against computeSvg of the batch ({:.2f} ms CPU, {:.2f} ms wall), "
      "means per batch:\n\n",
      1e3 * computeCpu / n, 1e3 * computeSeconds / n);
  std::cout << "| C | selection ms (CPU) | share of computeSvg (CPU) | selection ms (wall) | share (wall) | "
               "jmcss-gram ms (CPU), Gram products included | jmcss-gram / jmcss (CPU) |\n"
               "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (int64_t c : o.cs) {
    std::cout << fmt::format("| {} | {:.2f} | {:.1f}% | {:.2f} | {:.1f}% | {:.2f} | {:.2f} |\n", c,
                             1e3 * selectCpu[c] / n, 100.0 * selectCpu[c] / computeCpu, 1e3 * selectSeconds[c] / n,
                             100.0 * selectSeconds[c] / computeSeconds, 1e3 * gramCpu[c] / n,
                             gramCpu[c] / selectCpu[c]);
  }
}

int run(int argc, char** argv) {
  const Options o = parseOptions(argc, argv);
  std::cerr << fmt::format("selection_error: reading {}\n", o.train);
  const data::Dataset train = data::readDataset(o.train, data::ReadOptions{});
  const int64_t classes = train.maxLabel() + 1;
  for (const std::string& name : o.models) {
    if (name == "mlr") {
      const ops::MultinomialLogisticRegression mlr(train.features, classes);
      runModel("MLR", mlr, train, o);
    } else {  // mlp (parseOptions takes no other)
      const auto mlp = ops::GraphModel::fromFile(o.mlp, ops::LossDims{train.features, classes}, o.seed);
      runModel("MLP", *mlp, train, o);
    }
  }
  return 0;
}

}  // namespace
}  // namespace orpheus

int main(int argc, char** argv) {
  try {
    return orpheus::run(argc, argv);
  } catch (const orpheus::InputError& e) {
    std::cerr << "orpheus_bench_selection: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "orpheus_bench_selection: " << e.what() << "\n";
    return 1;
  }
}
