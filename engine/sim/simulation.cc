#include "engine/sim/simulation.h"

#include "engine/job/job_data.h"
#include "ops/model_factory.h"

#include "ckpt/model_file.h"
#include "comm/factory.h"
#include "comm/run_gate.h"
#include "engine/adapt/controller.h"
#include "engine/base/error.h"
#include "engine/failures.h"
#include "engine/memory_check.h"
#include "engine/metrics/metrics.h"
#include "engine/outputs.h"
#include "engine/metrics/progress.h"
#include "ops/backends.h"
#include "engine/sim/rank_tracer.h"
#include "engine/sim/sim_ranks.h"
#include "engine/sim/sim_shards.h"
#include "engine/sim/trace.h"
#include "engine/worker/part_options.h"
#include "engine/worker/worker.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include <sys/resource.h>

namespace orpheus::engine::sim {
namespace {

using data::Dataset;

// --sim-membership: the plan against the job, and what a live change needs
// (engine/membership/live.h): BSP SV batches over ranks that --balance does not tie.
void checkMembership(const TrainConfig& config, const SimConfig& sim) {
  if (sim.membership.empty()) return;
  validateMembershipPlan(sim.membership, sim.ranks, config.clocks);
  ORPHEUS_CHECK_INPUT(config.sync == SyncMode::kSv && config.consistency == Consistency::kBsp,
                      "--sim-membership changes the ranks at clock boundaries as a live job does: it needs --sync sv "
                      "and --consistency bsp");
  ORPHEUS_CHECK_INPUT(!config.balance, "--sim-membership: --balance lays its chunks out over a fixed set of ranks; "
                                       "leave out one of them");
  for (const int p : sim.membership.sizes(sim.ranks)) {
    ORPHEUS_CHECK_INPUT(p > 1 || config.multicast == comm::MulticastKind::kAll,
                        "--sim-membership: one rank left has no peer for --multicast {}: keep 2 ranks or use "
                        "--multicast all", comm::multicastName(config.multicast));
    try {
      sim.cpu.validate(p);
      validate(config, p);
      comm::MulticastSchedule(scheduleConfig(config, p));  // as each worker of the epoch makes it
    } catch (const InputError& e) {
      throw InputError(fmt::format("--sim-membership: on {} ranks, {}", p, e.what()));
    }
  }
}

void checkSimulable(const TrainConfig& config, const SimConfig& sim) {
  ORPHEUS_CHECK_INPUT(sim.ranks >= 1, "--ranks {} must be at least 1", sim.ranks);
  ORPHEUS_CHECK_INPUT(sim.threads >= 0, "--sim-threads {} must not be negative", sim.threads);
  ORPHEUS_CHECK_INPUT(sim.computeMs >= 0.0, "--sim-compute-ms {} must not be negative", sim.computeMs);
  sim.network.validate();
  sim.cpu.validate(sim.ranks);
  sim.slow.validate();
  validate(config, sim.ranks);
  ORPHEUS_CHECK_INPUT(!config.ckptSv && !config.ckptMatrix && !config.resume,
                      "simulate does not checkpoint: leave out --ckpt and --resume");
  ORPHEUS_CHECK_INPUT(config.failProb == 0.0, "simulate does not inject failures: leave out --fail-prob");
  ORPHEUS_CHECK_INPUT(config.transport == TrainConfig{}.transport,
                      "simulate sends over its own network model, not --transport {}: leave it out (--sim-link-gbps "
                      "and --sim-latency-us shape the links)",
                      config.transport);
  ORPHEUS_CHECK_INPUT(config.delayRank < 0,
                      "simulate times a worker's compute in simulated seconds, which --inject-delay's sleep would not "
                      "enter: use --sim-slow FRACTION:FACTOR for stragglers");
  ORPHEUS_CHECK_INPUT(!config.elastic, "simulate has no checkpoint to continue: leave out --elastic (--sim-membership "
                                       "changes the ranks while the simulation runs)");
  checkMembership(config, sim);
  // Every simulated worker runs in this one process: under mpirun, each rank would
  // run the whole simulation into the same outputs.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0' || std::string(v) == "1") continue;
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr) rank = std::getenv("PMI_RANK");
    if (rank != nullptr && std::atoi(rank) > 0) std::_Exit(2);  // rank 0 says why, once
    throw InputError(fmt::format("simulate runs every worker in one process: start it without mpirun ({}={} ranks)",
                                 name, v));
  }
  checkInputExists("--train", config.train);
  checkInputExists("--test", config.test);
  // Read once here, so that a bad one is one line, not one per simulated rank.
  if (config.adapt && !config.adaptTrace.empty()) adapt::Trace::read(config.adaptTrace);
  OutputPath metrics{"--metrics", config.metrics, OutputPath::Kind::kFile};
  metrics.stream = true;
  checkOutputs({{"--save", config.save, OutputPath::Kind::kFile}, metrics, replicasOutput(config.saveReplicas)},
               inputsOf(config));
}

double peakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

// "k:count,k:count" of a histogram.
template <typename K>
std::string histogram(const std::map<K, uint64_t>& h) {
  std::string out;
  for (const auto& [k, n] : h) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", k, n);
  return out;
}

template <typename K>
double quantile(const std::map<K, uint64_t>& h, double q) {
  uint64_t total = 0;
  for (const auto& [k, n] : h) total += n;
  uint64_t seen = 0;
  for (const auto& [k, n] : h) {
    seen += n;
    if (static_cast<double>(seen) >= q * static_cast<double>(total)) return static_cast<double>(k);
  }
  return 0.0;
}

template <typename K>
double mean(const std::map<K, uint64_t>& h) {
  double sum = 0.0;
  double count = 0.0;
  for (const auto& [k, n] : h) {
    sum += static_cast<double>(k) * static_cast<double>(n);
    count += static_cast<double>(n);
  }
  return count > 0 ? sum / count : 0.0;
}

void saveOutputs(const TrainConfig& config, const std::vector<Finished>& done, const ops::Model& model,
                 int64_t features, int64_t classes) {
  ckpt::ModelFileInfo info;
  info.modelSpec = model.spec();
  info.modelDigest = model.textDigest();
  info.clock = static_cast<int64_t>(done[0].lastClock);
  info.seed = config.seed;
  info.features = features;
  info.classes = classes;
  if (!config.saveReplicas.empty()) {
    createDirectories(config.saveReplicas, "replica directory ");
    for (const Finished& f : done) {
      info.replica = f.replicaId;
      ckpt::saveParams(fmt::format("{}/replica-{}.h5", config.saveReplicas, f.replicaId), f.replica, info);
    }
  }
  info.replica = done[0].replicaId;
  if (!config.save.empty()) ckpt::saveParams(resolveOutput(config.save), done[0].replica, info);
}

// Max and mean over replicas of ||W_r - mean|| / ||mean||.
std::pair<double, double> divergence(const std::vector<Finished>& done) {
  ParamSet mean = done[0].replica;
  for (size_t i = 1; i < done.size(); ++i)
    for (size_t k = 0; k < mean.size(); ++k) mean[k] += done[i].replica[k];
  for (auto& p : mean.params) p.value /= static_cast<float>(done.size());
  double max = 0.0;
  double sum = 0.0;
  for (const Finished& f : done) {
    const double d = relativeDifference(f.replica, mean);
    max = std::max(max, d);
    sum += d;
  }
  return {max, sum / static_cast<double>(done.size())};
}

// The job as the simulation runs it. Waits scale with the ranks sharing each core:
// a peer may be P/threads turns away.
TrainConfig simulatedConfig(const TrainConfig& given, int p, int threads) {
  TrainConfig config = given;
  config.timeoutSeconds = given.timeoutSeconds * std::max(1.0, static_cast<double>(p) / (8.0 * threads));
  config.progress = "off";
  // The network model times one exchange per clock after the compute (sim/trace.h).
  config.overlap = false;
  return config;
}

// A model per worker (a .loss model keeps scratch state per instance), once the
// job is known to fit in memory with `threads` of them running at once.
std::vector<std::unique_ptr<ops::Model>> makeModels(const TrainConfig& config, const Shards& shards, int p,
                                                    int threads) {
  const Dataset& first = shards.train.front();
  const auto make = [&] {
    auto model = ops::makeModel({config.model, "", ""}, shards.features, shards.classes, config.seed);
    configureModel(config, *model, first.steps);
    return model;
  };
  const auto probe = make();
  for (const Dataset& d : shards.train) checkLabelsFit("--train", config.train, d, *probe, config.model);
  for (const Dataset& d : shards.test) checkLabelsFit("--test", config.test, d, *probe, config.model);
  checkJobMemory(config, *probe, {shards.features, shards.classes, first.steps, first.sparse}, p, threads);
  std::vector<std::unique_ptr<ops::Model>> models;
  models.reserve(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) models.push_back(make());
  return models;
}

VirtualClock::Mode clockMode(const TrainConfig& config) {
  if (config.sync == SyncMode::kDense) return VirtualClock::Mode::kDense;
  if (config.sync == SyncMode::kPowerSgd) return VirtualClock::Mode::kPowerSgd;
  return config.consistency == Consistency::kSsp ? VirtualClock::Mode::kSsp : VirtualClock::Mode::kBsp;
}

// The metrics file's closing line: the job, its traffic, staleness and divergence,
// the network and CPU it was simulated on, and its result.
JsonLine simulationSummary(const TrainConfig& config, const SimConfig& sim, const ops::Model& model, int fanout,
                           const TraceTotals& totals, const MetricsAggregator& aggregator,
                           const std::vector<Finished>& done, double realSeconds) {
  const int p = static_cast<int>(done.size());  // the final membership's
  const auto [divMax, divMean] = divergence(done);
  const uint64_t last = done[0].lastClock;
  const double clocks = static_cast<double>(std::max<uint64_t>(1, totals.clocks));
  const double rankClocks = std::max(1.0, totals.rankClocks);  // clocks * P over the membership epochs
  const bool reachedTarget = done[0].reachedTarget;

  JsonLine summary;
  summary.add("summary", true)
      .add("simulated", true)
      .add("clocks", last)
      .add("clocks_planned", config.clocks)
      .add("reached_target", reachedTarget);
  addJobSettings(summary, metricsOptions(config), model, p, fanout);
  if (!sim.membership.empty()) {
    summary.add("membership", sim.membership.describe(sim.ranks, last)).add("ranks_initial", sim.ranks);
  }
  summary.add("seconds", totals.seconds)
      .add("seconds_per_clock", totals.seconds / clocks)
      .add("bytes_sent", aggregator.totalBytes())
      .add("messages", aggregator.totalMessages())
      .add("bytes_per_clock", totals.bytes / clocks)
      .add("max_clock_gap", static_cast<int64_t>(aggregator.maxGap()))
      .add("average_every", config.averageEvery)
      .add("rotate_every", config.rotateEvery)
      .add("failures", aggregator.totalFailures())
      .add("lost_clocks", aggregator.totalLostClocks())
      .add("replica", static_cast<int64_t>(done[0].replicaId))
      .add("messages_per_clock_min", totals.messagesMin == UINT64_MAX ? uint64_t{0} : totals.messagesMin)
      .add("messages_per_clock_max", totals.messagesMax)
      .add("messages_per_worker_per_clock", totals.messages / rankClocks)
      .add("bytes_per_worker_per_clock", totals.bytes / rankClocks)
      .add("compute_seconds_per_worker_per_clock", totals.computeSeconds / rankClocks)
      .add("in_degree_min", totals.inDegree.empty() ? 0 : totals.inDegree.begin()->first)
      .add("in_degree_mean", mean(totals.inDegree))
      .add("in_degree_p99", quantile(totals.inDegree, 0.99))
      .add("in_degree_max", totals.inDegree.empty() ? 0 : totals.inDegree.rbegin()->first)
      .add("in_degree_histogram", histogram(totals.inDegree))
      .add("staleness_mean", mean(totals.staleness))
      .add("staleness_max", totals.staleness.empty() ? int64_t{0} : totals.staleness.rbegin()->first)
      .add("staleness_histogram", histogram(totals.staleness))
      .add("replica_divergence_max", divMax)
      .add("replica_divergence_mean", divMean)
      .add("network_link_gbps", sim.network.linkGbps)
      .add("network_latency_us", sim.network.latencySeconds * 1e6)
      .add("network_nic_gbps", sim.network.nicGbps)
      .add("network_core_gbps", sim.network.coreGbps)
      .add("network_multicast", sim.network.multicast)
      .add("network_stack_gbps", sim.network.stackGbps)
      .add("network_allreduce", sim.network.allreduce == AllreduceAlgorithm::kTree ? "tree" : "ring")
      .add("sim_slow_fraction", sim.slow.fraction)
      .add("sim_slow_factor", sim.slow.factor)
      .add("sim_cores", sim.cpu.cores)
      .add("sim_hosts", sim.cpu.hosts)
      .add("cpu_slowdown_max", sim.cpu.slowdown(0, p))
      .add("compute", sim.computeMs > 0 ? fmt::format("given {} ms per clock", sim.computeMs)
                                        : std::string("measured (thread CPU time)"))
      .add("real_seconds", realSeconds)
      .add("peak_rss_mb", peakRssMb());
  const EvalResult& eval = done[0].eval;
  if (!config.test.empty()) {
    summary.add("test_loss", eval.loss);
    if (model.hasAccuracy()) {
      summary.add("test_accuracy", eval.accuracy);
      summary.add("best_test_accuracy", std::max(aggregator.bestAccuracy(), eval.accuracy));
    }
  }
  return summary;
}

}  // namespace

int runSimulation(const TrainConfig& given, const SimConfig& sim) {
  checkSimulable(given, sim);
  const int p = sim.ranks;
  const std::vector<int> sizes = sim.membership.sizes(p);
  const int most = *std::max_element(sizes.begin(), sizes.end());
  const int threads = sim.threads > 0 ? sim.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const TrainConfig config = simulatedConfig(given, most, threads);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000));

  const auto realStart = std::chrono::steady_clock::now();
  Shards shards = loadShards(config, p);
  // A membership that grows past the examples has a rank without any: said now, not at its clock.
  int64_t examples = 0;
  for (const Dataset& shard : shards.train) examples += shard.size();
  ORPHEUS_CHECK_INPUT(most <= examples,
                      "--sim-membership grows the job to {} ranks, more than the {} examples of '{}': every rank "
                      "needs at least one",
                      most, examples, config.train);
  const int64_t features = shards.features;
  const int64_t classes = shards.classes;
  const std::vector<std::unique_ptr<ops::Model>> models = makeModels(config, shards, most, threads);
  const ops::Model& model = *models[0];
  spdlog::info("simulating {} worker{} of {} ({} at once): {}", p, p == 1 ? "" : "s", model.spec(), threads,
               comm::MulticastSchedule(scheduleConfig(config, p)).describe());
  if (!sim.membership.empty()) spdlog::info("membership: {}", sim.membership.describe(p, UINT64_MAX));

  MetricsWriter writer(given.metrics);
  ProgressLine progress(given.progress, static_cast<uint64_t>(config.clocks));
  MetricsAggregator aggregator(p, writer, progress, model.hasAccuracy(), 1, static_cast<uint64_t>(config.clocks));
  if (!sim.membership.empty()) aggregator.reportRanks();
  const VirtualClock::Mode mode = clockMode(config);
  Trace trace(p, VirtualClock(sim.network, p, mode, config.staleness), aggregator);
  const comm::MulticastSchedule schedule(scheduleConfig(config, p));
  auto gate = std::make_shared<comm::RunGate>(threads);
  // SSP applies batches as they arrive: in the order of the virtual clock.
  std::optional<ArrivalBook> book;
  if (mode == VirtualClock::Mode::kSsp) {
    book.emplace(p, gate.get());
    trace.informs(&*book);
  }
  const RankRun run{config, sim, models, trace, gate, book ? &*book : nullptr, &schedule, timeout};
  const std::vector<Finished> done = runRanks(run, std::move(shards));
  progress.finish();
  const double realSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - realStart).count();

  saveOutputs(config, done, model, features, classes);
  const TraceTotals totals = trace.totals();
  const int final = static_cast<int>(done.size());
  const int fanout = comm::MulticastSchedule(scheduleConfig(config, final)).fanout();
  writer.write(simulationSummary(config, sim, model, fanout, totals, aggregator, done, realSeconds));
  writer.complete();

  const uint64_t last = done[0].lastClock;
  const EvalResult& eval = done[0].eval;
  std::printf("simulated %s on %d worker%s: %llu clock%s in %.4g simulated s (%.1f s real)", model.spec().c_str(), p,
              p == 1 ? "" : "s", static_cast<unsigned long long>(last), last == 1 ? "" : "s", totals.seconds,
              realSeconds);
  if (!config.test.empty() && model.hasAccuracy()) std::printf(", test accuracy %.4f", eval.accuracy);
  std::printf(", peak memory %.0f MB%s\n", peakRssMb(),
              targetOutcome(config.targetAccuracy, done[0].reachedTarget, last).c_str());
  if (!sim.membership.empty()) std::printf("membership: %s\n", sim.membership.describe(p, last).c_str());
  if (!given.metrics.empty()) std::printf("metrics: %s\n", given.metrics.c_str());
  if (!given.save.empty()) std::printf("model: %s\n", given.save.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace orpheus::engine::sim
