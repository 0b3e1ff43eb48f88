#include "engine/metrics/metrics.h"

#include "engine/base/error.h"
#include "engine/outputs.h"
#include "ops/model.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

namespace orpheus::engine {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

JsonLine& JsonLine::add(const std::string& key, double value) {
  fields_.emplace_back(key, std::isfinite(value) ? fmt::format("{:.9g}", value) : "null");
  return *this;
}
JsonLine& JsonLine::add(const std::string& key, int64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}
JsonLine& JsonLine::add(const std::string& key, uint64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}
JsonLine& JsonLine::add(const std::string& key, bool value) {
  fields_.emplace_back(key, value ? "true" : "false");
  return *this;
}
JsonLine& JsonLine::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, quote(value));
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, const std::vector<int64_t>& values) {
  fields_.emplace_back(key, fmt::format("[{}]", fmt::join(values, ", ")));
  return *this;
}
JsonLine& JsonLine::add(const std::string& key, const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += std::isfinite(values[i]) ? fmt::format("{:.9g}", values[i]) : "null";
  }
  fields_.emplace_back(key, out + "]");
  return *this;
}

std::string JsonLine::str() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += quote(fields_[i].first) + ": " + fields_[i].second;
  }
  return out + "}";
}

// Opened (and an earlier file replaced) at the first line: a job refused before
// its first clock leaves the file as it was.
MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::open() {
  // Through a symlink, the file it names is what is set aside (the link stays).
  const std::string target = resolveOutput(path_);
  const std::string prev = target + ".prev";
  std::error_code ec;
  if (std::filesystem::exists(prev, ec)) {
    // A job that failed left it: it is the last good file, and what is at the path
    // now is that failed job's partial log.
    prev_ = prev;
    spdlog::info("--metrics: the earlier '{}' stays until this job ends well", prev);
  } else if (std::filesystem::is_regular_file(target, ec) && std::filesystem::file_size(target, ec) > 0 && !ec) {
    std::filesystem::rename(target, prev, ec);
    if (ec) throw IoError(fmt::format("cannot set the earlier metrics file '{}' aside as '{}': {}", path_, prev,
                                      ec.message()));
    prev_ = prev;
    spdlog::info("--metrics: the earlier '{}' is kept as '{}' until this job ends well", path_, prev);
  }
  file_ = std::fopen(path_.c_str(), "w");
  if (!file_) throw IoError(fmt::format("cannot open metrics file '{}': {}", path_, std::strerror(errno)));
}

void MetricsWriter::complete() {
  if (prev_.empty()) return;
  std::error_code ec;
  std::filesystem::remove(prev_, ec);
  if (ec) spdlog::warn("--metrics: cannot remove the earlier file '{}': {}", prev_, ec.message());
  prev_.clear();
}

void MetricsWriter::write(const JsonLine& line) {
  if (path_.empty()) return;
  if (!file_) open();
  const std::string s = line.str() + "\n";
  if (std::fwrite(s.data(), 1, s.size(), file_) != s.size() || std::fflush(file_) != 0) {
    throw IoError(fmt::format("cannot write metrics file '{}': {}", path_, std::strerror(errno)));
  }
}

comm::SharedBytes encodeRecord(const ClockRecord& record) {
  auto bytes = std::make_shared<std::vector<std::byte>>(sizeof(ClockRecord));
  std::memcpy(bytes->data(), record.data(), sizeof(ClockRecord));
  return bytes;
}

ClockRecord decodeRecord(std::span<const std::byte> bytes, int peer) {
  ORPHEUS_ENFORCE(bytes.size() == sizeof(ClockRecord), "metrics record of {} bytes from rank {}", bytes.size(), peer);
  ClockRecord record;
  std::memcpy(record.data(), bytes.data(), sizeof(ClockRecord));
  return record;
}

MetricsAggregator::MetricsAggregator(int ranks, MetricsWriter& out, ProgressLine& progress, bool hasAccuracy,
                                     uint64_t first, uint64_t clocks)
    : ranks_(ranks), out_(out), progress_(progress), hasAccuracy_(hasAccuracy), clocks_(clocks), next_(first) {}

void MetricsAggregator::add(const ClockRecord& r) {
  const auto clock = static_cast<uint64_t>(r[kClock]);
  ORPHEUS_ENFORCE(clock >= next_ && clock <= clocks_, "metrics record for clock {} arrived out of order", clock);
  Entry& e = entries_[clock];
  for (size_t f = 0; f < kClockFieldCount; ++f) e.sum[f] += r[f];
  e.maxGap = std::max(e.maxGap, r[kGap]);
  e.maxWait = std::max(e.maxWait, r[kWait]);
  if (r[kSeconds] > 0 && e.leaderSeconds == 0) e.leaderSeconds = r[kSeconds];
  ++e.count;
  writeReady();
}

void MetricsAggregator::addAfter(uint64_t clock, JsonLine line) {
  ORPHEUS_ENFORCE(clock >= next_, "a line after clock {}, which is written already", clock);
  after_[clock].push_back(std::move(line));
}

void MetricsAggregator::regroup(int ranks, const JsonLine& note) {
  ORPHEUS_ENFORCE(entries_.empty(), "ranks changed with clock {} under way", next_);
  ranks_ = ranks;
  reportRanks_ = true;
  out_.write(note);
}

void MetricsAggregator::writeReady() {
  for (auto it = entries_.find(next_); it != entries_.end() && it->second.count == ranks_; it = entries_.find(next_)) {
    write(next_, it->second);
    entries_.erase(it);
    ++next_;
  }
}

void MetricsAggregator::write(uint64_t clock, const Entry& e) {
  const double p = ranks_;
  JsonLine line;
  line.add("clock", clock)
      .add("seconds", e.leaderSeconds)
      .add("clock_seconds", e.sum[kClockSeconds] / p)
      .add("train_loss", e.sum[kLoss] / p)
      .add("bytes_sent", static_cast<uint64_t>(e.sum[kBytes]))
      .add("messages", static_cast<uint64_t>(e.sum[kMessages]))
      .add("compute_seconds", e.sum[kCompute] / p)
      .add("comm_seconds", e.sum[kComm] / p)
      .add("update_seconds", e.sum[kUpdate] / p)
      .add("wait_seconds", e.sum[kWait] / p)
      .add("max_wait_seconds", e.maxWait)
      .add("select_seconds", e.sum[kSelect] / p)
      // The exchange under way and the share of it hidden behind compute and
      // rebuild (--overlap on): 1 - exposed comm / exchange, over all ranks.
      .add("exchange_seconds", e.sum[kExchange] / p)
      .add("hidden_exchange_share",
           e.sum[kExchange] > 0 ? std::clamp(1.0 - e.sum[kComm] / e.sum[kExchange], 0.0, 1.0) : 0.0)
      // Seconds into the clock's compute (rank mean; -1: not measured): the top
      // layer left before the backward pass ended when the first is the smaller.
      .add("first_send_seconds", e.sum[kFirstSend] / p)
      .add("backward_end_seconds", e.sum[kBackwardEnd] / p)
      .add("clock_gap", static_cast<int64_t>(e.maxGap))
      .add("replica", static_cast<int64_t>(e.sum[kReplica]))
      .add("ckpt_wait_seconds", e.sum[kCkptWait] / p)
      .add("data_wait_seconds", e.sum[kDataWait] / p)
      .add("ckpt_writer_cpu_seconds", e.sum[kCkptCpu] / p)
      .add("failures", static_cast<int64_t>(e.sum[kFailed]))
      .add("lost_clocks", static_cast<int64_t>(e.sum[kLostClocks]));
  if (reportRanks_) line.add("ranks", ranks_);
  // Operations queued on the ranks' backends (kernel launches on a GPU), all ranks.
  if (e.sum[kLaunches] > 0) line.add("launches", static_cast<uint64_t>(e.sum[kLaunches]));
  // Host <-> device copies, all ranks (a device's jobs only).
  if (e.sum[kDeviceIn] > 0 || e.sum[kDeviceOut] > 0) {
    line.add("device_in_bytes", static_cast<uint64_t>(e.sum[kDeviceIn]))
        .add("device_out_bytes", static_cast<uint64_t>(e.sum[kDeviceOut]))
        // Those that made the host wait for the device (copy(), not the asynchronous ones), all ranks.
        .add("blocking_copies", static_cast<uint64_t>(e.sum[kBlockingCopies]))
        // The data queue: how long the device waited for the clock's minibatch (rank mean).
        .add("device_data_wait_seconds", e.sum[kDeviceDataWait] / p);
  }
  // How the SVs crossed between device and host (a device's jobs only): rank 0's
  // way, all ranks' bytes, and the share of the copies' time to the host that
  // overlapped the backward pass.
  if (e.sum[kTransfer] > 0) {
    line.add("transfer", transferName(static_cast<TransferKind>(static_cast<int>(e.sum[kTransfer]))))
        .add("d2h_bytes", static_cast<uint64_t>(e.sum[kToHost]))
        .add("h2d_bytes", static_cast<uint64_t>(e.sum[kToDevice]))
        .add("transfer_hidden_share",
             e.sum[kTransferSeconds] > 0 ? std::clamp(e.sum[kTransferHidden] / e.sum[kTransferSeconds], 0.0, 1.0)
                                         : 0.0);
  }
  if (e.sum[kRankError] >= 0) line.add("sv_rank_error", e.sum[kRankError] / p);
  if (e.sum[kParamDigest] >= 0) line.add("param_crc32c", static_cast<int64_t>(e.sum[kParamDigest]));
  if (e.sum[kAveraged] > 0) {
    line.add("averaged", true)
        .add("divergence_max", e.sum[kDivergenceMax])
        .add("divergence_mean", e.sum[kDivergenceMean]);
  }
  if (e.sum[kRotated] > 0) line.add("rotated", true);
  double accuracy = -1.0;
  if (e.sum[kHasEval] > 0 && e.sum[kEvalCount] > 0) {
    line.add("test_loss", e.sum[kEvalLoss] / e.sum[kEvalCount]);
    if (perplexity_) {
      const double perplexity = std::exp(e.sum[kEvalLoss] / e.sum[kEvalCount]);
      line.add("test_perplexity", perplexity);
      progress_.setPerplexity(perplexity);
    }
    if (hasAccuracy_) {
      accuracy = e.sum[kEvalCorrect] / e.sum[kEvalCount];
      line.add("test_accuracy", accuracy);
    }
  }
  out_.write(line);
  if (const auto notes = after_.find(clock); notes != after_.end()) {
    for (const JsonLine& note : notes->second) out_.write(note);
    after_.erase(notes);
  }
  if (accuracy >= 0) {
    lastAccuracy_ = accuracy;
    bestAccuracy_ = std::max(bestAccuracy_, accuracy);
  }
  progress_.update(clock, e.sum[kLoss] / p, lastAccuracy_, e.leaderSeconds, e.sum[kHasEval] > 0);
  totalBytes_ += static_cast<uint64_t>(e.sum[kBytes]);
  totalMessages_ += static_cast<uint64_t>(e.sum[kMessages]);
  totalLaunches_ += static_cast<uint64_t>(e.sum[kLaunches]);
  totalFailures_ += static_cast<int64_t>(e.sum[kFailed]);
  totalLost_ += static_cast<int64_t>(e.sum[kLostClocks]);
  maxGapSeen_ = std::max(maxGapSeen_, e.maxGap);
}

void MetricsCollector::report(const ClockRecord& record) {
  aggregator_.add(record);
  collect();
}

void MetricsCollector::collect() {
  while (auto m = transport_.control().tryReceive()) aggregator_.add(decodeRecord(m->bytes, m->peer));
}

void MetricsCollector::finish(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!aggregator_.done()) {
    collect();
    if (std::chrono::steady_clock::now() > deadline) {
      throw TimeoutError("rank 0 timed out collecting the last clocks' metrics");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void MetricsReporter::report(const ClockRecord& record) {
  transport_.control().send(0, encodeRecord(record));
}

const char* transferName(TransferKind kind) {
  switch (kind) {
    case TransferKind::kNone: return "none";
    case TransferKind::kSync: return "sync";
    case TransferKind::kStaged: return "staged";
    case TransferKind::kCudaAware: return "cuda-aware";
  }
  return "unknown";
}

ClockRecord clockRecord(uint64_t clock, const ClockStats& stats, const ClockAround& around) {
  ClockRecord r{};
  r[kClock] = static_cast<double>(clock);
  r[kSeconds] = around.leader ? around.trainSeconds : 0.0;
  r[kLoss] = stats.loss;
  r[kBytes] = static_cast<double>(stats.bytesSent + around.coordinationBytes);
  r[kMessages] = static_cast<double>(stats.messages);
  r[kCompute] = stats.computeSeconds;
  r[kComm] = stats.commSeconds;
  r[kUpdate] = stats.updateSeconds;
  r[kWait] = stats.waitSeconds;
  r[kSelect] = stats.selectSeconds;
  r[kExchange] = stats.exchangeSeconds;
  r[kFirstSend] = stats.firstSendAt;
  r[kBackwardEnd] = stats.backwardEndAt;
  r[kClockSeconds] = around.clockSeconds;
  r[kGap] = static_cast<double>(stats.clockGap);
  r[kCkptWait] = around.ckptWaitSeconds;
  r[kCkptCpu] = around.ckptCpuSeconds;
  r[kFailed] = around.failed ? 1.0 : 0.0;
  r[kLostClocks] = static_cast<double>(around.lostClocks);
  r[kDeviceIn] = static_cast<double>(around.deviceInBytes);
  r[kDeviceOut] = static_cast<double>(around.deviceOutBytes);
  r[kLaunches] = static_cast<double>(around.launches);
  r[kBlockingCopies] = static_cast<double>(around.blockingCopies);
  r[kDataWait] = around.dataWaitSeconds;
  r[kToHost] = static_cast<double>(around.toHostBytes);
  r[kToDevice] = static_cast<double>(around.toDeviceBytes);
  r[kTransferSeconds] = around.transferSeconds;
  r[kTransferHidden] = around.transferHiddenSeconds;
  r[kDeviceDataWait] = around.deviceDataWaitSeconds;
  r[kRankError] = stats.rankError;
  if (around.leader) {
    r[kReplica] = around.replica;
    r[kAveraged] = around.averaged ? 1.0 : 0.0;
    r[kRotated] = around.rotated ? 1.0 : 0.0;
    r[kDivergenceMax] = around.divergenceMax;
    r[kDivergenceMean] = around.divergenceMean;
    r[kParamDigest] = around.paramDigest;
    r[kTransfer] = static_cast<double>(static_cast<int>(around.transfer));
  }
  return r;
}

void addJobSettings(JsonLine& line, const MetricsOptions& options, const ops::Model& model, int ranks, int fanout) {
  line.add("ranks", ranks)
      .add("sync", options.sync)
      .add("model", model.spec())
      .add("batch_per_rank", options.batch)
      .add("select", options.select)
      .add("multicast", options.multicast)
      .add("fanout", fanout)
      .add("consistency", options.consistency)
      .add("staleness", options.staleness)
      .add("drop_links", options.dropLinks);
}

std::string targetOutcome(double target, bool reached, uint64_t lastClock) {
  if (target <= 0.0) return {};
  return reached ? fmt::format(", --target-accuracy {} reached at clock {}", target, lastClock)
                 : fmt::format(", --target-accuracy {} not reached in {} clocks", target, lastClock);
}

JsonLine summaryLine(const MetricsOptions& options, const ops::Model& model, const RunSummary& run) {
  const RunTotals& totals = run.totals;
  const auto clocksRun = static_cast<double>(std::max<uint64_t>(1, run.lastClock + 1 - totals.firstClock));
  JsonLine summary;
  summary.add("summary", true)
      .add("clocks", run.lastClock)
      .add("clocks_planned", options.clocks)
      .add("reached_target", run.reachedTarget);
  addJobSettings(summary, options, model, run.ranks, run.fanout);
  summary.add("device", run.device);
  summary.add("seconds", run.trainSeconds)
      .add("bytes_sent", totals.bytesSent)
      .add("messages", totals.messages)
      .add("bytes_per_clock", static_cast<double>(totals.bytesSent) / clocksRun)
      .add("launches_per_clock", static_cast<double>(totals.launches) / clocksRun)
      .add("max_clock_gap", static_cast<int64_t>(totals.maxGap))
      .add("average_every", options.averageEvery)
      .add("rotate_every", options.rotateEvery)
      .add("failures", totals.failures)
      .add("lost_clocks", totals.lostClocks)
      .add("replica", static_cast<int64_t>(run.replica));
  if (run.quasiNewtonSkips >= 0) summary.add("quasi_newton_skips", run.quasiNewtonSkips);
  if (options.adapt) {
    summary.add("adapt", true)
        .add("final_select", run.knobs.select)
        .add("final_fanout", run.knobs.fanout)
        .add("final_staleness", run.knobs.staleness)
        .add("final_average_every", run.knobs.averageEvery)
        .add("final_sv_dtype", run.knobs.bf16 ? "bf16" : "f32")
        .add("final_rank", run.knobs.rank);
  }
  if (run.evaluated) {
    summary.add("initial_test_loss", run.initialTestLoss);
    summary.add("test_loss", run.testLoss);
    if (model.reportsPerplexity()) summary.add("test_perplexity", std::exp(run.testLoss));
    if (model.hasAccuracy()) {
      summary.add("test_accuracy", run.testAccuracy);
      summary.add("best_test_accuracy", std::max(totals.bestAccuracy, run.testAccuracy));
    }
  }
  return summary;
}

}  // namespace orpheus::engine
