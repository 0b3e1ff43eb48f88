// The inbox of point-to-point SV batches (engine/worker/consistency.h): what
// arrives early is held for its clock, a batch the schedule does not send here or
// one that comes twice is refused, SSP hands batches on in arrival order, and a
// wait ends when its clocks are complete or names the missing senders.
#include "comm/factory.h"
#include "comm/schedule.h"
#include "comm/stall.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "engine/worker/consistency.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

using namespace orpheus;
using engine::Inbox;

namespace {

// One 3x2 parameter matrix; a batch of one SVG.
const std::vector<std::pair<int64_t, int64_t>> kShapes{{3, 2}};
constexpr int kRanks = 3;

// A metrics sink that counts the collections the inbox lets it make.
struct CountingSink : engine::MetricsSink {
  int collects = 0;
  void report(const engine::ClockRecord&) override {}
  void collect() override { ++collects; }
  void endAt(uint64_t) override {}
  void finish(std::chrono::milliseconds) override {}
};

SvBatch batchOf(int sender, uint64_t clock, float value) {
  SvBatch b;
  b.header.sender = static_cast<uint32_t>(sender);
  b.header.clock = clock;
  b.coeffs = Vector::Constant(1, 1.0f);
  SvMatrix m;
  m.paramId = 0;
  m.u = Matrix::Constant(3, 1, value);
  m.vDense = Matrix::Constant(2, 1, value);
  b.matrices.push_back(std::move(m));
  return b;
}

// Rank 0's inbox in a job of kRanks ranks over loopback, and the other ranks' transports.
struct Job {
  explicit Job(engine::Consistency consistency, comm::MulticastKind kind = comm::MulticastKind::kAll,
               double timeoutSeconds = 300.0)
      : transports(comm::makeLoopbackGroup(kRanks)), schedule(scheduleFor(kind)) {
    options.clocks = 10;
    options.consistency = consistency;
    options.timeoutSeconds = timeoutSeconds;
    inbox = std::make_unique<Inbox>(options, schedule, *transports[0], kShapes, false);
  }
  static comm::ScheduleConfig scheduleFor(comm::MulticastKind kind) {
    comm::ScheduleConfig sc;
    sc.kind = kind;
    sc.ranks = kRanks;
    sc.fanout = kind == comm::MulticastKind::kAll ? kRanks - 1 : 1;
    sc.seed = 7;
    return sc;
  }
  // Rank `sender` sends its batch of `clock` to rank 0.
  void send(int sender, uint64_t clock, float value = 1.0f) {
    transports[sender]->sendAsync(0, std::make_shared<const std::vector<std::byte>>(
                                         encode(batchOf(sender, clock, value))));
  }

  engine::ConsistencyOptions options;
  std::vector<std::unique_ptr<comm::Transport>> transports;
  comm::MulticastSchedule schedule;
  std::unique_ptr<Inbox> inbox;
  CountingSink metrics;
};

}  // namespace

TEST_CASE("BSP: a clock is complete when every sender's batch is in; early batches wait for it", "[inbox]") {
  Job job(engine::Consistency::kBsp);
  job.send(1, 2, 2.0f);  // clock 2 before clock 1
  job.send(2, 2, 2.5f);
  job.inbox->receive(job.metrics);
  CHECK(job.metrics.collects == 1);
  CHECK(job.inbox->completeThrough() == 0);
  CHECK(job.inbox->takeClock(1).empty());

  job.send(1, 1);
  job.inbox->receive(job.metrics);
  CHECK(job.inbox->completeThrough() == 0);  // rank 2's batch of clock 1 is still out
  job.send(2, 1);
  job.inbox->receive(job.metrics);
  CHECK(job.inbox->completeThrough() == 2);  // clock 2 was complete already

  const auto first = job.inbox->takeClock(1);
  REQUIRE(first.size() == 2);
  CHECK(first.at(1).batch.header.clock == 1);
  CHECK(first.at(2).batch.header.sender == 2);
  CHECK(first.at(1).bytes == nullptr);  // keepBytes false: nothing kept for a log
  const auto second = job.inbox->takeClock(2);
  REQUIRE(second.size() == 2);
  CHECK(second.at(2).batch.matrices.at(0).u[0] == 2.5f);
  // Taken out: a second take finds nothing; BSP hands nothing on early.
  CHECK(job.inbox->takeClock(2).empty());
  CHECK(job.inbox->takeReady().empty());
}

TEST_CASE("a batch that comes twice, or for a clock already complete, is refused", "[inbox]") {
  Job job(engine::Consistency::kBsp);
  job.send(1, 3);
  job.send(1, 3);
  CHECK_THROWS_WITH(job.inbox->receive(job.metrics),
                    Catch::Contains("unexpected SV batch from rank 1 at clock 3") && Catch::Contains("came twice"));

  Job stale(engine::Consistency::kBsp);
  stale.send(1, 1);
  stale.send(2, 1);
  stale.inbox->receive(stale.metrics);
  REQUIRE(stale.inbox->completeThrough() == 1);
  stale.send(2, 1);
  CHECK_THROWS_AS(stale.inbox->receive(stale.metrics), CorruptRecordError);
}

TEST_CASE("a batch the schedule does not send here is refused", "[inbox]") {
  SECTION("past the job's last clock") {
    Job job(engine::Consistency::kBsp);
    job.send(1, 11);
    CHECK_THROWS_WITH(job.inbox->receive(job.metrics),
                      Catch::Contains("the schedule does not send it to rank 0"));
  }
  SECTION("from a sender whose peers at that clock do not include this rank") {
    Job job(engine::Consistency::kBsp, comm::MulticastKind::kRandom);
    // With Q = 1 of 2 peers, find a clock where rank 1 sends to rank 2, not to 0.
    uint64_t clock = 0;
    for (uint64_t c = 1; c <= 10 && clock == 0; ++c) {
      if (job.schedule.receivers(c, 1) == std::vector<int>{2}) clock = c;
    }
    REQUIRE(clock > 0);
    job.send(1, clock);
    CHECK_THROWS_AS(job.inbox->receive(job.metrics), CorruptRecordError);
  }
}

TEST_CASE("SSP: batches are handed on in arrival order, whatever their clock", "[inbox]") {
  Job job(engine::Consistency::kSsp);
  job.send(2, 3, 3.0f);
  job.send(1, 1, 1.0f);
  job.send(2, 1, 1.5f);
  job.inbox->receive(job.metrics);
  const auto ready = job.inbox->takeReady();
  REQUIRE(ready.size() == 3);
  CHECK(ready[0].batch.header.clock == 3);
  CHECK(ready[1].batch.header.sender == 1);
  CHECK(ready[2].batch.matrices.at(0).u[0] == 1.5f);
  CHECK(job.inbox->takeReady().empty());
  CHECK(job.inbox->takeClock(1).empty());  // nothing is held under SSP
  // Clock 1 is complete; clock 2 is not, so clock 3's batch does not complete it.
  CHECK(job.inbox->completeThrough() == 1);
}

TEST_CASE("a wait returns at once when its clocks are complete, else when the last batch comes", "[inbox]") {
  Job job(engine::Consistency::kSsp);
  job.send(1, 1);
  job.send(2, 1);
  job.inbox->receive(job.metrics);
  CHECK(job.inbox->waitComplete(1, 2, job.metrics) == 0.0);  // no wait: nothing is received
  CHECK(job.inbox->completeThrough() == 1);

  job.send(1, 2);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    job.send(2, 2);
  });
  const double waited = job.inbox->waitComplete(2, 4, job.metrics);
  late.join();
  CHECK(waited >= 0.05);
  CHECK(job.inbox->completeThrough() == 2);
}

TEST_CASE("a wait that times out names the clock and the senders missing", "[inbox]") {
  Job job(engine::Consistency::kBsp, comm::MulticastKind::kAll, 0.2);
  job.send(1, 1);
  try {
    job.inbox->waitComplete(1, 3, job.metrics);
    FAIL("the wait did not time out");
  } catch (const comm::StallError& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 0 waited 0.2 s at clock 3 for the SV batches of clock 1 from ranks 2"));
  }
}

TEST_CASE("resumeAt: the clocks up to it count as done", "[inbox]") {
  Job job(engine::Consistency::kBsp);
  job.inbox->resumeAt(4);
  CHECK(job.inbox->completeThrough() == 4);
  CHECK(job.inbox->waitComplete(4, 4, job.metrics) == 0.0);
  job.send(1, 4);  // a batch of a clock before the resume point
  CHECK_THROWS_AS(job.inbox->receive(job.metrics), CorruptRecordError);
}
