#include "engine/metrics/progress.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <unistd.h>

namespace orpheus::engine {

ProgressLine::ProgressLine(const std::string& mode, uint64_t totalClocks)
    : live_(mode == "on" || (mode == "auto" && ::isatty(STDERR_FILENO))),
      plain_(mode != "off" && !live_),
      total_(totalClocks) {}

ProgressLine::~ProgressLine() { finish(); }

void ProgressLine::update(uint64_t clock, double loss, double accuracy, double seconds, bool evaluated) {
  const double rate = seconds > 0 ? static_cast<double>(clock) / seconds : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total_ - clock) / rate : 0.0;
  if (live_) {
    const auto now = std::chrono::steady_clock::now();
    // Redraw at most ten times a second; always on the last clock and after an evaluation.
    if (!evaluated && clock != total_ && now - lastDraw_ < std::chrono::milliseconds(100)) return;
    lastDraw_ = now;
    const std::string acc = accuracy >= 0 ? fmt::format("{:.4f}", accuracy) : "-";
    const std::string ppl = perplexity_ > 0 ? fmt::format("  ppl {:.1f}", perplexity_) : "";
    std::fprintf(stderr, "\rclock %llu/%llu  loss %.4f  acc %s%s  %.1f clocks/s  ETA %.0fs   ",
                 static_cast<unsigned long long>(clock), static_cast<unsigned long long>(total_), loss, acc.c_str(),
                 ppl.c_str(), rate, eta);
    std::fflush(stderr);
    open_ = true;
  } else if (plain_ && evaluated && perplexity_ > 0) {
    spdlog::info("clock {}/{}  train_loss {:.4f}  test_perplexity {:.2f}  test_accuracy {:.4f}  {:.1f} clocks/s", clock,
                 total_, loss, perplexity_, accuracy, rate);
  } else if (plain_ && evaluated) {
    spdlog::info("clock {}/{}  train_loss {:.4f}  test_accuracy {:.4f}  {:.1f} clocks/s", clock, total_, loss,
                 accuracy, rate);
  }
}

void ProgressLine::finish() {
  if (open_) {
    std::fputc('\n', stderr);
    open_ = false;
  }
}

}  // namespace orpheus::engine
