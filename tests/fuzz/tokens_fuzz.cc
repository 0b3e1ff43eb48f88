// The token-stream reader (engine/data/token_reader.cc) on arbitrary file
// contents: whole and in shards, at the file's own steps and at others, with the
// default streams and with given ones, and the format detection that sends a
// "#orpheus-tokens" file to it. Bad input must end in InputError; anything else
// (a crash, another exception) is a finding.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "tests/fuzz/fuzz_file.h"

#include <utility>

using namespace orpheus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch().file("input.tokens");
  fuzz::writeBytes(path, data, size);
  try {
    static_cast<void>(data::resolveFormat(path, data::Format::kAuto));
  } catch (const InputError&) {
  }
  fuzz::readEveryShard(path, data::Format::kTokens);
  // As training reads it (streams = the minibatch), at a --steps of its own.
  for (const auto& [streams, steps] : {std::pair<int64_t, int64_t>{1, 1}, {3, 0}, {2, 7}}) {
    for (int rank = 0; rank < 2; ++rank) {
      data::ReadOptions options;
      options.format = data::Format::kTokens;
      options.rank = rank;
      options.worldSize = 2;
      options.streams = streams;
      options.steps = steps;
      try {
        const data::Dataset d = data::readDataset(path, options);
        if (d.size() > 0) data::slice(d, 0, d.size());
      } catch (const InputError&) {
      }
    }
  }
  return 0;
}
