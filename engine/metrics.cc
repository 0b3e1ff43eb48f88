#include "engine/metrics.h"

#include "engine/base/error.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
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

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) throw IoError(fmt::format("cannot open metrics file '{}': {}", path, std::strerror(errno)));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const JsonLine& line) {
  if (!file_) return;
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
      .add("ckpt_writer_cpu_seconds", e.sum[kCkptCpu] / p)
      .add("failures", static_cast<int64_t>(e.sum[kFailed]))
      .add("lost_clocks", static_cast<int64_t>(e.sum[kLostClocks]));
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

}  // namespace orpheus::engine
