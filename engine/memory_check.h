// Whether a job fits this machine: its memory, checked before its first clock (the
// training job and the simulator both ask), and its cores.
#pragma once

#include "engine/config.h"
#include "ops/model.h"

#include <cstdint>
#include <string>

namespace orpheus::engine {

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

// The compute threads --threads asks for against this host's cores: "" when they
// fit, else one line saying what the job will not get. `requested`: --threads;
// `inForce`: the threads BLAS runs (blasThreads); `ranksOnHost`: the job's ranks on
// this host; `usable`: the cores this process may run on (its CPU affinity);
// `cores`: the host's.
std::string threadsWarning(int requested, int inForce, int ranksOnHost, int usable, int cores);
// The same for this process, from its affinity and the host.
std::string threadsWarning(int requested, int ranksOnHost);

}  // namespace orpheus::engine
