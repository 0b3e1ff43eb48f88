// Load balancing by data chunks (`--balance`, after Chicle): every --balance-every
// clocks the coordinator moves chunks of training rows (engine/data/chunks.h) from
// slow workers to fast ones, and under BSP each worker's minibatch follows the rows
// it owns, so the global batch stays P·B while a slow worker trains fewer examples.
//
// Measuring. Each rank keeps its busy seconds per example of every clock since the
// last decision: compute (forward/backward, SV identification, selection) plus the
// --inject-delay sleep, over the examples of its minibatch; waiting for peers is not
// busy time. A decision takes each rank's median.
//
// Deciding (rank 0, decideMoves). With t_r a rank's seconds per example and b_r its
// share of the global batch, the clock's busy time is t_r·b_r. The slowest rank gives
// one chunk to the fastest as long as that lowers the larger of the two times, i.e.
// until the times differ by less than one chunk's worth; a rank keeps at least one
// chunk. A chunk that returns home is preferred (it needs no transfer).
//
// Agreeing. A decision costs one control-plane agreement of the measured times and
// one of the new owners (and, when chunks move under --ckpt sv, one that the log is
// written), every --balance-every clocks and never in between; every
// rank switches at the same clock boundary (after the decision clock). Moved rows
// travel from the chunk's origin in one allgatherv, only at decisions that move rows
// away from home (counted as traffic). The rows of a chunk that left are kept by its
// origin, so no file is read again.
//
// Sampling. Until the first move a rank samples its shard exactly as without
// --balance. After a change at clock K its sampler is a fresh stream keyed by K
// (data::MinibatchSampler's `stream`), over its owned rows in chunk order.
//
// The chunk log. With --ckpt sv the layout and every change are records of every
// rank's SV log (kChunks, ckpt/replay.h; recordTo), durable with its segment:
//   layout rows R shards n_0 n_1 ... n_{P-1}        (at the first clock: the chunk layout)
//   clock K moves c:f>t c:f>t ...                   (each change, clocks increasing)
// --resume replays them to the ownership (and sampler) of its resume clock, the
// records after it set aside with their segments; `orpheus restore` reads the same
// ownership at any clock. Directories written before keep them in DIR/chunks.
#pragma once

#include "ckpt/clock_log.h"
#include "ckpt/replay.h"
#include "comm/transport.h"
#include "engine/data/chunks.h"
#include "engine/data/dataset.h"
#include "engine/data/sampler.h"
#include "engine/metrics/metrics.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace orpheus::engine {

// What the data feed reads of the job (engine/worker/part_options.h makes it from
// the flags): the sampler's, --balance's and --inject-delay's settings.
struct BalanceOptions {
  int64_t batch = 100;  // B: examples per rank per clock
  uint64_t seed = 1;
  int64_t clocks = 1000;  // the job's last clock: no decision after it
  double timeoutSeconds = 300.0;
  bool balance = false;
  int64_t balanceEvery = 20;
  int64_t chunkRows = 256;
  std::string chunkLogDir;  // --ckpt sv: the checkpoint directory whose log takes the chunk records; empty: none
  int delayRank = -1;       // --inject-delay RANK:MS
  int delayMs = 0;
};

// Milliseconds --inject-delay has `rank` sleep for a minibatch of `examples`: the
// flag's MS per clock, which with --balance is per B examples (a slow machine is
// slow per example), so a smaller minibatch sleeps less.
int64_t injectedDelayMs(const BalanceOptions& options, int rank, int64_t examples);

// The chunk log is read by the checkpoint's replay (ckpt/replay.h).
using ckpt::ChunkLog;
using ckpt::readChunkLog;
using ckpt::Rebalance;
using ckpt::writeChunkLog;

// The ownership after clock `clock`: the layout's, with every change up to it applied.
data::ChunkOwnership ownershipAt(const data::ChunkLayout& layout, const std::vector<Rebalance>& changes,
                                 uint64_t clock);
// "rank r: k chunks, n rows; ..." for the ownership the chunk log gives at `clock`;
// nullopt when the directory has no chunk log.
std::optional<std::string> describeChunksAt(const std::string& dir, uint64_t clock);

// Rank 0's decision (see the top of this file): the moves, each from the slowest
// rank to the fastest, given each rank's seconds per example. No moves when a time
// is not positive and finite.
std::vector<data::ChunkMove> decideMoves(const data::ChunkLayout& layout, const data::ChunkOwnership& owners,
                                         std::span<const double> secondsPerExample, int64_t globalBatch);

// A rank's minibatches: its shard sampled as always, or with --balance the rows
// of the chunks it owns, in its share of the global batch. Not thread-safe; every
// collective call is made by every rank at the same clock.
class DataFeed {
 public:
  // The references must outlive the feed.
  DataFeed(const BalanceOptions& options, comm::Transport& transport, const data::Dataset& shard);
  ~DataFeed();
  DataFeed(const DataFeed&) = delete;
  DataFeed& operator=(const DataFeed&) = delete;

  // Feeds clocks from `first` on (collective with --balance): a resumed job takes
  // up the ownership its chunk log holds at first - 1, fetching moved rows, and the
  // sampler where the uninterrupted job had it.
  void start(uint64_t first);
  data::Batch next();
  // Where the rebalance records go (rank 0; null elsewhere).
  void reportTo(MetricsAggregator* aggregator) { aggregator_ = aggregator; }
  // The checkpoint log the chunk layout and every change of ownership are recorded
  // in (ckpt/replay.h reads them back), on every rank; null: none.
  void recordTo(ckpt::ClockLog* log) { clockLog_ = log; }

  // After clock `clock` (every rank, every clock): its busy seconds; at a decision
  // clock the rebalance (collective). True when this rank's examples changed.
  bool afterClock(uint64_t clock, double busySeconds);
  bool decidesAfter(uint64_t clock) const;

  // This rank's minibatch size now.
  int64_t batch() const { return batch_; }
  const BalanceOptions& options() const { return options_; }
  const data::ChunkOwnership* ownership() const { return owners_.get(); }

 private:
  void agreeLayout();
  void fetchAndInstall(uint64_t clock, std::span<const int64_t> incoming);
  void restartSampler(uint64_t streamClock, uint64_t skip);
  void record(uint64_t clock, const std::vector<data::ChunkMove>& moves, std::span<const double> secondsPerExample,
              bool resumed);
  bool logs() const;

  BalanceOptions options_;
  comm::Transport& transport_;
  const data::Dataset& shard_;
  MetricsAggregator* aggregator_ = nullptr;
  ckpt::ClockLog* clockLog_ = nullptr;
  int64_t batch_;
  // --balance only.
  data::ChunkLayout layout_;
  std::unique_ptr<data::ChunkOwnership> owners_;
  ChunkLog log_;                                  // the chunk log as this job has it
  std::map<int64_t, data::Dataset> foreign_;      // owned chunks read by other ranks
  data::Dataset owned_;                           // the owned rows, once any chunk moved
  std::vector<double> window_;                    // seconds per example since the last decision
  std::unique_ptr<data::PrefetchQueue> queue_;
};

}  // namespace orpheus::engine
