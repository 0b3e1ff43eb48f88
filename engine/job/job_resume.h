// A job's incremental SV checkpoint at the start of a run: what a fresh job
// records, and where and how a resumed job continues. Internal to engine/job.
#pragma once

#include "comm/transport.h"
#include "engine/config.h"
#include "engine/job/job_data.h"
#include "engine/membership/elastic.h"
#include "engine/worker/worker.h"
#include "ops/model.h"

#include <cstdint>
#include <vector>

namespace orpheus::engine {

// The incremental SV checkpoint: a fresh job records what it is; a resumed one
// continues from the newest clock every replica's log reaches. Returns that clock
// (0: a fresh start), the same on every rank.
uint64_t prepareCheckpointDir(const TrainConfig& config, comm::Transport& transport, const ops::Model& model,
                              const Shards& shards);

// --resume --elastic on a different number of ranks, or a live membership change
// (engine/membership/live.h): the next membership epoch starts at `resumeClock` from the
// average of the previous one (engine/membership/elastic.h).
void resumeElastic(Worker& worker, const TrainConfig& config, comm::Transport& transport, const ops::Model& model,
                   const std::vector<Epoch>& epochs, uint64_t resumeClock, bool live = false);

// With --resume, `worker` continues from `resumeClock` (0: nothing to resume) of
// the checkpoint, elastically when the number of ranks changed.
void resume(Worker& worker, const TrainConfig& config, comm::Transport& transport, const ops::Model& model,
            uint64_t resumeClock);

}  // namespace orpheus::engine
