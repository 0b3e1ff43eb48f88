// Elastic restart: a job killed on P ranks continues on P' ranks (`train --resume
// --elastic`), from the SV log and the snapshots of its checkpoint directory.
//
// Membership epochs. Epoch 0 is the job as it started (job.h5's ranks, from clock
// 0). Each change of the number of ranks opens the next epoch at a clock boundary C
// and is a record of every new member's log ("epoch E clock C ranks P",
// ckpt/replay.h), durable once the change is complete on disk; directories written
// before segment format 4 hold the epochs in DIR/membership, read as they are.
// From the end of clock C on, epoch E's ranks hold replicas 0..P-1, replica r at rank r (rotation continues from there), the
// data is resharded over them, and every SV batch they send carries E in its header.
//
// The change is an averaging barrier. Every replica of the new epoch starts from the
// average of all the previous epoch's replicas at C, parameters and optimizer state
// alike: with P' < P the surplus replicas are averaged in (none is simply dropped);
// with P' > P the new replicas start from that same average. Each new replica's log
// marks it (an averaged event at C, chained at C as a rotation's hand-over is) and
// the averaged state is the snapshot of C, so `orpheus restore` at any clock after
// C replays from there and equals what the live replica held; restore at C itself
// gives the averaged state. Replicas of earlier epochs stay restorable up to C.
#pragma once

#include "ckpt/replay.h"
#include "comm/transport.h"
#include "engine/base/params.h"
#include "engine/config.h"
#include "engine/worker/optimizer.h"
#include "ops/model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::engine {

// The membership epochs are records of the checkpoint (ckpt/replay.h).
using ckpt::Epoch;
using ckpt::appendEpoch;
using ckpt::epochAfter;
using ckpt::readMembership;
using ckpt::replicaCount;
using ckpt::replicaHeldAt;

// What a membership change needs of the job (elasticOptions: from its flags).
struct ElasticOptions {
  std::string dir;               // --ckpt-dir
  uint64_t seed = 0;             // the job seed: W0
  OptimizerSettings optimizer;   // the job's optimizer (its state is averaged too)
};
ElasticOptions elasticOptions(const TrainConfig& config);

// What a rank of the new epoch starts from at clock C.
struct ElasticStart {
  ParamSet params;
  ParamSet optimizerState;  // Optimizer::exportState()
  Epoch epoch;
  bool writeSnapshot = false;  // no usable snapshot of C exists yet: this rank writes its part
};

// The average of the previous epoch's replicas at `clock` (collective over the new
// epoch's ranks): the snapshot of `clock` where a usable one exists (every replica
// equals it), else every old replica restored by one new rank (replica i by rank i
// mod P') and summed across ranks, bitwise the same on every rank.
ElasticStart redistribute(const ElasticOptions& options, comm::Transport& transport, const ops::Model& model,
                          ops::Backend& backend,
                          const std::vector<Epoch>& epochs, uint64_t clock);

}  // namespace orpheus::engine
