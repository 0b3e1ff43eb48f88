// The steps of a job that need no launcher (engine/job/job.h): the memory a job
// would need, checked before the first clock, and the single-process evaluation
// of a saved model, and the exit code each kind of failure ends the job with.
#include "comm/stall.h"
#include "engine/base/error.h"
#include "engine/config.h"
#include "engine/failures.h"
#include "engine/job/job.h"
#include "engine/memory_check.h"
#include "ops/model.h"
#include "ops/model_factory.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

using namespace orpheus;

namespace {

std::string fixture(const std::string& name) {
  const char* root = std::getenv("ORPHEUS_TEST_DATA");
  return std::string(root != nullptr ? root : "tests/data") + "/e2e/" + name;
}

std::unique_ptr<ops::Model> mlr(int64_t features, int64_t classes) {
  return ops::makeModel({"mlr", "", ""}, features, classes, 1);
}

}  // namespace

TEST_CASE("each kind of failure has its exit code", "[job]") {
  using engine::exitCodeFor;
  CHECK(exitCodeFor(std::runtime_error("a bug")) == 1);
  CHECK(exitCodeFor(InputError("--lr: not a number")) == 2);
  CHECK(exitCodeFor(CorruptRecordError("a damaged batch")) == 2);
  CHECK(exitCodeFor(IoError("disk full")) == 3);
  CHECK(exitCodeFor(TimeoutError("no minibatch within 1000 ms")) == 4);
  CHECK(exitCodeFor(comm::StallError("stalled or gone: rank 1", true)) == 4);
  CHECK(exitCodeFor(engine::JobFailed(3)) == 3);
}

TEST_CASE("a job that fits in memory passes; one that cannot names its parts", "[job]") {
  engine::TrainConfig c;
  c.batch = 100;
  const auto model = mlr(784, 10);
  const engine::DataShape fmnist{784, 10, 0, false};
  CHECK_NOTHROW(engine::checkJobMemory(c, *model, fmnist, 1, 1));

  c.batch = 2000000000;
  CHECK_THROWS_WITH(engine::checkJobMemory(c, *model, fmnist, 1, 1),
                    Catch::Contains("1 replica of model 'mlr' (7850 parameters) with --batch 2000000000 over 10 "
                                    "classes needs") &&
                        Catch::Contains("of this machine's"));
  // Replicas count: ten million of 7850 parameters pass any machine's half.
  c.batch = 100;
  CHECK_THROWS_WITH(engine::checkJobMemory(c, *model, fmnist, 10000000, 1),
                    Catch::StartsWith("10000000 replicas of model 'mlr'"));
}

TEST_CASE("a quasi-Newton optimizer refuses a model too large for its n x n approximation", "[job]") {
  engine::TrainConfig c;
  c.batch = 2;
  c.optimizer = engine::OptimizerKind::kBfgs;
  const engine::DataShape shape{2000, 3, 0, false};
  CHECK_THROWS_WITH(engine::checkJobMemory(c, *mlr(2000, 3), shape, 1, 1),
                    Catch::Contains("--optimizer bfgs: model 'mlr' has 6003 parameter entries"));
  CHECK_NOTHROW(engine::checkJobMemory(c, *mlr(20, 3), engine::DataShape{20, 3, 0, false}, 1, 1));
}

TEST_CASE("--threads beyond what the host gives is said, naming why", "[job]") {
  using engine::threadsWarning;
  // One thread, or threads that fit: nothing to say.
  CHECK(threadsWarning(1, 1, 8, 1, 2).empty());
  CHECK(threadsWarning(2, 2, 2, 4, 4).empty());
  // More ranks times threads than the host's cores.
  CHECK_THAT(threadsWarning(2, 2, 4, 16, 4),
             Catch::Equals("--threads 2: 4 ranks on this host with 2 threads each are 8 compute threads on 4 cores, "
                           "which time-slice (--threads 1 fits)"));
  // A rank bound to fewer cores than its threads.
  CHECK_THAT(threadsWarning(2, 2, 1, 1, 2), Catch::Contains("this rank may run on 1 of the host's 2 cores") &&
                                                 Catch::Contains("--bind-to none"));
  // BLAS's own limit, said as well.
  CHECK_THAT(threadsWarning(1000, 64, 1, 2, 2),
             Catch::StartsWith("--threads 1000: BLAS runs at most 64 threads, so 64 run; 1 rank on this host with 64 "
                               "threads each are 64 compute threads on 2 cores"));
}

TEST_CASE("eval reads a saved model and refuses test data of another width", "[job]") {
  engine::EvalConfig e;
  e.params = fixture("mlr_small.h5");
  e.test = fixture("small.csv");
  CHECK(engine::runEval(e) == 0);

  e.test = fixture("wide.csv");
  CHECK_THROWS_AS(engine::runEval(e), InputError);
  try {
    engine::runEval(e);
  } catch (const InputError& error) {
    CHECK_THAT(error.what(), Catch::Matches(".*test data.*has 3 features but the model.*"));
  }

  e.test = fixture("no_such_file.csv");
  CHECK_THROWS_WITH(engine::runEval(e), Catch::Contains("no_such_file.csv"));
}
