// The simulated job's data: every rank's shards of the training and test files, cut
// as `train` would read them on P ranks, to the shapes every rank agrees on.
// A membership change recuts them for the new number of ranks
// (engine/sim/membership_plan.h).
#pragma once

#include "engine/config.h"
#include "engine/data/dataset.h"

#include <cstdint>
#include <vector>

namespace orpheus::engine::sim {

struct Shards {
  std::vector<data::Dataset> train;  // by rank
  std::vector<data::Dataset> test;   // by rank; empty without --test
  int64_t features = 0;
  int64_t classes = 0;
};

// Every rank's shards on `ranks` ranks, as runTrain reads and agrees them: an IDX
// file is read once and cut into the contiguous ranges its reader gives each rank,
// other formats shard by shard. The shapes come from the whole data, so a recut on
// another number of ranks has the model's.
Shards loadShards(const TrainConfig& config, int ranks);

}  // namespace orpheus::engine::sim
