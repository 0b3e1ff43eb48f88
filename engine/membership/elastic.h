// Elastic restart: a job killed on P ranks continues on P' ranks (`train --resume
// --elastic`), from the SV log and the snapshots of its checkpoint directory.
//
// Membership epochs. Epoch 0 is the job as it started (job.h5's ranks, from clock
// 0). Each change of the number of ranks opens the next epoch at a clock boundary C
// and is one line of DIR/membership ("epoch E clock C ranks P"), written durably
// once the change is complete on disk. From the end of clock C on, epoch E's ranks
// hold replicas 0..P-1, replica r at rank r (rotation continues from there), the
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
#include "ops/model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::engine {

// The membership log lives with the checkpoint (ckpt/membership.h).
using ckpt::Epoch;
using ckpt::appendEpoch;
using ckpt::epochAfter;
using ckpt::readMembership;
using ckpt::replicaCount;
using ckpt::replicaHeldAt;

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
ElasticStart redistribute(const TrainConfig& config, comm::Transport& transport, const ops::Model& model,
                          ops::Backend& backend,
                          const std::vector<Epoch>& epochs, uint64_t clock);

}  // namespace orpheus::engine
