// The conformance suite (tests/comm/conformance.h) under mpiexec, on MPI
// transports made by the factory, plus a direct comparison of what the MPI and
// loopback transports count for the same calls.
#define CATCH_CONFIG_RUNNER
#include "comm/factory.h"
#include "engine/base/error.h"
#include "tests/comm/conformance.h"

#include <catch2/catch.hpp>

#include <mpi.h>

#include <thread>

using namespace orpheus;
using namespace std::chrono_literals;

TEST_CASE("MPI transports pass the conformance suite", "[mpi][conformance]") {
  // An MPI collective does not say which rank is late; the base finds out (comm/stall.h).
  const auto cases = comm::testing::conformanceCases({.namesLatePeerInCollectives = true});
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const auto t = comm::makeTransport("mpi", {60s});
      REQUIRE_NOTHROW(c.body(*t));
    }
  }
}

TEST_CASE("MPI and loopback count the same traffic for the same calls", "[mpi][conformance]") {
  const auto t = comm::makeTransport("mpi", {60s});
  const int p = t->size();
  comm::testing::trafficSequence(*t);
  // Every rank's counters, gathered on the control plane (exact: small integers).
  std::vector<double> mpiCounts(2 * static_cast<size_t>(p), 0.0);
  mpiCounts[2 * static_cast<size_t>(t->rank())] = static_cast<double>(t->counters().bytesSent);
  mpiCounts[2 * static_cast<size_t>(t->rank()) + 1] = static_cast<double>(t->counters().messages);
  t->control().sum(mpiCounts);
  if (t->rank() != 0) return;

  auto group = comm::makeLoopbackGroup(p, {60s});
  std::vector<std::thread> threads;
  for (auto& member : group) threads.emplace_back([&member] { comm::testing::trafficSequence(*member); });
  for (auto& th : threads) th.join();
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r);
    const auto& counters = group[static_cast<size_t>(r)]->counters();
    CHECK(static_cast<double>(counters.bytesSent) == mpiCounts[2 * static_cast<size_t>(r)]);
    CHECK(static_cast<double>(counters.messages) == mpiCounts[2 * static_cast<size_t>(r) + 1]);
  }
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Catch::Session session;
  const int failed = session.run(argc, argv);
  // Every rank must pass; any failure fails the whole run.
  int worst = failed;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
