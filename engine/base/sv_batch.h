// The SV batch: the one record of the system. It is what a worker sends at a
// clock and what the checkpoint log stores.
//
// Columnar per parameter matrix W (J x K) for the n SVGs (one per example) of a
// batch: U (J x n), V (K x n, dense or sparse) and the coefficients that say how
// the columns combine. The update a batch stands for is, for every matrix,
//     W += U * diag(coeffs) * V^T        (per-column coefficients), or
//     W += U * core * V^T                (an n x n core, after selection)
// and, when the matrix has a bias vector b, b += U * diag(coeffs) * 1, or with a
// core b += U * biasCoeffs: the bias is updated from the same SVs.
//
// Wire format, little-endian, all offsets in bytes:
//   header (64 bytes)
//     0  magic "ORSV"            4  version u16 (=1)      6  flags u16 (=0)
//     8  job id u64             16  sender u32           20  replica u32
//    24  clock u64              32  epoch u32            36  matrices u32
//    40  columns n u32          44  dtype u8             45  reserved (3 bytes, zero)
//    48  payload length u64     56  crc32c u32 of header (crc field zero) + table + payload
//    60  reserved u32 (zero)
//   matrix table, 32 bytes per matrix
//     0 param id u32   4 bias id i32 (-1 none)   8 rows J u32   12 cols K u32
//    16 v kind u8 (0 dense, 1 sparse)   17 coeff kind u8 (0 per column, 1 core)
//    18 reserved u16   20 reserved u32   24 nnz of V u64 (dense: K*n)
//   payload (V below: U, dense V and sparse V's values, in the dtype's width: f32
//   for dtype 1, bf16 (the upper 16 bits of an f32) for dtype 2; everything
//   else is always f32)
//     coeffs: n f32
//     per matrix, in table order:
//       U: J*n V, column-major
//       V dense: K*n V, column-major | V sparse (CSC): n+1 u64 column starts,
//         nnz u32 row indices (strictly increasing within a column), nnz V values
//       core (coeff kind 1 only): n*n f32, column-major
//       bias coefficients (coeff kind 1 and bias id >= 0 only): n f32
// Decoding validates every field, the CRC, index ranges and that all values are
// finite; any violation is a CorruptRecordError naming sender and clock.
#pragma once

#include "engine/base/params.h"

#include <Eigen/SparseCore>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace orpheus {

using SparseMatrix = Eigen::SparseMatrix<float, Eigen::ColMajor, int32_t>;

inline constexpr uint32_t kSvBatchMagic = 0x5653524fu;  // "ORSV" read little-endian
inline constexpr uint16_t kSvBatchVersion = 1;
inline constexpr size_t kSvBatchHeaderBytes = 64;
inline constexpr size_t kSvBatchMatrixEntryBytes = 32;

// How a batch's SV values (U, V) are encoded: f32, or bf16 (--sv-dtype bf16:
// half the bytes; a receiver widens them back to f32 exactly). Coefficients,
// cores and bias coefficients are always f32.
enum class SvDtype : uint8_t { kF32 = 1, kBf16 = 2 };
const char* svDtypeName(SvDtype dtype);
// Rounds every U and V value of `batch` to the nearest bf16 (ties to even) in
// place and marks the batch kBf16, so that its encoding is exact: what a
// receiver decodes is bitwise what the sender holds. Idempotent.
struct SvBatch;
void roundToBf16(SvBatch& batch);
// The nearest bf16 of x (ties to even), as an f32.
float roundToBf16(float x);

// SVs of one parameter matrix for the n SVGs of a batch.
struct SvMatrix {
  uint32_t paramId = 0;  // index of W in the model's ParamSet
  int32_t biasId = -1;   // index of a bias vector (J x 1) updated from U, or -1
  Matrix u;              // J x n
  bool sparseV = false;
  Matrix vDense;         // K x n when !sparseV
  SparseMatrix vSparse;  // K x n when sparseV
  Matrix core;           // n x n, or empty: then the batch's per-column coeffs apply
  Vector biasCoeffs;     // n, with a core and a bias: b += U * biasCoeffs

  int64_t vRows() const { return sparseV ? vSparse.rows() : vDense.rows(); }
  int64_t vCols() const { return sparseV ? vSparse.cols() : vDense.cols(); }
};

struct SvBatchHeader {
  uint64_t jobId = 0;
  uint32_t sender = 0;   // rank that produced the batch
  uint32_t replica = 0;  // replica the SVs were computed on
  uint64_t clock = 0;
  uint32_t epoch = 0;    // membership epoch
};

struct SvBatch {
  SvBatchHeader header;
  Vector coeffs;                  // n per-column coefficients (used where a matrix has no core)
  std::vector<SvMatrix> matrices;
  // How every encoder writes U and V; kBf16 rounds any value that is not a bf16
  // value already (roundToBf16 makes them all exact).
  SvDtype dtype = SvDtype::kF32;

  int64_t numColumns() const { return coeffs.size(); }
};

// A batch whose arrays live elsewhere: views into a received record (decodeView)
// or into an SvBatch (viewOf). The rebuild reads batches through views, so a
// received batch goes from the receive buffer to the GEMM without a copy. The
// memory viewed must stay alive and unchanged while the view is used; `owner`
// (when set) keeps it alive. Views are cheap to copy and share what they view.
struct SvMatrixView {
  uint32_t paramId = 0;
  int32_t biasId = -1;
  int64_t rows = 0;     // J
  int64_t vRows = 0;    // K
  int64_t columns = 0;  // n
  const float* u = nullptr;  // J x n, column-major
  bool sparseV = false;
  const float* vDense = nullptr;  // K x n, column-major
  // Sparse V in CSC: column starts (n + 1 of them; with per-column counts, an
  // uncompressed matrix's n starts), row indices and values of nnz entries.
  const int32_t* vStarts = nullptr;
  const int32_t* vCounts = nullptr;  // null when compressed
  const int32_t* vRowIndices = nullptr;
  const float* vValues = nullptr;
  int64_t nnz = 0;
  bool withCore = false;              // an n x n core replaces the per-column coefficients
  const float* core = nullptr;        // n x n, column-major, when withCore
  const float* biasCoeffs = nullptr;  // n, when withCore and biasId >= 0

  Eigen::Map<const Matrix> uMap() const { return Eigen::Map<const Matrix>(u, rows, columns); }
  Eigen::Map<const Matrix> vDenseMap() const { return Eigen::Map<const Matrix>(vDense, vRows, columns); }
  Eigen::Map<const SparseMatrix> vSparseMap() const {
    return Eigen::Map<const SparseMatrix>(vRows, columns, nnz, vStarts, vRowIndices, vValues, vCounts);
  }
  Eigen::Map<const Matrix> coreMap() const { return Eigen::Map<const Matrix>(core, columns, columns); }
  Eigen::Map<const Vector> biasCoeffsMap() const {
    return Eigen::Map<const Vector>(biasCoeffs, biasCoeffs ? columns : 0);
  }
};

struct SvBatchView {
  SvBatchHeader header;
  SvDtype dtype = SvDtype::kF32;  // as the record was encoded (the views hold f32)
  int64_t columns = 0;
  const float* coeffs = nullptr;  // n per-column coefficients
  std::vector<SvMatrixView> matrices;
  std::shared_ptr<const void> owner;

  int64_t numColumns() const { return columns; }
  Eigen::Map<const Vector> coeffsMap() const { return Eigen::Map<const Vector>(coeffs, columns); }
};

// Views of `batch`'s arrays; the batch must outlive the view (or be its owner).
SvBatchView viewOf(const SvBatch& batch);
SvMatrixView viewOf(const SvMatrix& matrix);
SvBatchView viewOf(std::shared_ptr<const SvBatch> batch);
// The viewed batch as an SvBatch of its own (a copy of every array).
SvBatch toBatch(const SvBatchView& view);

// What the receiver knows independently of the bytes; used to validate them.
struct SvBatchExpectation {
  int64_t sender = -1;  // rank the bytes arrived from, or -1 if unknown
  int64_t clock = -1;   // clock the receiver waits for, or -1 for any
  // Shapes (rows, cols) of the model's parameters indexed by param id; when non-empty,
  // every matrix and bias id must refer to one of them with matching shape.
  std::vector<std::pair<int64_t, int64_t>> paramShapes;
};

// Exact size in bytes of encode(batch).
size_t encodedSize(const SvBatch& batch);

// Appends the encoded batch to out. Throws Error if the batch is inconsistent
// (shapes disagree with n, non-finite values).
void encode(const SvBatch& batch, std::vector<std::byte>& out);
std::vector<std::byte> encode(const SvBatch& batch);

// The encoding of `batch` without copying its arrays: `pieces`, written one after
// another, are exactly encode(batch). The header, the matrix table and the column
// starts of sparse V are built in `head`; every other piece points into the batch,
// which must outlive the pieces and stay unchanged. The CRC is left to seal().
// Shapes are checked as by encode; values are not scanned (the batch was applied).
struct SvBatchPieces {
  SvBatchPieces() = default;
  SvBatchPieces(SvBatchPieces&&) = default;  // the pieces stay valid: vectors keep their storage when moved
  SvBatchPieces& operator=(SvBatchPieces&&) = default;
  SvBatchPieces(const SvBatchPieces&) = delete;
  SvBatchPieces& operator=(const SvBatchPieces&) = delete;

  std::vector<std::byte> head;
  std::vector<std::span<const std::byte>> pieces;
  size_t size = 0;
  // Computes the record's CRC32C over the pieces, stores it in the header and returns it.
  uint32_t seal();
};
// `scanValues`: also refuse non-finite values, as encode does (a batch to be sent).
SvBatchPieces encodePieces(const SvBatch& batch, bool scanValues = false);
// encodePieces of the batch of `matrices` (in this order) with `header` and the
// per-column coefficients `coeffs`: a part of a batch (one layer), without
// gathering its matrices into an SvBatch first.
SvBatchPieces encodePieces(const SvBatchHeader& header, const Vector& coeffs,
                           std::span<const SvMatrix* const> matrices, bool scanValues = false);
// Writes encode(batch) to `out` (encodedSize(batch) bytes) in one pass: each piece
// is checksummed right after it is copied, while it is in cache. Values are not
// scanned, as for encodePieces. Returns the CRC (also stored in the header).
uint32_t encodeInto(const SvBatch& batch, std::byte* out);
// memcpy whose stores bypass the cache where the CPU allows, for a copy that is
// only read much later (written to disk): it neither waits for the destination's
// lines nor pushes the caller's working set out of the cache.
void streamCopy(std::byte* out, const std::byte* in, size_t size);
// streamCopy of `size` bytes that also returns their CRC32C (continuing `crc`),
// computed from the source while the copy has it in cache.
uint32_t copyWithCrc(const std::byte* in, size_t size, std::byte* out, uint32_t crc = 0);

// The CRC32C a record carries in its header, and the one its bytes have (what
// decode checks). Both need at least a whole header.
uint32_t storedCrc(std::span<const std::byte> record);
uint32_t computedCrc(std::span<const std::byte> record);
// The CRC32C of all of a record's bytes, its CRC field included, from the CRC its
// header carries (when that is right) and its size, without reading the bytes.
uint32_t wholeRecordCrc(uint32_t headerCrc, size_t size);

// Decodes and fully validates one record. Throws CorruptRecordError naming the
// sender and clock (from the expectation when known, else from the header).
SvBatch decode(std::span<const std::byte> bytes, const SvBatchExpectation& expect = {});
// decode, validating exactly as it does, without copying the arrays out: the view
// points into `bytes`, which `owner` (may be null: the caller's) keeps alive. Only
// sparse V's column starts are made (narrowed to the 32-bit indices Eigen uses).
SvBatchView decodeView(std::shared_ptr<const void> owner, std::span<const std::byte> bytes,
                       const SvBatchExpectation& expect = {});

}  // namespace orpheus
