#include "engine/recovery/job_record.h"

#include "engine/base/error.h"

#include "engine/outputs.h"

#include <catch2/catch.hpp>

#include "tests/support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace fs = std::filesystem;
using orpheus::testing::TempDir;
using namespace orpheus::engine;
using Catch::Matchers::Contains;
using orpheus::InputError;

namespace {


}  // namespace

TEST_CASE("a resumed job refuses every flag that changes the computation, naming it") {
  TrainConfig c;
  const ComputationRecord base = computationRecord(c, 4, 784, 10, "", "1:2");
  REQUIRE_NOTHROW(checkResume(base, computationRecord(c, 4, 784, 10, "", "1:2"), "ck"));
  // Flags that only change what is observed may change.
  TrainConfig observed = c;
  observed.clocks = 5000;
  observed.evalEvery = 7;
  observed.test = "other.libsvm";
  observed.timeoutSeconds = 9;
  REQUIRE_NOTHROW(checkResume(base, computationRecord(observed, 4, 784, 10, "", "1:2"), "ck"));

  REQUIRE_THROWS_WITH(checkResume(base, computationRecord(c, 2, 784, 10, "", "1:2"), "ck"),
                      Contains("the number of ranks (mpirun -np) differs") && Contains("it was 4 and is now 2") &&
                          Contains("--resume --elastic continues it on another number of ranks"));
  REQUIRE_THROWS_WITH(checkResume(base, computationRecord(c, 4, 784, 10, "", "9:9"), "ck"),
                      Contains("--train differs") && Contains("its contents changed"));
  REQUIRE_THROWS_WITH(checkResume(base, computationRecord(c, 4, 785, 10, "", "1:2"), "ck"), Contains("--features"));
  const auto changed = [&](auto edit, const char* flag) {
    TrainConfig d = c;
    edit(d);
    REQUIRE_THROWS_WITH(checkResume(base, computationRecord(d, 4, 784, 10, "", "1:2"), "ck"),
                        Contains(std::string(flag) + " differs"));
  };
  changed([](TrainConfig& d) { d.batch = 7; }, "--batch");
  changed([](TrainConfig& d) { d.lr = 0.2; }, "--lr");
  changed([](TrainConfig& d) { d.seed = 3; }, "--seed");
  changed([](TrainConfig& d) { d.select = 5; }, "--select");
  changed([](TrainConfig& d) { d.multicast = orpheus::comm::MulticastKind::kRandom; }, "--multicast");
  changed([](TrainConfig& d) { d.fanout = 2; }, "--fanout");
  changed([](TrainConfig& d) { d.averageEvery = 10; }, "--average-every");
  changed([](TrainConfig& d) { d.rotateEvery = 10; }, "--rotate-every");
  // --adapt records its settings only when on: turning it on (or off) is a change too.
  changed([](TrainConfig& d) { d.adapt = true; }, "--adapt");
  TrainConfig adaptive = c;
  adaptive.adapt = true;
  REQUIRE_THROWS_WITH(checkResume(computationRecord(adaptive, 4, 784, 10, "", "1:2"), base, "ck"),
                      Contains("--adapt differs") && Contains("it was on and is now off"));
  // So are the other settings recorded only while on.
  changed([](TrainConfig& d) { d.outerLr = 0.7; }, "--outer-lr");
  changed([](TrainConfig& d) { d.selectUnit = orpheus::ops::Model::SvgUnit::kStep; }, "--select-unit");
  changed([](TrainConfig& d) { d.balance = true; }, "--balance");
  TrainConfig ranked = c;
  ranked.svRank = 2;
  REQUIRE_THROWS_WITH(checkResume(base, computationRecord(ranked, 4, 784, 10, "", "1:2"), "ck"),
                      Contains("--sv-rank differs") && Contains("it was 0 and is now 2"));
  TrainConfig bf16 = c;
  bf16.svDtype = orpheus::SvDtype::kBf16;
  REQUIRE_THROWS_WITH(checkResume(computationRecord(bf16, 4, 784, 10, "", "1:2"), base, "ck"),
                      Contains("--sv-dtype differs") && Contains("it was bf16 and is now f32"));
  // The model's text, not its path, identifies it.
  const ComputationRecord loss = computationRecord(c, 4, 784, 10, "loss softmax_ce(W x, t)", "1:2");
  REQUIRE_THROWS_WITH(checkResume(loss, computationRecord(c, 4, 784, 10, "loss softmax_ce(W x, y)", "1:2"), "ck"),
                      Contains("--model differs"));
}

TEST_CASE("the record survives its text form; entries an old record lacks are not checked") {
  TrainConfig c;
  const ComputationRecord r = computationRecord(c, 2, 3, 4, "", "a:b");
  REQUIRE(decodeRecord(encodeRecord(r), "job.h5") == r);
  REQUIRE_NOTHROW(checkResume({{"np", "2"}}, r, "ck"));
  REQUIRE_THROWS_WITH(decodeRecord("np=2\ngarbage\n", "x/job.h5"), Contains("x/job.h5: line 2"));
}

TEST_CASE("a file's digest changes with its contents") {
  TempDir t;
  const std::string f = (t.path() / "data").string();
  std::ofstream(f) << "1 1:0.5\n";
  const std::string a = fileDigest(f);
  std::ofstream(f) << "1 1:0.6\n";
  REQUIRE(fileDigest(f) != a);
  REQUIRE(fileDigest((t.path() / "none").string()) == "unreadable");
}

TEST_CASE("a checkpoint directory belongs to one job") {
  TempDir t;
  const std::string dir = (t.path() / "ckpt").string();
  REQUIRE_NOTHROW(claimCheckpointDir(dir, false));  // does not exist yet
  fs::create_directories(dir);
  REQUIRE_NOTHROW(claimCheckpointDir(dir, false));  // empty
  std::ofstream(dir + "/job.h5") << "x";
  fs::create_directories(dir + "/replica-0");
  fs::create_directories(dir + "/snapshot-000000000050");
  REQUIRE_THROWS_WITH(claimCheckpointDir(dir, false),
                      Contains("is not empty (a checkpoint)") && Contains("--resume") && Contains("--overwrite"));
  REQUIRE(fs::exists(dir + "/job.h5"));
  // A file no job wrote stops --overwrite, and nothing is removed.
  std::ofstream(dir + "/notes.txt") << "mine";
  REQUIRE_THROWS_WITH(claimCheckpointDir(dir, true), Contains("'notes.txt', which no Orpheus job wrote"));
  REQUIRE(fs::exists(dir + "/job.h5"));
  fs::remove(dir + "/notes.txt");
  // Another rank's writability probe, there for an instant, is neither the user's
  // file nor the old job's: --overwrite goes on and leaves it to its rank.
  const std::string probe = dir + "/" + orpheus::engine::kProbePrefix + "AbC123";
  std::ofstream(probe) << "";
  REQUIRE_NOTHROW(claimCheckpointDir(dir, true));
  REQUIRE(fs::exists(probe));
  fs::remove(probe);
  REQUIRE(fs::is_empty(dir));
  std::ofstream(probe) << "";
  REQUIRE_NOTHROW(claimCheckpointDir(dir, false));  // a probe alone: an empty directory
  std::ofstream((t.path() / "file").string()) << "x";
  REQUIRE_THROWS_WITH(claimCheckpointDir((t.path() / "file").string(), false), Contains("is not a directory"));
  // A directory of the user's own files is not a checkpoint: no hint at --overwrite.
  const std::string mine = (t.path() / "mine").string();
  fs::create_directories(mine);
  std::ofstream(mine + "/thesis.tex") << "x";
  for (bool overwrite : {false, true}) {
    REQUIRE_THROWS_WITH(claimCheckpointDir(mine, overwrite),
                        Contains("holds files of its own ('thesis.tex'), not a checkpoint") &&
                            !Contains("--overwrite") && Contains("choose another --ckpt-dir"));
  }
  REQUIRE(fs::exists(mine + "/thesis.tex"));
}
