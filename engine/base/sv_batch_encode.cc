// Encoding an SV batch: the one place that lays a record out (see the wire
// format in sv_batch.h), into a vector, a caller's buffer or pieces that point
// into the batch.
#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "engine/base/sv_batch_wire.h"

#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace orpheus {
using namespace sv_wire;

namespace {

// Grows out by n bytes and returns where they start; capacity is reserved up front.
std::byte* grow(std::vector<std::byte>& out, size_t n) {
  const size_t old = out.size();
  out.resize(old + n);
  return out.data() + old;
}

// Appends count 32-bit words (f32 or u32) in their little-endian wire form.
void appendWords(std::vector<std::byte>& out, const void* src, size_t count) {
  if (count == 0) return;
  const auto* s = static_cast<const std::byte*>(src);
  if constexpr (kHostLittleEndian) {
    out.insert(out.end(), s, s + count * 4);
  } else {
    std::byte* dst = grow(out, count * 4);
    for (size_t i = 0; i < count; ++i) {
      uint32_t w;
      std::memcpy(&w, s + 4 * i, 4);
      putLe(dst + 4 * i, w);
    }
  }
}

// Start and length of column j of a sparse matrix, compressed or not.
struct SparseColumns {
  explicit SparseColumns(const SparseMatrix& s)
      : outer(s.outerIndexPtr()), counts(s.innerNonZeroPtr()), compressed(s.isCompressed()) {}
  int64_t begin(int64_t j) const { return outer[j]; }
  int64_t size(int64_t j) const { return counts ? counts[j] : outer[j + 1] - outer[j]; }

  const int32_t* outer;
  const int32_t* counts;  // per-column counts when not compressed, else null
  bool compressed;
};

// A batch as the encoder reads it: a header, per-column coefficients and matrices
// that need not be gathered in one SvBatch (a layer of a batch is sent as is).
class Parts {
 public:
  class Matrices {
   public:
    class Iterator {
     public:
      explicit Iterator(const SvMatrix* const* p) : p_(p) {}
      const SvMatrix& operator*() const { return **p_; }
      Iterator& operator++() {
        ++p_;
        return *this;
      }
      bool operator!=(const Iterator& o) const { return p_ != o.p_; }

     private:
      const SvMatrix* const* p_;
    };
    explicit Matrices(std::span<const SvMatrix* const> m) : m_(m) {}
    Iterator begin() const { return Iterator(m_.data()); }
    Iterator end() const { return Iterator(m_.data() + m_.size()); }
    size_t size() const { return m_.size(); }
    const SvMatrix& operator[](size_t i) const { return *m_[i]; }

   private:
    std::span<const SvMatrix* const> m_;
  };

  Parts(const SvBatchHeader& header, const Vector& coeffs, std::span<const SvMatrix* const> matrices,
        SvDtype dtype = SvDtype::kF32)
      : header(header), coeffs(coeffs), matrices(matrices), dtype(dtype) {}
  int64_t numColumns() const { return coeffs.size(); }
  // Bytes of one U or V value on the wire.
  size_t valueBytes() const { return dtype == SvDtype::kBf16 ? 2 : 4; }

  const SvBatchHeader& header;
  const Vector& coeffs;
  Matrices matrices;
  SvDtype dtype;
};

// The batch's SV arrays (U, dense V, sparse V's values) and their lengths, in record order.
template <class F>
void forEachValueArray(const SvMatrix& m, F&& f) {
  f(m.u.data(), static_cast<size_t>(m.u.size()));
  if (!m.sparseV) {
    f(m.vDense.data(), static_cast<size_t>(m.vDense.size()));
  } else {
    f(m.vSparse.valuePtr(), static_cast<size_t>(m.vSparse.nonZeros()));
  }
}

// count floats as bf16 (the nearest, ties to even), little-endian u16 each.
void packBf16(std::byte* out, const float* src, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    putLe(out + 2 * i, static_cast<uint16_t>(std::bit_cast<uint32_t>(roundToBf16(src[i])) >> 16));
  }
}

std::vector<const SvMatrix*> pointersTo(const SvBatch& batch) {
  std::vector<const SvMatrix*> out;
  out.reserve(batch.matrices.size());
  for (const SvMatrix& m : batch.matrices) out.push_back(&m);
  return out;
}

void checkForEncode(const Parts& batch, bool scanValues = true) {
  const int64_t n = batch.numColumns();
  ORPHEUS_ENFORCE(static_cast<uint64_t>(n) <= UINT32_MAX, "SV batch has {} columns, more than the wire format allows",
                  n);
  ORPHEUS_ENFORCE(batch.matrices.size() <= UINT32_MAX, "SV batch has {} matrices, more than the wire format allows",
                  batch.matrices.size());
  if (scanValues) {
    const size_t bad = firstNonFinite(batch.coeffs.data(), static_cast<size_t>(n));
    ORPHEUS_ENFORCE(bad == static_cast<size_t>(n), "SV batch coefficient {} is non-finite ({})", bad,
                    bad < static_cast<size_t>(n) ? batch.coeffs[static_cast<Eigen::Index>(bad)] : 0.0f);
  }
  for (size_t i = 0; i < batch.matrices.size(); ++i) {
    const SvMatrix& m = batch.matrices[i];
    ORPHEUS_ENFORCE(m.biasId >= -1, "SV matrix {} has bias id {}", i, m.biasId);
    ORPHEUS_ENFORCE(m.biasId < 0 || static_cast<uint32_t>(m.biasId) != m.paramId,
                    "SV matrix {} uses param {} as its own bias", i, m.paramId);
    ORPHEUS_ENFORCE(m.u.cols() == n, "SV matrix {} has U with {} columns, batch has {}", i, m.u.cols(), n);
    ORPHEUS_ENFORCE(static_cast<uint64_t>(m.u.rows()) <= UINT32_MAX, "SV matrix {} has {} rows", i, m.u.rows());
    ORPHEUS_ENFORCE(m.vCols() == n, "SV matrix {} has V with {} columns, batch has {}", i, m.vCols(), n);
    ORPHEUS_ENFORCE(static_cast<uint64_t>(m.vRows()) <= UINT32_MAX, "SV matrix {} has V with {} rows", i, m.vRows());
    ORPHEUS_ENFORCE(!scanValues || allFinite(m.u.data(), static_cast<size_t>(m.u.size())),
                    "SV matrix {} has a non-finite value in U", i);
    if (m.sparseV) {
      const SparseMatrix& s = m.vSparse;
      const int64_t rows = s.rows();
      ORPHEUS_ENFORCE(static_cast<uint64_t>(rows) <= kMaxSparseIndex, "SV matrix {} has sparse V with {} rows", i,
                      rows);
      const SparseColumns cols(s);
      for (int64_t j = 0; j < n; ++j) {
        const int32_t* idx = s.innerIndexPtr() + cols.begin(j);
        const int64_t count = cols.size(j);
        for (int64_t k = 0; k < count; ++k) {
          ORPHEUS_ENFORCE(idx[k] >= 0 && idx[k] < rows && (k == 0 || idx[k] > idx[k - 1]),
                          "SV matrix {} sparse V column {} has row indices out of range or out of order", i, j);
        }
        ORPHEUS_ENFORCE(!scanValues || allFinite(s.valuePtr() + cols.begin(j), static_cast<size_t>(count)),
                        "SV matrix {} has a non-finite value in sparse V column {}", i, j);
      }
    } else {
      ORPHEUS_ENFORCE(!scanValues || allFinite(m.vDense.data(), static_cast<size_t>(m.vDense.size())),
                      "SV matrix {} has a non-finite value in V", i);
    }
    if (hasCore(m)) {
      ORPHEUS_ENFORCE(m.core.rows() == n && m.core.cols() == n, "SV matrix {} has a {}x{} core, batch has {} columns",
                      i, m.core.rows(), m.core.cols(), n);
      ORPHEUS_ENFORCE(!scanValues || allFinite(m.core.data(), static_cast<size_t>(m.core.size())),
                      "SV matrix {} has a non-finite value in its core", i);
    }
    if (hasBiasCoeffs(m)) {
      ORPHEUS_ENFORCE(m.biasCoeffs.size() == n,
                      "SV matrix {} has a core and a bias but {} bias coefficients, batch has {} columns", i,
                      m.biasCoeffs.size(), n);
      ORPHEUS_ENFORCE(!scanValues || allFinite(m.biasCoeffs.data(), static_cast<size_t>(n)),
                      "SV matrix {} has a non-finite bias coefficient", i);
    } else {
      ORPHEUS_ENFORCE(m.biasCoeffs.size() == 0,
                      "SV matrix {} has {} bias coefficients but {}; they go only with a core and a bias", i,
                      m.biasCoeffs.size(), hasCore(m) ? "no bias" : "no core");
    }
  }
}

size_t encodedSizeOf(const Parts& batch) {
  const auto n = static_cast<size_t>(batch.numColumns());
  const size_t vb = batch.valueBytes();
  size_t size = kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes * batch.matrices.size() + 4 * n;
  for (const SvMatrix& m : batch.matrices) {
    size += vb * static_cast<size_t>(m.u.rows()) * n;
    if (m.sparseV) {
      size += 8 * (n + 1) + (4 + vb) * static_cast<size_t>(m.vSparse.nonZeros());
    } else {
      size += vb * static_cast<size_t>(m.vDense.rows()) * n;
    }
    if (hasCore(m)) size += 4 * n * n;
    if (hasBiasCoeffs(m)) size += 4 * n;
  }
  return size;
}

// Writes the header (CRC zero) and the matrix table of a record of `size` bytes at
// `h`, which holds kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes * matrices zeros.
void writeHead(const Parts& batch, size_t size, std::byte* h) {
  const auto n = static_cast<size_t>(batch.numColumns());
  putLe(h + kOffMagic, kSvBatchMagic);
  putLe(h + kOffVersion, kSvBatchVersion);
  putLe(h + kOffFlags, uint16_t{0});
  putLe(h + kOffJobId, batch.header.jobId);
  putLe(h + kOffSender, batch.header.sender);
  putLe(h + kOffReplica, batch.header.replica);
  putLe(h + kOffClock, batch.header.clock);
  putLe(h + kOffEpoch, batch.header.epoch);
  putLe(h + kOffMatrices, static_cast<uint32_t>(batch.matrices.size()));
  putLe(h + kOffColumns, static_cast<uint32_t>(n));
  putLe(h + kOffDtype, static_cast<uint8_t>(batch.dtype));
  putLe(h + kOffPayloadLength,
        static_cast<uint64_t>(size - kSvBatchHeaderBytes - kSvBatchMatrixEntryBytes * batch.matrices.size()));
  std::byte* e = h + kSvBatchHeaderBytes;
  for (const SvMatrix& m : batch.matrices) {
    putLe(e + kEntParamId, m.paramId);
    putLe(e + kEntBiasId, static_cast<uint32_t>(m.biasId));
    putLe(e + kEntRows, static_cast<uint32_t>(m.u.rows()));
    putLe(e + kEntCols, static_cast<uint32_t>(m.vRows()));
    putLe(e + kEntVKind, m.sparseV ? kVSparse : kVDense);
    putLe(e + kEntCoeffKind, hasCore(m) ? kCoeffCore : kCoeffPerColumn);
    putLe(e + kEntNnz, static_cast<uint64_t>(m.sparseV ? m.vSparse.nonZeros() : m.vDense.size()));
    e += kSvBatchMatrixEntryBytes;
  }
}

// The encoder: the one place that lays a record out (see the wire format in
// sv_batch.h). It hands `sink` the record's pieces in order, either bytes it makes
// itself, sink.build(bytes, fill), where `fill` writes them at a pointer to that
// many zeros (the header and matrix table, the column starts of sparse V), or
// sink.words(data, count): 32-bit words of the batch, in host order. The record is
// `size` bytes; its CRC field is left zero.
template <class Sink>
void writeRecord(const Parts& batch, size_t size, Sink& sink) {
  const auto n = static_cast<size_t>(batch.numColumns());
  // U and V values: the batch's words, or bf16 made here.
  const auto values = [&](const float* data, size_t count) {
    if (batch.dtype == SvDtype::kBf16) {
      sink.build(2 * count, [&](std::byte* p) { packBf16(p, data, count); });
    } else {
      sink.words(data, count);
    }
  };
  sink.build(kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes * batch.matrices.size(),
             [&](std::byte* h) { writeHead(batch, size, h); });
  sink.words(batch.coeffs.data(), n);
  for (const SvMatrix& m : batch.matrices) {
    values(m.u.data(), static_cast<size_t>(m.u.size()));
    if (m.sparseV) {
      const SparseMatrix& s = m.vSparse;
      const SparseColumns cols(s);
      uint64_t nnz = 0;
      sink.build(8 * (n + 1), [&](std::byte* starts) {
        putLe(starts, nnz);
        for (size_t j = 0; j < n; ++j) {
          nnz += static_cast<uint64_t>(cols.size(static_cast<int64_t>(j)));
          putLe(starts + 8 * (j + 1), nnz);
        }
      });
      // Row indices were checked non-negative, so their int32 bits are the u32 wire value.
      if (cols.compressed) {
        sink.words(s.innerIndexPtr(), nnz);
        values(s.valuePtr(), nnz);
      } else {
        for (size_t j = 0; j < n; ++j) {
          const auto jj = static_cast<int64_t>(j);
          sink.words(s.innerIndexPtr() + cols.begin(jj), static_cast<size_t>(cols.size(jj)));
        }
        for (size_t j = 0; j < n; ++j) {
          const auto jj = static_cast<int64_t>(j);
          values(s.valuePtr() + cols.begin(jj), static_cast<size_t>(cols.size(jj)));
        }
      }
    } else {
      values(m.vDense.data(), static_cast<size_t>(m.vDense.size()));
    }
    if (hasCore(m)) sink.words(m.core.data(), static_cast<size_t>(m.core.size()));
    if (hasBiasCoeffs(m)) sink.words(m.biasCoeffs.data(), n);
  }
}

// Appends the record to a vector.
class AppendSink {
 public:
  explicit AppendSink(std::vector<std::byte>& out) : out_(out) {}
  template <class Fill>
  void build(size_t bytes, Fill&& fill) {
    fill(grow(out_, bytes));
  }
  void words(const void* data, size_t count) { appendWords(out_, data, count); }

 private:
  std::vector<std::byte>& out_;
};

// Writes the record into a caller's buffer with streaming stores, checksumming each
// piece while it is in cache.
class BufferSink {
 public:
  explicit BufferSink(std::byte* out) : out_(out) {}
  template <class Fill>
  void build(size_t bytes, Fill&& fill) {
    std::byte* p = out_ + at_;
    std::memset(p, 0, bytes);
    fill(p);
    crc_ = crc32c(crc_, p, bytes);
    at_ += bytes;
  }
  void words(const void* data, size_t count) {
    const size_t bytes = 4 * count;
    std::byte* p = out_ + at_;
    if constexpr (kHostLittleEndian) {
      crc_ = copyWithCrc(static_cast<const std::byte*>(data), bytes, p, crc_);
    } else {
      const auto* s = static_cast<const std::byte*>(data);
      for (size_t i = 0; i < count; ++i) {
        uint32_t w;
        std::memcpy(&w, s + 4 * i, 4);
        putLe(p + 4 * i, w);
      }
      crc_ = crc32c(crc_, p, bytes);
    }
    at_ += bytes;
  }
  size_t size() const { return at_; }
  uint32_t crc() const { return crc_; }

 private:
  std::byte* out_;
  size_t at_ = 0;
  uint32_t crc_ = 0;
};

// Collects the pieces without copying the batch's arrays (a little-endian host's
// words are their wire form); the bytes the encoder makes go to `head`, which is
// sized for them up front and never reallocated.
class PiecesSink {
 public:
  explicit PiecesSink(SvBatchPieces& out) : out_(out) {}
  template <class Fill>
  void build(size_t bytes, Fill&& fill) {
    ORPHEUS_ENFORCE(used_ + bytes <= out_.head.size(), "SV batch head of {} bytes overflows", out_.head.size());
    std::byte* p = out_.head.data() + used_;
    fill(p);
    add(p, bytes);
    used_ += bytes;
  }
  void words(const void* data, size_t count) { add(data, 4 * count); }

 private:
  void add(const void* data, size_t bytes) {
    if (bytes > 0) out_.pieces.emplace_back(static_cast<const std::byte*>(data), bytes);
  }
  SvBatchPieces& out_;
  size_t used_ = 0;
};

// One encoded buffer with the CRC set, for a host whose words need their bytes swapped.
std::vector<std::byte> encodeWhole(const Parts& batch, bool scanValues) {
  checkForEncode(batch, scanValues);
  std::vector<std::byte> out;
  const size_t size = encodedSizeOf(batch);
  out.reserve(size);
  AppendSink sink(out);
  writeRecord(batch, size, sink);
  ORPHEUS_ENFORCE(out.size() == size, "SV batch encoded to {} bytes, expected {}", out.size(), size);
  putLe(out.data() + kOffCrc, crc32c(0, out.data(), size));
  return out;
}

SvBatchPieces piecesOf(const Parts& batch, bool scanValues) {
  SvBatchPieces out;
  if constexpr (!kHostLittleEndian) {
    // The arrays need their bytes swapped: one encoded buffer.
    out.head = encodeWhole(batch, scanValues);
    out.size = out.head.size();
    out.pieces.emplace_back(out.head.data(), out.head.size());
    return out;
  }
  checkForEncode(batch, scanValues);
  out.size = encodedSizeOf(batch);
  const auto n = static_cast<size_t>(batch.numColumns());
  size_t headBytes = kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes * batch.matrices.size();
  for (const SvMatrix& m : batch.matrices) {
    if (m.sparseV) headBytes += 8 * (n + 1);
    // bf16 values are made here, beside the header.
    if (batch.dtype == SvDtype::kBf16) forEachValueArray(m, [&](const float*, size_t count) { headBytes += 2 * count; });
  }
  out.head.assign(headBytes, std::byte{0});
  PiecesSink sink(out);
  writeRecord(batch, out.size, sink);
  size_t total = 0;
  for (const auto& p : out.pieces) total += p.size();
  ORPHEUS_ENFORCE(total == out.size, "SV batch encoded to {} bytes in pieces, expected {}", total, out.size);
  return out;
}

}  // namespace

size_t encodedSize(const SvBatch& batch) {
  const std::vector<const SvMatrix*> matrices = pointersTo(batch);
  return encodedSizeOf(Parts(batch.header, batch.coeffs, matrices, batch.dtype));
}

SvBatchPieces encodePieces(const SvBatch& batch, bool scanValues) {
  const std::vector<const SvMatrix*> matrices = pointersTo(batch);
  return piecesOf(Parts(batch.header, batch.coeffs, matrices, batch.dtype), scanValues);
}

SvBatchPieces encodePieces(const SvBatchHeader& header, const Vector& coeffs,
                           std::span<const SvMatrix* const> matrices, bool scanValues) {
  return piecesOf(Parts(header, coeffs, matrices), scanValues);
}

uint32_t SvBatchPieces::seal() {
  std::byte* h = head.data();
  putLe(h + kOffCrc, uint32_t{0});
  uint32_t crc = 0;
  for (const auto& p : pieces) crc = crc32c(crc, p.data(), p.size());
  putLe(h + kOffCrc, crc);
  return crc;
}

void streamCopy(std::byte* out, const std::byte* in, size_t size) {
#if defined(__SSE2__)
  if (size >= 4096) {
    const size_t head = (16 - reinterpret_cast<uintptr_t>(out) % 16) % 16;
    std::memcpy(out, in, head);
    size_t at = head;
    for (; at + 64 <= size; at += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 48), d);
    }
    std::memcpy(out + at, in + at, size - at);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(out, in, size);
}

uint32_t copyWithCrc(const std::byte* in, size_t size, std::byte* out, uint32_t crc) {
  // In blocks: each is checksummed from the source, which the copy just brought
  // into the cache.
  constexpr size_t kBlock = 64 * 1024;
  for (size_t at = 0; at < size; at += kBlock) {
    const size_t n = std::min(kBlock, size - at);
    streamCopy(out + at, in + at, n);
    crc = crc32c(crc, in + at, n);
  }
  return crc;
}

uint32_t encodeInto(const SvBatch& svBatch, std::byte* out) {
  const std::vector<const SvMatrix*> matrices = pointersTo(svBatch);
  const Parts batch(svBatch.header, svBatch.coeffs, matrices, svBatch.dtype);
  checkForEncode(batch, /*scanValues=*/false);
  const size_t size = encodedSizeOf(batch);
  BufferSink sink(out);
  writeRecord(batch, size, sink);
  ORPHEUS_ENFORCE(sink.size() == size, "SV batch encoded to {} bytes, expected {}", sink.size(), size);
  putLe(out + kOffCrc, sink.crc());  // the CRC field was zero in the copy, as the CRC requires
  return sink.crc();
}

void encode(const SvBatch& svBatch, std::vector<std::byte>& out) {
  const std::vector<const SvMatrix*> matrices = pointersTo(svBatch);
  const Parts batch(svBatch.header, svBatch.coeffs, matrices, svBatch.dtype);
  checkForEncode(batch);
  const size_t start = out.size();
  const size_t size = encodedSizeOf(batch);
  out.reserve(start + size);
  AppendSink sink(out);
  writeRecord(batch, size, sink);
  ORPHEUS_ENFORCE(out.size() == start + size, "SV batch encoded to {} bytes, expected {}", out.size() - start, size);
  const uint32_t crc = crc32c(0, out.data() + start, size);
  putLe(out.data() + start + kOffCrc, crc);
}

std::vector<std::byte> encode(const SvBatch& batch) {
  std::vector<std::byte> out;
  encode(batch, out);
  return out;
}

}  // namespace orpheus
