#include "engine/data/synthetic_data.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/base/rng.h"

#include <charconv>
#include <string_view>

namespace orpheus::engine {

bool isSyntheticSource(const std::string& path) { return path.rfind("synthetic:", 0) == 0; }

data::Dataset makeSyntheticShard(const std::string& spec, uint64_t seed, int rank, int worldSize) {
  int64_t examples = 10000;
  int64_t features = 1024;
  int64_t classes = 10;
  std::string_view rest = std::string_view(spec).substr(std::string_view("synthetic:").size());
  std::string given;  // the keys seen, each once
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    ORPHEUS_CHECK_INPUT(eq != std::string_view::npos, "synthetic data '{}': expected key=value, got '{}'", spec, item);
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    ORPHEUS_CHECK_INPUT(given.find(fmt::format(",{},", key)) == std::string::npos,
                        "synthetic data '{}': '{}' is given twice", spec, key);
    given += fmt::format(",{},", key);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    ORPHEUS_CHECK_INPUT(ec == std::errc() && end == value.data() + value.size() && v > 0,
                        "synthetic data '{}': '{}' needs a positive integer, got '{}'", spec, key, value);
    if (key == "examples") {
      examples = v;
    } else if (key == "features") {
      features = v;
    } else if (key == "classes") {
      classes = v;
    } else {
      throw InputError(fmt::format("synthetic data '{}': unknown key '{}' (examples, features, classes)", spec, key));
    }
  }
  data::Dataset d;
  d.source = spec;
  d.features = features;
  d.globalSize = examples;
  d.globalOffset = examples * rank / worldSize;
  const int64_t end = examples * (rank + 1) / worldSize;
  const int64_t n = end - d.globalOffset;
  checkFitsInMemory(static_cast<double>(features) * static_cast<double>(n) * sizeof(float),
                    fmt::format("synthetic data '{}': a shard of {} examples of {} features", spec, n, features), 0.5);
  d.dense.resize(features, n);
  d.labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    CounterRng rng(seed, RngPurpose::kData, static_cast<uint64_t>(d.globalOffset + i), 0);
    d.labels[static_cast<size_t>(i)] = static_cast<int32_t>(rng.uniformInt(static_cast<uint64_t>(classes)));
    for (int64_t j = 0; j < features; ++j) d.dense(j, i) = static_cast<float>(rng.normal());
  }
  // Make sure the label range spans every class so the model gets all K outputs.
  if (n > 0 && rank == 0) d.labels[0] = static_cast<int32_t>(classes - 1);
  return d;
}

}  // namespace orpheus::engine
