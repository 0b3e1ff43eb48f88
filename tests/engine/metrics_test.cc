// Rank 0's metrics aggregation: every rank's clock records, in whatever order they
// arrive, become one line per clock, in clock order, with the fields summed,
// averaged or maxed as the line says.
#include "comm/loopback/loopback_transport.h"
#include "engine/base/error.h"
#include "engine/metrics/metrics.h"
#include "engine/metrics/progress.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace orpheus;
using namespace orpheus::engine;

namespace {

class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               (name + "-" + std::to_string(std::random_device{}()) + ".jsonl"))
                  .string()) {}
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }
  std::vector<std::string> lines() const {
    std::ifstream in(path_);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

 private:
  std::string path_;
};

// Rank `rank`'s record of `clock`, with values that tell ranks and clocks apart.
ClockRecord record(int rank, uint64_t clock) {
  ClockRecord r{};
  r[kClock] = static_cast<double>(clock);
  r[kSeconds] = rank == 0 ? 0.5 * static_cast<double>(clock) : 0.0;
  r[kLoss] = static_cast<double>(rank + 1);  // 1, 2, 3: mean 2
  r[kBytes] = 100.0 * (rank + 1);            // sum 600
  r[kMessages] = 1.0;
  r[kWait] = 0.25 * rank;                    // max 0.5, mean 0.25
  r[kDataWait] = 0.5 * rank;                 // mean 0.5
  r[kGap] = rank == 1 ? static_cast<double>(clock) : 0.0;
  r[kFailed] = rank == 2 && clock == 2 ? 1.0 : 0.0;
  r[kLostClocks] = rank == 2 && clock == 2 ? 2.0 : 0.0;
  if (rank == 0) r[kReplica] = 7.0;
  if (clock == 3) {
    r[kHasEval] = 1.0;
    r[kEvalLoss] = 10.0;      // per rank; over 3 ranks 30 over 60 examples
    r[kEvalCorrect] = 15.0;   // 45 of 60
    r[kEvalCount] = 20.0;
  }
  return r;
}

bool has(const std::string& line, const std::string& field) { return line.find(field) != std::string::npos; }

}  // namespace

TEST_CASE("records from every rank, interleaved and out of order, become lines in clock order", "[engine][metrics]") {
  TempFile file("orpheus-metrics-order");
  std::vector<std::string> lines;
  {
    MetricsWriter out(file.path());
    ProgressLine progress("off", 4);
    MetricsAggregator aggregator(3, out, progress, true, 1, 4);
    // Rank 1 runs ahead; rank 0's clock 1 comes last of clock 1.
    const std::vector<std::pair<int, uint64_t>> arrivals = {
        {1, 1}, {1, 2}, {2, 1}, {1, 3}, {2, 2}, {0, 1}, {0, 2}, {2, 3}, {1, 4}, {0, 3}, {2, 4}, {0, 4}};
    size_t written = 0;
    for (const auto& [rank, clock] : arrivals) {
      aggregator.add(record(rank, clock));
      const size_t now = file.lines().size();
      INFO("after rank " << rank << " clock " << clock);
      // A line appears only once all three records of its clock are in.
      if (rank == 0 && clock == 1) CHECK(now == 1);  // clock 2 still lacks rank 0
      if (rank == 0 && clock == 2) CHECK(now == 2);
      if (rank == 2 && clock == 3) CHECK(now == 2);  // clock 3 still lacks rank 0
      if (rank == 1 && clock == 4) CHECK(now == 2);
      CHECK(now >= written);
      written = now;
    }
    CHECK(aggregator.done());
  }
  lines = file.lines();
  REQUIRE(lines.size() == 4);
  for (size_t i = 0; i < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK(lines[i].rfind("{\"clock\": " + std::to_string(i + 1) + ",", 0) == 0);
    CHECK(has(lines[i], "\"train_loss\": 2,"));
    CHECK(has(lines[i], "\"bytes_sent\": 600,"));
    CHECK(has(lines[i], "\"messages\": 3,"));
    CHECK(has(lines[i], "\"wait_seconds\": 0.25,"));
    CHECK(has(lines[i], "\"max_wait_seconds\": 0.5,"));
    CHECK(has(lines[i], "\"data_wait_seconds\": 0.5,"));
    CHECK(has(lines[i], "\"clock_gap\": " + std::to_string(i + 1) + ","));
    CHECK(has(lines[i], "\"replica\": 7,"));
    CHECK(has(lines[i], "\"seconds\": " + fmt::format("{:.9g}", 0.5 * static_cast<double>(i + 1)) + ","));
  }
  CHECK(has(lines[1], "\"failures\": 1,"));
  CHECK(has(lines[1], "\"lost_clocks\": 2"));
  CHECK(has(lines[0], "\"failures\": 0,"));
  CHECK(has(lines[2], "\"test_loss\": 0.5"));
  CHECK(has(lines[2], "\"test_accuracy\": 0.75"));
  CHECK_FALSE(has(lines[1], "test_loss"));
}

TEST_CASE("the aggregator's totals add up the lines written", "[engine][metrics]") {
  TempFile file("orpheus-metrics-totals");
  MetricsWriter out(file.path());
  ProgressLine progress("off", 4);
  MetricsAggregator aggregator(3, out, progress, true, 1, 4);
  for (uint64_t clock = 1; clock <= 3; ++clock) {
    for (int rank = 2; rank >= 0; --rank) aggregator.add(record(rank, clock));
  }
  // Clock 4 is incomplete: not in the totals.
  aggregator.add(record(1, 4));
  CHECK_FALSE(aggregator.done());
  CHECK(aggregator.totalBytes() == 1800);
  CHECK(aggregator.totalMessages() == 9);
  CHECK(aggregator.totalFailures() == 1);
  CHECK(aggregator.totalLostClocks() == 2);
  CHECK(aggregator.maxGap() == 3.0);
  CHECK(aggregator.bestAccuracy() == Approx(0.75));
  CHECK(file.lines().size() == 3);
}

TEST_CASE("endAt: a job stopped early is done at that clock", "[engine][metrics]") {
  TempFile file("orpheus-metrics-end");
  MetricsWriter out(file.path());
  ProgressLine progress("off", 10);
  MetricsAggregator aggregator(2, out, progress, false, 1, 10);
  for (uint64_t clock = 1; clock <= 2; ++clock) {
    aggregator.add(record(0, clock));
    aggregator.add(record(1, clock));
  }
  CHECK_FALSE(aggregator.done());
  aggregator.endAt(2);
  CHECK(aggregator.done());
  // Nothing may come after the end.
  CHECK_THROWS_AS(aggregator.add(record(0, 3)), Error);
  CHECK(file.lines().size() == 2);
}

TEST_CASE("a resumed job's lines start at its first clock; a record of a written clock is an error",
          "[engine][metrics]") {
  TempFile file("orpheus-metrics-resume");
  MetricsWriter out(file.path());
  ProgressLine progress("off", 6);
  MetricsAggregator aggregator(1, out, progress, false, 5, 6);
  CHECK_THROWS_AS(aggregator.add(record(0, 4)), Error);
  aggregator.add(record(0, 5));
  CHECK_THROWS_AS(aggregator.add(record(0, 5)), Error);
  aggregator.add(record(0, 6));
  CHECK(aggregator.done());
  const auto lines = file.lines();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].rfind("{\"clock\": 5,", 0) == 0);
  CHECK_FALSE(has(lines[0], "test_accuracy"));
}

TEST_CASE("records travel to rank 0 on the control channel", "[engine][metrics]") {
  TempFile file("orpheus-metrics-collect");
  auto hub = std::make_shared<comm::loopback::LoopbackHub>(3);
  comm::loopback::LoopbackTransport t0(hub, 0);
  comm::loopback::LoopbackTransport t1(hub, 1);
  comm::loopback::LoopbackTransport t2(hub, 2);
  MetricsWriter out(file.path());
  ProgressLine progress("off", 2);
  MetricsAggregator aggregator(3, out, progress, true, 1, 2);
  MetricsCollector collector(t0, aggregator);
  MetricsReporter reporter1(t1);
  MetricsReporter reporter2(t2);
  reporter2.report(record(2, 1));
  reporter1.report(record(1, 1));
  reporter1.report(record(1, 2));
  collector.report(record(0, 1));  // takes in what has arrived too
  CHECK(file.lines().size() == 1);
  reporter2.report(record(2, 2));
  collector.report(record(0, 2));
  collector.finish(std::chrono::seconds(5));
  CHECK(aggregator.done());
  CHECK(file.lines().size() == 2);
  CHECK(aggregator.totalBytes() == 1200);

  const comm::SharedBytes bytes = encodeRecord(record(1, 2));
  CHECK(decodeRecord(*bytes, 1) == record(1, 2));
  CHECK_THROWS_AS(decodeRecord(std::span<const std::byte>(*bytes).first(8), 1), Error);
}

TEST_CASE("a device job's lines say how its SVs crossed, with the bytes and the share hidden", "[engine][metrics]") {
  TempFile file("orpheus-metrics-transfer");
  {
    MetricsWriter out(file.path());
    ProgressLine progress("off", 2);
    MetricsAggregator aggregator(2, out, progress, true, 1, 2);
    for (int rank = 0; rank < 2; ++rank) {
      ClockAround around;
      around.leader = rank == 0;
      around.deviceInBytes = 1000;
      around.deviceOutBytes = 500;
      around.launches = 70;
      around.deviceDataWaitSeconds = 0.5 * rank;  // mean 0.25
      around.transfer = TransferKind::kStaged;
      around.toHostBytes = 400;
      around.toDeviceBytes = 300;
      around.transferSeconds = 2.0;              // 4 s of copies, 1 s of them before the passes ended
      around.transferHiddenSeconds = rank == 0 ? 1.0 : 0.0;
      aggregator.add(clockRecord(1, ClockStats{}, around));
      // Clock 2: a job on the host, whose SVs never cross.
      ClockAround host;
      host.leader = rank == 0;
      aggregator.add(clockRecord(2, ClockStats{}, host));
    }
    CHECK(aggregator.totalLaunches() == 140);  // the summary's launches_per_clock
  }
  const std::vector<std::string> lines = file.lines();
  REQUIRE(lines.size() == 2);
  INFO(lines[0]);
  CHECK(has(lines[0], "\"transfer\": \"staged\""));
  CHECK(has(lines[0], "\"d2h_bytes\": 800,"));
  CHECK(has(lines[0], "\"h2d_bytes\": 600,"));
  CHECK(has(lines[0], "\"transfer_hidden_share\": 0.25"));
  CHECK(has(lines[0], "\"device_data_wait_seconds\": 0.25"));
  CHECK(has(lines[0], "\"launches\": 140,"));
  CHECK_FALSE(has(lines[1], "launches"));
  CHECK_FALSE(has(lines[1], "transfer"));
  CHECK_FALSE(has(lines[1], "d2h_bytes"));
  CHECK(std::string(transferName(TransferKind::kCudaAware)) == "cuda-aware");
}
