// CRC32C (Castagnoli), as used by iSCSI, ext4 and the SV batch record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace orpheus {

// Continues a CRC: crc32c(crc32c(0, a), b) == crc32c(0, a ++ b).
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

// The CRC of a ++ b from the CRCs of a and b and the size of b, without the bytes:
// crc32cCombine(crc32c(0, a), crc32c(0, b), size(b)) == crc32c(0, a ++ b).
uint32_t crc32cCombine(uint32_t crcA, uint32_t crcB, uint64_t sizeB);

// "SIZE:CRC" in hex: what a text (a .loss file) is, to tell an edited one from the
// one recorded, in a checkpoint's job record and a parameter file.
std::string textDigest(std::string_view text);

}  // namespace orpheus
