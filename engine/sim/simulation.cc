#include "engine/sim/simulation.h"
#include "ops/model_factory.h"

#include "ckpt/model_file.h"
#include "comm/factory.h"
#include "comm/loopback/run_gate.h"
#include "engine/base/error.h"
#include "engine/failures.h"
#include "engine/memory_check.h"
#include "engine/metrics/metrics.h"
#include "engine/outputs.h"
#include "engine/metrics/progress.h"
#include "ops/backends.h"
#include "engine/sim/rank_tracer.h"
#include "engine/sim/trace.h"
#include "engine/data/synthetic_data.h"
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

#include <pthread.h>
#include <sys/resource.h>

namespace orpheus::engine::sim {
namespace {

using data::Dataset;

// Every rank's shard of `path`, as `train` would read it on P ranks. An IDX file
// is read once and cut into the same contiguous ranges its reader gives each rank;
// other formats are read shard by shard.
std::vector<Dataset> readShards(const std::string& path, const TrainConfig& config, int ranks, int64_t features,
                                int indexBase) {
  std::vector<Dataset> shards(static_cast<size_t>(ranks));
  if (isSyntheticSource(path)) {
    for (int r = 0; r < ranks; ++r) shards[static_cast<size_t>(r)] = makeSyntheticShard(path, config.seed, r, ranks);
    return shards;
  }
  data::ReadOptions options;
  options.format = config.format;
  options.features = features;
  options.indexBase = indexBase;
  if (data::resolveFormat(path, config.format) != data::Format::kIdx) {
    options.worldSize = ranks;
    for (int r = 0; r < ranks; ++r) {
      options.rank = r;
      shards[static_cast<size_t>(r)] = data::readDataset(path, options);
    }
    return shards;
  }
  Dataset whole = data::readDataset(path, options);
  const int64_t total = whole.size();
  for (int r = 0; r < ranks; ++r) {
    const int64_t begin = total * r / ranks;
    const int64_t end = total * (r + 1) / ranks;
    ORPHEUS_CHECK_INPUT(end > begin, "{}: shard {} of {} is empty ({} examples); simulate fewer ranks", path, r, ranks,
                        total);
    Dataset& d = shards[static_cast<size_t>(r)];
    d.source = whole.source;
    d.features = whole.features;
    d.dense = whole.dense.middleCols(begin, end - begin);
    d.labels.assign(whole.labels.begin() + begin, whole.labels.begin() + end);
    d.globalOffset = begin;
    d.globalSize = total;
  }
  return shards;
}

struct Shards {
  std::vector<Dataset> train;
  std::vector<Dataset> test;
  int64_t features = 0;
  int64_t classes = 0;
};

// The shapes every rank agrees on, as runTrain agrees them.
Shards loadShards(const TrainConfig& config, int ranks) {
  Shards s;
  int indexBase = -1;
  if (!isSyntheticSource(config.train)) indexBase = data::detectIndexBase(config.train, config.format);
  s.train = readShards(config.train, config, ranks, config.features, indexBase);
  int64_t maxLabel = -1;
  bool sparse = false;
  for (const Dataset& d : s.train) {
    ORPHEUS_CHECK_INPUT(d.size() >= 1, "a rank got no training examples from '{}'", config.train);
    s.features = std::max(s.features, d.features);
    maxLabel = std::max<int64_t>(maxLabel, d.maxLabel());
    sparse = sparse || d.sparse;
  }
  for (Dataset& d : s.train) {
    if (d.sparse) {
      data::widen(d, s.features);
    } else {
      ORPHEUS_CHECK_INPUT(d.features == s.features, "training data '{}' has rows of {} and of {} features",
                          config.train, d.features, s.features);
    }
  }
  s.classes = config.classes > 0 ? config.classes : maxLabel + 1;
  ORPHEUS_CHECK_INPUT(maxLabel < s.classes, "training data '{}' has label {} but --classes is {} (labels 0..{})",
                      config.train, maxLabel, s.classes, s.classes - 1);
  if (config.test.empty()) return s;
  s.test = readShards(config.test, config, ranks, sparse ? s.features : -1, indexBase);
  for (Dataset& d : s.test) {
    if (d.sparse) data::widen(d, s.features);
    ORPHEUS_CHECK_INPUT(d.features == s.features, "test data '{}' has {} features but the training data '{}' has {}",
                        config.test, d.features, config.train, s.features);
    ORPHEUS_CHECK_INPUT(d.maxLabel() < s.classes, "test data '{}' has label {} but the model has {} classes",
                        config.test, d.maxLabel(), s.classes);
  }
  return s;
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
  ORPHEUS_CHECK_INPUT(!config.elastic, "simulate has no membership changes to continue: leave out --elastic");
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
  checkInputExists(config.train);
  checkInputExists(config.test);
  OutputPath metrics{"--metrics", config.metrics, OutputPath::Kind::kFile};
  metrics.stream = true;
  checkOutputs({{"--save", config.save, OutputPath::Kind::kFile}, metrics,
                {"--save-replicas", config.saveReplicas, OutputPath::Kind::kDirectory}},
               {{"--train", config.train}, {"--test", config.test}, {"--model", config.model}});
}

// Every thread started from here on (the workers', their prefetchers') gets a
// small stack: a thousand workers must not reserve 8 MiB each.
void useSmallStacks() {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kSimThreadStack);
  pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
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

struct Finished {
  ParamSet replica;
  int replicaId = 0;
  EvalResult eval;
  uint64_t lastClock = 0;
  bool reachedTarget = false;
};

// One worker's life on its own thread, holding a place of the gate while it runs.
// `book`, `schedule`: SSP's virtual-time order (null: the threads' order).
void runRank(int rank, const TrainConfig& config, const SimConfig& sim, const ops::Model& model,
             std::unique_ptr<comm::Transport> loopback, comm::loopback::RunGate& gate, Trace& trace,
             ArrivalBook* book, const comm::MulticastSchedule* schedule, const Shards& shards,
             std::chrono::milliseconds timeout, double slowdown, Finished& out) {
  gate.enter();
  try {
    RankTracer tracer(trace, rank, sim.computeMs * 1e-3, slowdown);
    TracingTransport transport(std::move(loopback), tracer, book, schedule);
    transport.setTimeout(timeout);
    const Dataset* test = shards.test.empty() ? nullptr : &shards.test[static_cast<size_t>(rank)];
    const std::unique_ptr<ops::Backend> backend = ops::makeBackend(config.device, rank);  // this rank's, once
    // One model serves every simulated worker, and its device executor is one: the
    // replicas stay on the host, their rebuilds on the device.
    TrainConfig own = config;
    own.resident = false;
    Worker worker(own, model, *backend, transport, shards.train[static_cast<size_t>(rank)], test);
    worker.observeClocks(&tracer);
    MetricsWriter discard("");
    worker.run(discard);
    out.replica = worker.replica();
    out.replicaId = worker.replicaId();
    out.eval = worker.lastEval();
    out.lastClock = worker.lastClock();
  } catch (const std::exception& e) {
    // The other ranks would wait on this one until they time out: report and end.
    static std::mutex once;
    std::lock_guard lock(once);
    reportError(fmt::format("rank {}: {}", rank, e.what()));
    std::_Exit(exitCodeFor(e));
  }
  gate.leave();
}

void saveOutputs(const TrainConfig& config, const std::vector<Finished>& done, const ops::Model& model,
                 const Shards& shards) {
  ckpt::ModelFileInfo info;
  info.modelSpec = model.spec();
  info.clock = static_cast<int64_t>(done[0].lastClock);
  info.seed = config.seed;
  info.features = shards.features;
  info.classes = shards.classes;
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
  {
    const auto one = ops::makeModel({config.model, "", ""}, shards.features, shards.classes, config.seed);
    const Dataset& first = shards.train.front();
    checkJobMemory(config, *one, {shards.features, shards.classes, first.steps, first.sparse}, p, threads);
  }
  std::vector<std::unique_ptr<ops::Model>> models;
  models.reserve(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) models.push_back(ops::makeModel({config.model, "", ""}, shards.features, shards.classes, config.seed));
  return models;
}

VirtualClock::Mode clockMode(const TrainConfig& config) {
  if (config.sync == SyncMode::kDense) return VirtualClock::Mode::kDense;
  if (config.sync == SyncMode::kPowerSgd) return VirtualClock::Mode::kPowerSgd;
  return config.consistency == Consistency::kSsp ? VirtualClock::Mode::kSsp : VirtualClock::Mode::kBsp;
}

// Every worker on a thread of its own, `threads` of them running at once; what
// each finished with, by rank.
std::vector<Finished> runRanks(const TrainConfig& config, const SimConfig& sim,
                               const std::vector<std::unique_ptr<ops::Model>>& models, const Shards& shards,
                               Trace& trace, VirtualClock::Mode mode, const comm::MulticastSchedule& schedule,
                               int threads, std::chrono::milliseconds timeout) {
  const int p = sim.ranks;
  auto gate = std::make_shared<comm::loopback::RunGate>(threads);
  // SSP applies batches as they arrive: in the order of the virtual clock.
  std::optional<ArrivalBook> book;
  if (mode == VirtualClock::Mode::kSsp) {
    book.emplace(p, gate.get());
    trace.informs(&*book);
  }
  comm::TransportOptions options;
  options.timeout = timeout;
  auto group = comm::makeLoopbackGroup(p, options, gate);
  useSmallStacks();
  std::vector<Finished> done(static_cast<size_t>(p));
  const std::vector<double> slow = sim.slow.factors(p, config.seed);
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    workers.emplace_back(runRank, r, std::cref(config), std::cref(sim), std::cref(*models[static_cast<size_t>(r)]),
                         std::move(group[static_cast<size_t>(r)]), std::ref(*gate), std::ref(trace),
                         book ? &*book : nullptr, book ? &schedule : nullptr, std::cref(shards), timeout,
                         sim.cpu.slowdown(r, p) * slow[static_cast<size_t>(r)], std::ref(done[static_cast<size_t>(r)]));
  }
  for (auto& w : workers) w.join();
  return done;
}

// The metrics file's closing line: the job, its traffic, staleness and divergence,
// the network and CPU it was simulated on, and its result.
JsonLine simulationSummary(const TrainConfig& config, const SimConfig& sim, const ops::Model& model, int fanout,
                           const TraceTotals& totals, const MetricsAggregator& aggregator,
                           const std::vector<Finished>& done, double realSeconds) {
  const int p = sim.ranks;
  const auto [divMax, divMean] = divergence(done);
  const uint64_t last = done[0].lastClock;
  const double clocks = static_cast<double>(std::max<uint64_t>(1, totals.clocks));
  const bool reachedTarget = config.targetAccuracy > 0.0 && last < static_cast<uint64_t>(config.clocks);

  JsonLine summary;
  summary.add("summary", true)
      .add("simulated", true)
      .add("clocks", last)
      .add("clocks_planned", config.clocks)
      .add("reached_target", reachedTarget);
  addJobSettings(summary, metricsOptions(config), model, p, fanout);
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
      .add("messages_per_worker_per_clock", totals.messages / clocks / p)
      .add("bytes_per_worker_per_clock", totals.bytes / clocks / p)
      .add("compute_seconds_per_worker_per_clock", totals.computeSeconds / clocks / p)
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
  const int threads = sim.threads > 0 ? sim.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const TrainConfig config = simulatedConfig(given, p, threads);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.timeoutSeconds * 1000));

  const auto realStart = std::chrono::steady_clock::now();
  const Shards shards = loadShards(config, p);
  const std::vector<std::unique_ptr<ops::Model>> models = makeModels(config, shards, p, threads);
  const ops::Model& model = *models[0];
  spdlog::info("simulating {} workers of {} ({} at once): {}", p, model.spec(), threads,
               comm::MulticastSchedule(scheduleConfig(config, p)).describe());

  MetricsWriter writer(given.metrics);
  ProgressLine progress(given.progress, static_cast<uint64_t>(config.clocks));
  MetricsAggregator aggregator(p, writer, progress, model.hasAccuracy(), 1, static_cast<uint64_t>(config.clocks));
  const VirtualClock::Mode mode = clockMode(config);
  Trace trace(p, VirtualClock(sim.network, p, mode, config.staleness), aggregator);
  const comm::MulticastSchedule schedule(scheduleConfig(config, p));
  const std::vector<Finished> done = runRanks(config, sim, models, shards, trace, mode, schedule, threads, timeout);
  progress.finish();
  const double realSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - realStart).count();

  saveOutputs(config, done, model, shards);
  const TraceTotals totals = trace.totals();
  writer.write(simulationSummary(config, sim, model, schedule.fanout(), totals, aggregator, done, realSeconds));

  const uint64_t last = done[0].lastClock;
  const EvalResult& eval = done[0].eval;
  std::printf("simulated %s on %d workers: %llu clocks in %.4g simulated s (%.1f s real)", model.spec().c_str(), p,
              static_cast<unsigned long long>(last), totals.seconds, realSeconds);
  if (!config.test.empty() && model.hasAccuracy()) std::printf(", test accuracy %.4f", eval.accuracy);
  std::printf(", peak memory %.0f MB\n", peakRssMb());
  if (!given.metrics.empty()) std::printf("metrics: %s\n", given.metrics.c_str());
  if (!given.save.empty()) std::printf("model: %s\n", given.save.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace orpheus::engine::sim
