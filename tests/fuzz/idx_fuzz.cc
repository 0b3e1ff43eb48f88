// The IDX reader on an arbitrary images file and labels file. The input is split
// in two: its first two bytes (little-endian) give the images file's length, the
// rest after it is the labels file. Either may be gzip or raw. Bad input must end
// in InputError; anything else is a finding.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "tests/fuzz/fuzz_file.h"

#include <algorithm>

using namespace orpheus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t imagesSize = std::min<size_t>(data[0] | (size_t{data[1]} << 8), size - 2);
  const std::string images = fuzz::scratch().file("f-images-idx3-ubyte");
  fuzz::writeBytes(images, data + 2, imagesSize);
  fuzz::writeBytes(fuzz::scratch().file("f-labels-idx1-ubyte"), data + 2 + imagesSize, size - 2 - imagesSize);
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      data::ReadOptions options;
      options.rank = rank;
      options.worldSize = world;
      try {
        data::readDataset(images, options);
      } catch (const InputError&) {
      }
    }
  }
  return 0;
}
