// Telling a stalled peer from a waiting one (comm/stall.h), over loopback groups.
#include "comm/factory.h"
#include "comm/stall.h"

#include <catch2/catch.hpp>

#include <csignal>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace orpheus;
using namespace std::chrono_literals;

TEST_CASE("the ranks that timed out hear each other; the silent one is named; the lowest reports", "[comm][stall]") {
  auto group = comm::makeLoopbackGroup(4, {400ms});
  std::vector<comm::StallVerdict> verdicts(4);
  std::vector<std::thread> threads;
  // Ranks 0, 1 and 3 time out; rank 2 is stalled and says nothing.
  for (int r : {0, 1, 3}) {
    const auto i = static_cast<size_t>(r);
    threads.emplace_back([&, r, i] { verdicts[i] = comm::findStalled(group[i]->control(), r, 4, 9); });
  }
  for (auto& t : threads) t.join();
  for (int r : {0, 1, 3}) {
    INFO("rank " << r);
    const comm::StallVerdict& v = verdicts[static_cast<size_t>(r)];
    CHECK(v.silent == std::vector<int>{2});
    CHECK(v.reports == (r == 0));
    CHECK(v.waiting.size() == 2);
  }
  CHECK(comm::rankList({2}) == "rank 2");
  CHECK(comm::rankList({1, 3}) == "ranks 1, 3");
}

TEST_CASE("notes do not mix with control messages", "[comm][stall]") {
  auto group = comm::makeLoopbackGroup(2, {60s});
  group[0]->control().sendNote(1, 5);
  CHECK_FALSE(group[1]->control().tryReceive().has_value());
  const auto note = group[1]->control().tryReceiveNote();
  REQUIRE(note.has_value());
  CHECK(note->peer == 0);
  CHECK(note->value == 5u);
  CHECK_FALSE(group[1]->control().tryReceiveNote().has_value());
}

TEST_CASE("the grace is a quarter of the timeout, at most 1 s", "[comm][stall]") {
  CHECK(comm::stallGrace(400ms) == 100ms);
  CHECK(comm::stallGrace(60s) == 1000ms);
}

TEST_CASE("a deadline does not count the time the process was stopped", "[comm][stall]") {
  // A child stops itself for longer than its deadline; once woken it must not
  // find the deadline passed (it did not run that time).
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    comm::Deadline d(1500ms);
    for (int i = 0; i < 100; ++i) {
      if (d.passed()) _exit(1);
      std::this_thread::sleep_for(1ms);
    }
    raise(SIGSTOP);
    if (d.passed()) _exit(2);
    // Running time still counts: 1.5 s of it ends the wait.
    const auto start = std::chrono::steady_clock::now();
    while (!d.passed()) std::this_thread::sleep_for(1ms);
    _exit(std::chrono::steady_clock::now() - start < 1000ms ? 3 : 0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, WUNTRACED) == child);
  REQUIRE(WIFSTOPPED(status));
  std::this_thread::sleep_for(2500ms);
  kill(child, SIGCONT);
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a stalled wait's line names the silent ranks", "[comm][stall]") {
  comm::StallVerdict v;
  v.silent = {0, 2};
  CHECK(comm::stallSuffix(v) == "; stalled or gone: ranks 0, 2");
  v.silent.clear();
  CHECK(comm::stallSuffix(v) == "; every peer timed out too");
  CHECK(comm::stallSuffix(v, false).empty());
}
