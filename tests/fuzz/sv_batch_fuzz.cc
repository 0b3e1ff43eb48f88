// SV batch decoding on arbitrary bytes: a record from the network or the log that
// fails validation must end in CorruptRecordError (an InputError); anything else
// is a finding. Half the inputs get a recomputed CRC, so that mutations reach the
// checks behind it.
#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"

#include <cstring>
#include <vector>

using namespace orpheus;

namespace {

// Stores the CRC the record's bytes have (what decode checks) in its header.
void fixCrc(std::vector<std::byte>& record) {
  constexpr size_t kCrcOffset = 56;
  if (record.size() < kSvBatchHeaderBytes) return;
  std::memset(record.data() + kCrcOffset, 0, 4);
  const uint32_t crc = crc32c(0, record.data(), record.size());
  for (int i = 0; i < 4; ++i) record[kCrcOffset + i] = static_cast<std::byte>((crc >> (8 * i)) & 0xff);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte chooses whether the CRC is repaired; the rest is the record.
  const bool repair = data[0] & 1;
  std::vector<std::byte> record(size - 1);
  if (!record.empty()) std::memcpy(record.data(), data + 1, record.size());
  if (repair) fixCrc(record);
  try {
    decode(record);
  } catch (const InputError&) {
  }
  return 0;
}
