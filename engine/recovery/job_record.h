// What a checkpoint directory records of the job that owns it, and the checks made
// against that record: a directory belongs to one job, and `--resume` continues
// exactly that job or refuses, naming the flag that would change it.
#pragma once

#include "engine/config.h"

#include <string>
#include <utility>
#include <vector>

namespace orpheus::engine {

// The settings that decide what a job computes, as (flag, value) pairs in a fixed
// order: the model text, the training data's contents, the data shape and every
// flag that changes the parameters (not --clocks, --test, --eval-every, timeouts
// or output paths, which a resumed job may change).
using ComputationRecord = std::vector<std::pair<std::string, std::string>>;

// `modelText`: the .loss file's text ("" for built-ins); `trainDigest`: fileDigest()
// of the training file (or its synthetic description).
ComputationRecord computationRecord(const TrainConfig& config, int ranks, int64_t features, int64_t classes,
                                    const std::string& modelText, const std::string& trainDigest);

// One "flag=value" line per entry, and back (InputError naming `source` on a
// malformed line).
std::string encodeRecord(const ComputationRecord& record);
ComputationRecord decodeRecord(const std::string& text, const std::string& source);

// The optimizer and schedule a record names (engine/worker/optimizer.h); sgd with a
// constant lr for a record written before optimizers were recorded.
OptimizerSettings recordedOptimizer(const ComputationRecord& record);

// The BLAS threads the job computed with (--threads): 1, train's default, for a
// record written before they were recorded.
int recordedThreads(const ComputationRecord& record);

// Refuses a resume whose settings differ from the recorded ones: InputError naming
// the first flag that differs, with both values. Entries the record lacks (a
// checkpoint written before they were recorded) are not checked.
void checkResume(const ComputationRecord& recorded, const ComputationRecord& now, const std::string& dir);

// Size and CRC32C of a file's contents ("size:crc" in hex), so a resumed job can
// tell that its training data changed.
std::string fileDigest(const std::string& path);

// A fresh job's claim on its checkpoint directory. A directory that does not exist
// or is empty is taken. One holding anything is refused with a line that says how
// to continue (--resume) or replace it (--overwrite); with `overwrite`, what an
// earlier job wrote there (job.h5, replica-*, snapshot-*, matrix-* and their
// *.discarded sets) is removed, and any other file makes it refuse all the same:
// only the engine's own files are ever deleted.
void claimCheckpointDir(const std::string& dir, bool overwrite);

}  // namespace orpheus::engine
