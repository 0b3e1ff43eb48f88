// The one durable-write policy of the checkpoint, for every file it writes
// (parameter files, log segments, snapshot parts, the job file): the file is
// written under a temporary name in its directory, fsynced, renamed over its name,
// and the directory is fsynced. A reader sees the old file or the new one, never a
// part of one; a crash can leave only a temporary file (".<name>.<pid>-<n>.tmp").
// Every failure, a failed fsync included, throws IoError naming the path and the
// OS error, after removing the temporary file.
//
// Segments are large and written once: writeDirect puts their bytes on the device
// from an AlignedBuffer, bypassing the page cache where the file system allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace orpheus::ckpt {

// Writes `path` durably: `write` writes the whole file at the temporary path it is
// given. `createDirectory`: make `path`'s directory (and its parents) first; else a
// missing directory is an error. Returns the file's size.
uint64_t writeDurably(const std::filesystem::path& path, const std::function<void(const std::filesystem::path& tmp)>& write,
                      bool createDirectory);

// writeDurably of a text file whose whole contents are `text` (the directory must exist).
void writeTextDurably(const std::filesystem::path& path, const std::string& text);

// The read side of such a text log: calls `line(number, text)` for each non-empty
// line, numbered from 1 as an editor counts them. Returns the number of lines read
// (0 when the file does not exist).
int forEachTextLine(const std::filesystem::path& path, const std::function<void(int, const std::string&)>& line);

// fsync of `path` through a fresh descriptor; IoError naming `what` on failure. A
// directory the file system cannot sync (EINVAL, EROFS) is as durable as it gets.
void syncPath(const std::filesystem::path& path, const std::string& what, bool directory);

// Block size and alignment of direct writes.
inline constexpr size_t kDirectAlign = 4096;

// A growable buffer aligned for direct IO; its memory is kept when it is refilled.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  // Makes room for `size` bytes (at least `expected`, what a full buffer usually
  // needs, so it is allocated once), keeping the first `keep`.
  void reserve(size_t size, size_t keep, size_t expected);

 private:
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
};

// Writes `size` bytes of `data` (aligned for direct IO) at `offset` of the existing
// file `path`: whole blocks directly where the file system allows, the rest
// buffered, in pieces of 8 MiB with `between` called after each. IoError naming
// `target` (the name the file will have) on failure. Nothing is synced.
void writeDirect(const std::filesystem::path& path, const std::string& target, uint64_t offset, const std::byte* data,
                 size_t size, const std::function<void()>& between);

}  // namespace orpheus::ckpt
