// SV batches with bf16 values (--sv-dtype bf16): the encoding halves U and V, a
// rounded batch round-trips bitwise, and every encoder agrees.
#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "tests/support/sv_batches.h"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace orpheus {

namespace {

using Bytes = std::vector<std::byte>;

using testing::makeBatch;

SvBatchExpectation expectation() { return testing::makeExpectation(); }

bool sameBits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }
bool isBf16(float x) { return (std::bit_cast<uint32_t>(x) & 0xffffu) == 0; }

Bytes joined(const SvBatchPieces& p) {
  Bytes out;
  for (const auto& piece : p.pieces) out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

}  // namespace

TEST_CASE("bf16 rounding is to the nearest, ties to even", "[sv_batch][bf16]") {
  CHECK(roundToBf16(1.0f) == 1.0f);
  CHECK(roundToBf16(-0.0f) == 0.0f);
  CHECK(std::signbit(roundToBf16(-0.0f)));
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
  CHECK(roundToBf16(1.0f + 0x1p-8f) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
  CHECK(roundToBf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  CHECK(roundToBf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  const float x = 0.1f;
  CHECK(std::abs(roundToBf16(x) - x) <= x * 0x1p-9f);
  CHECK(isBf16(roundToBf16(x)));
  CHECK(roundToBf16(roundToBf16(x)) == roundToBf16(x));
}

TEST_CASE("a bf16 batch halves U and V and round-trips bitwise", "[sv_batch][bf16]") {
  const SvBatch f32 = makeBatch();
  SvBatch b = f32;
  roundToBf16(b);
  CHECK(b.dtype == SvDtype::kBf16);
  // U and V rounded; coefficients and the core kept.
  CHECK(b.matrices[0].u(1, 2) == roundToBf16(f32.matrices[0].u(1, 2)));
  CHECK(sameBits(b.coeffs.data(), f32.coeffs.data(), 3));
  CHECK(std::signbit(b.matrices[0].vDense(2, 1)));  // -0 stays -0
  CHECK(sameBits(b.matrices[1].core.data(), f32.matrices[1].core.data(), 9));
  const size_t values = 4 * 3 + 5 * 3 + 3 * 3 + 4;  // U, dense V, U, sparse V's values
  CHECK(encodedSize(b) == encodedSize(f32) - 2 * values);

  const Bytes bytes = encode(b);
  CHECK(bytes.size() == encodedSize(b));
  const SvBatch out = decode(bytes, expectation());
  CHECK(out.dtype == SvDtype::kBf16);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(sameBits(out.matrices[i].u.data(), b.matrices[i].u.data(), b.matrices[i].u.size()));
  }
  CHECK(sameBits(out.matrices[0].vDense.data(), b.matrices[0].vDense.data(), 15));
  CHECK(sameBits(out.matrices[1].vSparse.valuePtr(), b.matrices[1].vSparse.valuePtr(), 4));
  CHECK(sameBits(out.matrices[1].core.data(), b.matrices[1].core.data(), 9));
  CHECK(encode(out) == bytes);

  // Encoding an unrounded batch as bf16 rounds it the same way.
  SvBatch marked = f32;
  marked.dtype = SvDtype::kBf16;
  CHECK(encode(marked) == bytes);
}

TEST_CASE("every bf16 encoder writes the same bytes, and views widen them", "[sv_batch][bf16]") {
  SvBatch b = makeBatch();
  roundToBf16(b);
  const Bytes whole = encode(b);
  SvBatchPieces pieces = encodePieces(b, /*scanValues=*/true);
  CHECK(pieces.size == whole.size());
  CHECK(pieces.seal() == storedCrc(whole));
  CHECK(joined(pieces) == whole);
  Bytes into(whole.size(), std::byte{0x55});
  CHECK(encodeInto(b, into.data()) == storedCrc(whole));
  CHECK(into == whole);

  auto owned = std::make_shared<Bytes>(whole);
  const SvBatchView view = decodeView(owned, *owned, expectation());
  CHECK(view.dtype == SvDtype::kBf16);
  CHECK(sameBits(view.matrices[0].u, b.matrices[0].u.data(), 12));
  CHECK(sameBits(view.matrices[1].vValues, b.matrices[1].vSparse.valuePtr(), 4));
  CHECK(encode(toBatch(view)) == whole);
}

TEST_CASE("a bf16 record with a bad dtype, a cut payload or a non-finite value is refused", "[sv_batch][bf16]") {
  SvBatch b = makeBatch();
  roundToBf16(b);
  const Bytes whole = encode(b);
  const auto reseal = [](Bytes bytes) {
    std::memset(bytes.data() + 56, 0, 4);
    const uint32_t crc = crc32c(0, bytes.data(), bytes.size());
    std::memcpy(bytes.data() + 56, &crc, 4);
    return bytes;
  };
  Bytes dtype = whole;
  dtype[44] = std::byte{3};
  CHECK_THROWS_AS(decode(reseal(dtype), expectation()), CorruptRecordError);
  // Read as f32 the payload is too short for the table.
  Bytes f32 = whole;
  f32[44] = std::byte{1};
  CHECK_THROWS_AS(decode(reseal(f32), expectation()), CorruptRecordError);
  // U(0, 0) of matrix 0 as a bf16 infinity (0x7f80), right after the 3 coefficients.
  const size_t u0 = 64 + 2 * 32 + 3 * 4;
  Bytes inf = whole;
  inf[u0] = std::byte{0x80};
  inf[u0 + 1] = std::byte{0x7f};
  try {
    decode(reseal(inf), expectation());
    FAIL("decoded an infinity");
  } catch (const CorruptRecordError& e) {
    CHECK(std::string(e.what()).find("non-finite value inf in U of matrix 0 at row 0, column 0") != std::string::npos);
  }
}
}  // namespace orpheus
