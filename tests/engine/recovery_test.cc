// What a rank keeps so a lost replica can come back (engine/recovery/recovery.h):
// the clock log as the clock loop drives it (--ckpt sv) against restore(T), what a
// failure loses, and --fail-prob's recovery from a whole-matrix checkpoint.
#include "ckpt/job_info.h"
#include "ckpt/log_entry.h"
#include "ckpt/replay.h"
#include "comm/factory.h"
#include "engine/adapt/knobs.h"
#include "engine/base/error.h"
#include "engine/config.h"
#include "engine/recovery/checkpoint.h"
#include "engine/recovery/recovery.h"
#include "engine/worker/optimizer.h"
#include "ops/backends.h"

#include <catch2/catch.hpp>

#include "tests/support/bitwise.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tiny_clock.h"

#include <cstring>
#include <fstream>
#include <map>
#include <memory>

using namespace orpheus;
using orpheus::testing::bitwiseEqual;
using orpheus::testing::TempDir;

namespace {

// A one-rank MLR job (4 features, 3 classes, B = 3) with its checkpoint in `dir`.
struct Job {
  explicit Job(const std::string& dir) : transports(comm::makeLoopbackGroup(1)) {
    info.modelName = "mlr";
    info.modelSpec = "mlr features=4 classes=3";
    info.features = 4;
    info.classes = 3;
    info.seed = 11;
    info.ranks = 1;
    info.batch = 3;
    ckpt::writeJobInfo(dir, info);
    model = engine::modelOfJob(info);
    config.ckptDir = dir;
    config.seed = info.seed;
    config.batch = 3;
    params = model->initParams(info.seed);
  }

  // Clock `c`'s SV batch, applied to `params`; returned for the log.
  std::shared_ptr<SvBatch> step(uint64_t c) { return testing::tinyClock(*model, params, c); }

  ckpt::JobInfo info;
  std::vector<std::unique_ptr<comm::Transport>> transports;
  std::unique_ptr<ops::Model> model;
  engine::TrainConfig config;
  engine::adapt::Knobs knobs;
  ParamSet params;
};

engine::Restored restoreAt(const std::string& dir, uint64_t clock) {
  return engine::restore(dir, 0, clock, *ops::makeBackend("cpu"));
}

}  // namespace

TEST_CASE("without --ckpt sv the clock log keeps nothing and reaches nothing", "[recovery]") {
  TempDir dir;
  Job job(dir.str());
  auto log = engine::makeClockLog(job.config, *job.transports[0], 0, job.knobs, *job.model);
  CHECK_FALSE(log->keepsRecords());
  for (uint64_t c = 1; c <= 3; ++c) {
    log->appendGroup(c, {ckpt::Record::of(job.step(c))});
    log->endClock(c);
  }
  log->flush();
  CHECK(log->loseStaged() == 0);
  SvBatchHeader header;
  header.clock = 2;
  CHECK_FALSE(log->received(header, ckpt::Record{}).ref.has_value());
  // Nothing but job.h5 was written: there is no clock to restore.
  CHECK_THROWS_AS(restoreAt(dir.str(), 1), InputError);
}

TEST_CASE("the clock log restores every clock it logged, bitwise; past its end it refuses", "[recovery]") {
  TempDir dir;
  Job job(dir.str());
  job.config.ckptSv = true;
  auto log = engine::makeClockLog(job.config, *job.transports[0], 0, job.knobs, *job.model);
  // Format 3 without failures: received batches are references, so none is kept.
  CHECK_FALSE(log->keepsRecords());
  SvBatchHeader header;
  header.sender = 0;
  header.clock = 4;
  const ckpt::Record ref = log->received(header, ckpt::Record{});
  REQUIRE(ref.ref.has_value());
  CHECK(ref.ref->clock == 4);

  std::map<uint64_t, ParamSet> states;
  for (uint64_t c = 1; c <= 12; ++c) {
    // The job's own records share the stream; the replay passes over them.
    if (c == 1) log->jobRecord(c, ckpt::EventKind::kChunks, ckpt::layoutRecord(4, std::vector<int64_t>{8}));
    log->appendGroup(c, {ckpt::Record::of(job.step(c))});
    if (c == 6) log->averaged(c, job.params);
    if (c == 8) log->jobRecord(c, ckpt::EventKind::kMembership, ckpt::epochRecord({1, 8, 1}));
    log->endClock(c);
    states[c] = job.params;
  }
  log->flush();
  REQUIRE(ckpt::readMembership(dir.str()).size() == 2);
  CHECK(ckpt::readChunkLog(dir.str()).chunkRows == 4);
  for (uint64_t t : {1, 5, 6, 7, 8, 9, 12}) {
    INFO("clock " << t);
    const engine::Restored r = restoreAt(dir.str(), t);
    CHECK(r.clock == t);
    CHECK(bitwiseEqual(r.params, states.at(t)));
  }
  CHECK(restoreAt(dir.str(), 9).fromSnapshot == 6);
  CHECK(restoreAt(dir.str(), 0).clock == 12);  // 0: the newest
  CHECK_THROWS_AS(restoreAt(dir.str(), 13), InputError);
}

TEST_CASE("a failure loses what was only staged; the reset makes those clocks unrestorable", "[recovery]") {
  TempDir dir;
  Job job(dir.str());
  job.config.ckptSv = true;
  job.config.failProb = 0.5;  // a failed sender loses staged batches: receivers keep copies
  auto log = engine::makeClockLog(job.config, *job.transports[0], 0, job.knobs, *job.model);
  CHECK(log->keepsRecords());

  std::map<uint64_t, ParamSet> states;
  for (uint64_t c = 1; c <= 14; ++c) {
    log->appendGroup(c, {ckpt::Record::of(job.step(c))});
    if (c == 4) log->averaged(c, job.params);
    log->endClock(c);
    if (c == 10) log->flush();
    states[c] = job.params;
  }
  // The process dies after clock 14: the log on disk reaches 10.
  CHECK(log->loseStaged() == 10);
  log->recordReset(15, 10);
  job.params = states.at(10);
  for (uint64_t c = 15; c <= 16; ++c) {
    log->appendGroup(c, {ckpt::Record::of(job.step(c))});
    log->endClock(c);
    states[c] = job.params;
  }
  log->flush();
  CHECK(bitwiseEqual(restoreAt(dir.str(), 10).params, states.at(10)));
  CHECK(bitwiseEqual(restoreAt(dir.str(), 16).params, states.at(16)));
  for (uint64_t lost : {11, 14}) {
    INFO("clock " << lost);
    CHECK_THROWS_WITH(restoreAt(dir.str(), lost), Catch::Contains("lost") && Catch::Contains("failure at clock 15"));
  }
}

TEST_CASE("--fail-prob under --ckpt matrix: the replica returns to the last matrix, or to W0", "[recovery]") {
  TempDir dir;
  Job job(dir.str());
  job.config.ckptMatrix = true;
  job.config.ckptEvery = 5;
  auto backend = ops::makeBackend("cpu");
  engine::ReplicaUpdater updater(engine::optimizerSettings(job.config), *job.model, *backend);
  auto log = engine::makeClockLog(job.config, *job.transports[0], 0, job.knobs, *job.model);

  SECTION("no --fail-prob: nobody fails") {
    engine::Recovery recovery(engine::recoveryOptions(job.config), *job.model, *job.transports[0]);
    const ParamSet before = job.params;
    CHECK_FALSE(recovery.maybeFail(3, job.params, updater, 0, *log).failed);
    CHECK(bitwiseEqual(job.params, before));
    CHECK(recovery.failures() == 0);
  }
  SECTION("a failure before any checkpoint starts over from W0") {
    job.config.failProb = 0.999999;
    engine::Recovery recovery(engine::recoveryOptions(job.config), *job.model, *job.transports[0]);
    job.step(1);
    job.step(2);
    const auto failure = recovery.maybeFail(2, job.params, updater, 0, *log);
    REQUIRE(failure.failed);
    CHECK(failure.lostClocks == 2);
    CHECK(bitwiseEqual(job.params, job.model->initParams(job.info.seed)));
  }
  SECTION("a failure after a checkpoint comes back to it; the clocks since are lost") {
    job.config.failProb = 0.999999;
    engine::Recovery recovery(engine::recoveryOptions(job.config), *job.model, *job.transports[0]);
    ParamSet atCheckpoint;
    for (uint64_t c = 1; c <= 7; ++c) {
      job.step(c);
      recovery.checkpoint(c, job.params, updater, 0);  // writes at clock 5 only
      if (c == 5) atCheckpoint = job.params;
    }
    const auto failure = recovery.maybeFail(7, job.params, updater, 0, *log);
    REQUIRE(failure.failed);
    CHECK(failure.lostClocks == 2);
    CHECK(bitwiseEqual(job.params, atCheckpoint));
    CHECK(recovery.failures() == 1);
    CHECK(recovery.lostClocks() == 2);
  }
}

TEST_CASE("a directory as earlier jobs wrote it, its epochs and chunks in text files, restores and resumes as before",
          "[recovery]") {
  TempDir dir;
  Job job(dir.str());
  job.config.ckptSv = true;
  std::map<uint64_t, ParamSet> states;
  {
    auto log = engine::makeClockLog(job.config, *job.transports[0], 0, job.knobs, *job.model);
    for (uint64_t c = 1; c <= 8; ++c) {
      log->appendGroup(c, {ckpt::Record::of(job.step(c))});
      log->endClock(c);
      states[c] = job.params;
    }
    log->flush();
  }
  std::ofstream(dir / "membership") << "epoch 1 clock 4 ranks 1\n";
  std::ofstream(dir / "chunks") << "layout rows 4 shards 8\nclock 3 moves 0:0>0\nclock 7 moves 1:0>0\n";
  REQUIRE(ckpt::readMembership(dir.str()).size() == 2);
  for (uint64_t t : {1, 4, 5, 8}) {
    INFO("clock " << t);
    CHECK(bitwiseEqual(restoreAt(dir.str(), t).params, states.at(t)));
  }
  CHECK(engine::resumableClock(dir.str(), ckpt::inspect(dir.str()), 0, 1) == 8);
  // A resume at clock 5 cuts the chunk file there and leaves the membership file as it is.
  engine::discardAfter(dir.str(), 5);
  const ckpt::ChunkLog chunks = ckpt::readChunkLog(dir.str());
  REQUIRE(chunks.changes.size() == 1);
  CHECK(chunks.changes[0].clock == 3);
  CHECK(ckpt::readMembership(dir.str()).back().clock == 4);
}

TEST_CASE("a batch reference naming a selection method no version has is refused on restore", "[recovery]") {
  TempDir dir;
  Job job(dir.str());
  job.config.ckptSv = true;
  job.config.selectMethod = static_cast<engine::SelectionMethod>(9);  // as a damaged log would say
  auto log = engine::makeClockLog(job.config, *job.transports[0], 0, job.knobs, *job.model);
  for (uint64_t c = 1; c <= 3; ++c) {
    SvBatchHeader header;
    header.sender = 0;
    header.clock = c;
    const ckpt::Record ref = log->received(header, ckpt::Record{});
    REQUIRE(ref.ref.has_value());
    log->appendGroup(c, {ckpt::Record::of(job.step(c)), ref});
    log->endClock(c);
  }
  log->flush();
  CHECK_THROWS_WITH(restoreAt(dir.str(), 3), Catch::Contains("sender 0's batch of clock 1: a batch reference names selection method 9"));
}
