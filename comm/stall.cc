#include "comm/stall.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace orpheus::comm {

Deadline::Deadline(std::chrono::milliseconds timeout) : deadline_(Clock::now() + timeout), last_(Clock::now()) {}

bool Deadline::passed() {
  const auto now = Clock::now();
  if (const auto gap = now - last_; gap > kSelfStallGap) deadline_ += gap;
  last_ = now;
  return now > deadline_;
}

std::chrono::milliseconds stallGrace(std::chrono::milliseconds timeout) {
  return std::min(timeout / 4, std::chrono::milliseconds(1000));
}

StallVerdict findStalled(ControlPlane& control, int rank, int size, uint64_t clock) {
  std::vector<bool> heard(static_cast<size_t>(size), false);
  std::vector<bool> unreachable(static_cast<size_t>(size), false);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    try {
      control.sendNote(peer, clock);
    } catch (const Error&) {
      unreachable[static_cast<size_t>(peer)] = true;  // gone: it counts as silent
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + stallGrace(control.timeout());
  int left = size - 1;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    try {
      while (auto note = control.tryReceiveNote()) {
        const auto from = static_cast<size_t>(note->peer);
        if (from < heard.size() && !heard[from]) {
          heard[from] = true;
          --left;
        }
      }
    } catch (const Error&) {
      break;  // the control plane is failing too: what was heard is all there is
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  StallVerdict v;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    if (heard[static_cast<size_t>(peer)]) {
      v.waiting.push_back(peer);
      if (peer < rank) v.reports = false;
    } else {
      v.silent.push_back(peer);
    }
  }
  return v;
}

std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

std::string stallSuffix(const StallVerdict& v, bool sayEveryPeer) {
  if (!v.silent.empty()) return "; stalled or gone: " + rankList(v.silent);
  return sayEveryPeer ? "; every peer timed out too" : "";
}

}  // namespace orpheus::comm
