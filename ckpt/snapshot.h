// Snapshots (ckpt/layout.h): the averaged parameters after the averaging barrier of
// a clock, written by every rank in parallel as its row block (rows
// [r*R/P, (r+1)*R/P) of every parameter) from a copy. A part holds one 2-D float
// dataset per parameter (the block, row-major) with attributes rows (the full
// count) and crc32c, and the attributes version, clock, rank, ranks and parameters
// (the names, newline-separated, in model order).
#pragma once

#include "engine/base/params.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orpheus::ckpt {

// Writes rank `rank`'s part of the snapshot of `clock`, durably (ckpt/durable.h).
void writeSnapshotPart(const std::string& dir, uint64_t clock, int rank, int ranks, const ParamSet& params);
// The clocks of the snapshot directories in `dir`, ascending, unverified (cheap).
std::vector<uint64_t> snapshotClocks(const std::string& dir);
// Reassembles a snapshot; nullopt when a part is missing or damaged.
std::optional<ParamSet> readSnapshot(const std::string& dir, uint64_t clock, const ParamSet& shapes);
// Why the snapshot of `clock` is incomplete or damaged (naming the part and its
// file), or "" when every part is there, intact, and agrees with the others (and
// with `shapes`, the model's parameters, when given).
std::string snapshotProblem(const std::string& dir, uint64_t clock, const ParamSet* shapes = nullptr);

}  // namespace orpheus::ckpt
