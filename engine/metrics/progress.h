// The live progress line rank 0 shows on a terminal: clock, loss, accuracy,
// clocks/s and ETA, redrawn in place. Off a terminal it prints one plain log line
// per evaluation instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace orpheus::engine {

class ProgressLine {
 public:
  // mode: "auto" (only when stderr is a terminal), "on", "off".
  ProgressLine(const std::string& mode, uint64_t totalClocks);
  ~ProgressLine();

  // accuracy < 0: none measured yet. `evaluated`: an evaluation happened this clock.
  void update(uint64_t clock, double loss, double accuracy, double seconds, bool evaluated);
  // Language models: the latest test perplexity, shown from the next update on.
  void setPerplexity(double perplexity) { perplexity_ = perplexity; }
  void finish();

 private:
  bool live_;
  bool plain_;
  uint64_t total_;
  bool open_ = false;
  double perplexity_ = -1.0;
  std::chrono::steady_clock::time_point lastDraw_{};
};

}  // namespace orpheus::engine
