// The CSV reader on arbitrary file contents, whole and in shards. Bad input must
// end in InputError; anything else is a finding.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "tests/fuzz/fuzz_file.h"

using namespace orpheus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch().file("input.csv");
  fuzz::writeBytes(path, data, size);
  for (int world : {1, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      data::ReadOptions options;
      options.format = data::Format::kCsv;
      options.rank = rank;
      options.worldSize = world;
      try {
        const data::Dataset d = data::readDataset(path, options);
        if (d.size() > 0) data::slice(d, 0, d.size());
      } catch (const InputError&) {
      }
    }
  }
  return 0;
}
