// The replay of a checkpoint directory's event stream: what the job was at a clock.
// One module reads every record the directory keeps besides the replicas' batches
// (which ckpt/log_reader.h and ckpt/restorable.h read for restore):
//   membership  DIR/membership: each epoch of an elastic job (its first clock and
//               its number of ranks), and so which replica a rank holds when
//   chunks      DIR/chunks: the chunk layout of --balance and every change of
//               chunk ownership, by clock
//   knobs       the kKnobs entries of a replica's SV log (--adapt): the knobs the
//               job had set by a clock
// The membership and chunk records are small text logs, rewritten whole and
// durably (ckpt/durable.h) by rank 0; their formats are those every earlier
// directory has, so old directories replay as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
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

// Chunk `chunk` passes from rank `from` to rank `to`.
struct ChunkMove {
  int64_t chunk = 0;
  int from = 0;
  int to = 0;
  bool operator==(const ChunkMove&) const = default;
};

// One change of ownership, after clock `clock`.
struct Rebalance {
  uint64_t clock = 0;
  std::vector<ChunkMove> moves;
};

struct ChunkLog {
  int64_t chunkRows = 0;          // 0: no log
  std::vector<int64_t> shardRows;
  std::vector<Rebalance> changes;
};

// DIR/chunks; an empty log (chunkRows 0) when the file is absent. InputError on a
// malformed line, naming the file and line.
ChunkLog readChunkLog(const std::string& dir);
// Rewrites DIR/chunks with `log`, durably (rank 0 only).
void writeChunkLog(const std::string& dir, const ChunkLog& log);
// "c:f>t ..." for `moves`, as DIR/chunks spells them.
std::string describeMoves(std::span<const ChunkMove> moves);
// The changes of `log` made at or before clock `clock`, oldest first.
std::vector<Rebalance> changesUpTo(const ChunkLog& log, uint64_t clock);

// The record of replica `replica`'s newest kKnobs entry at or before `clock` (the
// knobs as engine/adapt encodes them), or none: the flags' knobs hold.
std::optional<std::vector<std::byte>> knobsRecordAt(const std::string& dir, int replica, uint64_t clock);

}  // namespace orpheus::ckpt
