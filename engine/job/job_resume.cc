#include "engine/job/job_resume.h"

#include "ckpt/layout.h"
#include "engine/adapt/controller.h"
#include "engine/data/synthetic_data.h"
#include "engine/failures.h"
#include "engine/recovery/checkpoint.h"
#include "engine/recovery/job_record.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace orpheus::engine {
namespace {

std::string readModelText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ComputationRecord computationRecordOf(const TrainConfig& config, const comm::Transport& transport,
                                      const Shards& shards, const std::string& modelText) {
  const std::string data = isSyntheticSource(config.train) ? config.train : fileDigest(config.train);
  return computationRecord(config, transport.size(), shards.features, shards.classes, modelText, data);
}

// What a fresh checkpoint directory records of the job, so restore can rebuild its model.
void writeJobInfo(const TrainConfig& config, const comm::Transport& transport, const ops::Model& model,
                  const Shards& shards) {
  createDirectories(config.ckptDir, "checkpoint directory ");
  ckpt::JobInfo info;
  info.modelName = config.model;
  if (config.model.ends_with(".loss")) info.modelText = readModelText(config.model);
  info.modelSpec = model.spec();
  info.features = shards.features;
  info.classes = shards.classes;
  info.seed = config.seed;
  info.ranks = transport.size();
  info.batch = config.batch;
  info.lr = optimizerSettings(config).lr;
  info.computation = encodeRecord(computationRecordOf(config, transport, shards, info.modelText));
  ckpt::writeJobInfo(config.ckptDir, info);
}

// A resumed job continues the recorded computation, or refuses naming the flag.
void checkResumedJob(const TrainConfig& config, const comm::Transport& transport, const Shards& shards) {
  const ckpt::JobInfo info = ckpt::readJobInfo(config.ckptDir);
  if (info.computation.empty()) {
    spdlog::warn("'{}' predates recorded job settings: --resume cannot check that the flags are unchanged",
                 config.ckptDir);
    return;
  }
  const std::string modelText = config.model.ends_with(".loss") ? readModelText(config.model) : std::string();
  ComputationRecord recorded = decodeRecord(info.computation, ckpt::jobPath(config.ckptDir).string());
  ComputationRecord now = computationRecordOf(config, transport, shards, modelText);
  // The number of ranks is the current membership epoch's; --elastic may change it.
  const int members = readMembership(config.ckptDir).back().ranks;
  for (auto* record : {&recorded, &now}) {
    for (auto it = record->begin(); it != record->end();) {
      if (it->first == "np" && config.elastic) {
        it = record->erase(it);
        continue;
      }
      if (it->first == "np" && record == &recorded) it->second = std::to_string(members);
      ++it;
    }
  }
  checkResume(recorded, now, config.ckptDir);
}

}  // namespace

// The incremental SV checkpoint: a fresh job records what it is; a resumed one
// continues from the newest clock every replica's log reaches. Returns that clock
// (0: a fresh start), the same on every rank.
uint64_t prepareCheckpointDir(const TrainConfig& config, comm::Transport& transport, const ops::Model& model,
                              const Shards& shards) {
  if (!config.ckptSv) return 0;
  uint64_t resumeClock = 0;
  collectively(transport, [&] {
    if (transport.rank() != 0) return;
    if (!config.resume) {
      writeJobInfo(config, transport, model, shards);
      return;
    }
    checkResumedJob(config, transport, shards);
    const ckpt::Inventory inventory = ckpt::inspect(config.ckptDir);
    // A sequence model, or --sv-rank, resumes where every rank's carried states are
    // on disk too; a checkpoint that holds none predates them and resumes without (zeros).
    // An elastic resume on another number of ranks starts every rank's carried states
    // afresh (resumeElastic), so it needs none on disk: asking for this launch's ranks'
    // would find none past the old count and start over.
    const std::vector<Epoch> epochs = readMembership(config.ckptDir);
    const int members = epochs.back().ranks;
    const bool carries = model.carriesState() || (config.sync == SyncMode::kSv && config.svRank > 0);
    const bool elastic = config.elastic && transport.size() != members;
    const bool withStates = carries && !elastic && !ckpt::listStatesDirs(config.ckptDir).empty();
    resumeClock = resumableClock(config.ckptDir, inventory, withStates ? transport.size() : 0, members);
    // A complete snapshot past that clock is a resume point too (the log is written in
    // segments of up to 50 clocks, a snapshot at every averaging barrier): there every
    // replica is the snapshot's average, and the continued job needs nothing the log
    // holds from before it, unless it carries states (written with segments; an elastic
    // resume starts them afresh on every rank anyway), moves its knobs (--adapt) or its
    // data (--balance), or changed its membership (records in the log). An elastic
    // resume there starts the new epoch from the snapshot, which is the average it takes.
    const bool logFree = (!carries || elastic) && !config.adapt && !config.balance && epochs.size() == 1;
    if (logFree && !inventory.snapshots.empty() && inventory.snapshots.back() > resumeClock) {
      spdlog::info("--resume: '{}' has a snapshot of clock {}, past the clock every replica's log reaches ({}): the "
                   "job resumes from the snapshot",
                   config.ckptDir, inventory.snapshots.back(), resumeClock);
      resumeClock = inventory.snapshots.back();
    }
    if (resumeClock == 0 && !inventory.replicas.empty()) {
      spdlog::warn("--resume: no clock of '{}' is reached by every replica's log{}: the job starts over from "
                   "clock 1, and the log there is set aside as *.discarded",
                   config.ckptDir, withStates ? " with every rank's carried states" : "");
    } else if (resumeClock == 0) {
      spdlog::warn("--resume: '{}' holds no replica's log yet (the job stopped before its first clocks reached the "
                   "disk): the job starts over from clock 1",
                   config.ckptDir);
    }
    ORPHEUS_CHECK_INPUT(resumeClock <= static_cast<uint64_t>(config.clocks),
                        "--resume: the job in '{}' is at clock {}, past --clocks {}: nothing is left to train (orpheus "
                        "restore --ckpt-dir {} --clock {} gives the parameters of that clock)",
                        config.ckptDir, resumeClock, config.clocks, config.ckptDir, config.clocks);
    discardAfter(config.ckptDir, resumeClock);
  });
  double shared[1] = {static_cast<double>(resumeClock)};
  transport.control().sum(shared);
  return static_cast<uint64_t>(shared[0]);
}

// --resume --elastic on a different number of ranks, or a live membership change
// (engine/membership/live.h): the next membership epoch starts at `resumeClock` from the
// average of the previous one (engine/membership/elastic.h).
void resumeElastic(Worker& worker, const TrainConfig& config, comm::Transport& transport, const ops::Model& model,
                   const std::vector<Epoch>& epochs, uint64_t resumeClock, bool live) {
  ElasticStart start = redistribute(elasticOptions(config), transport, model, worker.backend(), epochs, resumeClock);
  worker.setEpoch(start.epoch.epoch);
  // Collective: rejoinAt agrees on the snapshot parts itself. The new epoch then
  // becomes a record of the new members' logs, durable with the epoch's first
  // clock: a job killed before that resumes as before the change.
  worker.rejoinAt(resumeClock, std::move(start.params), start.optimizerState, transport.rank(), start.writeSnapshot);
  if (transport.rank() == 0) {
    spdlog::info("{} clock {} of '{}' on {} ranks (was {}): membership epoch {}, every replica the average",
                 live ? "continued after" : "resumed from", resumeClock, config.ckptDir, transport.size(),
                 epochAfter(epochs, resumeClock).ranks, start.epoch.epoch);
  }
}

void resume(Worker& worker, const TrainConfig& config, comm::Transport& transport, const ops::Model& model,
            uint64_t resumeClock) {
  if (!config.resume || resumeClock == 0) return;
  std::vector<Epoch> epochs;
  collectively(transport, [&] { epochs = readMembership(config.ckptDir); });
  if (config.elastic && epochAfter(epochs, resumeClock).ranks != transport.size()) {
    resumeElastic(worker, config, transport, model, epochs, resumeClock);
    return;
  }
  collectively(transport, [&] {
    const int id = replicaHeldAt(transport.rank(), epochs, resumeClock, config.rotateEvery);
    Restored r = restore(config.ckptDir, id, resumeClock, worker.backend());
    // What the log does not hold: the states a sequence model carries from one
    // segment of a stream to the next and --sv-rank's error feedback, this rank's own.
    const bool states = std::filesystem::exists(ckpt::statesPath(config.ckptDir, resumeClock, transport.rank()));
    if (worker.carriesRankState() && states) {
      const std::string path = ckpt::statesPath(config.ckptDir, resumeClock, transport.rank()).string();
      try {
        worker.restoreRankState(loadCarriedState(config.ckptDir, resumeClock, transport.rank()));
      } catch (const InputError& e) {
        const std::string what = e.what();
        // loadParams names the file itself; the state's own checks do not.
        if (what.find(path) != std::string::npos) throw;
        throw InputError(fmt::format("--resume: '{}': {}", path, what));
      }
    } else if (worker.carriesRankState() && resumeClock > 0 && transport.rank() == 0) {
      spdlog::warn("--resume: '{}' holds no carried state (recurrent states, --sv-rank's error feedback) at clock "
                   "{}; it restarts from zero, so the continued run is not bitwise the uninterrupted one",
                   config.ckptDir, resumeClock);
    }
    worker.resumeFrom(resumeClock, std::move(r.params), r.optimizerState, id);
    worker.resumeOuterStep(std::move(r.outer.anchor), std::move(r.outer.momentum));
    worker.setEpoch(epochs.back().epoch);
    if (auto knobs = adapt::knobsAt(config.ckptDir, id, resumeClock)) worker.resumeKnobs(*knobs);
  });
  if (transport.rank() == 0) spdlog::info("resumed from clock {} of '{}'", resumeClock, config.ckptDir);
}

}  // namespace orpheus::engine
