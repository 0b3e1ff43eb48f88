#include "engine/base/sv_batch.h"

#include "engine/base/crc32c.h"
#include "engine/base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace orpheus {
namespace {

// Header field offsets (see the wire format in sv_batch.h).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffFlags = 6;
constexpr size_t kOffJobId = 8;
constexpr size_t kOffSender = 16;
constexpr size_t kOffReplica = 20;
constexpr size_t kOffClock = 24;
constexpr size_t kOffEpoch = 32;
constexpr size_t kOffMatrices = 36;
constexpr size_t kOffColumns = 40;
constexpr size_t kOffDtype = 44;
constexpr size_t kOffReserved1 = 45;  // 3 bytes
constexpr size_t kOffPayloadLength = 48;
constexpr size_t kOffCrc = 56;
constexpr size_t kOffReserved2 = 60;  // 4 bytes

// Matrix table entry field offsets.
constexpr size_t kEntParamId = 0;
constexpr size_t kEntBiasId = 4;
constexpr size_t kEntRows = 8;
constexpr size_t kEntCols = 12;
constexpr size_t kEntVKind = 16;
constexpr size_t kEntCoeffKind = 17;
constexpr size_t kEntReserved1 = 18;  // u16
constexpr size_t kEntReserved2 = 20;  // u32
constexpr size_t kEntNnz = 24;

constexpr uint8_t kDtypeF32 = 1;
constexpr uint8_t kVDense = 0;
constexpr uint8_t kVSparse = 1;
constexpr uint8_t kCoeffPerColumn = 0;
constexpr uint8_t kCoeffCore = 1;

// Sparse V is held in an Eigen matrix with 32-bit signed indices.
constexpr uint64_t kMaxSparseIndex = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

constexpr bool kHostLittleEndian = std::endian::native == std::endian::little;
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

// One vectorised pass: x * 0 is 0 for finite x and NaN for inf or NaN, and a sum
// is NaN exactly when one of its terms is.
bool allFinite(const float* p, size_t count) {
  if (count == 0) return true;
  return !std::isnan((Eigen::Map<const Eigen::ArrayXf>(p, static_cast<Eigen::Index>(count)) * 0.0f).sum());
}

size_t firstNonFinite(const float* p, size_t count) {
  size_t i = 0;
  while (i < count && std::isfinite(p[i])) ++i;
  return i;
}

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

bool hasCore(const SvMatrix& m) { return m.core.rows() != 0 || m.core.cols() != 0; }

// A core replaces the per-column coefficients for the bias too, so a matrix with a
// core and a bias carries its own bias coefficients; no other matrix may carry any.
bool hasBiasCoeffs(const SvMatrix& m) { return hasCore(m) && m.biasId >= 0; }

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

  Parts(const SvBatchHeader& header, const Vector& coeffs, std::span<const SvMatrix* const> matrices)
      : header(header), coeffs(coeffs), matrices(matrices) {}
  int64_t numColumns() const { return coeffs.size(); }

  const SvBatchHeader& header;
  const Vector& coeffs;
  Matrices matrices;
};

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
    const std::byte* h = bytes_.data();
    if (bytes_.size() < kSvBatchHeaderBytes) {
      corrupt("record is {} bytes, shorter than the {}-byte header", bytes_.size(), kSvBatchHeaderBytes);
    }
    SvBatchView batch;
    batch.header.jobId = getLe<uint64_t>(h + kOffJobId);
    batch.header.sender = getLe<uint32_t>(h + kOffSender);
    batch.header.replica = getLe<uint32_t>(h + kOffReplica);
    batch.header.clock = getLe<uint64_t>(h + kOffClock);
    batch.header.epoch = getLe<uint32_t>(h + kOffEpoch);
    if (expect_.sender < 0) sender_ = std::to_string(batch.header.sender);
    if (expect_.clock < 0) clock_ = std::to_string(batch.header.clock);

    const uint32_t magic = getLe<uint32_t>(h + kOffMagic);
    if (magic != kSvBatchMagic) corrupt("bad magic 0x{:08x}, expected 0x{:08x} (\"ORSV\")", magic, kSvBatchMagic);
    const uint16_t version = getLe<uint16_t>(h + kOffVersion);
    if (version != kSvBatchVersion) corrupt("unsupported version {}, expected {}", version, kSvBatchVersion);
    const uint16_t flags = getLe<uint16_t>(h + kOffFlags);
    if (flags != 0) corrupt("unknown flags 0x{:04x}", flags);
    const uint8_t dtype = getLe<uint8_t>(h + kOffDtype);
    if (dtype != kDtypeF32) corrupt("unsupported dtype {}, expected {} (f32)", dtype, kDtypeF32);
    if (!allZero(h + kOffReserved1, 3) || !allZero(h + kOffReserved2, 4)) corrupt("reserved header bytes are not zero");

    const uint32_t numMatrices = getLe<uint32_t>(h + kOffMatrices);
    const uint64_t n = getLe<uint32_t>(h + kOffColumns);
    const uint64_t tableEnd = kSvBatchHeaderBytes + uint64_t{kSvBatchMatrixEntryBytes} * numMatrices;
    if (bytes_.size() < tableEnd) {
      corrupt("record is {} bytes, too short for the header and a table of {} matrices ({} bytes)", bytes_.size(),
              numMatrices, tableEnd);
    }
    const uint64_t payloadLength = getLe<uint64_t>(h + kOffPayloadLength);
    if (payloadLength != bytes_.size() - tableEnd) {
      corrupt("header says the payload is {} bytes, but {} bytes follow the matrix table", payloadLength,
              bytes_.size() - tableEnd);
    }

    checkCrc();

    if (expect_.sender >= 0 && batch.header.sender != static_cast<uint64_t>(expect_.sender)) {
      corrupt("header names sender rank {}", batch.header.sender);
    }
    if (expect_.clock >= 0 && batch.header.clock != static_cast<uint64_t>(expect_.clock)) {
      corrupt("header names clock {}", batch.header.clock);
    }

    std::vector<TableEntry> table(numMatrices);
    uint64_t expectedPayload = 0;
    bool fits = addProduct(expectedPayload, 4, n);
    for (uint32_t i = 0; i < numMatrices; ++i) {
      table[i] = readEntry(i, h + kSvBatchHeaderBytes + size_t{kSvBatchMatrixEntryBytes} * i, n);
      const TableEntry& e = table[i];
      fits = fits && addProduct(expectedPayload, 4 * uint64_t{e.rows}, n);
      if (e.vKind == kVDense) {
        fits = fits && addProduct(expectedPayload, 4 * uint64_t{e.cols}, n);
      } else {
        fits = fits && addProduct(expectedPayload, 8, n + 1) && addProduct(expectedPayload, 8, e.nnz);
      }
      if (e.coeffKind == kCoeffCore) fits = fits && addProduct(expectedPayload, 4 * n, n);
      if (e.coeffKind == kCoeffCore && e.biasId >= 0) fits = fits && addProduct(expectedPayload, 4, n);
      if (!fits) corrupt("matrix table implies a payload of more than 2^64 bytes");
    }
    if (expectedPayload != payloadLength) {
      corrupt("payload is {} bytes, the matrix table implies {}", payloadLength, expectedPayload);
    }

    // All sizes are now consistent with the bytes actually present, so every
    // allocation below is bounded by the record's length.
    auto made = std::make_shared<Made>();
    size_t sparse = 0;
    for (const TableEntry& e : table) sparse += e.vKind == kVSparse ? 1 : 0;
    made->starts.resize(sparse * (n + 1));  // never resized again: views point into it
    made_ = made.get();
    Reader r(h + tableEnd, h + bytes_.size());
    batch.columns = static_cast<int64_t>(n);
    batch.coeffs = readFloats(r, n, static_cast<int64_t>(n), "coefficients", -1);
    batch.matrices.resize(numMatrices);
    for (uint32_t i = 0; i < numMatrices; ++i) readMatrix(r, i, table[i], n, batch.matrices[i]);
    ORPHEUS_ENFORCE(r.atEnd(), "SV batch payload not fully consumed");
    if (sparse == 0 && kHostLittleEndian) {
      batch.owner = std::move(owner);
    } else {
      made->record = std::move(owner);
      batch.owner = std::move(made);
    }
    return batch;
  }

 private:
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

  // What decoding makes beside the record: sparse V's 32-bit column starts and,
  // on a big-endian host, the arrays in host order. Kept with the view.
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

  // Takes count floats laid out column-major with `rows` rows and checks them; `what`
  // and `matrix` (-1 for none) name them in an error.
  const float* readFloats(Reader& r, uint64_t count, int64_t rows, const char* what, int64_t matrix) const {
    const auto* values = reinterpret_cast<const float*>(words(r, count));
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
    m.u = readFloats(r, uint64_t{e.rows} * n, e.rows, "U", i);
    m.sparseV = e.vKind == kVSparse;
    if (m.sparseV) {
      readSparse(r, i, e, n, m);
    } else {
      m.vDense = readFloats(r, uint64_t{e.cols} * n, e.cols, "V", i);
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

    const auto* values = reinterpret_cast<const float*>(words(r, e.nnz));
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
};

}  // namespace

namespace {

size_t encodedSizeOf(const Parts& batch) {
  const auto n = static_cast<size_t>(batch.numColumns());
  size_t size = kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes * batch.matrices.size() + 4 * n;
  for (const SvMatrix& m : batch.matrices) {
    size += 4 * static_cast<size_t>(m.u.rows()) * n;
    if (m.sparseV) {
      size += 8 * (n + 1) + 8 * static_cast<size_t>(m.vSparse.nonZeros());
    } else {
      size += 4 * static_cast<size_t>(m.vDense.rows()) * n;
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
  putLe(h + kOffDtype, kDtypeF32);
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
  sink.build(kSvBatchHeaderBytes + kSvBatchMatrixEntryBytes * batch.matrices.size(),
             [&](std::byte* h) { writeHead(batch, size, h); });
  sink.words(batch.coeffs.data(), n);
  for (const SvMatrix& m : batch.matrices) {
    sink.words(m.u.data(), static_cast<size_t>(m.u.size()));
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
        sink.words(s.valuePtr(), nnz);
      } else {
        for (size_t j = 0; j < n; ++j) {
          const auto jj = static_cast<int64_t>(j);
          sink.words(s.innerIndexPtr() + cols.begin(jj), static_cast<size_t>(cols.size(jj)));
        }
        for (size_t j = 0; j < n; ++j) {
          const auto jj = static_cast<int64_t>(j);
          sink.words(s.valuePtr() + cols.begin(jj), static_cast<size_t>(cols.size(jj)));
        }
      }
    } else {
      sink.words(m.vDense.data(), static_cast<size_t>(m.vDense.size()));
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

}  // namespace

size_t encodedSize(const SvBatch& batch) {
  const std::vector<const SvMatrix*> matrices = pointersTo(batch);
  return encodedSizeOf(Parts(batch.header, batch.coeffs, matrices));
}

namespace {

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

SvBatchPieces encodePieces(const SvBatch& batch, bool scanValues) {
  const std::vector<const SvMatrix*> matrices = pointersTo(batch);
  return piecesOf(Parts(batch.header, batch.coeffs, matrices), scanValues);
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
  const Parts batch(svBatch.header, svBatch.coeffs, matrices);
  checkForEncode(batch, /*scanValues=*/false);
  const size_t size = encodedSizeOf(batch);
  BufferSink sink(out);
  writeRecord(batch, size, sink);
  ORPHEUS_ENFORCE(sink.size() == size, "SV batch encoded to {} bytes, expected {}", sink.size(), size);
  putLe(out + kOffCrc, sink.crc());  // the CRC field was zero in the copy, as the CRC requires
  return sink.crc();
}

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

void encode(const SvBatch& svBatch, std::vector<std::byte>& out) {
  const std::vector<const SvMatrix*> matrices = pointersTo(svBatch);
  const Parts batch(svBatch.header, svBatch.coeffs, matrices);
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

SvBatch decode(std::span<const std::byte> bytes, const SvBatchExpectation& expect) {
  return toBatch(Decoder(bytes, expect).run(nullptr));
}

SvBatchView decodeView(std::shared_ptr<const void> owner, std::span<const std::byte> bytes,
                       const SvBatchExpectation& expect) {
  return Decoder(bytes, expect).run(std::move(owner));
}

SvBatchView viewOf(const SvBatch& batch) {
  SvBatchView v;
  v.header = batch.header;
  v.columns = batch.numColumns();
  v.coeffs = batch.coeffs.data();
  v.matrices.reserve(batch.matrices.size());
  for (const SvMatrix& m : batch.matrices) v.matrices.push_back(viewOf(m));
  return v;
}

SvMatrixView viewOf(const SvMatrix& m) {
  SvMatrixView x;
  x.paramId = m.paramId;
  x.biasId = m.biasId;
  x.rows = m.u.rows();
  x.vRows = m.vRows();
  x.columns = m.u.cols();
  x.u = m.u.data();
  x.sparseV = m.sparseV;
  if (m.sparseV) {
    const SparseMatrix& s = m.vSparse;
    x.vStarts = s.outerIndexPtr();
    x.vCounts = s.innerNonZeroPtr();
    x.vRowIndices = s.innerIndexPtr();
    x.vValues = s.valuePtr();
    x.nnz = s.isCompressed() ? s.nonZeros() : s.data().size();
  } else {
    x.vDense = m.vDense.data();
  }
  x.withCore = hasCore(m);
  if (x.withCore) x.core = m.core.data();
  if (m.biasCoeffs.size() > 0) x.biasCoeffs = m.biasCoeffs.data();
  return x;
}

SvBatchView viewOf(std::shared_ptr<const SvBatch> batch) {
  SvBatchView v = viewOf(*batch);
  v.owner = std::move(batch);
  return v;
}

SvBatch toBatch(const SvBatchView& view) {
  SvBatch b;
  b.header = view.header;
  b.coeffs = view.coeffsMap();
  b.matrices.resize(view.matrices.size());
  for (size_t i = 0; i < view.matrices.size(); ++i) {
    const SvMatrixView& x = view.matrices[i];
    SvMatrix& m = b.matrices[i];
    m.paramId = x.paramId;
    m.biasId = x.biasId;
    m.u = x.uMap();
    m.sparseV = x.sparseV;
    if (x.sparseV) {
      // The compressed arrays copied as they are: Eigen's sparse assignment would
      // reserve room by the dimensions (2·max(rows, cols)), and V's rows come from
      // the wire.
      // (A view of a local, uncompressed batch is assigned.)
      const Eigen::Map<const SparseMatrix> v = x.vSparseMap();
      if (v.isCompressed()) {
        m.vSparse.resize(v.rows(), v.cols());
        m.vSparse.resizeNonZeros(v.nonZeros());
        std::copy_n(v.outerIndexPtr(), v.cols() + 1, m.vSparse.outerIndexPtr());
        std::copy_n(v.innerIndexPtr(), v.nonZeros(), m.vSparse.innerIndexPtr());
        std::copy_n(v.valuePtr(), v.nonZeros(), m.vSparse.valuePtr());
      } else {
        m.vSparse = v;
        m.vSparse.makeCompressed();
      }
    } else {
      m.vDense = x.vDenseMap();
    }
    if (x.withCore) m.core = x.coreMap();
    if (x.biasCoeffs != nullptr) m.biasCoeffs = x.biasCoeffsMap();
  }
  return b;
}

}  // namespace orpheus
