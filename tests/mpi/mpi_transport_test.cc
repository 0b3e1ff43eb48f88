// Runs under mpiexec with 2 and 4 ranks: the MPI transport moves real bytes
// between processes and counts them as the loopback transport does.
#define CATCH_CONFIG_RUNNER
#include "comm/mpi/mpi_transport.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <mpi.h>

using namespace orpheus;

TEST_CASE("MPI allgatherv delivers variable-size records in rank order", "[mpi]") {
  comm::mpi::MpiTransport t(MPI_COMM_WORLD);
  const int size = t.size();
  for (uint64_t clock = 1; clock <= 10; ++clock) {
    std::vector<std::byte> mine(static_cast<size_t>(t.rank()) * 1000 + clock, std::byte(t.rank() + 1));
    const comm::Gathered all = t.allgatherv(mine, clock);
    REQUIRE(all.count() == static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      const auto part = all.part(static_cast<size_t>(r));
      REQUIRE(part.size() == static_cast<size_t>(r) * 1000 + clock);
      for (auto b : part) REQUIRE(b == std::byte(r + 1));
    }
  }
  CHECK(t.counters().messages == 10u * static_cast<uint64_t>(size - 1));
  CHECK(t.counters().bytesSent == (10u * static_cast<uint64_t>(t.rank()) * 1000 + 55) * static_cast<uint64_t>(size - 1));
}

TEST_CASE("MPI sum-allreduce and control reductions", "[mpi]") {
  comm::mpi::MpiTransport t(MPI_COMM_WORLD);
  const int size = t.size();
  std::vector<float> v(1000, 1.0f);
  v[0] = static_cast<float>(t.rank());
  t.allreduceSum(v, 1);
  CHECK(v[0] == static_cast<float>(size * (size - 1) / 2));
  CHECK(v[999] == static_cast<float>(size));
  CHECK(t.counters().bytesSent == 2u * 4000u * static_cast<uint64_t>(size - 1) / static_cast<uint64_t>(size));
  std::vector<double> d = {static_cast<double>(t.rank())};
  t.control().max(d);
  CHECK(d[0] == size - 1);
  const uint64_t before = t.counters().bytesSent;
  t.control().sum(d);
  CHECK(t.counters().bytesSent == before);  // control traffic is not counted
}

TEST_CASE("MPI sums are bitwise identical on every rank", "[mpi]") {
  comm::mpi::MpiTransport t(MPI_COMM_WORLD);
  std::vector<float> v(10007);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / static_cast<float>(i + 1 + 7 * t.rank());
  t.allreduceSumIdentical(v, 2);
  std::vector<float> fromRoot = v;
  MPI_Bcast(fromRoot.data(), static_cast<int>(fromRoot.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(std::memcmp(fromRoot.data(), v.data(), v.size() * sizeof(float)) == 0);
}

TEST_CASE("MPI ring shift moves data to the next rank", "[mpi]") {
  comm::mpi::MpiTransport t(MPI_COMM_WORLD);
  std::vector<float> v(3000, static_cast<float>(t.rank()));
  t.shiftRing(v, 3);
  for (float x : v) REQUIRE(x == static_cast<float>((t.rank() + t.size() - 1) % t.size()));
}

TEST_CASE("MPI point-to-point messages arrive in order per sender", "[mpi]") {
  comm::mpi::MpiTransport t(MPI_COMM_WORLD);
  const int next = (t.rank() + 1) % t.size();
  for (int i = 0; i < 5; ++i) {
    auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(100 + i), std::byte(i));
    if (t.size() > 1) t.sendAsync(next, bytes);
  }
  for (int i = 0; i < 5 && t.size() > 1; ++i) {
    std::optional<comm::Message> m;
    while (!(m = t.tryReceive())) {
    }
    CHECK(m->peer == (t.rank() + t.size() - 1) % t.size());
    REQUIRE(m->bytes.size() == static_cast<size_t>(100 + i));
    CHECK(m->bytes[0] == std::byte(i));
  }
  t.flushSends();
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  const int failed = session.run(argc, argv);
  // Every rank must pass; any failure fails the whole run.
  int worst = failed;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
