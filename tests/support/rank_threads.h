// Ranks of an in-process job as threads: fn(rank) on one thread each, joined;
// the first rank's exception (in rank order) is rethrown after all have ended.
#pragma once

#include <exception>
#include <thread>
#include <vector>

namespace orpheus::testing {

template <typename Fn>
void onRankThreads(int size, Fn&& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace orpheus::testing
