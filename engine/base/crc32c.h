// CRC32C (Castagnoli), as used by iSCSI, ext4 and the SV batch record.
#pragma once

#include <cstddef>
#include <cstdint>

namespace orpheus {

// Continues a CRC: crc32c(crc32c(0, a), b) == crc32c(0, a ++ b).
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

}  // namespace orpheus
