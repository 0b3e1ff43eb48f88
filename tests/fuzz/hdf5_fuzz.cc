// The HDF5 reader (ckpt::loadParams, what `eval --params` and `--init-from` read)
// on arbitrary file contents. Bad input must end in InputError; anything else is
// a finding.
#include "ckpt/model_file.h"
#include "engine/base/error.h"
#include "tests/fuzz/fuzz_file.h"

#include <hdf5.h>

using namespace orpheus;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the library's own error stack print
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch().file("input.h5");
  fuzz::writeBytes(path, data, size);
  try {
    ckpt::ModelFileInfo info;
    ckpt::loadParams(path, &info);
  } catch (const InputError&) {
  }
  return 0;
}
