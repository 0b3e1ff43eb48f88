#include "ckpt/sv_log.h"

#include "engine/base/crc32c.h"
#include "engine/base/error.h"

#include <hdf5.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <climits>
#include <cstdlib>
#include <memory>
#include <new>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

// Segment chaining. A segment of replica R covers its local clocks first..last; the
// segments of R chain when each starts right after the previous one ends, or at the
// very clock the previous one ends: a rotation hands a replica over in the middle of
// a clock (the old holder logs the clock's batches and "rotated out", the new holder
// "rotated in"), so both holders' segments hold a part of that clock. A writer never
// closes a segment that holds nothing but the hand-over clock, so the two holders
// never write the same file name.

namespace orpheus::ckpt {
namespace {

namespace fs = std::filesystem;

// Every CRC here is defined over the little-endian encoding of the stored values,
// which on the supported hosts is their in-memory representation.
static_assert(std::endian::native == std::endian::little, "checkpoint CRCs assume a little-endian host");

constexpr int64_t kFormatVersion = 1;
// Log segments: version 2 added the reset event.
constexpr int64_t kSegmentVersion = 2;
constexpr const char* kJobFile = "job.h5";
// flush() and a full staging area wait for the IO thread; a disk that does not
// answer within this long is reported rather than waited on forever.
constexpr auto kStallTimeout = std::chrono::minutes(10);

// One row of a segment's "entries" dataset.
struct EntryRow {
  uint64_t clock;
  uint32_t kind;
  uint32_t records;
};
static_assert(sizeof(EntryRow) == 16, "EntryRow is stored without padding");

// Owns an HDF5 handle; closes it with the matching function.
class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() {
    if (id_ >= 0) close_(id_);
  }
  H5Handle(H5Handle&& other) noexcept : id_(other.release()), close_(other.close_) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle& operator=(H5Handle&&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership, for a close whose result matters.
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its own error stack by default; errors are reported as exceptions here.
// The setting is per thread in a thread-safe HDF5, so every entry point calls this.
void silenceHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string osError(int err) { return err != 0 ? std::strerror(err) : "HDF5 error"; }

std::string clockName(uint64_t clock) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%012llu", static_cast<unsigned long long>(clock));
  return buf;
}

fs::path replicaDir(const std::string& dir, int replica) {
  return fs::path(dir) / ("replica-" + std::to_string(replica));
}
fs::path segmentPath(const std::string& dir, int replica, uint64_t first, uint64_t last) {
  return replicaDir(dir, replica) / ("seg-" + clockName(first) + "-" + clockName(last) + ".h5");
}
fs::path snapshotDir(const std::string& dir, uint64_t clock) {
  return fs::path(dir) / ("snapshot-" + clockName(clock));
}
fs::path partPath(const std::string& dir, uint64_t clock, int rank) {
  return snapshotDir(dir, clock) / ("part-" + std::to_string(rank) + ".h5");
}

// Parses a non-empty run of decimal digits covering all of `text`.
bool parseNumber(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 19) return false;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = value;
  return true;
}

// "seg-<first>-<last>.h5"; temporary files (".seg-…") do not match.
bool parseSegmentName(const std::string& name, uint64_t* first, uint64_t* last) {
  constexpr std::string_view kPrefix = "seg-", kSuffix = ".h5";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) || !name.ends_with(kSuffix)) {
    return false;
  }
  const std::string_view body(name.data() + kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  const size_t dash = body.find('-');
  return dash != std::string_view::npos && parseNumber(body.substr(0, dash), first) &&
         parseNumber(body.substr(dash + 1), last);
}

bool parsePrefixedNumber(const std::string& name, std::string_view prefix, uint64_t* out) {
  return name.starts_with(prefix) && parseNumber(std::string_view(name).substr(prefix.size()), out);
}

// --- attributes -------------------------------------------------------------------

void writeAttr(hid_t loc, const char* name, hid_t fileType, hid_t memType, const void* value, const std::string& path) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  errno = 0;
  H5Handle attr(H5Acreate2(loc, name, fileType, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), memType, value) < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot write attribute '{}' of '{}': {}", name, path, osError(err)));
  }
}
void writeU64Attr(hid_t loc, const char* name, uint64_t value, const std::string& path) {
  writeAttr(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, path);
}
void writeI64Attr(hid_t loc, const char* name, int64_t value, const std::string& path) {
  writeAttr(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, path);
}
void writeU32Attr(hid_t loc, const char* name, uint32_t value, const std::string& path) {
  writeAttr(loc, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value, path);
}
void writeF64Attr(hid_t loc, const char* name, double value, const std::string& path) {
  writeAttr(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, path);
}
void writeStringAttr(hid_t loc, const char* name, const std::string& value, const std::string& path) {
  // Fixed length, NUL padded, UTF-8: what h5py and h5dump read as a plain string.
  std::string buffer = value;
  if (buffer.empty()) buffer.push_back('\0');
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), buffer.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  writeAttr(loc, name, type.get(), type.get(), buffer.data(), path);
}

bool readAttr(hid_t loc, const char* name, hid_t memType, void* out) {
  if (H5Aexists(loc, name) <= 0) return false;
  H5Handle attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  return attr.valid() && H5Aread(attr.get(), memType, out) >= 0;
}
bool readU64Attr(hid_t loc, const char* name, uint64_t* out) { return readAttr(loc, name, H5T_NATIVE_UINT64, out); }
bool readI64Attr(hid_t loc, const char* name, int64_t* out) { return readAttr(loc, name, H5T_NATIVE_INT64, out); }
bool readU32Attr(hid_t loc, const char* name, uint32_t* out) { return readAttr(loc, name, H5T_NATIVE_UINT32, out); }
bool readF64Attr(hid_t loc, const char* name, double* out) { return readAttr(loc, name, H5T_NATIVE_DOUBLE, out); }
bool readStringAttr(hid_t loc, const char* name, std::string* out) {
  if (H5Aexists(loc, name) <= 0) return false;
  H5Handle attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) != 0) return false;
  const size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  // Read as stored: HDF5 does not convert between character sets.
  H5Handle memType(H5Tget_native_type(type.get(), H5T_DIR_DEFAULT), H5Tclose);
  if (H5Aread(attr.get(), memType.get(), value.data()) < 0) return false;
  while (!value.empty() && value.back() == '\0') value.pop_back();
  *out = std::move(value);
  return true;
}

// --- atomic files -----------------------------------------------------------------

// Large writes bypass the page cache (O_DIRECT) where the file system allows:
// the bytes go from an aligned buffer to the device, saving the kernel's copy and
// its page cache bookkeeping, which compete with training for the cores.
constexpr size_t kDirectAlign = 4096;
constexpr hsize_t kAlignThreshold = 64 * 1024;
constexpr size_t kWriteChunk = size_t{8} << 20;
constexpr size_t kHugePage = size_t{2} << 20;
// The most a segment holds before it closes early (a group may pass it).
constexpr size_t kSegmentBytes = size_t{64} << 20;

// Closes a descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// pwrite of all of `size` bytes; false with errno set on failure.
bool pwriteAll(int fd, const std::byte* data, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

// A growable buffer aligned for direct IO; its memory is kept for the next segment.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  // Makes room for `size` bytes (at least `expected`, what a whole segment usually
  // needs, so it is allocated once), keeping the first `keep`.
  void reserve(size_t size, size_t keep, size_t expected) {
    if (size <= capacity_) return;
    size_t capacity = std::max({size + size / 4, expected, size_t{1} << 20});
    capacity = (capacity + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    // Aligned to huge pages and asking for them: fewer faults the first time, and
    // fewer pages for the kernel to pin on each direct write.
    capacity = (capacity + kHugePage - 1) / kHugePage * kHugePage;
    void* p = nullptr;
    if (::posix_memalign(&p, kHugePage, capacity) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    ::madvise(p, capacity, MADV_HUGEPAGE);
#endif
    if (keep > 0) std::memcpy(p, data_, keep);
    std::free(data_);
    data_ = static_cast<std::byte*>(p);
    capacity_ = capacity;
  }

 private:
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
};

// Writes `size` bytes of `data` (aligned for direct IO) at `offset` of the file
// `path`: whole blocks directly where the file system allows, the rest buffered,
// in pieces of kWriteChunk with `between` called after each.
void writeRaw(const fs::path& path, const std::string& target, uint64_t offset, const std::byte* data, size_t size,
              const std::function<void()>& between) {
  const auto fail = [&](int err) { throw IoError(fmt::format("cannot write '{}': {}", target, std::strerror(err))); };
  Fd buffered(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (buffered.get() < 0) fail(errno);
  int directFd = -1;
#ifdef O_DIRECT
  if (offset % kDirectAlign == 0) directFd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
#endif
  Fd direct(directFd);
  bool useDirect = direct.get() >= 0;
  for (size_t at = 0; at < size;) {
    const size_t n = std::min(kWriteChunk, size - at);
    const size_t whole = useDirect ? n / kDirectAlign * kDirectAlign : 0;
    if (whole > 0 && !pwriteAll(direct.get(), data + at, whole, offset + at)) {
      if (errno != EINVAL) fail(errno);
      useDirect = false;  // refused after all: buffered from here on
      continue;
    }
    if (n > whole && !pwriteAll(buffered.get(), data + at + whole, n - whole, offset + at + whole)) fail(errno);
    at += n;
    if (between) between();
  }
}

// fsync through a fresh descriptor: HDF5 does not expose its own.
void syncPath(const fs::path& path, const std::string& what, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0));
  if (fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot open '{}' to sync {}: {}", path.string(), what, std::strerror(err)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot sync a directory; the rename is then as durable as they make it.
  if (rc != 0 && !(directory && (err == EINVAL || err == EROFS))) {
    throw IoError(fmt::format("cannot sync '{}': {}", what, std::strerror(err)));
  }
}

// Writes `path` as a whole or not at all: `fill` writes the HDF5 file under a
// temporary name in the same directory, which is then flushed, closed, synced and
// renamed, and the directory synced. `afterClose`, when given, writes into the
// closed temporary file before it is synced (raw data HDF5 only allocated). On
// failure only the temporary file existed and is removed; IoError names `path` and
// the OS error. Returns the file's size.
uint64_t writeAtomically(const fs::path& path, const std::function<void(hid_t file)>& fill,
                         const std::function<void(const fs::path& tmp)>& afterClose = nullptr) {
  static std::atomic<uint64_t> counter{0};
  const fs::path dir = path.parent_path();
  const std::string target = path.string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create directory '{}': {}", dir.string(), ec.message()));
  const fs::path tmp = dir / fmt::format(".{}.{}-{}.tmp", path.filename().string(), ::getpid(), counter.fetch_add(1));
  uint64_t size = 0;
  try {
    // Creation order is tracked so readers list parameters in model order; dense
    // attribute storage (HDF5 1.8 format) lifts the 64 KiB attribute limit, which a
    // stored .loss text may pass.
    H5Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    H5Pset_link_creation_order(fcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    H5Pset_attr_phase_change(fcpl.get(), 0, 0);
    H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    // Large raw data starts on a file system block, so it can be written directly.
    H5Pset_alignment(fapl.get(), kAlignThreshold, kDirectAlign);
#if H5_VERSION_GE(1, 10, 7)
    // The file is private until renamed; locks only fail on shared file systems.
    H5Pset_file_locking(fapl.get(), false, true);
#endif
    errno = 0;
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, fcpl.get(), fapl.get()), H5Fclose);
    if (!file.valid()) {
      const int err = errno;
      throw IoError(fmt::format("cannot create '{}': {}", target, osError(err)));
    }
    fill(file.get());
    errno = 0;
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) {
      const int err = errno;
      throw IoError(fmt::format("cannot write '{}': {}", target, osError(err)));
    }
    errno = 0;
    if (H5Fclose(file.release()) < 0) {
      const int err = errno;
      throw IoError(fmt::format("cannot write '{}': {}", target, osError(err)));
    }
    if (afterClose) afterClose(tmp);
    syncPath(tmp, target, false);
    size = fs::file_size(tmp, ec);
    if (ec) throw IoError(fmt::format("cannot write '{}': {}", target, ec.message()));
    fs::rename(tmp, path, ec);
    if (ec) throw IoError(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), target, ec.message()));
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  syncPath(dir, dir.string(), true);
  return size;
}

// Opens an HDF5 file for reading; invalid handle when it cannot be.
H5Handle openForReading(const std::string& path) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl.get(), false, true);
#endif
  if (H5Fis_hdf5(path.c_str()) <= 0) return H5Handle(-1, H5Fclose);
  return H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
}

// --- datasets ---------------------------------------------------------------------

// A compound type for EntryRow: `file` true gives the stored little-endian layout.
H5Handle entryType(bool file) {
  H5Handle type(H5Tcreate(H5T_COMPOUND, sizeof(EntryRow)), H5Tclose);
  H5Tinsert(type.get(), "clock", HOFFSET(EntryRow, clock), file ? H5T_STD_U64LE : H5T_NATIVE_UINT64);
  H5Tinsert(type.get(), "kind", HOFFSET(EntryRow, kind), file ? H5T_STD_U32LE : H5T_NATIVE_UINT32);
  H5Tinsert(type.get(), "records", HOFFSET(EntryRow, records), file ? H5T_STD_U32LE : H5T_NATIVE_UINT32);
  return type;
}

// Creates a one-dimensional dataset of `count` elements; its space is allocated on
// the first write, without a fill pass.
H5Handle createVector(hid_t file, const char* name, hid_t type, hsize_t count, const std::string& path) {
  H5Handle space(H5Screate_simple(1, &count, nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  errno = 0;
  H5Handle set(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!set.valid()) {
    const int err = errno;
    throw IoError(fmt::format("cannot create dataset '{}' in '{}': {}", name, path, osError(err)));
  }
  return set;
}

void writeAll(hid_t set, hid_t memType, const void* data, const char* name, const std::string& path) {
  errno = 0;
  if (H5Dwrite(set, memType, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot write dataset '{}' of '{}': {}", name, path, osError(err)));
  }
}

// Reads a one-dimensional dataset whole; false when absent or not readable as T.
template <typename T>
bool readVector(hid_t file, const char* name, hid_t memType, std::vector<T>* out) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return false;
  H5Handle set(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (!set.valid()) return false;
  H5Handle space(H5Dget_space(set.get()), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1) return false;
  hsize_t count = 0;
  H5Sget_simple_extent_dims(space.get(), &count, nullptr);
  out->resize(static_cast<size_t>(count));
  return count == 0 || H5Dread(set.get(), memType, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) >= 0;
}

// --- segments ---------------------------------------------------------------------

// What the IO thread hands to writeSegment: a segment in stored form.
// A segment as the IO thread builds it: its records copied, one after another, into
// one aligned buffer (the worker's own batches encoded there), with their rows,
// sizes and CRC.
struct BuiltSegment {
  int replica = -1;  // -1: nothing being built
  AlignedBuffer data;
  size_t used = 0;
  std::vector<EntryRow> rows;
  std::vector<uint64_t> sizes;
  uint32_t recordsCrc = 0;  // CRC32C of all records' bytes, concatenated
  size_t bytes = 0;         // record bytes, as counted in the writer's staged_

  void reset(int id) {
    replica = id;
    used = 0;
    rows.clear();
    sizes.clear();
    recordsCrc = 0;
    bytes = 0;
  }
};

// The segment's CRC: over all records' bytes, then the rows, then the sizes.
uint32_t segmentCrc(uint32_t recordsCrc, const std::vector<EntryRow>& rows, const std::vector<uint64_t>& sizes) {
  uint32_t crc = crc32c(recordsCrc, rows.data(), rows.size() * sizeof(EntryRow));
  return crc32c(crc, sizes.data(), sizes.size() * sizeof(uint64_t));
}

uint32_t segmentCrc(const std::vector<uint8_t>& records, const std::vector<EntryRow>& rows,
                    const std::vector<uint64_t>& sizes) {
  return segmentCrc(crc32c(0, records.data(), records.size()), rows, sizes);
}

// Writes replica `replica`'s segment of clocks first..last; `between` runs while the
// records are being written (between pieces). Returns the file's size.
uint64_t writeSegment(const std::string& dir, int replica, uint64_t first, uint64_t last, const BuiltSegment& seg,
                      const std::function<void()>& between) {
  const fs::path path = segmentPath(dir, replica, first, last);
  const std::string name = path.string();
  const uint64_t total = seg.used;
  haddr_t recordsAt = HADDR_UNDEF;  // where the records go once HDF5 has closed the file
  const auto fill = [&](hid_t file) {
    {
      // The records dataset is allocated now, contiguous, block aligned and never
      // filled; its bytes are written after HDF5 closes the file, straight from the
      // segment's buffer.
      const hsize_t count = total;
      H5Handle space(H5Screate_simple(1, &count, nullptr), H5Sclose);
      H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
      H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
      errno = 0;
      H5Handle set(H5Dcreate2(file, "records", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                   H5Dclose);
      if (!set.valid()) {
        const int err = errno;
        throw IoError(fmt::format("cannot create dataset 'records' in '{}': {}", name, osError(err)));
      }
      if (total > 0) recordsAt = H5Dget_offset(set.get());
      if (total > 0 && recordsAt == HADDR_UNDEF) writeAll(set.get(), H5T_NATIVE_UINT8, seg.data.data(), "records", name);
    }
    {
      H5Handle fileType = entryType(true);
      H5Handle memType = entryType(false);
      H5Handle set = createVector(file, "entries", fileType.get(), seg.rows.size(), name);
      if (!seg.rows.empty()) writeAll(set.get(), memType.get(), seg.rows.data(), "entries", name);
    }
    {
      H5Handle set = createVector(file, "record_sizes", H5T_STD_U64LE, seg.sizes.size(), name);
      if (!seg.sizes.empty()) writeAll(set.get(), H5T_NATIVE_UINT64, seg.sizes.data(), "record_sizes", name);
    }
    writeI64Attr(file, "version", kSegmentVersion, name);
    writeU64Attr(file, "first_clock", first, name);
    writeU64Attr(file, "last_clock", last, name);
    writeI64Attr(file, "replica", replica, name);
    writeU32Attr(file, "crc32c", segmentCrc(seg.recordsCrc, seg.rows, seg.sizes), name);
  };
  const auto raw = [&](const fs::path& tmp) {
    if (recordsAt != HADDR_UNDEF) writeRaw(tmp, name, recordsAt, seg.data.data(), total, between);
  };
  return writeAtomically(path, fill, raw);
}

// Copies one staged entry into `seg`: received records as they are, the worker's
// own batches encoded; each record's CRC is taken from its header when that is
// known to be right, else computed on the copy while it is in cache.
void appendEntry(BuiltSegment& seg, uint64_t clock, EventKind kind, const std::vector<Record>& records,
                 size_t segmentBytes) {
  seg.rows.push_back({clock, static_cast<uint32_t>(kind), static_cast<uint32_t>(records.size())});
  for (const Record& r : records) {
    const size_t size = r.size();
    seg.data.reserve(seg.used + size, seg.used, segmentBytes + segmentBytes / 8);
    std::byte* out = seg.data.data() + seg.used;
    uint32_t crc = 0;
    if (r.batch) {
      crc = wholeRecordCrc(encodeInto(*r.batch, out), size);
    } else if (r.checkedCrc) {
      streamCopy(out, r.bytes.data(), size);
      crc = wholeRecordCrc(storedCrc(r.bytes), size);
    } else {
      crc = copyWithCrc(r.bytes.data(), size, out);
    }
    seg.used += size;
    seg.sizes.push_back(size);
    seg.recordsCrc = crc32cCombine(seg.recordsCrc, crc, size);
  }
}

// Reads and verifies a segment against its name and CRC. Returns why it is damaged,
// or "" with its entries in `out` (when given).
std::string loadSegment(const std::string& path, int replica, uint64_t first, uint64_t last,
                        std::vector<LogEntry>* out, std::vector<ClockRange>* lost = nullptr) {
  H5Handle file = openForReading(path);
  if (!file.valid()) return "not a readable HDF5 file (truncated or overwritten)";
  int64_t version = 0, storedReplica = 0;
  uint64_t storedFirst = 0, storedLast = 0;
  uint32_t storedCrc = 0;
  if (!readI64Attr(file.get(), "version", &version) || !readU64Attr(file.get(), "first_clock", &storedFirst) ||
      !readU64Attr(file.get(), "last_clock", &storedLast) || !readI64Attr(file.get(), "replica", &storedReplica) ||
      !readU32Attr(file.get(), "crc32c", &storedCrc)) {
    return "its attributes are missing or unreadable";
  }
  if (version < 1 || version > kSegmentVersion) return fmt::format("unknown format version {}", version);
  if (storedFirst != first || storedLast != last || first > last) {
    return fmt::format("it holds clocks {}..{}, its name says {}..{}", storedFirst, storedLast, first, last);
  }
  if (storedReplica != replica) return fmt::format("it belongs to replica {}", storedReplica);

  std::vector<uint8_t> records;
  std::vector<EntryRow> rows;
  std::vector<uint64_t> sizes;
  H5Handle memType = entryType(false);
  if (!readVector(file.get(), "records", H5T_NATIVE_UINT8, &records)) return "dataset 'records' is unreadable";
  if (!readVector(file.get(), "entries", memType.get(), &rows)) return "dataset 'entries' is unreadable";
  if (!readVector(file.get(), "record_sizes", H5T_NATIVE_UINT64, &sizes)) {
    return "dataset 'record_sizes' is unreadable";
  }
  if (segmentCrc(records, rows, sizes) != storedCrc) return "CRC32C mismatch";

  // The CRC matched, so what follows only fails for a file written by something else.
  uint64_t recordCount = 0, byteCount = 0;
  for (const EntryRow& r : rows) recordCount += r.records;
  for (uint64_t s : sizes) byteCount += s;
  if (recordCount != sizes.size() || byteCount != records.size()) return "entries, sizes and records disagree";
  uint64_t previous = first;
  {
    size_t record = 0, offset = 0;
    for (const EntryRow& r : rows) {
      if (r.clock < previous || r.clock > last) return fmt::format("entry of clock {} out of order", r.clock);
      const auto kind = static_cast<EventKind>(r.kind);
      if (r.kind > static_cast<uint32_t>(EventKind::kReset)) return fmt::format("unknown entry kind {}", r.kind);
      if (kind == EventKind::kReset) {
        // One record: the clock reset to and the end of the log before it.
        if (r.records != 1 || sizes[record] != 2 * sizeof(uint64_t)) return "a reset event is malformed";
        uint64_t values[2];
        std::memcpy(values, records.data() + offset, sizeof(values));
        const uint64_t resetTo = values[0], logEnd = values[1];
        if (logEnd > resetTo || resetTo > r.clock || logEnd >= r.clock || logEnd + 1 < first) {
          return fmt::format("a reset at clock {} to clock {} after a log ending at clock {}", r.clock, resetTo, logEnd);
        }
        if (previous > logEnd && &r != &rows.front()) {
          return fmt::format("the reset at clock {} follows entries past clock {}", r.clock, logEnd);
        }
        if (lost) {
          // The states of the clocks between the log's end and the reset are gone,
          // except a snapshot's the replica was reset to.
          const uint64_t cut = resetTo > logEnd && resetTo < r.clock ? resetTo : r.clock;
          if (logEnd + 1 < cut) lost->push_back({logEnd + 1, cut - 1});
          if (cut + 1 < r.clock) lost->push_back({cut + 1, r.clock - 1});
        }
      } else if (kind != EventKind::kGroup && r.records != 0) {
        return "an event carries records";
      }
      for (uint32_t i = 0; i < r.records; ++i, ++record) offset += sizes[record];
      previous = r.clock;
    }
  }
  if (out) {
    size_t record = 0, offset = 0;
    for (const EntryRow& r : rows) {
      LogEntry e;
      e.clock = r.clock;
      e.kind = static_cast<EventKind>(r.kind);
      if (e.kind == EventKind::kReset) {
        uint64_t values[2];
        std::memcpy(values, records.data() + offset, sizeof(values));
        e.resetTo = values[0];
        e.logEnd = values[1];
        offset += sizes[record++];
        out->push_back(std::move(e));
        continue;
      }
      e.records.reserve(r.records);
      for (uint32_t i = 0; i < r.records; ++i, ++record) {
        const auto* begin = reinterpret_cast<const std::byte*>(records.data()) + offset;
        e.records.emplace_back(begin, begin + sizes[record]);
        offset += sizes[record];
      }
      out->push_back(std::move(e));
    }
  }
  return "";
}

struct SegmentFile {
  std::string path;
  uint64_t first = 0;
  uint64_t last = 0;
};

// The segments of one replica by first (then last) clock; none when the directory
// does not exist.
std::vector<SegmentFile> listSegments(const fs::path& dir) {
  std::vector<SegmentFile> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    SegmentFile s;
    if (!e.is_regular_file(ec) || !parseSegmentName(e.path().filename().string(), &s.first, &s.last)) continue;
    s.path = e.path().string();
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const SegmentFile& a, const SegmentFile& b) {
    return a.first != b.first ? a.first < b.first : a.last < b.last;
  });
  return out;
}

// Whether a segment starting at `first` continues a chain that has reached `reached`
// (0: nothing yet, so the chain must start at the first clock). See the top of file.
bool continuesChain(uint64_t reached, bool started, uint64_t first) {
  if (!started) return first <= 1;
  return first == reached + 1 || first == reached;
}

// --- snapshots --------------------------------------------------------------------

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

int64_t blockBegin(int64_t rows, int rank, int ranks) { return rows * rank / ranks; }

struct PartBlock {
  std::string name;
  int64_t fullRows = 0;
  RowMajor rows;
};
struct Part {
  uint64_t clock = 0;
  int64_t rank = 0;
  int64_t ranks = 0;
  std::vector<PartBlock> blocks;  // in parameter order
};

// Reads and verifies one snapshot part; returns why it is unusable, or "".
std::string loadPart(const std::string& path, Part* part) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "missing";
  H5Handle file = openForReading(path);
  if (!file.valid()) return "not a readable HDF5 file";
  int64_t version = 0;
  std::string names;
  if (!readI64Attr(file.get(), "version", &version) || !readU64Attr(file.get(), "clock", &part->clock) ||
      !readI64Attr(file.get(), "rank", &part->rank) || !readI64Attr(file.get(), "ranks", &part->ranks) ||
      !readStringAttr(file.get(), "parameters", &names)) {
    return "its attributes are missing or unreadable";
  }
  if (version < 1 || version > kFormatVersion) return fmt::format("unknown format version {}", version);
  if (part->ranks < 1 || part->rank < 0 || part->rank >= part->ranks) return "bad rank attributes";
  for (size_t begin = 0; begin < names.size();) {
    const size_t end = std::min(names.find('\n', begin), names.size());
    PartBlock block;
    block.name = names.substr(begin, end - begin);
    begin = end + 1;
    H5Handle set(H5Dopen2(file.get(), block.name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!set.valid()) return fmt::format("dataset '{}' is missing", block.name);
    H5Handle space(H5Dget_space(set.get()), H5Sclose);
    if (H5Sget_simple_extent_ndims(space.get()) != 2) return fmt::format("dataset '{}' is not 2-D", block.name);
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    uint32_t crc = 0;
    if (!readI64Attr(set.get(), "rows", &block.fullRows) || !readU32Attr(set.get(), "crc32c", &crc)) {
      return fmt::format("dataset '{}' lacks its attributes", block.name);
    }
    block.rows.resize(static_cast<Eigen::Index>(dims[0]), static_cast<Eigen::Index>(dims[1]));
    if (block.rows.size() > 0 &&
        H5Dread(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, block.rows.data()) < 0) {
      return fmt::format("dataset '{}' is unreadable", block.name);
    }
    if (crc32c(0, block.rows.data(), static_cast<size_t>(block.rows.size()) * sizeof(float)) != crc) {
      return fmt::format("dataset '{}' fails its CRC32C", block.name);
    }
    const int64_t expected =
        blockBegin(block.fullRows, static_cast<int>(part->rank) + 1, static_cast<int>(part->ranks)) -
        blockBegin(block.fullRows, static_cast<int>(part->rank), static_cast<int>(part->ranks));
    if (static_cast<int64_t>(dims[0]) != expected) {
      return fmt::format("dataset '{}' holds {} rows, its block has {}", block.name, dims[0], expected);
    }
    part->blocks.push_back(std::move(block));
  }
  return "";
}

// Reads every part of a snapshot and checks that they agree (with `shapes` when
// given). Returns why the snapshot is unusable, or ""; assembles into `out` when given.
std::string assembleSnapshot(const std::string& dir, uint64_t clock, const ParamSet* shapes, ParamSet* out) {
  Part part;
  std::string problem = loadPart(partPath(dir, clock, 0).string(), &part);
  if (!problem.empty()) return fmt::format("part 0: {}", problem);
  const int ranks = static_cast<int>(part.ranks);
  // Part 0 sets what every part must hold: the parameter names, full rows, columns.
  struct Shape {
    std::string name;
    int64_t rows;
    int64_t cols;
  };
  std::vector<Shape> reference;
  for (const auto& b : part.blocks) reference.push_back({b.name, b.fullRows, b.rows.cols()});
  if (shapes) {
    if (reference.size() != shapes->size()) {
      return fmt::format("it holds {} parameters, the model has {}", reference.size(), shapes->size());
    }
    for (const Param& p : shapes->params) {
      const auto it =
          std::find_if(reference.begin(), reference.end(), [&](const Shape& s) { return s.name == p.name; });
      if (it == reference.end()) return fmt::format("it lacks parameter '{}'", p.name);
      if (it->rows != p.value.rows() || it->cols != p.value.cols()) {
        return fmt::format("parameter '{}' is {}x{}, the model's is {}x{}", p.name, it->rows, it->cols, p.value.rows(),
                           p.value.cols());
      }
    }
  }
  if (out) {
    // In the model's order when it is given, else in the stored order.
    out->params.clear();
    if (shapes) {
      for (const Param& p : shapes->params) out->params.push_back({p.name, Matrix(p.value.rows(), p.value.cols())});
    } else {
      for (const Shape& s : reference) out->params.push_back({s.name, Matrix(s.rows, s.cols)});
    }
  }
  for (int r = 0; r < ranks; ++r) {
    if (r > 0) {
      part = Part{};
      problem = loadPart(partPath(dir, clock, r).string(), &part);
      if (!problem.empty()) return fmt::format("part {}: {}", r, problem);
    }
    if (part.clock != clock || part.ranks != ranks || part.rank != r) {
      return fmt::format("part {} claims clock {}, rank {} of {}", r, part.clock, part.rank, part.ranks);
    }
    if (part.blocks.size() != reference.size()) return fmt::format("part {} holds other parameters", r);
    for (size_t i = 0; i < part.blocks.size(); ++i) {
      const PartBlock& b = part.blocks[i];
      if (b.name != reference[i].name || b.fullRows != reference[i].rows || b.rows.cols() != reference[i].cols) {
        return fmt::format("part {} disagrees with part 0 on parameter '{}'", r, b.name);
      }
      if (out) {
        const int index = out->find(b.name);
        (*out)[static_cast<size_t>(index)].middleRows(blockBegin(b.fullRows, r, ranks), b.rows.rows()) = b.rows;
      }
    }
  }
  return "";
}

}  // namespace

// --- job --------------------------------------------------------------------------

void writeJobInfo(const std::string& dir, const JobInfo& info) {
  silenceHdf5();
  const fs::path path = fs::path(dir) / kJobFile;
  const std::string name = path.string();
  writeAtomically(path, [&](hid_t file) {
    writeI64Attr(file, "version", kFormatVersion, name);
    writeStringAttr(file, "model_name", info.modelName, name);
    writeStringAttr(file, "model_text", info.modelText, name);
    writeStringAttr(file, "model_spec", info.modelSpec, name);
    writeI64Attr(file, "features", info.features, name);
    writeI64Attr(file, "classes", info.classes, name);
    writeU64Attr(file, "seed", info.seed, name);
    writeI64Attr(file, "ranks", info.ranks, name);
    writeI64Attr(file, "batch", info.batch, name);
    writeF64Attr(file, "lr", info.lr, name);
    writeStringAttr(file, "flags", info.flags, name);
  });
}

JobInfo readJobInfo(const std::string& dir) {
  silenceHdf5();
  const std::string path = (fs::path(dir) / kJobFile).string();
  std::error_code ec;
  ORPHEUS_CHECK_INPUT(fs::exists(path, ec), "checkpoint '{}' has no job file '{}'", dir, path);
  H5Handle file = openForReading(path);
  ORPHEUS_CHECK_INPUT(file.valid(), "job file '{}' is not a readable HDF5 file", path);
  JobInfo info;
  int64_t version = 0, ranks = 0;
  const auto require = [&](bool ok, const char* name) {
    ORPHEUS_CHECK_INPUT(ok, "job file '{}' lacks a readable attribute '{}'", path, name);
  };
  require(readI64Attr(file.get(), "version", &version), "version");
  ORPHEUS_CHECK_INPUT(version >= 1 && version <= kFormatVersion, "job file '{}' has unknown format version {}", path,
                      version);
  require(readStringAttr(file.get(), "model_name", &info.modelName), "model_name");
  require(readStringAttr(file.get(), "model_text", &info.modelText), "model_text");
  require(readStringAttr(file.get(), "model_spec", &info.modelSpec), "model_spec");
  require(readI64Attr(file.get(), "features", &info.features), "features");
  require(readI64Attr(file.get(), "classes", &info.classes), "classes");
  require(readU64Attr(file.get(), "seed", &info.seed), "seed");
  require(readI64Attr(file.get(), "ranks", &ranks), "ranks");
  require(readI64Attr(file.get(), "batch", &info.batch), "batch");
  require(readF64Attr(file.get(), "lr", &info.lr), "lr");
  require(readStringAttr(file.get(), "flags", &info.flags), "flags");
  info.ranks = static_cast<int>(ranks);
  return info;
}

// --- writer -----------------------------------------------------------------------

Record Record::encoded(SharedBytes bytes, bool checkedCrc) {
  ORPHEUS_ENFORCE(bytes != nullptr, "checkpoint log: a null record");
  Record r;
  r.bytes = std::span<const std::byte>(*bytes);
  r.owner = std::move(bytes);
  r.checkedCrc = checkedCrc;
  return r;
}

Record Record::part(std::shared_ptr<const void> owner, std::span<const std::byte> bytes, bool checkedCrc) {
  ORPHEUS_ENFORCE(owner != nullptr, "checkpoint log: a record without its owner");
  Record r;
  r.owner = std::move(owner);
  r.bytes = bytes;
  r.checkedCrc = checkedCrc;
  return r;
}

Record Record::of(std::shared_ptr<const SvBatch> batch) {
  ORPHEUS_ENFORCE(batch != nullptr, "checkpoint log: a null batch");
  Record r;
  r.batch = std::move(batch);
  return r;
}

struct SvLogWriter::Segment : BuiltSegment {};

SvLogWriter::SvLogWriter(std::string dir, int replica, size_t stagingBytes, int clocksPerSegment)
    : dir_(std::move(dir)),
      clocksPerSegment_(clocksPerSegment),
      stagingLimit_(stagingBytes),
      segmentBytes_(std::min(stagingBytes / 2, kSegmentBytes)),
      replica_(replica),
      building_(std::make_unique<Segment>()),
      writing_(std::make_unique<Segment>()) {
  ORPHEUS_CHECK_INPUT(clocksPerSegment >= 1, "a log segment must span at least one clock, not {}", clocksPerSegment);
  ORPHEUS_CHECK_INPUT(replica >= 0, "replica id {} is negative", replica);
  thread_ = std::thread([this] { run(); });
}

SvLogWriter::~SvLogWriter() {
  if (!abandoned_) {
    try {
      flush();
    } catch (const std::exception& e) {
      spdlog::error("checkpoint log of replica {} is incomplete: {}", replica_, e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int SvLogWriter::replica() const { return replica_; }

uint64_t SvLogWriter::bytesWritten() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytesWritten_;
}

void SvLogWriter::push(Command command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(command));
  }
  cv_.notify_all();
}

void SvLogWriter::startSegment(uint64_t clock) {
  if (openStarted_) return;
  openStarted_ = true;
  // Within one replica this writer's segments chain exactly; the first one starts
  // at the first clock it sees.
  openFirst_ = chainEnd_ ? *chainEnd_ + 1 : clock;
  openLast_ = openFirst_;
}

void SvLogWriter::closeIfDue(uint64_t clock) {
  // A segment due at clock c stays open until a later clock begins: entries that
  // arrive after endClock(c) but still belong to clock c (late SSP batches) then
  // land in the segment that holds c.
  if (closeDue_ && clock > lastEnded_) closeSegment();
}

void SvLogWriter::stage(Entry entry, size_t bytes) {
  ORPHEUS_ENFORCE(entry.clock >= lastEntry_ && entry.clock >= lastEnded_,
                  "checkpoint log: an entry of clock {} after clock {} (ended: {})", entry.clock, lastEntry_,
                  lastEnded_);
  ORPHEUS_ENFORCE(!chainEnd_ || entry.clock > *chainEnd_,
                  "checkpoint log: an entry of clock {} after its segment was closed", entry.clock);
  startSegment(entry.clock);
  lastEntry_ = entry.clock;
  openLast_ = std::max(openLast_, entry.clock);
  openBytes_ += bytes;
  Command c;
  c.type = Command::Type::kEntry;
  c.replica = replica_;
  c.entry = std::move(entry);
  c.bytes = bytes;
  push(std::move(c));
}

void SvLogWriter::waitForRoom(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  // Only closed segments drain; the open one is held until its clock boundary, so a
  // group larger than what the queue can free is staged over the limit.
  const auto full = [&] { return staged_ + bytes > stagingLimit_ && staged_ > openBytes_ && !error_; };
  if (full()) {
    const auto start = std::chrono::steady_clock::now();
    const bool drained = cv_.wait_for(lock, kStallTimeout, [&] { return !full(); });
    waitSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!drained) {
      throw IoError(fmt::format("checkpoint writer stalled: {} bytes of replica {} not written to '{}' in {} s",
                                staged_, replica_, dir_, std::chrono::seconds(kStallTimeout).count()));
    }
  }
  staged_ += bytes;
}

void SvLogWriter::appendGroup(uint64_t clock, std::vector<SharedBytes> records) {
  std::vector<Record> converted;
  converted.reserve(records.size());
  for (auto& r : records) {
    ORPHEUS_ENFORCE(r != nullptr, "checkpoint log: a null record in the group of clock {}", clock);
    converted.push_back(Record::encoded(std::move(r)));
  }
  appendGroup(clock, std::move(converted));
}

void SvLogWriter::appendGroup(uint64_t clock, std::vector<Record> records) {
  size_t bytes = 0;
  for (const auto& r : records) bytes += r.size();
  closeIfDue(clock);
  waitForRoom(bytes);
  stage(Entry{clock, EventKind::kGroup, std::move(records)}, bytes);
}

void SvLogWriter::appendEvent(uint64_t clock, EventKind kind) {
  ORPHEUS_ENFORCE(kind != EventKind::kGroup && kind != EventKind::kReset,
                  "checkpoint log: event kind {} staged without its contents at clock {}", static_cast<uint32_t>(kind),
                  clock);
  stageEvent(clock, kind, {});
}

void SvLogWriter::stageEvent(uint64_t clock, EventKind kind, std::vector<Record> records) {
  closeIfDue(clock);
  size_t bytes = 0;
  for (const auto& r : records) bytes += r.size();
  if (bytes > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    staged_ += bytes;
  }
  stage(Entry{clock, kind, std::move(records)}, bytes);
}

void SvLogWriter::endClock(uint64_t clock) {
  ORPHEUS_ENFORCE(clock >= lastEntry_ && clock >= lastEnded_ && (!chainEnd_ || clock > *chainEnd_),
                  "checkpoint log: clock {} ended after clock {} (entries up to {})", clock, lastEnded_, lastEntry_);
  closeIfDue(clock);
  startSegment(clock);
  lastEnded_ = clock;
  openLast_ = std::max(openLast_, clock);
  // A segment closes every clocksPerSegment clocks, or earlier once it holds
  // segmentBytes_ (at most half the staging area), so the disk writes one segment
  // while the next one fills, and the buffers they are built in stay small.
  const bool longEnough = clock - openFirst_ + 1 >= static_cast<uint64_t>(clocksPerSegment_);
  const bool big = openBytes_ > 0 && openBytes_ >= segmentBytes_;
  closeDue_ = closeDue_ || longEnough || big;
}

void SvLogWriter::closeSegment() {
  closeDue_ = false;
  if (!openStarted_) return;
  // A segment of nothing but the hand-over clock would take the previous holder's
  // file name (see the top of this file); it stays open into the next clock.
  const bool handOverOnly = handOver_ && openFirst_ == *handOver_ && openLast_ == *handOver_;
  if (handOverOnly && openBytes_ == 0) return;
  chainEnd_ = openLast_;
  Command c;
  c.type = Command::Type::kClose;
  c.replica = replica_;
  c.firstClock = openFirst_;
  c.lastClock = openLast_;
  openStarted_ = false;
  openBytes_ = 0;
  push(std::move(c));
}

void SvLogWriter::switchReplica(int id) {
  ORPHEUS_CHECK_INPUT(id >= 0, "replica id {} is negative", id);
  const uint64_t seen = std::max(lastEnded_, lastEntry_);
  closeSegment();
  if (openStarted_) {
    // Still open: only the hand-over events of the previous arrival, which are not
    // written, as the previous holder's segment already ends that clock.
    Command c;
    c.type = Command::Type::kDrop;
    c.replica = replica_;
    push(std::move(c));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    replica_ = id;
    durable_ = seen;
  }
  openStarted_ = false;
  openBytes_ = 0;
  chainEnd_.reset();
  lastEnded_ = 0;
  lastEntry_ = 0;
  handOver_ = seen > 0 ? std::optional<uint64_t>(seen) : std::nullopt;
}

void SvLogWriter::resumeAt(int id, uint64_t clock) {
  switchReplica(id);
  std::lock_guard<std::mutex> lock(mu_);
  durable_ = clock;
  handOver_.reset();
  if (clock > 0) {
    chainEnd_ = clock;
    lastEnded_ = clock;
  }
}

uint64_t SvLogWriter::discardStaged() {
  openStarted_ = false;
  openBytes_ = 0;
  closeDue_ = false;
  uint64_t durable = 0;
  std::deque<Command> dropped;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // What the IO thread has not taken of this replica was only in memory; what it
    // took and has not written goes with a drop. A write in progress completes.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->replica == replica_) {
        if (it->type == Command::Type::kEntry) staged_ -= it->bytes;
        dropped.push_back(std::move(*it));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    Command c;
    c.type = Command::Type::kDrop;
    c.replica = replica_;
    pending_.push_back(std::move(c));
    cv_.notify_all();
    const bool done = cv_.wait_for(lock, kStallTimeout, [&] { return pending_.empty() && idle_; });
    if (!done) {
      throw IoError(fmt::format("checkpoint writer stalled: {} bytes of replica {} not written to '{}' in {} s",
                                staged_, replica_, dir_, std::chrono::seconds(kStallTimeout).count()));
    }
    durable = durable_;
  }
  // Entries after the durable end would follow a hole: the log continues from there.
  chainEnd_ = durable;
  handOver_.reset();
  return durable;
}

void SvLogWriter::appendReset(uint64_t clock, uint64_t resetTo) {
  ORPHEUS_ENFORCE(chainEnd_ && resetTo >= *chainEnd_ && resetTo <= clock && *chainEnd_ < clock,
                  "checkpoint log: a reset to clock {} at clock {} (log on disk up to {})", resetTo, clock,
                  chainEnd_ ? *chainEnd_ : 0);
  auto record = std::make_shared<std::vector<std::byte>>(2 * sizeof(uint64_t));
  const uint64_t values[2] = {resetTo, *chainEnd_};
  std::memcpy(record->data(), values, sizeof(values));
  stageEvent(clock, EventKind::kReset, {Record::encoded(std::move(record))});
}

void SvLogWriter::abandon() {
  openStarted_ = false;
  openBytes_ = 0;
  std::deque<Command> dropped;
  {
    std::unique_lock<std::mutex> lock(mu_);
    abandoned_ = true;
    dropped.swap(pending_);
    cv_.wait_for(lock, kStallTimeout, [&] { return idle_; });
    staged_ = 0;
  }
}

void SvLogWriter::check() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void SvLogWriter::flush() {
  closeSegment();
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = cv_.wait_for(lock, kStallTimeout, [&] { return pending_.empty() && idle_; });
  if (!done) {
    throw IoError(fmt::format("checkpoint writer stalled: {} bytes of replica {} not written to '{}' in {} s", staged_,
                              replica_, dir_, std::chrono::seconds(kStallTimeout).count()));
  }
  if (error_) std::rethrow_exception(error_);
}

void SvLogWriter::run() {
  silenceHdf5();
  // This thread keeps up with the compute thread rather than yielding to it: a
  // group copied at once is released while it is in cache and its memory serves the
  // next clock's batches; a lagging writer would make the process fault in fresh
  // memory every clock and then catch up in a burst.
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) break;
    Command command = std::move(pending_.front());
    pending_.pop_front();
    idle_ = false;
    const bool skip = error_ != nullptr || abandoned_;
    lock.unlock();
    consume(command, skip);
    command = Command{};  // releases the records outside the lock
    lock.lock();
    idle_ = true;
    cv_.notify_all();
  }
}

void SvLogWriter::takeEntries() {
  // While a segment is being written, entries of the next one are copied in (so
  // they are released while still in cache); closes and drops wait their turn.
  for (;;) {
    Command command;
    bool skip = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() || pending_.front().type != Command::Type::kEntry) return;
      command = std::move(pending_.front());
      pending_.pop_front();
      skip = error_ != nullptr || abandoned_;
    }
    consume(command, skip);
  }
}

void SvLogWriter::consume(Command& command, bool skip) {
  Segment& seg = *building_;
  size_t freed = 0;  // record bytes no longer staged
  switch (command.type) {
    case Command::Type::kEntry:
      if (seg.replica != command.replica) {
        // Not expected (a segment ends with a close or a drop): what was built is not written.
        freed += seg.bytes;
        seg.reset(command.replica);
      }
      seg.bytes += command.bytes;
      // After a failure nothing is written: no need to copy.
      if (!skip) appendEntry(seg, command.entry.clock, command.entry.kind, command.entry.records, segmentBytes_);
      break;
    case Command::Type::kDrop:
      if (seg.replica == command.replica) {
        freed += seg.bytes;
        seg.reset(-1);
      }
      break;
    case Command::Type::kClose: {
      if (seg.replica != command.replica) {
        freed += seg.bytes;
        seg.reset(command.replica);  // a segment with no entries
      }
      // The built segment is written while the next one is built in the other buffer.
      std::swap(building_, writing_);
      building_->reset(-1);
      Segment& out = *writing_;
      uint64_t written = 0;
      std::exception_ptr error;
      if (!skip) {
        try {
          written = writeSegment(dir_, command.replica, command.firstClock, command.lastClock, out,
                                 [this] { takeEntries(); });
        } catch (...) {
          error = std::current_exception();
        }
      }
      freed += out.bytes;
      out.reset(-1);
      std::lock_guard<std::mutex> lock(mu_);
      staged_ -= freed;
      bytesWritten_ += written;
      if (error && !error_) error_ = error;
      if (!skip && !error && command.replica == replica_) durable_ = std::max(durable_, command.lastClock);
      cv_.notify_all();
      return;
    }
  }
  if (freed > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    staged_ -= freed;
    cv_.notify_all();
  }
}

// --- snapshots --------------------------------------------------------------------

void writeSnapshotPart(const std::string& dir, uint64_t clock, int rank, int ranks, const ParamSet& params) {
  silenceHdf5();
  ORPHEUS_CHECK_INPUT(ranks >= 1 && rank >= 0 && rank < ranks, "snapshot part {} of {} ranks", rank, ranks);
  const fs::path path = partPath(dir, clock, rank);
  const std::string name = path.string();
  writeAtomically(path, [&](hid_t file) {
    std::string names;
    H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    for (const Param& p : params.params) {
      ORPHEUS_ENFORCE(p.name.find('\n') == std::string::npos, "parameter name '{}' holds a newline", p.name);
      const int64_t rows = p.value.rows();
      const int64_t begin = blockBegin(rows, rank, ranks), end = blockBegin(rows, rank + 1, ranks);
      // Stored row-major as (rows, cols), like a parameter file.
      const RowMajor block = p.value.middleRows(begin, end - begin);
      const hsize_t dims[2] = {static_cast<hsize_t>(block.rows()), static_cast<hsize_t>(block.cols())};
      H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
      errno = 0;
      H5Handle set(H5Dcreate2(file, p.name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
      if (!set.valid() || (block.size() > 0 &&
                           H5Dwrite(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, block.data()) < 0)) {
        const int err = errno;
        throw IoError(fmt::format("cannot write parameter '{}' to '{}': {}", p.name, name, osError(err)));
      }
      writeI64Attr(set.get(), "rows", rows, name);
      writeU32Attr(set.get(), "crc32c", crc32c(0, block.data(), static_cast<size_t>(block.size()) * sizeof(float)),
                   name);
      if (!names.empty()) names.push_back('\n');
      names += p.name;
    }
    writeI64Attr(file, "version", kFormatVersion, name);
    writeU64Attr(file, "clock", clock, name);
    writeI64Attr(file, "rank", rank, name);
    writeI64Attr(file, "ranks", ranks, name);
    writeStringAttr(file, "parameters", names, name);
  });
}

std::vector<uint64_t> snapshotClocks(const std::string& dir) {
  std::vector<uint64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    uint64_t number = 0;
    if (e.is_directory(ec) && parsePrefixedNumber(e.path().filename().string(), "snapshot-", &number)) {
      out.push_back(number);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<ParamSet> readSnapshot(const std::string& dir, uint64_t clock, const ParamSet& shapes) {
  silenceHdf5();
  ParamSet out;
  const std::string problem = assembleSnapshot(dir, clock, &shapes, &out);
  if (!problem.empty()) {
    spdlog::warn("snapshot of clock {} in '{}' is unusable: {}", clock, dir, problem);
    return std::nullopt;
  }
  return out;
}

// --- reading ----------------------------------------------------------------------

Inventory inspect(const std::string& dir) {
  silenceHdf5();
  std::error_code ec;
  ORPHEUS_CHECK_INPUT(fs::is_directory(dir, ec), "checkpoint directory '{}' does not exist", dir);
  Inventory inv;
  if (fs::exists(fs::path(dir) / kJobFile, ec)) {
    inv.job = readJobInfo(dir);
  } else {
    spdlog::warn("checkpoint '{}' has no {}: the job is unknown", dir, kJobFile);
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    uint64_t number = 0;
    if (!e.is_directory(ec)) continue;
    if (parsePrefixedNumber(name, "replica-", &number)) {
      ReplicaInventory r;
      r.replica = static_cast<int>(number);
      bool started = false;
      bool chained = true;
      for (const SegmentFile& f : listSegments(e.path())) {
        SegmentInfo s;
        s.path = f.path;
        s.firstClock = f.first;
        s.lastClock = f.last;
        s.bytes = fs::file_size(f.path, ec);
        if (ec) s.bytes = 0;
        std::vector<ClockRange> lost;
        s.problem = loadSegment(f.path, r.replica, f.first, f.last, nullptr, &lost);
        if (s.problem.empty()) r.lost.insert(r.lost.end(), lost.begin(), lost.end());
        s.intact = s.problem.empty();
        if (chained && s.intact && continuesChain(r.lastIntactClock, started, f.first)) {
          r.lastIntactClock = std::max(r.lastIntactClock, f.last);
          started = true;
        } else {
          chained = false;
        }
        r.segments.push_back(std::move(s));
      }
      inv.replicas.push_back(std::move(r));
    } else if (parsePrefixedNumber(name, "snapshot-", &number)) {
      const std::string problem = assembleSnapshot(dir, number, nullptr, nullptr);
      if (problem.empty()) {
        inv.snapshots.push_back(number);
      } else {
        spdlog::warn("snapshot of clock {} in '{}' is incomplete: {}", number, dir, problem);
      }
    }
  }
  std::sort(inv.replicas.begin(), inv.replicas.end(),
            [](const ReplicaInventory& a, const ReplicaInventory& b) { return a.replica < b.replica; });
  std::sort(inv.snapshots.begin(), inv.snapshots.end());
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    std::error_code sizeError;
    if (e.is_regular_file(sizeError)) {
      const uint64_t size = e.file_size(sizeError);
      if (!sizeError) inv.totalBytes += size;
    }
  }
  return inv;
}

std::vector<LogEntry> readLog(const std::string& dir, int replica, uint64_t after, uint64_t upTo) {
  silenceHdf5();
  ORPHEUS_CHECK_INPUT(after <= upTo, "cannot read the log of replica {} from clock {} back to {}", replica, after,
                      upTo);
  std::vector<LogEntry> out;
  if (after == upTo) return out;
  const std::vector<SegmentFile> segments = listSegments(replicaDir(dir, replica));
  ORPHEUS_CHECK_INPUT(!segments.empty(), "checkpoint '{}' holds no log of replica {}", dir, replica);

  // Follow the chain from the first clock; only the segments that hold clocks in
  // (after, upTo] are read and verified, the earlier ones are known by name.
  uint64_t reached = 0;
  bool started = false;
  for (size_t i = 0; i < segments.size() && reached < upTo; ++i) {
    const SegmentFile& s = segments[i];
    if (!continuesChain(reached, started, s.first)) {
      const std::string missing =
          started ? fmt::format("no segment continues clock {}", reached) : std::string("no segment starts at clock 1");
      throw InputError(
          fmt::format("log of replica {} is broken before '{}' (clocks {}..{}): {}; the log is intact "
                      "only up to clock {}",
                      replica, s.path, s.first, s.last, missing, reached));
    }
    if (s.last > after) {
      std::vector<LogEntry> entries;
      const std::string problem = loadSegment(s.path, replica, s.first, s.last, &entries);
      if (!problem.empty()) {
        if (i + 1 == segments.size()) {
          spdlog::warn("ignoring torn last segment '{}' of replica {}: {}", s.path, replica, problem);
          break;
        }
        throw InputError(
            fmt::format("log segment '{}' of replica {} is damaged ({}); the log is intact only up to clock {}", s.path,
                        replica, problem, reached));
      }
      for (LogEntry& e : entries) {
        // A reset after upTo whose log ended before it: the holder lost upTo.
        if (e.kind == EventKind::kReset && e.logEnd < upTo && upTo < e.clock) {
          throw InputError(fmt::format(
              "clock {} of replica {} is lost: a failure at clock {} reset the replica to clock {} before its log "
              "reached clock {}; clocks {} and {} are restorable",
              upTo, replica, e.clock, e.resetTo, upTo, e.logEnd, e.clock));
        }
        if (e.clock > after && e.clock <= upTo) out.push_back(std::move(e));
      }
    }
    reached = std::max(reached, s.last);
    started = true;
  }
  ORPHEUS_CHECK_INPUT(upTo <= reached, "clock {} is past the log of replica {} (latest: {})", upTo, replica, reached);
  return out;
}

}  // namespace orpheus::ckpt
