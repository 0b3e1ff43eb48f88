// A training job from configuration to saved model: loads every rank's shards,
// agrees on the data's shape across ranks, builds the model, runs the worker and
// writes the outputs. Also the single-process evaluation of a saved model.
#pragma once

#include "comm/transport.h"
#include "engine/config.h"
#include "ops/model.h"

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace orpheus::engine {

// Thrown on every rank once a failure has been reported (by one rank, one line),
// so the caller only has to exit with `code`.
class JobFailed : public std::runtime_error {
 public:
  explicit JobFailed(int code) : std::runtime_error("job failed"), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Exit code for an exception: 2 for bad input or usage, 1 otherwise.
int exitCodeFor(const std::exception& e);

// Prints "orpheus: <message>" as one line on stderr.
void reportError(const std::string& message);

// Runs `step` on every rank (collective: every rank calls it at the same point). If
// it throws anywhere, the lowest failing rank prints its message and every rank
// throws JobFailed with the worst exit code, so a problem on one rank stops the
// whole job with one line and no hang.
void collectively(comm::Transport& transport, const std::function<void()>& step);

// The model named on the command line (a .loss file or "mlr"), for data of the given shape.
std::unique_ptr<ops::Model> makeModel(const std::string& name, int64_t features, int64_t classes, uint64_t seed);

// Runs `config` on this rank (collective). Returns 0 on success; throws JobFailed
// after a reported failure.
int runTrain(const TrainConfig& config, comm::Transport& transport);

struct EvalConfig {
  std::string params;
  std::string model = "mlr";
  std::string test;
  data::Format format = data::Format::kAuto;
  int64_t features = -1;
};

// Evaluates a saved model on a test file in this process; prints one JSON line.
int runEval(const EvalConfig& config);

}  // namespace orpheus::engine
