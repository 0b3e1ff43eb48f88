// The CSV reader on arbitrary file contents, whole and in shards. Bad input must
// end in InputError; anything else is a finding.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "tests/fuzz/fuzz_file.h"

using namespace orpheus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch().file("input.csv");
  fuzz::writeBytes(path, data, size);
  fuzz::readEveryShard(path, data::Format::kCsv);
  return 0;
}
