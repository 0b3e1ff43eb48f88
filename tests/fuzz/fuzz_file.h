// Helpers for fuzz targets whose readers take a path: the input is written to a
// file in a directory private to the process, removed at exit.
#pragma once

#include "engine/base/error.h"
#include "engine/data/dataset.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>

namespace orpheus::fuzz {

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "orpheus-fuzz-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The process's scratch directory (one per process: fuzzers run one input at a time).
inline const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

inline void writeBytes(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
}

// Reads `path` as `format` whole and as every shard of 3 (or, given `worlds`, of
// each of those), slicing what loads; `streams` and `steps` as ReadOptions takes
// them (token streams). Bad input must end in InputError; anything else escapes
// as a finding.
inline void readEveryShard(const std::string& path, data::Format format, std::initializer_list<int> worlds = {1, 3},
                           int64_t streams = 0, int64_t steps = 0) {
  for (int world : worlds) {
    for (int rank = 0; rank < world; ++rank) {
      data::ReadOptions options;
      options.format = format;
      options.rank = rank;
      options.worldSize = world;
      options.streams = streams;
      options.steps = steps;
      try {
        const data::Dataset d = data::readDataset(path, options);
        if (d.size() > 0) data::slice(d, 0, d.size());
      } catch (const InputError&) {
      }
    }
  }
}

}  // namespace orpheus::fuzz
