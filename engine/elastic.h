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

#include "comm/transport.h"
#include "engine/base/params.h"
#include "engine/config.h"
#include "ops/model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::engine {

struct Epoch {
  uint32_t epoch = 0;
  uint64_t clock = 0;  // the epoch's members run the clocks after this one
  int ranks = 1;
};

// A job's epochs, oldest first; at least epoch 0 (from job.h5). InputError on a
// malformed membership file.
std::vector<Epoch> readMembership(const std::string& dir);
// Appends `epoch` to DIR/membership durably (rank 0 only).
void appendEpoch(const std::string& dir, const Epoch& epoch);

// The epoch whose members hold the replicas after the end of clock `clock`.
const Epoch& epochAfter(const std::vector<Epoch>& epochs, uint64_t clock);
// The number of replica ids any epoch used (the largest epoch's ranks).
int replicaCount(const std::vector<Epoch>& epochs);
// The replica rank `rank` holds after `clock` clocks, rotating every `rotateEvery`
// clocks (0: never) within the epoch of that clock.
int replicaHeldAt(int rank, const std::vector<Epoch>& epochs, uint64_t clock, int64_t rotateEvery);

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
