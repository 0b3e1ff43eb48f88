// The SV batch's wire layout (the format is specified in sv_batch.h) and the
// little-endian and value checks that its encoder and decoder share. Internal to
// engine/base: sv_batch_encode.cc and sv_batch_decode.cc include it.
#pragma once

#include "engine/base/sv_batch.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace orpheus::sv_wire {

// Header field offsets (see the wire format in sv_batch.h).
inline constexpr size_t kOffMagic = 0;
inline constexpr size_t kOffVersion = 4;
inline constexpr size_t kOffFlags = 6;
inline constexpr size_t kOffJobId = 8;
inline constexpr size_t kOffSender = 16;
inline constexpr size_t kOffReplica = 20;
inline constexpr size_t kOffClock = 24;
inline constexpr size_t kOffEpoch = 32;
inline constexpr size_t kOffMatrices = 36;
inline constexpr size_t kOffColumns = 40;
inline constexpr size_t kOffDtype = 44;
inline constexpr size_t kOffReserved1 = 45;  // 3 bytes
inline constexpr size_t kOffPayloadLength = 48;
inline constexpr size_t kOffCrc = 56;
inline constexpr size_t kOffReserved2 = 60;  // 4 bytes

// Matrix table entry field offsets.
inline constexpr size_t kEntParamId = 0;
inline constexpr size_t kEntBiasId = 4;
inline constexpr size_t kEntRows = 8;
inline constexpr size_t kEntCols = 12;
inline constexpr size_t kEntVKind = 16;
inline constexpr size_t kEntCoeffKind = 17;
inline constexpr size_t kEntReserved1 = 18;  // u16
inline constexpr size_t kEntReserved2 = 20;  // u32
inline constexpr size_t kEntNnz = 24;

inline constexpr uint8_t kDtypeF32 = static_cast<uint8_t>(SvDtype::kF32);
inline constexpr uint8_t kDtypeBf16 = static_cast<uint8_t>(SvDtype::kBf16);
inline constexpr uint8_t kVDense = 0;
inline constexpr uint8_t kVSparse = 1;
inline constexpr uint8_t kCoeffPerColumn = 0;
inline constexpr uint8_t kCoeffCore = 1;

// Sparse V is held in an Eigen matrix with 32-bit signed indices.
inline constexpr uint64_t kMaxSparseIndex = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

inline constexpr bool kHostLittleEndian = std::endian::native == std::endian::little;
static_assert(kHostLittleEndian || std::endian::native == std::endian::big, "mixed-endian hosts are not supported");

template <class T>
void putLe(std::byte* p, T v) {
  static_assert(std::is_unsigned_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

template <class T>
T getLe(const std::byte* p) {
  static_assert(std::is_unsigned_v<T>);
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | static_cast<T>(std::to_integer<T>(p[i]) << (8 * i)));
  return v;
}

// One vectorised pass: x * 0 is 0 for finite x and NaN for inf or NaN, and a sum
// is NaN exactly when one of its terms is.
inline bool allFinite(const float* p, size_t count) {
  if (count == 0) return true;
  return !std::isnan((Eigen::Map<const Eigen::ArrayXf>(p, static_cast<Eigen::Index>(count)) * 0.0f).sum());
}

inline size_t firstNonFinite(const float* p, size_t count) {
  size_t i = 0;
  while (i < count && std::isfinite(p[i])) ++i;
  return i;
}

inline bool hasCore(const SvMatrix& m) { return m.core.rows() != 0 || m.core.cols() != 0; }

// A core replaces the per-column coefficients for the bias too, so a matrix with a
// core and a bias carries its own bias coefficients; no other matrix may carry any.
inline bool hasBiasCoeffs(const SvMatrix& m) { return hasCore(m) && m.biasId >= 0; }

}  // namespace orpheus::sv_wire
