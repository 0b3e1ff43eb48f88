// A job's data: every rank's shards of the training and test files, read to the
// width and the label range all ranks agree on; and the rules between the flags,
// the model and the data that train (engine/job) and simulate (engine/sim) share.
#pragma once

#include "comm/transport.h"
#include "engine/config.h"
#include "engine/data/dataset.h"
#include "ops/model.h"

#include <cstdint>
#include <memory>
#include <string>

namespace orpheus::engine {

// A job's data as every rank agrees on it: its shards, read to the same width.
struct Shards {
  data::Dataset train;
  data::Dataset test;
  bool haveTest = false;
  int indexBase = -1;  // of LIBSVM files: 0 or 1, detected from the training file
  int64_t features = 0;
  int64_t classes = 0;
};

// Token streams are a sequence model's data and only theirs: any other pairing of `data`
// (read from `path`, given by `flag`) and `model` is refused, naming both.
void checkDataKind(const char* flag, const std::string& path, const data::Dataset& data, const std::string& model);
// The labels of `data` (a token stream's words) against those `model` (named `name`)
// takes: a label past them is refused before the first clock, naming both.
void checkLabelsFit(const char* flag, const std::string& path, const data::Dataset& data, const ops::Model& model,
                    const std::string& name);
// Rank `rank`'s shard of `path` (a file or a synthetic spec) of a job of `ranks`:
// as wide as `features` where that is > 0, token streams cut into --batch streams.
data::Dataset readShard(const std::string& path, const TrainConfig& config, int rank, int ranks, int64_t features,
                        int indexBase);
// One shard of the training data against the model and the flags: its kind
// (checkDataKind), and --balance and --sv-rank against token streams and sparse rows.
void checkTrainingShard(const TrainConfig& config, const data::Dataset& train);
// The model as the flags shape it (--select-unit), refusing what it cannot take
// (--select-unit step or --balance where it has no steps or carries state); `steps`:
// the training data's steps per segment.
void configureModel(const TrainConfig& config, ops::Model& model, int64_t steps);
// The training shard, then the shape every rank agrees on: the widest rows, the
// largest label.
void loadTrainShard(const TrainConfig& config, comm::Transport& transport, Shards& shards);
// The test shard, read to the training data's width.
void loadTestShard(const TrainConfig& config, comm::Transport& transport, Shards& shards);
// Reads this epoch's shards over `group`: the same shape as the job's model.
std::unique_ptr<Shards> reshard(const TrainConfig& config, comm::Transport& group, int64_t features,
                                int64_t classes);

}  // namespace orpheus::engine
