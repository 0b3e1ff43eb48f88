// TrainConfig::validate(): each refusal of a combination of flags, with the line
// `orpheus train` prints for it (the same patterns tests/e2e/bad_input.cmake once
// matched through mpiexec). Each case starts from a configuration validate()
// accepts, so the one flag changed is what it refuses.
#include "engine/base/error.h"
#include "engine/config.h"

#include <catch2/catch.hpp>

#include <regex>
#include <string>

namespace engine = orpheus::engine;
using engine::TrainConfig;

namespace {

// `orpheus train --progress off --clocks 5 --batch 2 --train small.libsvm`.
TrainConfig smallJob() {
  TrainConfig c;
  c.train = "small.libsvm";
  c.clocks = 5;
  c.batch = 2;
  return c;
}

// The InputError validate() throws for `c` on `ranks` ranks ("" when it accepts it).
std::string refusal(const TrainConfig& c, int ranks) {
  try {
    engine::validate(c, ranks);
  } catch (const orpheus::InputError& e) {
    return e.what();
  }
  return "";
}

// The refusal matches `pattern` (grep -E, as tests/e2e/expect_error.sh) and is one line.
void requireRefusal(const TrainConfig& c, int ranks, const std::string& pattern) {
  const std::string message = refusal(c, ranks);
  INFO("message: " << message);
  REQUIRE_FALSE(message.empty());
  CHECK(std::regex_search(message, std::regex(pattern, std::regex::extended)));
  CHECK(message.find('\n') == std::string::npos);
}

}  // namespace

TEST_CASE("the starting configurations are accepted", "[config]") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    CHECK(refusal(smallJob(), ranks).empty());
  }
}

TEST_CASE("--select above the batch size", "[config]") {
  TrainConfig c = smallJob();
  c.select = 2;
  REQUIRE(refusal(c, 4).empty());
  c.select = 3;
  requireRefusal(c, 4, "--select 3 must be between 1 and the batch size");
}

TEST_CASE("--fanout beyond P-1 peers, and --fanout under broadcast", "[config]") {
  TrainConfig c = smallJob();
  c.multicast = orpheus::comm::MulticastKind::kRandom;
  c.fanout = 3;
  REQUIRE(refusal(c, 4).empty());
  c.fanout = 4;
  requireRefusal(c, 4, "--fanout 4 needs at most P-1 = 3");

  TrainConfig broadcast = smallJob();
  broadcast.fanout = 1;
  requireRefusal(broadcast, 2, "--fanout 1 applies to --multicast random");
}

TEST_CASE("--staleness under BSP", "[config]") {
  TrainConfig c = smallJob();
  c.staleness = 3;
  requireRefusal(c, 2, "--staleness 3 applies to --consistency ssp");
  c.consistency = engine::Consistency::kSsp;
  CHECK(refusal(c, 2).empty());
}

TEST_CASE("--inject-delay naming a rank the job does not have", "[config]") {
  TrainConfig c = smallJob();
  c.delayRank = 1;
  c.delayMs = 10;
  REQUIRE(refusal(c, 2).empty());
  c.delayRank = 5;
  requireRefusal(c, 2, "--inject-delay 5:10 names rank 5, but the job has ranks 0..1");
}

TEST_CASE("--fail-prob without a checkpoint", "[config]") {
  TrainConfig c = smallJob();
  c.failProb = 0.1;
  requireRefusal(c, 2, "--fail-prob needs a checkpoint");
  c.ckptSv = true;
  c.ckptDir = "ckpt";
  CHECK(refusal(c, 2).empty());
  // Recovery replays to the clock the log reaches: an averaging without a snapshot
  // on the way would stop it mid-run (it did, at the first failure after one).
  c.averageEvery = 4;
  c.snapshotEvery = 2;
  requireRefusal(c, 2,
                 "--fail-prob recovers a replica to the clock its log reaches, which needs a snapshot at every "
                 "averaging barrier, and --snapshot-every 2 keeps one at one barrier in 2 \\(give --snapshot-every 1\\)");
  c.snapshotEvery = 1;
  CHECK(refusal(c, 2).empty());
}

TEST_CASE("--target-accuracy without --test", "[config]") {
  TrainConfig c = smallJob();
  c.targetAccuracy = 0.9;
  requireRefusal(c, 2, "target-accuracy");
  c.test = "small.libsvm";
  CHECK(refusal(c, 2).empty());
}

TEST_CASE("optimizer flags the optimizer or schedule does not use", "[config]") {
  TrainConfig c = smallJob();
  c.optimizer = engine::OptimizerKind::kAdam;
  REQUIRE(refusal(c, 1).empty());
  c.momentum = 0.5;
  requireRefusal(c, 1, "--momentum applies to --optimizer momentum or nesterov, not adam");

  TrainConfig step = smallJob();
  step.lrSchedule = engine::LrScheduleKind::kStep;
  requireRefusal(step, 1, "--lr-schedule step needs --lr-step-every");
  step.lrStepEvery = 2;
  CHECK(refusal(step, 1).empty());
}

TEST_CASE("--sv-rank with --overlap or --select", "[config]") {
  // --train synthetic:examples=100,features=20,classes=3 --batch 2.
  TrainConfig c = smallJob();
  c.train = "synthetic:examples=100,features=20,classes=3";
  c.svRank = 1;
  c.overlap = true;
  requireRefusal(c, 2, "--sv-rank compresses a clock's whole batch after the backward pass");

  TrainConfig high = smallJob();
  high.train = c.train;
  high.svRank = 2;
  // R + 1 against a clock's columns needs the model (a sequence model's are B*T):
  // refused when the job configures it (tests/e2e/bad_input.cmake, bad_flag_sv_rank_*).
  CHECK(refusal(high, 2).empty());
  high.batch = 4;
  high.select = 2;
  requireRefusal(high, 2, "--sv-rank sends each matrix's whole update at rank R with error feedback: it replaces "
                          "--select");
  high.select = 0;
  high.adapt = true;  // --adapt moves the rank in place of C
  CHECK(refusal(high, 2).empty());
}

TEST_CASE("--adapt-rank: with --adapt and --sv-rank, around the starting rank; no --adapt-select", "[config]") {
  TrainConfig c = smallJob();
  c.train = "synthetic:examples=100,features=20,classes=3";
  c.batch = 10;
  c.adaptRank = {1, 4};
  requireRefusal(c, 2, "--adapt-rank, --adapt-fanout");  // not without --adapt
  c.adapt = true;
  requireRefusal(c, 2, "--adapt-rank bounds the rank of --sv-rank R: give --sv-rank");
  c.svRank = 2;
  CHECK(refusal(c, 2).empty());
  c.adaptRank = {3, 4};
  requireRefusal(c, 2, "--sv-rank 2 is the rank to start from: it must lie in --adapt-rank 3:4");
  c.adaptRank = {1, 9};
  requireRefusal(c, 2, "--adapt-rank 1:9 must be MIN:MAX with 1 <= MIN <= MAX <= 8");
  c.adaptRank = {1, 4};
  c.adaptSelect = {1, 5};
  requireRefusal(c, 2, "--adapt-select bounds C, which --sv-rank replaces");
}

TEST_CASE("--sync powersgd: BSP broadcast only, a rank, no checkpoint", "[config]") {
  TrainConfig c = smallJob();
  c.sync = engine::SyncMode::kPowerSgd;
  requireRefusal(c, 2, "--sync powersgd needs --sv-rank R >= 1");
  c.svRank = 2;  // not bound by the batch: the factors are not SVGs
  CHECK(refusal(c, 2).empty());

  TrainConfig ssp = c;
  ssp.consistency = engine::Consistency::kSsp;
  requireRefusal(ssp, 2, "--sync powersgd all-reduces its factors every clock \\(BSP\\): it takes no --select, "
                         "--multicast, --consistency ssp");
  TrainConfig multicast = c;
  multicast.multicast = orpheus::comm::MulticastKind::kRandom;
  multicast.fanout = 1;
  requireRefusal(multicast, 2, "--sync powersgd all-reduces its factors every clock");
  TrainConfig overlap = c;
  overlap.overlap = true;
  requireRefusal(overlap, 2, "--sync powersgd all-reduces its factors every clock");
  TrainConfig ckpt = c;
  ckpt.ckptMatrix = true;
  ckpt.ckptDir = "ckpt";
  requireRefusal(ckpt, 2, "--sync powersgd keeps each rank's error feedback in no checkpoint");
}

TEST_CASE("--optimizer dfp with --select", "[config]") {
  TrainConfig c = smallJob();
  c.train = "synthetic:examples=10,features=20,classes=3";
  c.optimizer = engine::OptimizerKind::kDfp;
  REQUIRE(refusal(c, 2).empty());
  c.select = 1;
  requireRefusal(c, 2, "--optimizer dfp needs the same curvature pair");
}

TEST_CASE("--balance under SSP, and its knobs without --balance", "[config]") {
  TrainConfig c = smallJob();
  c.balance = true;
  REQUIRE(refusal(c, 2).empty());
  c.consistency = engine::Consistency::kSsp;
  requireRefusal(c, 2, "--balance .* needs --consistency bsp");

  TrainConfig knobs = smallJob();
  knobs.balanceEvery = 5;
  requireRefusal(knobs, 2, "--balance-every and --chunk-rows apply to --balance");
  knobs.balance = true;
  CHECK(refusal(knobs, 2).empty());
}

TEST_CASE("--adapt-bf16: with --adapt and a byte budget, without --overlap", "[config]") {
  TrainConfig c = smallJob();
  c.adaptBf16 = true;
  requireRefusal(c, 2, "--adapt-bf16 and --max-bytes-per-clock apply to --adapt");
  c.adapt = true;
  requireRefusal(c, 2, "--adapt-bf16 lets the controller meet --max-bytes-per-clock with bf16 SVs: give the budget");
  c.maxBytesPerClock = 1e6;
  CHECK(refusal(c, 2).empty());
  c.overlap = true;
  requireRefusal(c, 2, "--adapt-bf16 rounds a clock's batch before it is sent: it takes no --overlap");
}

TEST_CASE("--outer-lr and --outer-momentum: ranges, and only at an averaging barrier", "[config]") {
  TrainConfig c = smallJob();
  c.averageEvery = 10;
  c.outerLr = 0.7;
  c.outerMomentum = 0.9;
  REQUIRE(refusal(c, 4).empty());
  TrainConfig negative = c;
  negative.outerLr = -0.1;
  requireRefusal(negative, 4, "--outer-lr -0.1 must be a number >= 0");
  TrainConfig momentum = c;
  momentum.outerMomentum = 1.0;
  requireRefusal(momentum, 4, "--outer-momentum 1 must be in \\[0, 1\\)");
  momentum.outerMomentum = -0.5;
  requireRefusal(momentum, 4, "--outer-momentum -0.5 must be in");
  TrainConfig alone = c;
  alone.outerLr = 0.0;
  requireRefusal(alone, 4, "--outer-momentum needs --outer-lr L > 0");
  TrainConfig unsynced = c;
  unsynced.averageEvery = 0;
  requireRefusal(unsynced, 4, "--outer-lr and --outer-momentum step at the averaging barrier: they need "
                              "--average-every R");
}
