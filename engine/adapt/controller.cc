#include "engine/adapt/controller.h"

#include "ckpt/log_entry.h"
#include "ckpt/replay.h"
#include "engine/base/error.h"
#include "engine/failures.h"
#include "engine/metrics/metrics.h"
#include "engine/worker/select.h"

#include <algorithm>
#include <chrono>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace orpheus::engine::adapt {

static_assert(kKnobsRecordBytes == ckpt::kKnobsRecordBytes && kKnobsRecordBytesWide == ckpt::kKnobsRecordBytesWide &&
                  kKnobsRecordBytesRank == ckpt::kKnobsRecordBytesRank,
              "the SV log keeps knobs as engine/adapt encodes them");

namespace {

// The number after "key": in one JSON line (spaces around the colon allowed), if
// the key is there; InputError naming the line where its value is not a number.
std::optional<double> numberField(const std::string& line, const std::string& key, const std::string& source,
                                  int64_t number) {
  const std::string quoted = "\"" + key + "\"";
  size_t pos = std::string::npos;
  for (size_t at = line.find(quoted); at != std::string::npos; at = line.find(quoted, at + 1)) {
    pos = line.find_first_not_of(" \t", at + quoted.size());
    if (pos != std::string::npos && line[pos] == ':') break;  // else the word inside a string, not a key
    pos = std::string::npos;
  }
  if (pos == std::string::npos) return std::nullopt;
  pos = line.find_first_not_of(" \t", pos + 1);
  // A number as JSON writes it (no hex, no leading '+'), ended by what may follow one.
  const char* begin = line.c_str() + (pos == std::string::npos ? line.size() : pos);
  const char* last = line.c_str() + line.size();
  double v = 0.0;
  const auto [end, ec] = std::from_chars(begin, last, v, std::chars_format::general);
  const bool ended = end != begin && (end == last || std::string_view(" \t\r,}").find(*end) != std::string_view::npos);
  ORPHEUS_CHECK_INPUT(ec == std::errc() && ended, "--adapt-trace '{}' line {}: {} is not a number", source,
                      number, key);
  return v;
}

Range rangeOf(const std::pair<int64_t, int64_t>& given, Range fallback) {
  if (given.first < 0) return fallback;
  return {given.first, given.second};
}

}  // namespace

Trace Trace::parse(const std::string& text, const std::string& source) {
  Trace trace;
  std::istringstream in(text);
  std::string line;
  int64_t number = 0;
  std::map<uint64_t, int64_t> lineOf;  // clock -> the line that gave it
  while (std::getline(in, line)) {
    ++number;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const size_t last = line.find_last_not_of(" \t\r");
    // A metrics file holds one JSON object a line; anything else (a line cut off
    // by a killed job, text pasted in) would drop a clock without a word.
    ORPHEUS_CHECK_INPUT(line[first] == '{' && line[last] == '}',
                        "--adapt-trace '{}' line {} is not one JSON object{}: a trace is a metrics file (--metrics)",
                        source, number, line[first] == '{' ? " (cut off?)" : "");
    if (line.find("\"summary\"") != std::string::npos || line.find("\"decision\"") != std::string::npos) continue;
    const auto clock = numberField(line, "clock", source, number);
    const auto compute = numberField(line, "compute_seconds", source, number);
    if (!clock || !compute) continue;
    ORPHEUS_CHECK_INPUT(*clock >= 0.0 && *clock < 9.0e18 && std::floor(*clock) == *clock,
                        "--adapt-trace '{}' line {}: clock {} is not a whole number >= 0", source, number, *clock);
    // A time is a number of seconds >= 0 (absent: 0).
    const auto seconds = [&](const char* key) {
      const double v = numberField(line, key, source, number).value_or(0.0);
      ORPHEUS_CHECK_INPUT(std::isfinite(v) && v >= 0.0 && v < 1e9, "--adapt-trace '{}' line {}: {} {} is not a time "
                          "in seconds", source, number, key, v);
      return v;
    };
    // One job's metrics hold each clock once: a second one is another job's file
    // pasted on, and which of the two should count is not for the engine to guess.
    const auto [seen, fresh] = lineOf.emplace(static_cast<uint64_t>(*clock), number);
    ORPHEUS_CHECK_INPUT(fresh, "--adapt-trace '{}' line {}: clock {} is there already, on line {} (one job's metrics "
                        "hold each clock once)", source, number, seen->first, seen->second);
    Timing t;
    t.computeSeconds = seconds("compute_seconds");
    t.commSeconds = seconds("comm_seconds");
    t.waitSeconds = seconds("wait_seconds");
    t.clockSeconds = seconds("clock_seconds");
    t.selectSeconds = seconds("select_seconds");
    trace.byClock_[static_cast<uint64_t>(*clock)] = t;
  }
  ORPHEUS_CHECK_INPUT(!trace.byClock_.empty(), "--adapt-trace '{}' holds no per-clock metrics line", source);
  return trace;
}

Trace Trace::read(const std::string& path) {
  checkSmallInput("--adapt-trace", path, kMaxTraceBytes);
  std::ifstream in(path);
  ORPHEUS_CHECK_INPUT(in.good(), "--adapt-trace: cannot read '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

const Trace::Timing& Trace::at(uint64_t clock) const {
  auto it = byClock_.upper_bound(clock);
  if (it == byClock_.begin()) return it->second;
  return std::prev(it)->second;
}

Knobs startKnobs(const ControllerOptions& o, int startFanout) {
  Knobs k;
  k.select = o.select;
  k.fanout = startFanout;
  k.staleness = o.staleness;
  k.averageEvery = o.averageEvery;
  k.bf16 = o.startBf16;
  k.rank = o.rank;
  if (o.rank > 0) k.select = 0;
  return k;
}

Bounds boundsFor(const ControllerOptions& o, int ranks, int startFanout) {
  Bounds b;
  // Under --sv-rank the rank is the knob and C stays "all"; r up to 4 times the
  // flag's, below the B - 1 that would send as many SVGs as the batch holds.
  b.select = o.rank > 0 ? Range{o.batch, o.batch} : rangeOf(o.selectRange, {1, o.batch});
  b.rank = o.rank > 0 ? rangeOf(o.rankRange, {1, std::max(o.rank, std::min(4 * o.rank, o.batch - 2))}) : Range{0, 0};
  const bool multicast = o.multicast != comm::MulticastKind::kAll && ranks > 1;
  b.fanout = multicast ? rangeOf(o.fanoutRange, {1, ranks - 1}) : Range{startFanout, startFanout};
  b.staleness = o.consistency == Consistency::kSsp
                    ? rangeOf(o.stalenessRange, {0, std::max<int64_t>(8, 2 * o.staleness)})
                    : Range{o.staleness, o.staleness};
  b.averageEvery = o.averageEvery > 0 ? rangeOf(o.averageEveryRange, {std::max<int64_t>(1, o.averageEvery / 4),
                                                                      4 * o.averageEvery})
                                      : Range{0, 0};
  b.maxBytesPerClock = o.maxBytesPerClock;
  b.bf16 = o.bf16;
  b.commShare = o.commShare;
  return b;
}

Decision Controller::start(const ControllerOptions& options, int ranks,
                           const std::vector<std::pair<int64_t, int64_t>>& shapes, int startFanout) {
  const Bounds bounds = boundsFor(options, ranks, startFanout);
  return initialKnobs(startKnobs(options, startFanout), bounds, byteModelFor(shapes, options.batch),
                      options.consistency == Consistency::kSsp);
}

void Controller::checkBudget(const ControllerOptions& options, int ranks,
                             const std::vector<std::pair<int64_t, int64_t>>& shapes, int startFanout) {
  if (!options.enabled || options.maxBytesPerClock <= 0.0) return;
  const Bounds bounds = boundsFor(options, ranks, startFanout);
  const Decision d = start(options, ranks, shapes, startFanout);
  ORPHEUS_CHECK_INPUT(d.predictedBytes <= bounds.maxBytesPerClock,
                      "--max-bytes-per-clock {}: even with every knob at its bound ({}) a rank sends about {:.0f} "
                      "bytes per clock; raise the budget or widen the --adapt-* bounds",
                      bounds.maxBytesPerClock, toString(d.knobs), d.predictedBytes);
}

Controller::Controller(const ControllerOptions& options, comm::Transport& transport,
                       const std::vector<std::pair<int64_t, int64_t>>& shapes, int startFanout)
    : options_(options),
      transport_(transport),
      bounds_(boundsFor(options, transport.size(), startFanout)),
      bytes_(byteModelFor(shapes, options.batch)) {
  const Knobs start = startKnobs(options, startFanout);
  if (!options.enabled) {
    initial_ = {start, "off", "", bytes_.perClock(start)};
    return;
  }
  initial_ = initialKnobs(start, bounds_, bytes_, options.consistency == Consistency::kSsp);
  checkBudget(options, transport.size(), shapes, startFanout);
  if (!options.trace.empty()) trace_ = Trace::read(options.trace);
}

bool Controller::decidesAfter(uint64_t clock) const {
  return options_.enabled && transport_.size() > 1 && options_.every > 0 &&
         clock % static_cast<uint64_t>(options_.every) == 0 && clock < static_cast<uint64_t>(options_.clocks);
}

bool Controller::measuresAt(uint64_t clock) const {
  return decidesAfter(clock) && (options_.jmcss || options_.rank > 0);
}

std::array<int64_t, 3> Controller::errorCountsFor(const Knobs& current) const {
  return errorCounts(current, bounds_, options_.batch);
}

void Controller::measured(const std::vector<double>& errors, double seconds, ClockSample& sample) const {
  std::copy_n(errors.begin(), std::min(errors.size(), sample.errors.size()), sample.errors.begin());
  sample.measureSeconds = seconds;
}

void Controller::measure(uint64_t clock, const SvBatch& local, const Knobs& current, ClockSample& sample) const {
  const auto start = std::chrono::steady_clock::now();
  const std::array<int64_t, 3> counts = errorCounts(current, bounds_, options_.batch);
  const std::vector<double> errors = selectionErrors(local, counts, options_.seed, clock, transport_.rank());
  std::copy(errors.begin(), errors.end(), sample.errors.begin());
  sample.measureSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Controller::observe(uint64_t clock, const ClockSample& s) {
  if (!options_.enabled) return;
  ++clocks_;
  lastClock_ = clock;
  if (trace_) {
    const Trace::Timing& t = trace_->at(clock);
    compute_ += t.computeSeconds;
    comm_ += t.commSeconds;
    wait_ += t.waitSeconds;
    clock_ += t.clockSeconds;
    select_ += t.selectSeconds;
  } else {
    compute_ += s.computeSeconds;
    comm_ += s.commSeconds;
    wait_ += s.waitSeconds;
    clock_ += s.clockSeconds;
    select_ += s.selectSeconds;
  }
  if (s.errors[0] >= 0.0) {
    for (size_t i = 0; i < errorSums_.size(); ++i) errorSums_[i] += s.errors[i];
    measured_ += 1.0;
    if (!trace_) measureSeconds_ += s.measureSeconds;
  }
  svBytes_ += s.svBytes;
  if (s.averaged) {
    averageBytes_ = std::max(averageBytes_, s.coordinationBytes);
    if (averagings_++ == 0) firstDivergence_ = s.divergence;
    lastDivergence_ = s.divergence;
  }
}

// Every rank's window, pooled: means over ranks of the timing, maxima of the
// bytes; divergence is the same on every rank (Coordinator::average).
Window Controller::pooled() {
  const double n = std::max<double>(1.0, static_cast<double>(clocks_));
  double sums[10] = {compute_ / n,   comm_ / n,      wait_ / n, clock_ / n, select_ / n, errorSums_[0],
                     errorSums_[1], errorSums_[2], measured_, measureSeconds_};
  double maxima[2] = {svBytes_ / n, averageBytes_};
  transport_.control().sum(sums);
  transport_.control().max(maxima);
  const double p = transport_.size();
  Window w;
  w.clocks = clocks_;
  w.computeSeconds = sums[0] / p;
  w.commSeconds = sums[1] / p;
  w.waitSeconds = sums[2] / p;
  w.clockSeconds = sums[3] / p;
  w.selectSeconds = sums[4] / p;
  if (sums[8] > 0.0) {
    for (size_t i = 0; i < w.errors.size(); ++i) w.errors[i] = sums[5 + i] / sums[8];
    w.measureSeconds = sums[9] / sums[8];
  }
  w.svBytes = maxima[0];
  w.averageBytes = maxima[1];
  // Two averagings in one window show a trend; one shows a level; none, nothing.
  if (averagings_ >= 1) w.divergence = lastDivergence_;
  if (averagings_ >= 2) w.previousDivergence = firstDivergence_;
  return w;
}

Decision Controller::decide(uint64_t clock, const Knobs& current) {
  const Window w = pooled();
  clocks_ = 0;
  compute_ = comm_ = wait_ = svBytes_ = averageBytes_ = 0.0;
  clock_ = select_ = measured_ = measureSeconds_ = 0.0;
  errorSums_ = {};
  firstDivergence_ = lastDivergence_ = -1.0;
  averagings_ = 0;

  // Rank 0 decides; the others take its knobs (a sum of integers with zeros: exact).
  const bool leader = transport_.rank() == 0;
  const std::array<int64_t, 3> counts = errorCounts(current, bounds_, options_.batch);
  Decision d;
  if (leader) d = adapt::decide(current, w, bounds_, bytes_, options_.consistency == Consistency::kSsp);
  double knobs[6] = {0, 0, 0, 0, 0, 0};
  if (leader) {
    knobs[0] = static_cast<double>(d.knobs.select);
    knobs[1] = static_cast<double>(d.knobs.fanout);
    knobs[2] = static_cast<double>(d.knobs.staleness);
    knobs[3] = static_cast<double>(d.knobs.averageEvery);
    knobs[4] = d.knobs.bf16 ? 1.0 : 0.0;
    knobs[5] = static_cast<double>(d.knobs.rank);
  }
  transport_.control().sum(knobs);
  d.knobs = {static_cast<int64_t>(knobs[0]), static_cast<int64_t>(knobs[1]), static_cast<int64_t>(knobs[2]),
             static_cast<int64_t>(knobs[3]), knobs[4] > 0.5, static_cast<int64_t>(knobs[5])};
  if (leader && aggregator_ != nullptr) {
    JsonLine line;
    line.add("decision", true)
        .add("clock", clock)
        .add("rule", d.rule)
        .add("reason", d.reason)
        .add("changed", !(d.knobs == current))
        .add("select", d.knobs.select)
        .add("fanout", d.knobs.fanout)
        .add("staleness", d.knobs.staleness)
        .add("average_every", d.knobs.averageEvery)
        .add("sv_dtype", d.knobs.bf16 ? "bf16" : "f32")
        .add("rank", d.knobs.rank)
        .add("predicted_bytes_per_clock", d.predictedBytes)
        .add("max_bytes_per_clock", bounds_.maxBytesPerClock)
        .add("window_clocks", w.clocks)
        .add("window_compute_seconds", w.computeSeconds)
        .add("window_comm_seconds", w.commSeconds)
        .add("window_wait_seconds", w.waitSeconds)
        .add("window_sv_bytes", w.svBytes)
        .add("window_clock_seconds", w.clockSeconds)
        .add("window_select_seconds", w.selectSeconds)
        .add("error_counts", std::vector<int64_t>(counts.begin(), counts.end()))
        .add("errors", std::vector<double>(w.errors.begin(), w.errors.end()))
        .add("window_measure_seconds", w.measureSeconds);
    aggregator_->addAfter(clock, line);
  }
  return d;
}

std::optional<Knobs> knobsAt(const std::string& dir, int replica, uint64_t clock) {
  const std::optional<std::vector<std::byte>> record = ckpt::knobsRecordAt(dir, replica, clock);
  if (!record) return std::nullopt;
  return decodeKnobs(*record);
}

std::vector<std::byte> encodeKnobs(const Knobs& k) {
  const int64_t values[6] = {k.select, k.fanout, k.staleness, k.averageEvery, k.bf16 ? 1 : 0, k.rank};
  const size_t size = k.rank > 0 ? kKnobsRecordBytesRank : k.bf16 ? kKnobsRecordBytesWide : kKnobsRecordBytes;
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), values, out.size());
  return out;
}

Knobs decodeKnobs(std::span<const std::byte> bytes) {
  if (bytes.size() != kKnobsRecordBytes && bytes.size() != kKnobsRecordBytesWide &&
      bytes.size() != kKnobsRecordBytesRank) {
    throw CorruptRecordError(fmt::format("a knobs record of {} bytes (expected {}, {} or {})", bytes.size(),
                                         kKnobsRecordBytes, kKnobsRecordBytesWide, kKnobsRecordBytesRank));
  }
  int64_t values[6] = {0, 0, 0, 0, 0, 0};
  std::memcpy(values, bytes.data(), bytes.size());
  for (const int64_t v : values) {
    if (v < 0) throw CorruptRecordError(fmt::format("a knobs record with a negative value {}", v));
  }
  if (bytes.size() == kKnobsRecordBytesWide && values[4] != 1) {
    throw CorruptRecordError(fmt::format("a knobs record with SV value width code {} (expected 1: bf16)", values[4]));
  }
  if (bytes.size() == kKnobsRecordBytesRank && (values[4] > 1 || values[5] < 1 || values[0] != 0)) {
    throw CorruptRecordError(fmt::format("a knobs record with width code {}, rank {} and C {} (expected 0 or 1, "
                                         "a rank >= 1 and C 0)", values[4], values[5], values[0]));
  }
  Knobs k{values[0], values[1], values[2], values[3], values[4] == 1};
  k.rank = values[5];
  return k;
}

}  // namespace orpheus::engine::adapt
