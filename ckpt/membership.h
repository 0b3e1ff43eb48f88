// The membership log of a checkpoint directory: each epoch of an elastic job (its
// first clock and its number of ranks), and which replica a rank holds when.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::ckpt {

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

}  // namespace orpheus::ckpt
