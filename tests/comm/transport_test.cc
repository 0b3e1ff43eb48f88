// What the transport base does for every backend: chunking, counting, refusing
// use after a timeout, buffer registration; and the factory's choices.
#include "comm/factory.h"
#include "comm/transport.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

using namespace orpheus;

namespace {

class NullControl final : public comm::ControlPlane {
 public:
  void sum(std::span<double>) override {}
  void max(std::span<double>) override {}
  void min(std::span<double>) override {}
  void send(int, comm::SharedBytes) override {}
  std::optional<comm::Message> tryReceive() override { return std::nullopt; }
  void flush() override {}
  void sendNote(int, uint64_t) override {}
  std::optional<comm::Note> tryReceiveNote() override { return std::nullopt; }
  [[noreturn]] void abortJob(int code) override { std::_Exit(code); }
};

// Records the chunks the base hands over; moves no data.
class RecordingTransport final : public comm::Transport {
 public:
  explicit RecordingTransport(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string name() const override { return "recording"; }
  comm::ControlPlane& control() override { return control_; }

  std::vector<size_t> chunks;
  bool timeOutNext = false;

 protected:
  comm::Gathered doAllgatherv(std::span<const std::byte>, uint64_t) override { return {}; }
  void doAllreduceSum(std::span<float> chunk, uint64_t clock) override { record(chunk, clock); }
  void doAllreduceSumIdentical(std::span<float> chunk, uint64_t clock) override { record(chunk, clock); }
  void doShiftRing(std::span<float> chunk, uint64_t clock) override { record(chunk, clock); }
  void doSendAsync(int, comm::SharedBytes) override {}
  std::optional<comm::Message> doTryReceive() override { return std::nullopt; }
  void doFlushSends() override {}

 private:
  void record(std::span<float> chunk, uint64_t clock) {
    if (timeOutNext) throw TimeoutError(fmt::format("rank 0: recorded call at clock {} timed out", clock));
    chunks.push_back(chunk.size());
  }
  int size_;
  NullControl control_;
};

}  // namespace

TEST_CASE("the base cuts float collectives into chunks and counts per chunk", "[comm]") {
  RecordingTransport t(3);
  std::vector<float> v(comm::kChunkFloats + 5);
  t.allreduceSum(v, 1);
  CHECK(t.chunks == std::vector<size_t>{comm::kChunkFloats, 5});
  // Per chunk 2(P-1)/P·4n, rounded down per chunk: 89478485 + 26 (over the whole
  // span it would be 89478512).
  CHECK(t.counters().bytesSent == 89478485u + 26u);
  CHECK(t.counters().messages == 2u * 4u);
  CHECK(comm::traffic::allreduceSum(v.size(), 3) == t.counters());

  RecordingTransport ring(3);
  ring.shiftRing(v, 2);
  CHECK(ring.counters() == comm::TrafficCounters{4 * v.size(), 2});
  RecordingTransport identical(3);
  identical.allreduceSumIdentical(v, 3);
  // Blocks of ceil(n/P): 5592406 and 2 floats.
  CHECK(identical.counters() == comm::TrafficCounters{2 * 2 * 4 * (5592406u + 2u), 2 * 2 * 2});
}

TEST_CASE("one rank moves nothing and counts nothing", "[comm]") {
  RecordingTransport t(1);
  std::vector<float> v(10, 1.0f);
  t.allreduceSum(v, 1);
  t.allreduceSumIdentical(v, 1);
  t.shiftRing(v, 1);
  static_cast<void>(t.allgatherv(std::as_bytes(std::span<float>(v)), 1));
  CHECK(t.chunks.empty());
  CHECK(t.counters() == comm::TrafficCounters{});
}

TEST_CASE("after a timeout the data plane refuses every call, naming the timeout", "[comm]") {
  RecordingTransport t(2);
  std::vector<float> v(4);
  t.timeOutNext = true;
  CHECK_THROWS_AS(t.shiftRing(v, 9), TimeoutError);
  t.timeOutNext = false;
  CHECK_THROWS_WITH(t.allreduceSum(v, 10), Catch::Contains("unusable") && Catch::Contains("clock 9"));
  CHECK_THROWS_WITH(t.sendAsync(1, std::make_shared<std::vector<std::byte>>(3)), Catch::Contains("unusable"));
  CHECK(t.counters() == comm::TrafficCounters{});
  double x = 1.0;
  CHECK_NOTHROW(t.control().sum({&x, 1}));
}

TEST_CASE("buffer registration: host memory is accepted, device memory refused by name", "[comm]") {
  RecordingTransport t(2);
  std::vector<std::byte> host(64);
  const comm::RegisteredBuffer h = t.registerBuffer(host, comm::MemoryKind::kHost);
  CHECK(h.bytes().data() == host.data());
  CHECK(h.backend() == nullptr);
  CHECK_THROWS_AS(t.registerBuffer(host, comm::MemoryKind::kDevice), InputError);
  CHECK_THROWS_WITH(t.registerBuffer(host, comm::MemoryKind::kDevice),
                    "transport recording does not support device buffers");
  CHECK_FALSE(t.deviceMemoryAware());
}

TEST_CASE("the factory names what is built", "[comm]") {
  CHECK(comm::availableTransports() == std::vector<std::string>{"mpi"});
  CHECK_THROWS_AS(comm::makeTransport("ibverbs"), InputError);
  CHECK_THROWS_WITH(comm::makeTransport("x"), "transport 'x' is not built; available: mpi");
  CHECK_THROWS_WITH(comm::checkTransport("loopback"), Catch::Contains("one process") && Catch::Contains("available: mpi"));
  CHECK_NOTHROW(comm::checkTransport("mpi"));
  auto group = comm::makeLoopbackGroup(3, {std::chrono::milliseconds(1234)});
  REQUIRE(group.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CHECK(group[static_cast<size_t>(r)]->rank() == r);
    CHECK(group[static_cast<size_t>(r)]->size() == 3);
    CHECK(group[static_cast<size_t>(r)]->name() == "loopback");
    CHECK(group[static_cast<size_t>(r)]->timeout() == std::chrono::milliseconds(1234));
    CHECK(group[static_cast<size_t>(r)]->control().timeout() == std::chrono::milliseconds(1234));
  }
}
