// HDF5 for the checkpoint files: one owning handle, one checking macro, the
// attribute helpers, and durable creation of a file (ckpt/durable.h).
#pragma once

#include "engine/base/error.h"

#include <hdf5.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace orpheus::ckpt {

// Owns an HDF5 handle; closes it with the matching function. Invalid when negative.
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

// HDF5 prints its own error stack by default; errors are reported as exceptions
// here. The setting is per thread in a thread-safe HDF5, so every entry point of
// the checkpoint library calls this.
void silenceHdf5();

// The OS error behind a failed HDF5 call (errno, which the call left), or "HDF5 error".
std::string h5ErrorString(int err);

namespace detail {
[[noreturn]] void throwH5(const char* call, const std::string& path, const std::string& what, int err);

template <typename T, typename... Args>
T checkH5(T result, const char* call, const std::string& path, fmt::format_string<Args...> what, Args&&... args) {
  if (result < 0) {
    const int err = errno;
    throwH5(call, path, fmt::format(what, std::forward<Args>(args)...), err);
  }
  return result;
}
}  // namespace detail

// Runs an HDF5 call (hid_t or herr_t) with errno cleared and yields its result; a
// negative one throws IoError "cannot <what> '<path>': <OS error> (<call>)". `what`
// is a format string with its arguments, formatted only on failure.
#define ORPHEUS_H5_CHECK(call, path, ...) \
  ::orpheus::ckpt::detail::checkH5((errno = 0, (call)), #call, (path), __VA_ARGS__)

// Scalar attributes. Writers throw IoError naming the attribute and `path`; readers
// return false when the attribute is absent or not readable as the type.
void writeI64Attr(hid_t loc, const char* name, int64_t value, const std::string& path);
void writeU64Attr(hid_t loc, const char* name, uint64_t value, const std::string& path);
void writeU32Attr(hid_t loc, const char* name, uint32_t value, const std::string& path);
void writeF64Attr(hid_t loc, const char* name, double value, const std::string& path);
bool readI64Attr(hid_t loc, const char* name, int64_t* out);
bool readU64Attr(hid_t loc, const char* name, uint64_t* out);
bool readU32Attr(hid_t loc, const char* name, uint32_t* out);
bool readF64Attr(hid_t loc, const char* name, double* out);

// String attributes are fixed length. kUtf8 (log files): UTF-8, NUL padded, what
// h5py and h5dump read as a plain string. kAscii (parameter files, as they always
// were): HDF5's default C string, ASCII, NUL terminated.
enum class StringAttr { kUtf8, kAscii };
void writeStringAttr(hid_t loc, const char* name, const std::string& value, const std::string& path,
                     StringAttr kind = StringAttr::kUtf8);
// Reads a fixed-length string attribute as stored, less its NUL padding, or one
// variable-length string (as h5py writes a Python str).
bool readStringAttr(hid_t loc, const char* name, std::string* out);

// How a file is created. kParams: HDF5's defaults, as parameter files always were.
// kLog (segments, snapshot parts, the job file): the 1.8 format with dense
// attribute storage (a stored .loss text may pass the 64 KiB attribute limit), and
// large raw data aligned to file system blocks, so it can be written directly.
// Both track link creation order, so readers list datasets in the order written.
enum class H5FileKind { kParams, kLog };

// Writes the HDF5 file `path` durably (ckpt/durable.h): `fill` writes into the new
// file; `afterClose`, when given, writes into the closed temporary file before it
// is synced (raw data HDF5 only allocated). Returns the file's size.
uint64_t writeH5Durably(const std::filesystem::path& path, H5FileKind kind, const std::function<void(hid_t file)>& fill,
                        const std::function<void(const std::filesystem::path& tmp)>& afterClose = nullptr,
                        bool createDirectory = true);

// Opens an HDF5 file for reading; an invalid handle when it is missing or not HDF5.
H5Handle openH5ForReading(const std::string& path);

// A one-dimensional dataset of `count` elements, allocated on its first write
// without a fill pass; and a write of all of a dataset. IoError naming `path`.
H5Handle createVector(hid_t file, const char* name, hid_t type, hsize_t count, const std::string& path);
void writeAll(hid_t set, hid_t memType, const void* data, const char* name, const std::string& path);

// Creates and writes the float dataset `name`: `rows` x `cols`, row-major `data`
// (the layout every HDF5 reader expects); `groups`: a '/' in the name makes
// intermediate groups. IoError naming the dataset and `path`.
H5Handle writeFloatMatrix(hid_t file, const std::string& name, const float* data, int64_t rows, int64_t cols,
                          bool groups, const std::string& path);

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
  // A damaged file may declare more elements than it holds: never allocate past
  // what its storage (or, for a compact or unallocated set, the file) can contain.
  hsize_t fileBytes = 0;
  H5Fget_filesize(file, &fileBytes);
  const hsize_t stored = std::max<hsize_t>(H5Dget_storage_size(set.get()), fileBytes);
  if (count > stored / sizeof(T) + 1) return false;
  out->resize(static_cast<size_t>(count));
  return count == 0 || H5Dread(set.get(), memType, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) >= 0;
}

}  // namespace orpheus::ckpt
