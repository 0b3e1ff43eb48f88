#include "engine/sim/sim_ranks.h"

#include "comm/factory.h"
#include "engine/base/error.h"
#include "engine/failures.h"
#include "engine/membership/live.h"
#include "engine/sim/membership_plan.h"
#include "engine/sim/rank_tracer.h"
#include "ops/backends.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sys/resource.h>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace orpheus::engine::sim {
namespace {

// Every thread started from here on (the workers', their prefetchers') gets a
// small stack: a thousand workers must not reserve 8 MiB each.
void useSmallStacks() {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kSimThreadStack);
  pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
}

double bytesOf(const ParamSet& set) {
  double bytes = 0.0;
  for (const auto& p : set.params) bytes += static_cast<double>(p.value.size()) * sizeof(float);
  return bytes;
}

// The workers over the job's membership epochs: the threads, and what the ranks
// of a change hand each other (the average, the recut data).
class Ranks {
 public:
  Ranks(const RankRun& run, Shards shards)
      : run_(run), plan_(run.sim.membership), own_(run.config), shards_(std::make_shared<const Shards>(std::move(shards))) {
    // One model serves every simulated worker, and its device executor is one: the
    // replicas stay on the host, their rebuilds on the device.
    own_.resident = false;
  }

  std::vector<Finished> run();

 private:
  void start(std::unique_ptr<comm::Transport> transport, std::unique_ptr<comm::LiveGroup> live, uint64_t after);
  void life(std::unique_ptr<comm::Transport> transport, std::unique_ptr<comm::LiveGroup> live, uint64_t after);
  uint64_t runEpoch(comm::Transport& traced, RankTracer& tracer, ops::Backend& backend, uint64_t after);
  std::unique_ptr<comm::Transport> changeGroup(comm::Transport& group, comm::LiveGroup& live, uint64_t clock);
  void advance(const MembershipStep& step, int size, uint64_t clock);
  double slowdown(int rank, int size);

  const RankRun& run_;
  const MembershipPlan& plan_;
  TrainConfig own_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::shared_ptr<const Shards> shards_;  // this epoch's
  ParamSet average_;                      // where the epoch started: the old replicas' average
  ParamSet averageState_;                 // and their optimizer states'
  uint32_t epoch_ = 0;
  std::map<int, std::vector<double>> slow_;  // the stragglers' factors, by the epoch's ranks
  std::vector<Finished> done_;
  int finalRanks_ = 0;
};

std::vector<Finished> Ranks::run() {
  const int p = run_.sim.ranks;
  comm::TransportOptions options;
  options.timeout = run_.timeout;
  auto group = comm::makeLoopbackGroup(p, options, run_.gate);
  std::vector<std::unique_ptr<comm::LiveGroup>> live;
  if (!plan_.empty()) {
    live = comm::makeLoopbackLiveGroup(
        p, run_.gate, [this](std::unique_ptr<comm::Transport> t, std::unique_ptr<comm::LiveGroup> l, uint64_t clock) {
          start(std::move(t), std::move(l), clock);
        });
  }
  useSmallStacks();
  for (int r = 0; r < p; ++r) {
    start(std::move(group[static_cast<size_t>(r)]), live.empty() ? nullptr : std::move(live[static_cast<size_t>(r)]), 0);
  }
  // A grow starts threads from a running one, before that one ends: when none is
  // left to join, every thread has ended.
  for (;;) {
    std::thread t;
    {
      std::lock_guard lock(mu_);
      if (threads_.empty()) break;
      t = std::move(threads_.back());
      threads_.pop_back();
    }
    t.join();
  }
  done_.resize(static_cast<size_t>(finalRanks_));
  return std::move(done_);
}

// A thread the host would not start (EAGAIN: a limit on threads or processes) is
// the size asked for, not a fault: said with the host's limits, as bad input.
std::string threadLimitMessage(int ranks, const std::system_error& e) {
  rlimit processes{};
  ::getrlimit(RLIMIT_NPROC, &processes);
  std::string threadsMax = "?";
  if (std::FILE* f = std::fopen("/proc/sys/kernel/threads-max", "r")) {
    char line[32] = {};
    if (std::fgets(line, sizeof line, f) != nullptr) threadsMax = std::string(line, std::strcspn(line, "\n"));
    std::fclose(f);
  }
  const std::string ulimit =
      processes.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : std::to_string(processes.rlim_cur);
  return fmt::format("simulate --ranks {}: the host would not start another thread ({}); each simulated worker "
                     "runs on threads of its own, more than this host allows (ulimit -u {}, kernel.threads-max {}): "
                     "simulate fewer ranks",
                     ranks, e.code().message(), ulimit, threadsMax);
}

bool isThreadLimit(const std::exception& e) {
  const auto* system = dynamic_cast<const std::system_error*>(&e);
  return system != nullptr && system->code() == std::errc::resource_unavailable_try_again;
}

void Ranks::start(std::unique_ptr<comm::Transport> transport, std::unique_ptr<comm::LiveGroup> live, uint64_t after) {
  std::lock_guard lock(mu_);
  try {
    threads_.emplace_back(&Ranks::life, this, std::move(transport), std::move(live), after);
  } catch (const std::system_error& e) {
    if (!isThreadLimit(e)) throw;
    reportError(threadLimitMessage(run_.sim.ranks, e));
    std::_Exit(kExitBadInput);  // the threads started so far wait on this one
  }
}

double Ranks::slowdown(int rank, int size) {
  std::lock_guard lock(mu_);
  auto it = slow_.find(size);
  if (it == slow_.end()) it = slow_.emplace(size, run_.sim.slow.factors(size, run_.config.seed)).first;
  return run_.sim.cpu.slowdown(rank, size) * it->second[static_cast<size_t>(rank)];
}

// One worker's life on its own thread, from clock `after` (0: the job's start; else
// it starts the membership epoch after that clock) until the job ends or it
// leaves, holding a place of the gate while it runs.
void Ranks::life(std::unique_ptr<comm::Transport> transport, std::unique_ptr<comm::LiveGroup> live, uint64_t after) {
  run_.gate->enter();
  int rank = transport->rank();
  try {
    const std::unique_ptr<ops::Backend> backend = ops::makeBackend(run_.config.device, rank);  // this rank's, once
    while (transport != nullptr) {
      rank = transport->rank();
      RankTracer tracer(run_.trace, rank, run_.sim.computeMs * 1e-3, slowdown(rank, transport->size()));
      TracingTransport traced(std::move(transport), tracer, run_.book, run_.book != nullptr ? run_.schedule : nullptr);
      traced.setTimeout(run_.timeout);
      after = runEpoch(traced, tracer, *backend, after);
      if (after == 0) break;
      transport = changeGroup(traced, *live, after);  // null: this rank left
    }
  } catch (const std::exception& e) {
    // The other ranks would wait on this one until they time out: report and end.
    static std::mutex once;
    std::lock_guard lock(once);
    if (isThreadLimit(e)) {
      reportError(threadLimitMessage(run_.sim.ranks, dynamic_cast<const std::system_error&>(e)));
      std::_Exit(kExitBadInput);
    }
    reportError(fmt::format("rank {}: {}", rank, e.what()));
    std::_Exit(exitCodeFor(e));
  }
  run_.gate->leave();
}

// One membership epoch of a worker, from `after` (0: the job's start, else the
// average of the previous epoch at that clock). Returns the clock after which the
// membership changes, with every replica the average there; 0: the job ended.
uint64_t Ranks::runEpoch(comm::Transport& traced, RankTracer& tracer, ops::Backend& backend, uint64_t after) {
  const int rank = traced.rank();
  std::shared_ptr<const Shards> shards;
  ParamSet start;
  ParamSet state;
  uint32_t epoch = 0;
  {
    std::lock_guard lock(mu_);
    shards = shards_;
    if (after > 0) {
      start = average_;
      state = averageState_;
      epoch = epoch_;
    }
  }
  const auto r = static_cast<size_t>(rank);
  Worker worker(own_, *run_.models[r], backend, traced, shards->train[r], shards->test.empty() ? nullptr : &shards->test[r]);
  worker.observeClocks(&tracer);
  PlannedChanges planned(plan_);
  if (!plan_.empty()) worker.watchMembership(&planned);
  if (after > 0) {
    worker.resumeFrom(after, std::move(start), state, rank);
    worker.setEpoch(epoch);
    if (run_.sim.onChange) run_.sim.onChange(after, rank, false, worker.replica());
  }
  MetricsWriter discard("");
  worker.run(discard);
  const uint64_t change = worker.changesAfter();
  if (change == 0) {
    std::lock_guard lock(mu_);
    finalRanks_ = traced.size();
    if (done_.size() < static_cast<size_t>(finalRanks_)) done_.resize(static_cast<size_t>(finalRanks_));
    done_[r] = {worker.replica(), worker.replicaId(), worker.lastEval(), worker.lastClock(), worker.reachedTarget()};
    return 0;
  }
  if (run_.sim.onChange) run_.sim.onChange(change, rank, true, worker.replica());
  // Every replica the average of the old group's, bitwise the same on every rank
  // (Transport::allreduceSumIdentical), its optimizer state too.
  worker.averageReplicas(change);
  if (rank == 0) {
    std::lock_guard lock(mu_);
    average_ = worker.replica();
    averageState_ = worker.optimizer().exportState();
  }
  return change;
}

// The change after `clock` over the old group (collective): once every old worker
// is gone, rank 0 recuts the data and moves the trace on; then the group splits
// or grows (engine/membership/live.h). Null on a rank that leaves.
std::unique_ptr<comm::Transport> Ranks::changeGroup(comm::Transport& group, comm::LiveGroup& live, uint64_t clock) {
  const MembershipStep& step = *plan_.at(clock);
  double barrier[1] = {0.0};
  group.control().sum(barrier);
  if (group.rank() == 0) advance(step, group.size(), clock);
  group.control().sum(barrier);
  return regroup(group, live, changeOf(step, group.size()), clock);
}

void Ranks::advance(const MembershipStep& step, int size, uint64_t clock) {
  const int next = size + step.change;
  {
    std::lock_guard lock(mu_);
    shards_.reset();  // the old data goes before the new is read
  }
  auto shards = std::make_shared<const Shards>(loadShards(run_.config, next));
  double averaged = 0.0;
  uint32_t epoch = 0;
  {
    std::lock_guard lock(mu_);
    shards_ = std::move(shards);
    epoch = ++epoch_;
    averaged = bytesOf(average_) + bytesOf(averageState_);
  }
  JsonLine note;
  note.add("membership", true).add("epoch", static_cast<int64_t>(epoch)).add("clock", clock).add("ranks", next);
  note.add(step.change < 0 ? "left" : "joined", std::abs(step.change));
  run_.trace.regroup(next, clock, averaged, note);
  if (step.change < 0) {
    spdlog::info("after clock {}: ranks {}..{} left ({} ranks), every replica the average", clock, next, size - 1,
                 next);
  } else {
    spdlog::info("after clock {}: {} ranks joined ({} ranks), every replica the average", clock, step.change, next);
  }
}

}  // namespace

std::vector<Finished> runRanks(const RankRun& run, Shards shards) {
  Ranks ranks(run, std::move(shards));
  return ranks.run();
}

}  // namespace orpheus::engine::sim
