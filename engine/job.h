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

// The CLI's exit codes (besides 0).
constexpr int kExitInternal = 1;  // a bug, a lost peer, a timeout
constexpr int kExitBadInput = 2;  // bad input or usage
constexpr int kExitIoError = 3;   // the operating system refused a file operation (a full or failing disk)

// Exit code for an exception: kExitIoError for IoError, kExitBadInput for other
// InputErrors, a JobFailed's own code, kExitInternal otherwise.
int exitCodeFor(const std::exception& e);

// Prints "orpheus: <message>" as one line on stderr.
void reportError(const std::string& message);

// When the launcher ends the job (SIGTERM: a peer died, or mpirun was signalled),
// rank 0 prints "orpheus: rank 0 stopped by the launcher at clock C (a peer died or
// the job was cancelled)" once, then dies of the signal as before; nothing when it
// reported an error already, or when it was itself stalled (no clock for longer
// than the timeout: it was stopped, and a peer has reported). Other ranks stay
// silent. Install once the rank is known; the handler is async-signal-safe.
void installTerminationReport(int rank, double timeoutSeconds);
// The clock this rank is at, for that line (each clock's start).
void noteClock(uint64_t clock);

// Runs `step` on every rank (collective: every rank calls it at the same point). If
// it throws anywhere, the lowest failing rank prints its message and every rank
// throws JobFailed with the worst exit code, so a problem on one rank stops the
// whole job with one line and no hang.
void collectively(comm::Transport& transport, const std::function<void()>& step);

// What a model is built from: its name as given ("mlr" or a .loss path) and, for a
// .loss model a checkpoint recorded, the file's text and the spec it had then
// (the file itself may be gone or changed since).
struct ModelSource {
  std::string name;
  std::string text;  // empty: read the .loss file `name`
  std::string spec;  // with `text`
};

// The one model factory: the built-in MLR or a .loss model, for data of the given
// shape. InputError naming the model when it is neither.
std::unique_ptr<ops::Model> makeModel(const ModelSource& source, int64_t features, int64_t classes, uint64_t seed);

// What a process needs for `replicas` replicas of `model` (parameters, the update
// buffer, the optimizer's state, the rebuild's operands) and, for `running` of them
// at once, their minibatches in flight and their outputs (batch x steps x classes
// probabilities and gradients): an InputError that names the parts, before the first
// clock, when that passes half of this machine's memory.
struct DataShape {
  int64_t features = 0;
  int64_t classes = 0;
  int64_t steps = 0;  // token streams: steps per segment; 0 otherwise
  bool sparse = false;
};
void checkJobMemory(const TrainConfig& config, const ops::Model& model, const DataShape& data, int replicas,
                    int running);

// Creates `dir` and its parents; `what` names it in the message ("cannot create
// <what>'<dir>': <reason>"). A path that cannot be a directory (a file in the way)
// or may not be written is the user's choice of path: InputError. Anything else the
// system refuses (a full or failing disk) is an IoError.
void createDirectories(const std::string& dir, const std::string& what);

// A named input file (not a synthetic: source) that does not exist, or is a
// directory, is bad input: InputError in the data readers' words, before a reader
// would report it as a failing file operation.
void checkInputExists(const std::string& path);

class LiveGroup;

// Runs `config` on this rank (collective). Returns 0 on success, also on a rank
// that left the running job (engine/live.h: `live` null, never); throws JobFailed
// after a reported failure.
int runTrain(const TrainConfig& config, comm::Transport& transport, LiveGroup* live = nullptr);
// A rank that `live`'s grow() spawned: joins the running job as the new membership
// epoch after `clock` and trains to its end (collective with the job's ranks).
int joinTrain(const TrainConfig& config, comm::Transport& transport, LiveGroup& live, uint64_t clock);

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
