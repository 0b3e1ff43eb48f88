// The LIBSVM/svmlight reader on arbitrary file contents, whole and in shards.
// Bad input must end in InputError; anything else (a crash, another exception)
// is a finding.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "tests/fuzz/fuzz_file.h"

using namespace orpheus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch().file("input.libsvm");
  fuzz::writeBytes(path, data, size);
  fuzz::readEveryShard(path, data::Format::kLibsvm);
  return 0;
}
