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
    fuzz::readEveryShard(path, data::Format::kTokens, {2}, streams, steps);
  }
  return 0;
}
