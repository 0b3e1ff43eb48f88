// Generated data for benchmarks and tests: "synthetic:examples=N,features=D,classes=K"
// gives N dense examples with standard normal features and uniform labels, each a
// pure function of (seed, example index), so every rank generates only its shard.
#pragma once

#include "engine/data/dataset.h"

#include <string>

namespace orpheus::engine {

bool isSyntheticSource(const std::string& path);
data::Dataset makeSyntheticShard(const std::string& spec, uint64_t seed, int rank, int worldSize);

}  // namespace orpheus::engine
