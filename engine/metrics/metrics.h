// Metrics as JSON lines: one object per clock, a summary last. Written by rank 0.
//
// Every rank reports each clock as a ClockRecord; rank 0's MetricsAggregator adds
// up the records of all ranks and writes a clock's line once every rank's record
// of it is in. Records travel on the control channel, never as a collective, so
// metrics never make a worker wait for another.
#pragma once

#include "comm/transport.h"
#include "engine/adapt/knobs.h"
#include "engine/metrics/progress.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::ops {
class Model;
}  // namespace orpheus::ops

namespace orpheus::engine {

// What one clock measured on this rank.
struct ClockStats {
  double loss = 0.0;
  double computeSeconds = 0.0;  // forward/backward, SV identification and selection
  double commSeconds = 0.0;     // encode, send, receive, decode (or gradient allreduce)
  double updateSeconds = 0.0;   // rebuild / apply
  double waitSeconds = 0.0;     // blocked on peers (BSP barrier or SSP staleness bound)
  double selectSeconds = 0.0;   // selection and --sv-rank's compression
  double rankError = -1.0;      // --sv-rank: relative error of the sent update (LowRankSender); -1: off
  // The exchange under way (--overlap on; else equal to commSeconds): from the
  // first layer sent (or all-reduce begun) to the last one in. commSeconds is the
  // part of it the worker waited for (exposed), the rest hid behind compute and rebuild.
  double exchangeSeconds = 0.0;
  // Seconds into the clock's compute when the first layer went out and when the
  // backward pass ended (-1: not measured, --overlap off).
  double firstSendAt = -1.0;
  double backwardEndAt = -1.0;
  int64_t clockGap = 0;         // this clock minus the newest clock whose batches have all arrived, minus 1
  uint64_t bytesSent = 0;
  uint64_t messages = 0;
};


// One JSON object built field by field; non-finite numbers become null.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, double value);
  JsonLine& add(const std::string& key, int64_t value);
  JsonLine& add(const std::string& key, uint64_t value);
  JsonLine& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonLine& add(const std::string& key, bool value);
  JsonLine& add(const std::string& key, const std::string& value);
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  // JSON arrays.
  JsonLine& add(const std::string& key, const std::vector<int64_t>& values);
  JsonLine& add(const std::string& key, const std::vector<double>& values);
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// Appends lines to a file, flushed per line so a killed job keeps what it measured.
// An empty path makes a sink that discards everything.
//
// The file is a live log, written in place. A regular file there from before is
// renamed to FILE.prev at the first line (and said so on the console), and removed
// only by complete(): a job that fails, or is killed, loses no earlier metrics. A
// FILE.prev already there (a failed job left it) is kept as it is, and that failed
// job's partial FILE is replaced.
class MetricsWriter {
 public:
  // Nothing is written, nor the file opened, before the first line.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const JsonLine& line);
  // The job ended well: the earlier file set aside at the first line goes.
  void complete();
  const std::string& path() const { return path_; }

 private:
  void open();

  std::string path_;
  std::string prev_;  // the earlier file, set aside; empty: none
  std::FILE* file_ = nullptr;
};

// The fields of one rank's report of one clock. Summed over ranks by rank 0
// (averaged where the line says so); the fields after kReplica are set by rank 0
// only, so their sum is rank 0's value.
enum ClockField : size_t {
  kClock, kSeconds, kLoss, kBytes, kMessages, kCompute, kComm, kUpdate, kWait, kSelect, kClockSeconds, kGap,
  kHasEval, kEvalLoss, kEvalCorrect, kEvalCount, kDeviceIn, kDeviceOut, kDataWait,
  kToHost, kToDevice, kTransferSeconds, kTransferHidden, kDeviceDataWait, kLaunches, kBlockingCopies,
  kReplica, kAveraged, kRotated, kDivergenceMax, kDivergenceMean,
  kCkptWait, kFailed, kLostClocks, kCkptCpu, kExchange, kFirstSend, kBackwardEnd, kRankError, kParamDigest,
  kTransfer, kClockFieldCount
};
// On the wire: the kClockFieldCount doubles as they are in memory (every rank runs
// the same binary).
using ClockRecord = std::array<double, kClockFieldCount>;

comm::SharedBytes encodeRecord(const ClockRecord& record);
// Error (an internal invariant) when `bytes` is not one record; `peer` names the sender.
ClockRecord decodeRecord(std::span<const std::byte> bytes, int peer);

// How a clock's SVs crossed between the job's device and host memory (the metrics'
// "transfer"; engine/worker/sv_transfer.h): not at all (the device is the host),
// with blocking copies, staged on the device's copy queue, or handed to a
// CUDA-aware transport as device memory (not done yet: such a job stages too).
enum class TransferKind { kNone, kSync, kStaged, kCudaAware };
const char* transferName(TransferKind kind);

// What the loop measured around a clock, for its record (clockRecord).
struct ClockAround {
  double trainSeconds = 0.0;       // the run's training seconds through this clock (rank 0's count)
  double clockSeconds = 0.0;
  uint64_t coordinationBytes = 0;  // averaging, rotation
  double ckptWaitSeconds = 0.0;    // waited for the checkpoint writer
  double ckptCpuSeconds = 0.0;     // the writer's CPU time
  bool failed = false;             // an injected failure hit this rank
  uint64_t lostClocks = 0;
  // Bytes copied between host memory and the job's device during the clock
  // (ops::Backend::transfers; 0 on the CPU).
  uint64_t deviceInBytes = 0;
  uint64_t deviceOutBytes = 0;
  // Operations queued on the job's backend during the clock (ops::Backend::launches:
  // on a GPU, kernel launches and library calls).
  uint64_t launches = 0;
  // Copies between host and device during the clock that made the host wait for
  // the device (ops::Backend::Transfers::blocking).
  uint64_t blockingCopies = 0;
  // Waited for the clock's minibatch (the prefetch queue had none ready); with
  // the data queue, for the next clock's too, and staged it for the device.
  double dataWaitSeconds = 0.0;
  // The SVs' share of those copies: the clock's batch to the host (U, V) and the
  // rebuilds' operands to the device, with the copies' time to the host and the
  // part of it hidden behind the backward pass.
  TransferKind transfer = TransferKind::kNone;
  uint64_t toHostBytes = 0;
  uint64_t toDeviceBytes = 0;
  double transferSeconds = 0.0;
  double transferHiddenSeconds = 0.0;
  // The data queue: the device's compute waited this long for the clock's
  // minibatch to land (ops::Model::takeDeviceDataWait).
  double deviceDataWaitSeconds = 0.0;
  // Set by rank 0 only (the fields after kReplica).
  bool leader = false;
  int replica = 0;
  bool averaged = false;
  bool rotated = false;
  double divergenceMax = 0.0;
  double divergenceMean = 0.0;
  double paramDigest = -1.0;  // --param-digests: the replica's paramDigest at the clock's end; -1: off
};

// This rank's record of clock `clock` (without its evaluation fields).
ClockRecord clockRecord(uint64_t clock, const ClockStats& stats, const ClockAround& around);

// What a run adds up to over its membership epochs (engine/membership/live.h): each epoch's
// worker continues from the totals of the epochs before it, so the clock records
// and the summary cover the whole run. Rank 0's are the job's; elsewhere only the
// seconds count.
struct RunTotals {
  double trainSeconds = 0.0;
  uint64_t bytesSent = 0;
  uint64_t messages = 0;
  uint64_t launches = 0;  // operations queued on the ranks' backends (ClockAround::launches)
  int64_t failures = 0;
  int64_t lostClocks = 0;
  double maxGap = 0.0;
  double bestAccuracy = -1.0;
  uint64_t firstClock = 0;  // the run's first clock; 0: this epoch's
};

// What a summary line says of the job's settings (engine/worker/part_options.h
// makes it from the flags), the enums by the names the flags take.
struct MetricsOptions {
  std::string sync = "sv";
  int64_t batch = 100;  // per rank
  int64_t select = 0;
  std::string multicast = "all";
  std::string consistency = "bsp";
  int64_t staleness = 0;
  double dropLinks = 0.0;
  int64_t clocks = 1000;  // planned
  int64_t averageEvery = 0;
  int64_t rotateEvery = 0;
  bool adapt = false;
};

// The summary line of a run (train's), from what its worker knows at the end.
struct RunSummary {
  uint64_t lastClock = 0;
  bool reachedTarget = false;
  double trainSeconds = 0.0;
  RunTotals totals;
  int ranks = 1;
  int fanout = 0;
  std::string device;
  int replica = 0;
  adapt::Knobs knobs;  // in force at the end (--adapt)
  bool evaluated = false;
  double initialTestLoss = 0.0;
  double testLoss = 0.0;
  double testAccuracy = 0.0;
  int64_t quasiNewtonSkips = -1;  // bfgs, dfp: W's updates skipped (curvature); -1 otherwise
};
JsonLine summaryLine(const MetricsOptions& options, const ops::Model& model, const RunSummary& run);

// The console's word on --target-accuracy (empty without one): ", --target-accuracy
// 0.85 reached at clock 412", or "... not reached in 1000 clocks".
std::string targetOutcome(double target, bool reached, uint64_t lastClock);

// The job's settings in a summary line (train's and simulate's): ranks, sync, model,
// batch, selection, multicast, fanout, consistency, staleness, broken links.
void addJobSettings(JsonLine& line, const MetricsOptions& options, const ops::Model& model, int ranks, int fanout);

// Rank 0's sum of every rank's records: writes the line of a clock once all
// `ranks` records of it have arrived, in clock order, whatever order the records
// come in, and draws the progress line. Records of clocks already written or past
// the last clock are an internal error.
class MetricsAggregator {
 public:
  // Lines for clocks first..clocks; `hasAccuracy`: the model reports test accuracy.
  MetricsAggregator(int ranks, MetricsWriter& out, ProgressLine& progress, bool hasAccuracy, uint64_t first,
                    uint64_t clocks);

  void add(const ClockRecord& record);
  // Language models: every line with a test loss also gives test_perplexity =
  // exp(test loss per token), and the progress line shows it.
  void reportPerplexity() { perplexity_ = true; }
  // `line` is written right after clock `clock`'s line (a decision taken at its
  // end); `clock` must not be written yet.
  void addAfter(uint64_t clock, JsonLine line);
  // A membership change (the simulator's): every line from the next clock on is
  // over `ranks` ranks; `note` is written now. Lines say their ranks from then on.
  void regroup(int ranks, const JsonLine& note);
  // Every line says its ranks ("ranks": P).
  void reportRanks() { reportRanks_ = true; }
  // Every clock's line is written.
  bool done() const { return next_ > clocks_; }
  // The job stops early at `clock`: no records come after it.
  void endAt(uint64_t clock) { clocks_ = clock; }

  // Totals over the lines written so far.
  uint64_t totalBytes() const { return totalBytes_; }
  uint64_t totalMessages() const { return totalMessages_; }
  uint64_t totalLaunches() const { return totalLaunches_; }
  int64_t totalFailures() const { return totalFailures_; }
  int64_t totalLostClocks() const { return totalLost_; }
  double maxGap() const { return maxGapSeen_; }
  // -1 before any line with a test accuracy.
  double bestAccuracy() const { return bestAccuracy_; }

 private:
  struct Entry {
    int count = 0;
    ClockRecord sum{};
    double maxGap = 0;
    double maxWait = 0;
    double leaderSeconds = 0;
  };
  void writeReady();
  void write(uint64_t clock, const Entry& e);

  int ranks_;
  MetricsWriter& out_;
  ProgressLine& progress_;
  bool hasAccuracy_;
  bool perplexity_ = false;
  bool reportRanks_ = false;
  uint64_t clocks_;
  uint64_t next_;
  std::map<uint64_t, Entry> entries_;
  std::map<uint64_t, std::vector<JsonLine>> after_;
  uint64_t totalBytes_ = 0;
  uint64_t totalMessages_ = 0;
  uint64_t totalLaunches_ = 0;
  int64_t totalFailures_ = 0;
  int64_t totalLost_ = 0;
  double maxGapSeen_ = 0;
  double lastAccuracy_ = -1.0;
  double bestAccuracy_ = -1.0;
};

// Where a rank's clock records go. Not thread-safe: the compute thread calls it.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // This rank's record of a clock.
  virtual void report(const ClockRecord& record) = 0;
  // Takes in the other ranks' records that have arrived, without blocking. The
  // worker calls it whenever it waits on peers, so rank 0's collecting never
  // holds the others up.
  virtual void collect() = 0;
  // The job stops early at `clock` (every rank calls it at the same clock).
  virtual void endAt(uint64_t clock) = 0;
  // After the last report: blocks until every record is delivered (rank 0: until
  // every line is written; TimeoutError after `timeout`).
  virtual void finish(std::chrono::milliseconds timeout) = 0;
};

// Discards everything: clocks driven without a metrics file (tests, a failed job's drain).
class NullMetricsSink final : public MetricsSink {
 public:
  void report(const ClockRecord&) override {}
  void collect() override {}
  void endAt(uint64_t) override {}
  void finish(std::chrono::milliseconds) override {}
};

// Rank 0: its own records and those that arrive on the control channel go to the aggregator.
class MetricsCollector final : public MetricsSink {
 public:
  MetricsCollector(comm::Transport& transport, MetricsAggregator& aggregator)
      : transport_(transport), aggregator_(aggregator) {}
  void report(const ClockRecord& record) override;
  void collect() override;
  void endAt(uint64_t clock) override { aggregator_.endAt(clock); }
  void finish(std::chrono::milliseconds timeout) override;

 private:
  comm::Transport& transport_;
  MetricsAggregator& aggregator_;
};

// Every other rank: records go to rank 0.
class MetricsReporter final : public MetricsSink {
 public:
  explicit MetricsReporter(comm::Transport& transport) : transport_(transport) {}
  void report(const ClockRecord& record) override;
  void collect() override {}
  void endAt(uint64_t) override {}
  // Completes this rank's sends.
  void finish(std::chrono::milliseconds) override { transport_.control().flush(); }

 private:
  comm::Transport& transport_;
};

}  // namespace orpheus::engine
