// Decoding an SV batch record: every field, the CRC, index ranges and values are
// validated before a view of the record is handed out (see the wire format in
// sv_batch.h).
#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/base/sv_batch.h"
#include "engine/base/sv_batch_wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>

namespace orpheus {
using namespace sv_wire;

namespace {

// Copies count little-endian 32-bit words from the wire into host order.
void loadWords(void* dst, const std::byte* src, size_t count) {
  if (count == 0) return;
  if constexpr (kHostLittleEndian) {
    std::memcpy(dst, src, count * 4);
  } else {
    auto* d = static_cast<std::byte*>(dst);
    for (size_t i = 0; i < count; ++i) {
      const uint32_t w = getLe<uint32_t>(src + 4 * i);
      std::memcpy(d + 4 * i, &w, 4);
    }
  }
}

// Adds a * b to acc; false on overflow.
bool addProduct(uint64_t& acc, uint64_t a, uint64_t b) {
  uint64_t p;
  if (__builtin_mul_overflow(a, b, &p)) return false;
  return !__builtin_add_overflow(acc, p, &acc);
}

struct TableEntry {
  uint32_t paramId;
  int32_t biasId;
  uint32_t rows;  // J
  uint32_t cols;  // K
  uint8_t vKind;
  uint8_t coeffKind;
  uint64_t nnz;
};

// Bounds-checked cursor over a payload whose size the table has already validated;
// running past the end is a bug in the decoder, not a corrupt record.
class Reader {
 public:
  Reader(const std::byte* begin, const std::byte* end) : p_(begin), end_(end) {}

  const std::byte* take(uint64_t n) {
    ORPHEUS_ENFORCE(n <= static_cast<uint64_t>(end_ - p_), "SV batch payload read of {} bytes runs past the end", n);
    const std::byte* r = p_;
    p_ += n;
    return r;
  }
  bool atEnd() const { return p_ == end_; }

 private:
  const std::byte* p_;
  const std::byte* end_;
};

class Decoder {
 public:
  Decoder(std::span<const std::byte> bytes, const SvBatchExpectation& expect) : bytes_(bytes), expect_(expect) {
    if (expect.sender >= 0) sender_ = std::to_string(expect.sender);
    if (expect.clock >= 0) clock_ = std::to_string(expect.clock);
  }

  SvBatchView run(std::shared_ptr<const void> owner) {
    SvBatchView batch;
    const Layout layout = readHeader(batch.header);
    batch.dtype = dtype_;
    checkCrc();
    checkSenderAndClock(batch.header);
    const std::vector<TableEntry> table = readTable(layout);
    readPayload(layout, table, std::move(owner), batch);
    return batch;
  }

 private:
  // Where the header says the matrix table and the payload are.
  struct Layout {
    uint32_t numMatrices = 0;
    uint64_t n = 0;
    uint64_t tableEnd = 0;
    uint64_t payloadLength = 0;
  };

  // Reads the header into `header` and checks its fixed fields and the sizes it
  // gives against the record's length.
  Layout readHeader(SvBatchHeader& header) {
    const std::byte* h = bytes_.data();
    if (bytes_.size() < kSvBatchHeaderBytes) {
      corrupt("record is {} bytes, shorter than the {}-byte header", bytes_.size(), kSvBatchHeaderBytes);
    }
    header.jobId = getLe<uint64_t>(h + kOffJobId);
    header.sender = getLe<uint32_t>(h + kOffSender);
    header.replica = getLe<uint32_t>(h + kOffReplica);
    header.clock = getLe<uint64_t>(h + kOffClock);
    header.epoch = getLe<uint32_t>(h + kOffEpoch);
    if (expect_.sender < 0) sender_ = std::to_string(header.sender);
    if (expect_.clock < 0) clock_ = std::to_string(header.clock);

    const uint32_t magic = getLe<uint32_t>(h + kOffMagic);
    if (magic != kSvBatchMagic) corrupt("bad magic 0x{:08x}, expected 0x{:08x} (\"ORSV\")", magic, kSvBatchMagic);
    const uint16_t version = getLe<uint16_t>(h + kOffVersion);
    if (version != kSvBatchVersion) corrupt("unsupported version {}, expected {}", version, kSvBatchVersion);
    const uint16_t flags = getLe<uint16_t>(h + kOffFlags);
    if (flags != 0) corrupt("unknown flags 0x{:04x}", flags);
    const uint8_t dtype = getLe<uint8_t>(h + kOffDtype);
    if (dtype != kDtypeF32 && dtype != kDtypeBf16) {
      corrupt("unsupported dtype {}, expected {} (f32) or {} (bf16)", dtype, kDtypeF32, kDtypeBf16);
    }
    dtype_ = static_cast<SvDtype>(dtype);
    if (!allZero(h + kOffReserved1, 3) || !allZero(h + kOffReserved2, 4)) corrupt("reserved header bytes are not zero");

    Layout layout;
    layout.numMatrices = getLe<uint32_t>(h + kOffMatrices);
    layout.n = getLe<uint32_t>(h + kOffColumns);
    layout.tableEnd = kSvBatchHeaderBytes + uint64_t{kSvBatchMatrixEntryBytes} * layout.numMatrices;
    if (bytes_.size() < layout.tableEnd) {
      corrupt("record is {} bytes, too short for the header and a table of {} matrices ({} bytes)", bytes_.size(),
              layout.numMatrices, layout.tableEnd);
    }
    layout.payloadLength = getLe<uint64_t>(h + kOffPayloadLength);
    if (layout.payloadLength != bytes_.size() - layout.tableEnd) {
      corrupt("header says the payload is {} bytes, but {} bytes follow the matrix table", layout.payloadLength,
              bytes_.size() - layout.tableEnd);
    }
    return layout;
  }

  void checkSenderAndClock(const SvBatchHeader& header) const {
    if (expect_.sender >= 0 && header.sender != static_cast<uint64_t>(expect_.sender)) {
      corrupt("header names sender rank {}", header.sender);
    }
    if (expect_.clock >= 0 && header.clock != static_cast<uint64_t>(expect_.clock)) {
      corrupt("header names clock {}", header.clock);
    }
  }

  // Reads and checks the matrix table, and that the payload is exactly as long as it implies.
  std::vector<TableEntry> readTable(const Layout& layout) const {
    const std::byte* h = bytes_.data();
    const uint64_t n = layout.n;
    const uint64_t vb = valueBytes();
    std::vector<TableEntry> table(layout.numMatrices);
    uint64_t expectedPayload = 0;
    bool fits = addProduct(expectedPayload, 4, n);
    for (uint32_t i = 0; i < layout.numMatrices; ++i) {
      table[i] = readEntry(i, h + kSvBatchHeaderBytes + size_t{kSvBatchMatrixEntryBytes} * i, n);
      const TableEntry& e = table[i];
      fits = fits && addProduct(expectedPayload, vb * uint64_t{e.rows}, n);
      if (e.vKind == kVDense) {
        fits = fits && addProduct(expectedPayload, vb * uint64_t{e.cols}, n);
      } else {
        fits = fits && addProduct(expectedPayload, 8, n + 1) && addProduct(expectedPayload, 4 + vb, e.nnz);
      }
      if (e.coeffKind == kCoeffCore) fits = fits && addProduct(expectedPayload, 4 * n, n);
      if (e.coeffKind == kCoeffCore && e.biasId >= 0) fits = fits && addProduct(expectedPayload, 4, n);
      if (!fits) corrupt("matrix table implies a payload of more than 2^64 bytes");
    }
    if (expectedPayload != layout.payloadLength) {
      corrupt("payload is {} bytes, the matrix table implies {}", layout.payloadLength, expectedPayload);
    }
    return table;
  }

  // Reads the coefficients and the matrices into `batch`. All sizes are now
  // consistent with the bytes actually present, so every allocation is bounded by
  // the record's length.
  void readPayload(const Layout& layout, const std::vector<TableEntry>& table, std::shared_ptr<const void> owner,
                   SvBatchView& batch) {
    const std::byte* h = bytes_.data();
    const uint64_t n = layout.n;
    auto made = std::make_shared<Made>();
    size_t sparse = 0;
    for (const TableEntry& e : table) sparse += e.vKind == kVSparse ? 1 : 0;
    made->starts.resize(sparse * (n + 1));  // never resized again: views point into it
    made_ = made.get();
    Reader r(h + layout.tableEnd, h + bytes_.size());
    batch.columns = static_cast<int64_t>(n);
    batch.coeffs = readFloats(r, n, static_cast<int64_t>(n), "coefficients", -1);
    batch.matrices.resize(layout.numMatrices);
    for (uint32_t i = 0; i < layout.numMatrices; ++i) readMatrix(r, i, table[i], n, batch.matrices[i]);
    ORPHEUS_ENFORCE(r.atEnd(), "SV batch payload not fully consumed");
    if (sparse == 0 && kHostLittleEndian && dtype_ == SvDtype::kF32) {
      batch.owner = std::move(owner);
    } else {
      made->record = std::move(owner);
      batch.owner = std::move(made);
    }
  }

  template <class... Args>
  [[noreturn]] void corrupt(fmt::format_string<Args...> format, Args&&... args) const {
    throw CorruptRecordError(fmt::format("corrupt SV batch from rank {} at clock {}: {}", sender_, clock_,
                                         fmt::format(format, std::forward<Args>(args)...)));
  }

  static bool allZero(const std::byte* p, size_t n) {
    return std::all_of(p, p + n, [](std::byte b) { return b == std::byte{0}; });
  }

  void checkCrc() const {
    const std::byte* p = bytes_.data();
    const uint32_t stored = getLe<uint32_t>(p + kOffCrc);
    const std::byte zeros[4] = {};
    uint32_t crc = crc32c(0, p, kOffCrc);
    crc = crc32c(crc, zeros, sizeof zeros);
    crc = crc32c(crc, p + kOffCrc + 4, bytes_.size() - kOffCrc - 4);
    if (crc != stored) corrupt("CRC32C mismatch (stored 0x{:08x}, computed 0x{:08x})", stored, crc);
  }

  TableEntry readEntry(uint32_t i, const std::byte* p, uint64_t n) const {
    TableEntry e;
    e.paramId = getLe<uint32_t>(p + kEntParamId);
    e.biasId = static_cast<int32_t>(getLe<uint32_t>(p + kEntBiasId));
    e.rows = getLe<uint32_t>(p + kEntRows);
    e.cols = getLe<uint32_t>(p + kEntCols);
    e.vKind = getLe<uint8_t>(p + kEntVKind);
    e.coeffKind = getLe<uint8_t>(p + kEntCoeffKind);
    e.nnz = getLe<uint64_t>(p + kEntNnz);

    if (e.vKind != kVDense && e.vKind != kVSparse) corrupt("matrix {} has unknown V kind {}", i, e.vKind);
    if (e.coeffKind != kCoeffPerColumn && e.coeffKind != kCoeffCore) {
      corrupt("matrix {} has unknown coefficient kind {}", i, e.coeffKind);
    }
    if (getLe<uint16_t>(p + kEntReserved1) != 0 || getLe<uint32_t>(p + kEntReserved2) != 0) {
      corrupt("matrix {} has non-zero reserved fields", i);
    }
    if (e.biasId < -1) corrupt("matrix {} has bias id {}", i, e.biasId);
    if (e.biasId >= 0 && static_cast<uint32_t>(e.biasId) == e.paramId) {
      corrupt("matrix {} uses param {} as its own bias", i, e.paramId);
    }
    const uint64_t entries = uint64_t{e.cols} * n;  // < 2^64: both factors are 32-bit
    if (e.vKind == kVDense) {
      if (e.nnz != entries) corrupt("matrix {} has dense V of {}x{} but nnz {}", i, e.cols, n, e.nnz);
    } else {
      if (e.nnz > entries) corrupt("matrix {} has sparse V of {}x{} with nnz {}", i, e.cols, n, e.nnz);
      if (e.cols > kMaxSparseIndex || e.nnz > kMaxSparseIndex) {
        corrupt("matrix {} has sparse V of {} rows and {} non-zeros, beyond 32-bit indices", i, e.cols, e.nnz);
      }
    }

    const auto& shapes = expect_.paramShapes;
    if (!shapes.empty()) {
      if (e.paramId >= shapes.size())
        corrupt("matrix {} refers to param {}, model has {} params", i, e.paramId, shapes.size());
      const auto [rows, cols] = shapes[e.paramId];
      if (rows != e.rows || cols != e.cols) {
        corrupt("matrix {} has shape {}x{}, model expects {}x{}", i, e.rows, e.cols, rows, cols);
      }
      if (e.biasId >= 0) {
        if (static_cast<size_t>(e.biasId) >= shapes.size()) {
          corrupt("matrix {} refers to bias param {}, model has {} params", i, e.biasId, shapes.size());
        }
        const auto [biasRows, biasCols] = shapes[static_cast<size_t>(e.biasId)];
        if (biasRows != e.rows || biasCols != 1) {
          corrupt("matrix {} has bias shape {}x1, model expects {}x{} for param {}", i, e.rows, biasRows, biasCols,
                  e.biasId);
        }
      }
    }
    return e;
  }

  // What decoding makes beside the record: sparse V's 32-bit column starts, bf16
  // values widened to f32 and, on a big-endian host, the arrays in host order.
  // Kept with the view.
  struct Made {
    std::shared_ptr<const void> record;
    std::vector<int32_t> starts;
    std::deque<std::vector<uint32_t>> words;
  };

  // `count` 32-bit words of the payload in host order: where they are on a
  // little-endian host, a swapped copy on a big-endian one.
  const std::byte* words(Reader& r, uint64_t count) const {
    const std::byte* p = r.take(4 * count);
    if constexpr (kHostLittleEndian) return p;
    std::vector<uint32_t>& copy = made_->words.emplace_back(count);
    loadWords(copy.data(), p, count);
    return reinterpret_cast<const std::byte*>(copy.data());
  }

  uint64_t valueBytes() const { return dtype_ == SvDtype::kBf16 ? 2 : 4; }

  // `count` SV values (U, V) as f32: words(), or bf16 widened into a copy.
  const float* svValues(Reader& r, uint64_t count) const {
    if (dtype_ == SvDtype::kF32) return reinterpret_cast<const float*>(words(r, count));
    const std::byte* p = r.take(2 * count);
    std::vector<uint32_t>& wide = made_->words.emplace_back(count);
    for (uint64_t i = 0; i < count; ++i) wide[i] = uint32_t{getLe<uint16_t>(p + 2 * i)} << 16;
    return reinterpret_cast<const float*>(wide.data());
  }

  // Takes count floats laid out column-major with `rows` rows and checks them; `what`
  // and `matrix` (-1 for none) name them in an error. `sv`: U or V, in the record's dtype.
  const float* readFloats(Reader& r, uint64_t count, int64_t rows, const char* what, int64_t matrix,
                          bool sv = false) const {
    const float* values = sv ? svValues(r, count) : reinterpret_cast<const float*>(words(r, count));
    if (!allFinite(values, count)) {
      const size_t bad = firstNonFinite(values, count);
      const int64_t row = rows > 0 ? static_cast<int64_t>(bad) % rows : 0;
      const int64_t col = rows > 0 ? static_cast<int64_t>(bad) / rows : 0;
      if (matrix < 0) corrupt("non-finite value {} in {} at row {}, column {}", values[bad], what, row, col);
      corrupt("non-finite value {} in {} of matrix {} at row {}, column {}", values[bad], what, matrix, row, col);
    }
    return values;
  }

  void readMatrix(Reader& r, uint32_t i, const TableEntry& e, uint64_t n, SvMatrixView& m) {
    m.paramId = e.paramId;
    m.biasId = e.biasId;
    m.rows = e.rows;
    m.vRows = e.cols;
    m.columns = static_cast<int64_t>(n);
    m.u = readFloats(r, uint64_t{e.rows} * n, e.rows, "U", i, /*sv=*/true);
    m.sparseV = e.vKind == kVSparse;
    if (m.sparseV) {
      readSparse(r, i, e, n, m);
    } else {
      m.vDense = readFloats(r, uint64_t{e.cols} * n, e.cols, "V", i, /*sv=*/true);
    }
    if (e.coeffKind == kCoeffCore) {
      m.withCore = true;
      m.core = readFloats(r, n * n, static_cast<int64_t>(n), "core", i);
      if (e.biasId >= 0) m.biasCoeffs = readFloats(r, n, static_cast<int64_t>(n), "bias coefficients", i);
    }
  }

  void readSparse(Reader& r, uint32_t i, const TableEntry& e, uint64_t n, SvMatrixView& m) {
    int32_t* outer = made_->starts.data() + startsUsed_;
    startsUsed_ += n + 1;
    m.nnz = static_cast<int64_t>(e.nnz);

    const std::byte* starts = r.take(8 * (n + 1));
    uint64_t prev = getLe<uint64_t>(starts);
    if (prev != 0) corrupt("sparse V of matrix {} has column 0 starting at {}, not 0", i, prev);
    outer[0] = 0;
    for (uint64_t j = 1; j <= n; ++j) {
      const uint64_t start = getLe<uint64_t>(starts + 8 * j);
      if (start < prev || start > e.nnz) {
        corrupt("sparse V of matrix {} has column {} starting at {} after {} (nnz {})", i, j, start, prev, e.nnz);
      }
      outer[j] = static_cast<int32_t>(start);  // <= nnz <= INT32_MAX
      prev = start;
    }
    if (prev != e.nnz) corrupt("sparse V of matrix {} has columns ending at {}, nnz is {}", i, prev, e.nnz);
    m.vStarts = outer;

    // Wire indices are u32; any value below K <= INT32_MAX has the same bits as int32.
    const auto* inner = reinterpret_cast<const int32_t*>(words(r, e.nnz));
    for (uint64_t j = 0; j < n; ++j) {
      int64_t last = -1;
      for (int64_t k = outer[j]; k < outer[j + 1]; ++k) {
        const auto row = static_cast<int64_t>(static_cast<uint32_t>(inner[k]));
        if (row >= e.cols)
          corrupt("sparse V of matrix {} has row index {} in column {}, V has {} rows", i, row, j, e.cols);
        if (row <= last) corrupt("sparse V of matrix {} has row index {} after {} in column {}", i, row, last, j);
        last = row;
      }
    }
    m.vRowIndices = inner;

    const float* values = svValues(r, e.nnz);
    if (!allFinite(values, e.nnz)) {
      const auto bad = static_cast<int64_t>(firstNonFinite(values, e.nnz));
      const int64_t col = std::upper_bound(outer, outer + n + 1, bad) - outer - 1;
      corrupt("non-finite value {} in sparse V of matrix {} at row {}, column {}", values[bad], i, inner[bad], col);
    }
    m.vValues = values;
  }

  std::span<const std::byte> bytes_;
  const SvBatchExpectation& expect_;
  std::string sender_ = "?";
  std::string clock_ = "?";
  Made* made_ = nullptr;
  size_t startsUsed_ = 0;
  SvDtype dtype_ = SvDtype::kF32;
};

}  // namespace

uint32_t storedCrc(std::span<const std::byte> record) {
  ORPHEUS_ENFORCE(record.size() >= kSvBatchHeaderBytes, "an SV batch record of {} bytes has no header", record.size());
  return getLe<uint32_t>(record.data() + kOffCrc);
}

uint32_t computedCrc(std::span<const std::byte> record) {
  ORPHEUS_ENFORCE(record.size() >= kSvBatchHeaderBytes, "an SV batch record of {} bytes has no header", record.size());
  const std::byte* p = record.data();
  const std::byte zeros[4] = {};
  uint32_t crc = crc32c(0, p, kOffCrc);
  crc = crc32c(crc, zeros, sizeof zeros);
  return crc32c(crc, p + kOffCrc + 4, record.size() - kOffCrc - 4);
}

uint32_t wholeRecordCrc(uint32_t headerCrc, size_t size) {
  ORPHEUS_ENFORCE(size >= kSvBatchHeaderBytes, "an SV batch record of {} bytes has no header", size);
  // The header CRC covers the record with a zero CRC field; the stored field adds
  // the CRC of its four bytes (against four zero bytes) carried over the rest.
  std::byte field[kOffCrc + 4] = {};
  putLe(field + kOffCrc, headerCrc);
  const std::byte zeros[kOffCrc + 4] = {};
  const uint32_t delta = crc32c(0, field, sizeof field) ^ crc32c(0, zeros, sizeof zeros);
  return headerCrc ^ crc32cCombine(delta, 0, size - kOffCrc - 4);
}

SvBatch decode(std::span<const std::byte> bytes, const SvBatchExpectation& expect) {
  return toBatch(Decoder(bytes, expect).run(nullptr));
}

SvBatchView decodeView(std::shared_ptr<const void> owner, std::span<const std::byte> bytes,
                       const SvBatchExpectation& expect) {
  return Decoder(bytes, expect).run(std::move(owner));
}

}  // namespace orpheus
