// The conformance suite over loopback groups of 1, 2, 3, 4 and 8 ranks (threads).
#include "comm/factory.h"
#include "engine/base/error.h"
#include "tests/comm/conformance.h"

#include <catch2/catch.hpp>

#include <thread>

using namespace orpheus;
using namespace std::chrono_literals;

namespace {

// Runs `body` on every rank of a fresh loopback group, one thread each; rethrows
// the first failure that is not a timeout (a failing rank leaves the others
// waiting), else the first timeout.
void runGroup(int ranks, const std::function<void(comm::Transport&)>& body) {
  auto group = comm::makeLoopbackGroup(ranks, {60s});
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<bool> timedOut(static_cast<size_t>(ranks), false);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(*group[static_cast<size_t>(r)]);
      } catch (const TimeoutError&) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        timedOut[static_cast<size_t>(r)] = true;
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r)
    if (errors[static_cast<size_t>(r)] && !timedOut[static_cast<size_t>(r)]) std::rethrow_exception(errors[static_cast<size_t>(r)]);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

TEST_CASE("loopback transports pass the conformance suite", "[comm][conformance]") {
  const auto cases = comm::testing::conformanceCases({.namesLatePeerInCollectives = true});
  for (int ranks : {1, 2, 3, 4, 8}) {
    for (const auto& c : cases) {
      DYNAMIC_SECTION(c.name << " (" << ranks << " ranks)") { REQUIRE_NOTHROW(runGroup(ranks, c.body)); }
    }
  }
}
