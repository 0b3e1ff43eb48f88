// The replay of a checkpoint directory's event stream: what the job was at a clock.
// One module reads every record the directory keeps besides the replicas' batches
// (which ckpt/log_reader.h and ckpt/restorable.h read for restore):
//   membership  the kMembership records of the replicas' logs: each epoch of an
//               elastic job (its first clock and its number of ranks), and so which
//               replica a rank holds when
//   chunks      the kChunks records: the chunk layout of --balance and every change
//               of chunk ownership, by clock
//   knobs       the kKnobs entries of a replica's SV log (--adapt): the knobs the
//               job had set by a clock
//   batches     a replica's groups and events in order, with the batches its
//               references name (LogReplay): what restore rebuilds a replica from
// Every rank writes the membership and chunk records into the log of the replica it
// holds (ckpt/clock_log.h, jobRecord), so they are read from every replica's intact
// segments, each record once. Directories written before (segment format 3 and
// older) keep them in the text files DIR/membership and DIR/chunks, which are read
// as they are, before the log's records: a job resumed on such a directory
// continues its history in the log.
#pragma once

#include "ckpt/log_entry.h"
#include "ckpt/log_reader.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::ckpt {

struct Epoch {
  uint32_t epoch = 0;
  uint64_t clock = 0;  // the epoch's members run the clocks after this one
  int ranks = 1;
};

// A job's epochs, oldest first; at least epoch 0 (from job.h5), then those of an
// old DIR/membership, then the log's. InputError on a malformed line or record, or
// epochs that do not count up by one.
std::vector<Epoch> readMembership(const std::string& dir);
// The kMembership record of `epoch`: "epoch E clock C ranks P".
std::string epochRecord(const Epoch& epoch);
// Appends `epoch` to DIR/membership durably, as directories before segment format
// 4 hold it (what reads and tests such directories; a job writes epochs to its log).
void appendEpoch(const std::string& dir, const Epoch& epoch);

// The epoch whose members hold the replicas after the end of clock `clock`.
const Epoch& epochAfter(const std::vector<Epoch>& epochs, uint64_t clock);
// The number of replica ids any epoch used (the largest epoch's ranks).
int replicaCount(const std::vector<Epoch>& epochs);
// The clock after which replica `replica` first ran: 0 for the job's first ranks, an
// epoch's clock for one a grow added (it starts as the average at that clock).
uint64_t replicaJoined(const std::vector<Epoch>& epochs, int replica);
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

// The chunk layout and changes: an old DIR/chunks, then the log's kChunks records;
// an empty log (chunkRows 0) when there are none. InputError on a malformed line or
// record (naming the file and line, or the segment and clock), a second layout
// that differs, or changes whose clocks do not increase.
ChunkLog readChunkLog(const std::string& dir);
// The kChunks records: the layout ("layout rows R shards n0 n1 ..."), and the
// change after `clock` ("clock K moves c:f>t ...").
std::string layoutRecord(int64_t chunkRows, std::span<const int64_t> shardRows);
std::string movesRecord(uint64_t clock, std::span<const ChunkMove> moves);
// Rewrites DIR/chunks with `log`, durably, as directories before segment format 4
// hold it (discardAfter cuts an old one at a resumed clock; tests build old ones).
void writeChunkLog(const std::string& dir, const ChunkLog& log);
// Cuts an old DIR/chunks (if any) to the changes up to `clock` (a resume at `clock`).
void cutChunkFile(const std::string& dir, uint64_t clock);
// "c:f>t ..." for `moves`, as DIR/chunks spells them.
std::string describeMoves(std::span<const ChunkMove> moves);
// The changes of `log` made at or before clock `clock`, oldest first.
std::vector<Rebalance> changesUpTo(const ChunkLog& log, uint64_t clock);

// The stream restore replays for one replica (engine/recovery/checkpoint.h): its
// log's entries in order, and the whole local batches its references name, read
// from the logs of the replicas that computed them. Not thread-safe.
class LogReplay {
 public:
  LogReplay(std::string dir, int replica) : dir_(std::move(dir)), replica_(replica), batches_(dir_) {}
  // The entries of local clocks in (after, upTo] (ckpt/log_reader.h, readLog: the
  // same errors for a damaged or missing segment, or a clock past the log).
  std::vector<LogEntry> entries(uint64_t after, uint64_t upTo) const;
  // The record of the batch `ref` names, valid until the next call; BatchUnavailable
  // when its log cannot give it (ckpt/log_reader.h, BatchStore).
  std::span<const std::byte> batch(const BatchRef& ref) { return batches_.batch(ref.replica, ref.clock); }

 private:
  std::string dir_;
  int replica_;
  BatchStore batches_;
};

// The record of replica `replica`'s newest kKnobs entry at or before `clock` (the
// knobs as engine/adapt encodes them), or none: the flags' knobs hold.
std::optional<std::vector<std::byte>> knobsRecordAt(const std::string& dir, int replica, uint64_t clock);

}  // namespace orpheus::ckpt
