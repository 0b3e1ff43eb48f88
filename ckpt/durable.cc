#include "ckpt/durable.h"

#include "engine/base/error.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <fcntl.h>
#include <new>
#include <sys/mman.h>
#include <unistd.h>

namespace orpheus::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr size_t kWriteChunk = size_t{8} << 20;
constexpr size_t kHugePage = size_t{2} << 20;

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

}  // namespace

uint64_t writeDurably(const fs::path& path, const std::function<void(const fs::path& tmp)>& write,
                      bool createDirectory) {
  static std::atomic<uint64_t> counter{0};
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string target = path.string();
  std::error_code ec;
  if (createDirectory) {
    fs::create_directories(dir, ec);
    if (ec) throw IoError(fmt::format("cannot create directory '{}': {}", dir.string(), ec.message()));
  }
  const fs::path tmp = dir / fmt::format(".{}.{}-{}.tmp", path.filename().string(), ::getpid(), counter.fetch_add(1));
  uint64_t size = 0;
  try {
    write(tmp);
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

void syncPath(const fs::path& path, const std::string& what, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) {
    const int err = errno;
    throw IoError(fmt::format("cannot open '{}' to sync {}: {}", path.string(), what, std::strerror(err)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && !(directory && (err == EINVAL || err == EROFS))) {
    throw IoError(fmt::format("cannot sync '{}': {}", what, std::strerror(err)));
  }
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

void AlignedBuffer::reserve(size_t size, size_t keep, size_t expected) {
  if (size <= capacity_) return;
  size_t capacity = std::max({size + size / 4, expected, size_t{1} << 20});
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

void writeDirect(const fs::path& path, const std::string& target, uint64_t offset, const std::byte* data, size_t size,
                 const std::function<void()>& between) {
  // Bypassing the page cache saves the kernel's copy and its page cache
  // bookkeeping, which compete with training for the cores.
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

void writeTextDurably(const fs::path& path, const std::string& text) {
  writeDurably(
      path,
      [&](const fs::path& tmp) {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.flush();
        if (!out) throw IoError(fmt::format("cannot write '{}'", tmp.string()));
      },
      false);
}

int forEachTextLine(const std::filesystem::path& path, const std::function<void(int, const std::string&)>& line) {
  std::ifstream in(path);
  if (!in) return 0;
  std::string text;
  int number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (!text.empty()) line(number, text);
  }
  return number;
}

}  // namespace orpheus::ckpt
