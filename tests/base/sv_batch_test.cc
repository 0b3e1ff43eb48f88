#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/base/rng.h"
#include "engine/base/sv_batch.h"
#include "tests/support/sv_batches.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace orpheus {
namespace {

using testing::kClock;
using testing::kSender;
constexpr size_t kCrcOffset = 56;

using Bytes = std::vector<std::byte>;

using testing::makeBatch;
using testing::makeExpectation;

uint32_t readU32(const Bytes& b, size_t off) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= std::to_integer<uint32_t>(b[off + i]) << (8 * i);
  return v;
}

void writeU32(Bytes& b, size_t off, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) b[off + i] = static_cast<std::byte>(v >> (8 * i));
}

void writeU16(Bytes& b, size_t off, uint16_t v) {
  for (size_t i = 0; i < 2; ++i) b[off + i] = static_cast<std::byte>(v >> (8 * i));
}

// Recomputes the CRC so that a patch is caught by the field checks, not the CRC.
void fixCrc(Bytes& b) {
  writeU32(b, kCrcOffset, 0);
  writeU32(b, kCrcOffset, crc32c(0, b.data(), b.size()));
}

// Payload offsets of makeBatch()'s record.
constexpr size_t kPayload = kSvBatchHeaderBytes + 2 * kSvBatchMatrixEntryBytes;
constexpr size_t kCoeffsAt = kPayload;
constexpr size_t kDenseUAt = kCoeffsAt + 3 * 4;
constexpr size_t kDenseVAt = kDenseUAt + 4 * 3 * 4;
constexpr size_t kSparseUAt = kDenseVAt + 5 * 3 * 4;
constexpr size_t kSparseStartsAt = kSparseUAt + 3 * 3 * 4;
constexpr size_t kSparseRowsAt = kSparseStartsAt + 4 * 8;
constexpr size_t kSparseValuesAt = kSparseRowsAt + 4 * 4;
constexpr size_t kCoreAt = kSparseValuesAt + 4 * 4;
constexpr size_t kRecordBytes = kCoreAt + 3 * 3 * 4;

// The message of the CorruptRecordError decode throws; fails the test if it accepts.
std::string decodeError(const Bytes& bytes, const SvBatchExpectation& expect = makeExpectation()) {
  try {
    decode(bytes, expect);
  } catch (const CorruptRecordError& e) {
    return e.what();
  }
  FAIL("decode accepted a corrupt record");
  return {};
}

void requireNamesSenderAndClock(const std::string& msg) {
  INFO(msg);
  CHECK(msg.find("rank 3") != std::string::npos);
  CHECK(msg.find("clock 17") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
}

bool sameBits(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

bool sameBits(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && sameBits(a.data(), b.data(), a.size());
}

}  // namespace

TEST_CASE("crc32c matches the standard check value and chains", "[crc32c]") {
  const char* check = "123456789";
  CHECK(crc32c(0, check, 9) == 0xE3069283u);
  CHECK(crc32c(0, nullptr, 0) == 0u);
  for (size_t split = 0; split <= 9; ++split) {
    CHECK(crc32c(crc32c(0, check, split), check + split, 9 - split) == 0xE3069283u);
  }
  // 32 zero bytes: the iSCSI test vector (RFC 3720 B.4).
  const std::vector<unsigned char> zeros(32, 0);
  CHECK(crc32c(0, zeros.data(), zeros.size()) == 0x8A9136AAu);

  // Long inputs take the multi-stream path; every split and offset must agree with
  // the bytewise definition.
  CounterRng rng(1, RngPurpose::kTest, 0, 0);
  std::vector<unsigned char> data(3 * 8192 * 2 + 3 * 256 + 77);
  for (auto& c : data) c = static_cast<unsigned char>(rng.nextU64());
  uint32_t bitwise = 0xFFFFFFFFu;
  for (unsigned char c : data) {
    bitwise ^= c;
    for (int k = 0; k < 8; ++k) bitwise = (bitwise & 1) ? (bitwise >> 1) ^ 0x82F63B78u : bitwise >> 1;
  }
  bitwise = ~bitwise;
  CHECK(crc32c(0, data.data(), data.size()) == bitwise);
  for (int t = 0; t < 50; ++t) {
    const size_t a = rng.uniformInt(data.size() + 1);
    const size_t b = a + rng.uniformInt(data.size() - a + 1);
    const uint32_t c =
        crc32c(crc32c(crc32c(0, data.data(), a), data.data() + a, b - a), data.data() + b, data.size() - b);
    CHECK(c == bitwise);
  }
}

TEST_CASE("crc32c of a concatenation from the parts' CRCs", "[crc32c]") {
  std::vector<unsigned char> bytes(70000);
  uint32_t state = 12345;
  for (auto& b : bytes) b = static_cast<unsigned char>((state = state * 1103515245u + 12345u) >> 24);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{69999}, size_t{70000}}) {
    const uint32_t a = crc32c(0, bytes.data(), cut);
    const uint32_t b = crc32c(0, bytes.data() + cut, bytes.size() - cut);
    CHECK(crc32cCombine(a, b, bytes.size() - cut) == crc32c(0, bytes.data(), bytes.size()));
  }
}

TEST_CASE("SV batch round trip is bit-exact", "[sv_batch]") {
  const SvBatch in = makeBatch();
  const Bytes bytes = encode(in);
  CHECK(bytes.size() == kRecordBytes);
  CHECK(encodedSize(in) == bytes.size());
  CHECK(readU32(bytes, 0) == kSvBatchMagic);
  CHECK(std::memcmp(bytes.data(), "ORSV", 4) == 0);

  const SvBatch out = decode(bytes, makeExpectation());
  CHECK(out.header.jobId == in.header.jobId);
  CHECK(out.header.sender == in.header.sender);
  CHECK(out.header.replica == in.header.replica);
  CHECK(out.header.clock == in.header.clock);
  CHECK(out.header.epoch == in.header.epoch);
  REQUIRE(out.coeffs.size() == 3);
  CHECK(sameBits(out.coeffs.data(), in.coeffs.data(), 3));
  REQUIRE(out.matrices.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const SvMatrix& a = in.matrices[i];
    const SvMatrix& b = out.matrices[i];
    CHECK(b.paramId == a.paramId);
    CHECK(b.biasId == a.biasId);
    CHECK(sameBits(b.u, a.u));
    CHECK(b.sparseV == a.sparseV);
    CHECK(sameBits(b.core, a.core));
    if (a.sparseV) {
      REQUIRE(b.vSparse.rows() == a.vSparse.rows());
      REQUIRE(b.vSparse.cols() == a.vSparse.cols());
      REQUIRE(b.vSparse.nonZeros() == a.vSparse.nonZeros());
      CHECK(std::equal(a.vSparse.outerIndexPtr(), a.vSparse.outerIndexPtr() + 4, b.vSparse.outerIndexPtr()));
      CHECK(std::equal(a.vSparse.innerIndexPtr(), a.vSparse.innerIndexPtr() + 4, b.vSparse.innerIndexPtr()));
      CHECK(sameBits(a.vSparse.valuePtr(), b.vSparse.valuePtr(), 4));
    } else {
      CHECK(sameBits(b.vDense, a.vDense));
    }
  }
  CHECK(std::signbit(out.matrices[0].vDense(2, 1)));
  CHECK(encode(out) == bytes);

  // Without an expectation the header supplies sender and clock.
  CHECK(decode(bytes).header.sender == kSender);

  // encode appends.
  Bytes appended = {std::byte{0xAB}};
  encode(in, appended);
  REQUIRE(appended.size() == 1 + bytes.size());
  CHECK(std::equal(bytes.begin(), bytes.end(), appended.begin() + 1));
}

TEST_CASE("SV batch encodes an uncompressed sparse V like its compressed form", "[sv_batch]") {
  SvBatch b = makeBatch();
  const Bytes compressed = encode(b);
  SparseMatrix& s = b.matrices[1].vSparse;
  s.uncompress();
  s.reserve(Eigen::VectorXi::Constant(3, 4));  // leaves gaps between columns
  REQUIRE_FALSE(s.isCompressed());
  CHECK(encodedSize(b) == compressed.size());
  CHECK(encode(b) == compressed);
}

TEST_CASE("SV batch with no columns or no matrices round-trips", "[sv_batch]") {
  SvBatch b;
  b.header.sender = kSender;
  b.header.clock = kClock;
  CHECK(decode(encode(b)).matrices.empty());

  SvMatrix m;
  m.u = Matrix(4, 0);
  m.vDense = Matrix(5, 0);
  b.matrices.push_back(m);
  const Bytes bytes = encode(b);
  CHECK(bytes.size() == encodedSize(b));
  const SvBatch out = decode(bytes, {.sender = kSender, .clock = kClock, .paramShapes = {{4, 5}}});
  REQUIRE(out.matrices.size() == 1);
  CHECK(out.matrices[0].u.rows() == 4);
  CHECK(out.matrices[0].vDense.rows() == 5);
}

TEST_CASE("SV batch encode rejects inconsistent batches", "[sv_batch]") {
  auto encodeMutated = [](auto mutate) {
    SvBatch b = makeBatch();
    mutate(b);
    return encode(b);
  };
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[0].u = Matrix::Zero(4, 2); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[0].vDense = Matrix::Zero(5, 4); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].vSparse = SparseMatrix(6, 2); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].core = Matrix::Zero(3, 2); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[0].biasId = -2; }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[0].biasId = 0; }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.coeffs[1] = std::numeric_limits<float>::infinity(); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[0].u(1, 1) = std::nanf(""); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[0].vDense(4, 2) = std::nanf(""); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].vSparse.coeffRef(5, 2) = std::nanf(""); }), Error);
  CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].core(2, 2) = -std::numeric_limits<float>::infinity(); }),
                  Error);
}

// makeBatch() with a bias (param 3, 3x1) on the cored sparse matrix: its record
// gains n bias coefficients after the core.
SvBatch makeBiasCoreBatch() {
  SvBatch b = makeBatch();
  b.matrices[1].biasId = 3;
  b.matrices[1].biasCoeffs = Vector(3);
  b.matrices[1].biasCoeffs << 0.25f, -0.0f, -4.5f;
  return b;
}

SvBatchExpectation makeBiasCoreExpectation() {
  SvBatchExpectation e = makeExpectation();
  e.paramShapes.push_back({3, 1});
  return e;
}

TEST_CASE("SV batch carries bias coefficients with a core and a bias", "[sv_batch]") {
  // Records without them are unchanged.
  const SvBatch plain = decode(encode(makeBatch()), makeExpectation());
  CHECK(plain.matrices[0].biasCoeffs.size() == 0);
  CHECK(plain.matrices[1].biasCoeffs.size() == 0);

  const SvBatch in = makeBiasCoreBatch();
  const Bytes bytes = encode(in);
  constexpr size_t kBiasCoeffsAt = kRecordBytes;
  REQUIRE(bytes.size() == kRecordBytes + 3 * 4);
  CHECK(encodedSize(in) == bytes.size());
  CHECK(std::memcmp(bytes.data() + kBiasCoeffsAt, in.matrices[1].biasCoeffs.data(), 12) == 0);
  const Bytes plainBytes = encode(makeBatch());
  // Everything before them is the core-only record but the bias id, the payload length and the CRC.
  CHECK(std::equal(bytes.begin() + kPayload, bytes.begin() + kRecordBytes, plainBytes.begin() + kPayload));

  const SvBatch out = decode(bytes, makeBiasCoreExpectation());
  REQUIRE(out.matrices.size() == 2);
  CHECK(out.matrices[1].biasId == 3);
  REQUIRE(out.matrices[1].biasCoeffs.size() == 3);
  CHECK(sameBits(out.matrices[1].biasCoeffs.data(), in.matrices[1].biasCoeffs.data(), 3));
  CHECK(std::signbit(out.matrices[1].biasCoeffs[1]));
  CHECK(sameBits(out.matrices[1].core, in.matrices[1].core));
  CHECK(out.matrices[0].biasCoeffs.size() == 0);  // a bias without a core uses the per-column coeffs
  CHECK(encode(out) == bytes);

  SECTION("encode requires them exactly where a core meets a bias") {
    auto encodeMutated = [](auto mutate) {
      SvBatch b = makeBiasCoreBatch();
      mutate(b);
      return encode(b);
    };
    CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].biasCoeffs.resize(0); }), Error);
    CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].biasCoeffs = Vector::Ones(2); }), Error);
    CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].biasCoeffs[2] = std::nanf(""); }), Error);
    CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[1].biasId = -1; }), Error);  // core, no bias
    CHECK_THROWS_AS(encodeMutated([](SvBatch& b) { b.matrices[0].biasCoeffs = Vector::Ones(3); }), Error);  // no core
  }

  SECTION("decode rejects non-finite, missing and surplus bias coefficients") {
    Bytes nan = bytes;
    writeU32(nan, kBiasCoeffsAt + 8, 0x7FC00000u);
    fixCrc(nan);
    std::string msg = decodeError(nan, makeBiasCoreExpectation());
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("non-finite value nan in bias coefficients of matrix 1 at row 2") != std::string::npos);

    Bytes shorter(bytes.begin(), bytes.end() - 12);
    fixCrc(shorter);
    requireNamesSenderAndClock(decodeError(shorter, makeBiasCoreExpectation()));

    // The table says "no bias" but the coefficients are still there: the sizes disagree.
    Bytes noBias = bytes;
    writeU32(noBias, kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes + 4, 0xFFFFFFFFu);
    fixCrc(noBias);
    msg = decodeError(noBias, makeExpectation());
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("payload") != std::string::npos);

    // A bias named on the cored matrix of a record that has no coefficients for it.
    Bytes plainWithBias = plainBytes;
    writeU32(plainWithBias, kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes + 4, 3);
    fixCrc(plainWithBias);
    requireNamesSenderAndClock(decodeError(plainWithBias, makeBiasCoreExpectation()));
  }
}

Bytes joined(const SvBatchPieces& p) {
  Bytes out;
  for (const auto& piece : p.pieces) out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

TEST_CASE("SV batch pieces are the encoding, without copying the arrays", "[sv_batch]") {
  std::vector<SvBatch> batches = {makeBatch(), makeBiasCoreBatch(), makeBatch(), SvBatch{}};
  batches[2].matrices[1].vSparse.uncompress();
  batches[2].matrices[1].vSparse.reserve(Eigen::VectorXi::Constant(3, 4));
  batches[3].header.clock = 3;
  for (const SvBatch& b : batches) {
    const Bytes whole = encode(b);
    SvBatchPieces p = encodePieces(b);
    CHECK(p.size == whole.size());
    CHECK(p.seal() == storedCrc(whole));
    CHECK(joined(p) == whole);
    CHECK(computedCrc(whole) == storedCrc(whole));
    CHECK(wholeRecordCrc(storedCrc(whole), whole.size()) == crc32c(0, whole.data(), whole.size()));
    // The large arrays are referenced, not copied.
    if (!b.matrices.empty()) {
      const auto* u = reinterpret_cast<const std::byte*>(b.matrices[0].u.data());
      CHECK(std::any_of(p.pieces.begin(), p.pieces.end(), [&](const auto& piece) { return piece.data() == u; }));
    }
    Bytes into(whole.size(), std::byte{0x77});
    CHECK(encodeInto(b, into.data()) == storedCrc(whole));
    CHECK(into == whole);
    // Moving the pieces keeps them valid.
    SvBatchPieces moved = std::move(p);
    CHECK(joined(moved) == whole);
  }
  Bytes bad = encode(makeBatch());
  bad[100] ^= std::byte{1};
  CHECK(computedCrc(bad) != storedCrc(bad));
}

TEST_CASE("SV batch decode rejects corrupt records naming sender and clock", "[sv_batch]") {
  const Bytes good = encode(makeBatch());
  REQUIRE_NOTHROW(decode(good, makeExpectation()));

  SECTION("flipped payload byte fails the CRC") {
    Bytes b = good;
    b[kDenseVAt + 5] ^= std::byte{0x10};
    const std::string msg = decodeError(b);
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("CRC32C mismatch") != std::string::npos);
    // Without an expectation the names come from the header.
    requireNamesSenderAndClock(decodeError(b, {}));
  }

  SECTION("truncated records") {
    for (size_t len : {size_t{0}, size_t{1}, size_t{4}, size_t{40}, size_t{63}, size_t{64}, size_t{100}, kPayload,
                       kPayload + 1, good.size() / 2, good.size() - 1}) {
      const Bytes b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
      INFO("length " << len);
      requireNamesSenderAndClock(decodeError(b));
    }
    // A trailing byte is as wrong as a missing one.
    Bytes longer = good;
    longer.push_back(std::byte{0});
    requireNamesSenderAndClock(decodeError(longer));
  }

  SECTION("wrong magic") {
    Bytes b = good;
    b[0] = std::byte{'X'};
    fixCrc(b);
    const std::string msg = decodeError(b);
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("magic") != std::string::npos);
  }

  SECTION("wrong version") {
    Bytes b = good;
    writeU16(b, 4, 2);
    fixCrc(b);
    const std::string msg = decodeError(b);
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("version 2") != std::string::npos);
  }

  SECTION("non-zero flags, dtype and reserved bytes") {
    for (size_t off : {size_t{6}, size_t{44}, size_t{45}, size_t{47}, size_t{60}, size_t{63}}) {
      Bytes b = good;
      b[off] ^= std::byte{0x02};
      fixCrc(b);
      INFO("offset " << off);
      requireNamesSenderAndClock(decodeError(b));
    }
  }

  SECTION("NaN in a value is caught by the finiteness check, not the CRC") {
    for (size_t off : {kCoeffsAt + 4, kDenseUAt + 8, kDenseVAt, kSparseValuesAt + 12, kCoreAt + 32}) {
      Bytes b = good;
      writeU32(b, off, 0x7FC00000u);
      fixCrc(b);
      const std::string msg = decodeError(b);
      INFO("offset " << off);
      requireNamesSenderAndClock(msg);
      CHECK(msg.find("non-finite") != std::string::npos);
    }
    Bytes b = good;
    writeU32(b, kDenseUAt, 0x7F800000u);  // +inf
    fixCrc(b);
    CHECK(decodeError(b).find("non-finite value inf in U of matrix 0 at row 0, column 0") != std::string::npos);
  }

  SECTION("sparse row index out of range") {
    Bytes b = good;
    REQUIRE(readU32(b, kSparseRowsAt + 4) == 4);
    writeU32(b, kSparseRowsAt + 4, 6);  // V has 6 rows
    fixCrc(b);
    const std::string msg = decodeError(b);
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("row index 6") != std::string::npos);
  }

  SECTION("sparse row indices out of order") {
    Bytes b = good;
    writeU32(b, kSparseRowsAt + 4, 0);  // column 0 becomes {0, 0}
    fixCrc(b);
    requireNamesSenderAndClock(decodeError(b));
  }

  SECTION("sparse column starts inconsistent") {
    Bytes b = good;
    b[kSparseStartsAt + 8] = std::byte{3};  // column 1 starts after column 2's
    fixCrc(b);
    requireNamesSenderAndClock(decodeError(b));
    Bytes c = good;
    c[kSparseStartsAt] = std::byte{1};  // column 0 not at 0
    fixCrc(c);
    requireNamesSenderAndClock(decodeError(c));
  }

  SECTION("unknown V and coefficient kinds") {
    for (size_t off : {kSvBatchHeaderBytes + 16, kSvBatchHeaderBytes + 17, kSvBatchHeaderBytes + 18,
                       kSvBatchHeaderBytes + 32 + 20}) {
      Bytes b = good;
      b[off] = std::byte{7};
      fixCrc(b);
      INFO("offset " << off);
      requireNamesSenderAndClock(decodeError(b));
    }
  }

  SECTION("shape mismatch against the model") {
    SvBatchExpectation e = makeExpectation();
    e.paramShapes[0] = {4, 6};
    const std::string msg = decodeError(good, e);
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("matrix 0 has shape 4x5, model expects 4x6") != std::string::npos);

    e = makeExpectation();
    e.paramShapes[1] = {4, 2};  // bias must be 4x1
    requireNamesSenderAndClock(decodeError(good, e));

    e = makeExpectation();
    e.paramShapes.pop_back();  // param 2 unknown
    requireNamesSenderAndClock(decodeError(good, e));
  }

  SECTION("sender and clock mismatch against the expectation") {
    SvBatchExpectation e = makeExpectation();
    SvBatch other = makeBatch();
    other.header.sender = 5;
    std::string msg = decodeError(encode(other), e);
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("sender rank 5") != std::string::npos);

    other = makeBatch();
    other.header.clock = 18;
    msg = decodeError(encode(other), e);
    requireNamesSenderAndClock(msg);
    CHECK(msg.find("clock 18") != std::string::npos);
  }
}

TEST_CASE("SV batch decode survives random corruption", "[sv_batch][fuzz]") {
  const Bytes good = encode(makeBatch());
  const SvBatchExpectation withShapes = makeExpectation();
  const SvBatchExpectation none;
  CounterRng rng(2024, RngPurpose::kTest, 0, 0);
  int accepted = 0;
  int rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    Bytes b = good;
    const uint64_t kind = rng.uniformInt(4);
    if (kind == 0) {
      b.resize(rng.uniformInt(good.size()));
    } else if (kind == 1) {
      b.resize(good.size() + 1 + rng.uniformInt(64));
    } else {
      const uint64_t flips = 1 + rng.uniformInt(4);
      for (uint64_t f = 0; f < flips; ++f) {
        // Bias mutations towards the header and table, where the structure is.
        const size_t limit = rng.uniformInt(2) == 0 ? kPayload : good.size();
        b[rng.uniformInt(limit)] = static_cast<std::byte>(rng.nextU64());
      }
    }
    // Half the records get a valid CRC so that the structural checks are reached.
    if (b.size() >= kSvBatchHeaderBytes && rng.uniformInt(2) == 0) fixCrc(b);
    const SvBatchExpectation& expect = rng.uniformInt(2) == 0 ? withShapes : none;
    try {
      const SvBatch out = decode(b, expect);
      ++accepted;
      // Anything accepted must be a canonical record.
      CHECK(encode(out) == b);
    } catch (const CorruptRecordError& e) {
      ++rejected;
      const std::string msg = e.what();
      CHECK(msg.rfind("corrupt SV batch from rank ", 0) == 0);
    }
  }
  CHECK(rejected > 0);
  CHECK(accepted > 0);
}

}  // namespace orpheus

namespace orpheus {
namespace {

bool within(const void* p, const Bytes& b) {
  const auto* q = static_cast<const std::byte*>(p);
  return q >= b.data() && q < b.data() + b.size();
}

TEST_CASE("SV batch decodes as views into its record, as decode does", "[sv_batch]") {
  std::vector<std::pair<SvBatch, SvBatchExpectation>> cases = {{makeBatch(), makeExpectation()},
                                                                {makeBiasCoreBatch(), makeBiasCoreExpectation()},
                                                                {SvBatch{}, SvBatchExpectation{}}};
  for (const auto& [batch, expect] : cases) {
    const auto record = std::make_shared<const Bytes>(encode(batch));
    const SvBatchView view = decodeView(record, *record, expect);
    CHECK(view.owner != nullptr);
    REQUIRE(view.matrices.size() == batch.matrices.size());
    if (!batch.matrices.empty()) {
      // Read where they lie: no copy of the arrays.
      CHECK(within(view.coeffs, *record));
      CHECK(within(view.matrices[0].u, *record));
      CHECK(within(view.matrices[0].vDense, *record));
    }
    // What the views say is the batch, bit for bit.
    const SvBatch copied = toBatch(view);
    CHECK(encode(copied) == *record);
    CHECK(encode(decode(*record, expect)) == *record);
    CHECK(encode(toBatch(viewOf(batch))) == *record);
  }
  // Sparse V: the values and row indices in the record, the column starts made.
  const auto record = std::make_shared<const Bytes>(encode(makeBatch()));
  const SvBatchView view = decodeView(record, *record, makeExpectation());
  const SvMatrixView& sparse = view.matrices[1];
  REQUIRE(sparse.sparseV);
  CHECK(within(sparse.vValues, *record));
  CHECK(within(sparse.vRowIndices, *record));
  CHECK_FALSE(within(sparse.vStarts, *record));
  CHECK(sparse.vSparseMap().nonZeros() == 4);
  CHECK(sparse.vSparseMap().coeff(5, 2) == 3.25f);
}

TEST_CASE("SV batch views reject a record with any byte changed", "[sv_batch]") {
  const Bytes good = encode(makeBatch());
  REQUIRE_NOTHROW(decodeView(nullptr, good, makeExpectation()));
  // The CRC covers every byte: header, table and every array of the payload.
  for (size_t i = 0; i < good.size(); ++i) {
    Bytes bad = good;
    bad[i] ^= std::byte{0x04};
    CHECK_THROWS_AS(decodeView(nullptr, bad, makeExpectation()), CorruptRecordError);
  }
}

TEST_CASE("SV batch pieces of a layer are the encoding of that layer's batch", "[sv_batch]") {
  const SvBatch whole = makeBatch();
  for (size_t i = 0; i < whole.matrices.size(); ++i) {
    SvBatch layer;
    layer.header = whole.header;
    layer.coeffs = whole.coeffs;
    layer.matrices.push_back(whole.matrices[i]);
    const SvMatrix* matrices[] = {&whole.matrices[i]};
    SvBatchPieces p = encodePieces(whole.header, whole.coeffs, matrices, /*scanValues=*/true);
    const Bytes expected = encode(layer);
    CHECK(p.seal() == storedCrc(expected));
    CHECK(joined(p) == expected);
    const auto* u = reinterpret_cast<const std::byte*>(whole.matrices[i].u.data());
    CHECK(std::any_of(p.pieces.begin(), p.pieces.end(), [&](const auto& piece) { return piece.data() == u; }));
  }
  // Scanning refuses what encode refuses.
  SvBatch bad = makeBatch();
  bad.matrices[0].u(1, 1) = std::numeric_limits<float>::infinity();
  const SvMatrix* matrices[] = {&bad.matrices[0]};
  CHECK_THROWS_AS(encodePieces(bad.header, bad.coeffs, matrices, /*scanValues=*/true), Error);
  CHECK_NOTHROW(encodePieces(bad.header, bad.coeffs, matrices));
}

}  // namespace
}  // namespace orpheus
