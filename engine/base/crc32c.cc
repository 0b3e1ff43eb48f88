#include "engine/base/crc32c.h"

#include <fmt/format.h>

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ORPHEUS_CRC32C_HW 1
#include <nmmintrin.h>
#else
#define ORPHEUS_CRC32C_HW 0
#endif

namespace orpheus {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

// kTable[k][b]: the CRC register after feeding byte b followed by k zero bytes,
// for slice-by-8.
using SliceTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr SliceTables makeSliceTables() {
  SliceTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}

constexpr SliceTables kSlice = makeSliceTables();

uint64_t loadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Works on the raw (unconditioned) register.
uint32_t crcSoftware(uint32_t crc, const unsigned char* p, size_t n) {
  while (n >= 8) {
    const uint64_t w = loadLe64(p) ^ crc;
    crc = kSlice[7][w & 0xff] ^ kSlice[6][(w >> 8) & 0xff] ^ kSlice[5][(w >> 16) & 0xff] ^ kSlice[4][(w >> 24) & 0xff] ^
          kSlice[3][(w >> 32) & 0xff] ^ kSlice[2][(w >> 40) & 0xff] ^ kSlice[1][(w >> 48) & 0xff] ^ kSlice[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ kSlice[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if ORPHEUS_CRC32C_HW

// The crc32 instruction has a latency of three cycles and a throughput of one, so
// three independent streams over adjacent blocks run about three times faster than
// one. The streams are joined by advancing a register over a block of zeros, which
// is linear over GF(2) and precomputed as byte-indexed tables (after M. Adler).
constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;

using Gf2Matrix = std::array<uint32_t, 32>;
using ZerosTables = std::array<std::array<uint32_t, 256>, 4>;

constexpr uint32_t gf2Times(const Gf2Matrix& mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

constexpr Gf2Matrix gf2Square(const Gf2Matrix& mat) {
  Gf2Matrix sq{};
  for (int i = 0; i < 32; ++i) sq[i] = gf2Times(mat, mat[i]);
  return sq;
}

// Tables that advance a raw register over `bytes` zero bytes; bytes is a power of two.
constexpr ZerosTables makeZerosTables(size_t bytes) {
  Gf2Matrix op{};  // one zero bit
  op[0] = kPoly;
  for (int i = 1; i < 32; ++i) op[i] = 1u << (i - 1);
  for (int i = 0; i < 3; ++i) op = gf2Square(op);  // one zero byte
  for (size_t len = bytes; len > 1; len >>= 1) op = gf2Square(op);
  ZerosTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 0; k < 4; ++k) t[k][b] = gf2Times(op, b << (8 * k));
  }
  return t;
}

constexpr ZerosTables kZerosLong = makeZerosTables(kLongBlock);
constexpr ZerosTables kZerosShort = makeZerosTables(kShortBlock);

inline uint32_t shift(const ZerosTables& t, uint32_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // x86 is little-endian
  return v;
}

template <size_t kBlock>
__attribute__((target("sse4.2"))) inline uint64_t crcThreeWay(uint64_t crc0, const unsigned char*& p, size_t& n,
                                                              const ZerosTables& zeros) {
  while (n >= 3 * kBlock) {
    uint64_t crc1 = 0;
    uint64_t crc2 = 0;
    for (const unsigned char* end = p + kBlock; p < end; p += 8) {
      crc0 = _mm_crc32_u64(crc0, load64(p));
      crc1 = _mm_crc32_u64(crc1, load64(p + kBlock));
      crc2 = _mm_crc32_u64(crc2, load64(p + 2 * kBlock));
    }
    crc0 = shift(zeros, static_cast<uint32_t>(crc0)) ^ crc1;
    crc0 = shift(zeros, static_cast<uint32_t>(crc0)) ^ crc2;
    p += 2 * kBlock;
    n -= 3 * kBlock;
  }
  return crc0;
}

__attribute__((target("sse4.2"))) uint32_t crcHardware(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  c = crcThreeWay<kLongBlock>(c, p, n, kZerosLong);
  c = crcThreeWay<kShortBlock>(c, p, n, kZerosShort);
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool haveSse42() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return have;
}

#endif

// a(x) * b(x) modulo the polynomial, in the reflected bit order of the register.
constexpr uint32_t multModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// kX2n[k] = x^(2^k) modulo the polynomial.
constexpr std::array<uint32_t, 32> makeX2n() {
  std::array<uint32_t, 32> t{};
  uint32_t p = 1u << 30;  // x^1
  t[0] = p;
  for (int k = 1; k < 32; ++k) t[k] = p = multModP(p, p);
  return t;
}

constexpr std::array<uint32_t, 32> kX2n = makeX2n();

// x^(n * 2^k) modulo the polynomial.
uint32_t x2nModP(uint64_t n, unsigned k) {
  uint32_t p = 1u << 31;  // x^0
  for (; n != 0; n >>= 1, ++k) {
    if (n & 1) p = multModP(kX2n[k & 31], p);
  }
  return p;
}

}  // namespace

uint32_t crc32cCombine(uint32_t crcA, uint32_t crcB, uint64_t sizeB) {
  return multModP(x2nModP(sizeB, 3), crcA) ^ crcB;
}

uint32_t crc32c(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if ORPHEUS_CRC32C_HW
  if (haveSse42()) return ~crcHardware(crc, p, size);
#endif
  return ~crcSoftware(crc, p, size);
}

std::string textDigest(std::string_view text) {
  return fmt::format("{:x}:{:08x}", text.size(), crc32c(0, text.data(), text.size()));
}

}  // namespace orpheus
