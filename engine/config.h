// Everything a training job is configured by, in one struct built from the
// command line (engine/cli) and passed down; no globals.
#pragma once

#include "engine/data/dataset.h"

#include <cstdint>
#include <string>

namespace orpheus::engine {

enum class SyncMode { kSv, kDense };

struct TrainConfig {
  std::string model = "mlr";
  std::string train;
  std::string test;
  data::Format format = data::Format::kAuto;
  int64_t features = -1;  // -1: from the data
  int64_t classes = -1;   // -1: largest training label + 1
  int64_t clocks = 1000;
  int64_t batch = 100;    // examples per rank per clock
  double lr = 0.1;
  uint64_t seed = 1;
  SyncMode sync = SyncMode::kSv;
  int64_t evalEvery = 100;  // 0: only at the end
  std::string metrics;
  std::string save;
  double timeoutSeconds = 300.0;
  int blasThreads = 1;
  std::string logLevel = "info";
  std::string progress = "auto";  // auto (on a terminal), on, off
};

std::string toString(SyncMode mode);

}  // namespace orpheus::engine
