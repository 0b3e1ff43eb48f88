// IDX (MNIST-style) reader: an idx3 unsigned-byte images file and its idx1 labels
// file, gzipped or raw.

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/data/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

namespace orpheus::data::detail {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr int64_t kImagesHeaderBytes = 16;
constexpr int64_t kLabelsHeaderBytes = 8;
constexpr unsigned kGzBufferBytes = 1u << 18;
constexpr int64_t kReadChunkBytes = int64_t{1} << 22;
// Deflate expands at most 1032:1, so a gzip file of n bytes holds no more than
// this many times n (plus a little) bytes of content.
constexpr int64_t kMaxDeflateRatio = 1032;

uint32_t bigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// An IDX file read through zlib, which reads gzip and raw files alike: a raw file
// seeks directly, a gzip file skips by decompressing.
class IdxFile {
 public:
  explicit IdxFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throwFileError(path, "cannot open", errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
      const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
      ::close(fd);
      throwFileError(path, "cannot read", err);
    }
    fileBytes_ = st.st_size;
    file_ = gzdopen(fd, "rb");
    if (file_ == nullptr) {
      ::close(fd);
      throwFileError(path, "cannot open", ENOMEM);
    }
    gzbuffer(file_, kGzBufferBytes);
  }
  ~IdxFile() { gzclose(file_); }
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  const std::string& path() const { return path_; }

  // The file's size on disk when it is raw (so its length can be checked up
  // front), or -1 when it is compressed.
  int64_t rawBytes() { return gzdirect(file_) ? fileBytes_ : -1; }
  // The most content bytes the file can hold: its size when raw; what deflate can
  // expand it to when compressed.
  double maxContentBytes() {
    const double bytes = static_cast<double>(fileBytes_);
    return gzdirect(file_) ? bytes : bytes * kMaxDeflateRatio + 1024;
  }

  // Reads exactly `n` bytes; `what` names them in the message if the file ends first.
  void read(void* dst, int64_t n, const char* what) {
    auto* out = static_cast<unsigned char*>(dst);
    while (n > 0) {
      const auto want = static_cast<unsigned>(std::min<int64_t>(n, INT_MAX / 2));
      const int got = gzread(file_, out, want);
      if (got < 0) throw InputError(fmt::format("{}: cannot read {}: {}", path_, what, zlibError()));
      if (got == 0) {
        int err = Z_OK;
        gzerror(file_, &err);
        throw InputError(fmt::format("{}: truncated: the file ends inside the {}{}", path_, what,
                                     err == Z_OK || err == Z_BUF_ERROR ? "" : " (" + zlibError() + ")"));
      }
      out += got;
      n -= got;
    }
  }

  // Moves to `offset` in the uncompressed content.
  void seek(int64_t offset, const char* what) {
    if (gzseek(file_, static_cast<z_off_t>(offset), SEEK_SET) < 0) {
      throw InputError(fmt::format("{}: cannot seek to the {}: {}", path_, what, zlibError()));
    }
  }

 private:
  std::string zlibError() {
    int err = Z_OK;
    const char* msg = gzerror(file_, &err);
    if (err == Z_ERRNO) return std::strerror(errno);
    return msg != nullptr && *msg != '\0' ? msg : "unknown zlib error";
  }

  std::string path_;
  int64_t fileBytes_ = 0;
  gzFile file_ = nullptr;
};

std::string labelsPathFor(const std::string& imagesPath) {
  std::filesystem::path p(imagesPath);
  std::string name = p.filename().string();
  const auto at = name.find("images-idx3");
  ORPHEUS_CHECK_INPUT(at != std::string::npos,
                      "{}: cannot find the IDX labels file: the images file name must contain "
                      "'images-idx3' (the labels file has 'labels-idx1' in its place)",
                      imagesPath);
  name.replace(at, std::strlen("images-idx3"), "labels-idx1");
  return (p.parent_path() / name).string();
}

// The images file's header: its dimensions, checked against the options and, for
// a raw file, against its size.
struct ImagesHeader {
  int64_t total = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t features = 0;
  int64_t bytes = 0;  // header and every image
};

ImagesHeader readImagesHeader(IdxFile& images, const ReadOptions& options) {
  const std::string& path = images.path();
  std::array<unsigned char, kImagesHeaderBytes> header{};
  images.read(header.data(), kImagesHeaderBytes, "header");
  const uint32_t magic = bigEndian32(header.data());
  ORPHEUS_CHECK_INPUT(magic == kImagesMagic,
                      "{}: not an IDX images file: magic 0x{:08x}, expected 0x{:08x}{}", path, magic,
                      kImagesMagic, magic == kLabelsMagic ? " (this is a labels file)" : "");
  const int64_t total = bigEndian32(header.data() + 4);
  const int64_t rows = bigEndian32(header.data() + 8);
  const int64_t cols = bigEndian32(header.data() + 12);
  // Each is below 2^32, so their product could overflow: divide instead.
  ORPHEUS_CHECK_INPUT(rows > 0 && cols > 0 && rows <= INT32_MAX / cols,
                      "{}: bad IDX image dimensions {}x{}", path, rows, cols);
  const int64_t features = rows * cols;
  ORPHEUS_CHECK_INPUT(options.features < 0 || options.features == features,
                      "{}: the images have {}x{} = {} features, but {} were expected", path, rows,
                      cols, features, options.features);
  const int64_t imageBytes = kImagesHeaderBytes + total * features;
  if (const int64_t raw = images.rawBytes(); raw >= 0) {
    ORPHEUS_CHECK_INPUT(raw >= imageBytes,
                        "{}: truncated: the header promises {} images of {}x{} ({} bytes) but the "
                        "file has {} bytes",
                        path, total, rows, cols, imageBytes, raw);
  }
  return {total, rows, cols, features, imageBytes};
}

// The labels file's header: one label for each of the `total` images of `path`.
void checkLabelsHeader(IdxFile& labelsFile, int64_t total, const std::string& path) {
  const std::string& labelsPath = labelsFile.path();
  std::array<unsigned char, kLabelsHeaderBytes> header{};
  labelsFile.read(header.data(), kLabelsHeaderBytes, "header");
  const uint32_t labelsMagic = bigEndian32(header.data());
  ORPHEUS_CHECK_INPUT(labelsMagic == kLabelsMagic,
                      "{}: not an IDX labels file: magic 0x{:08x}, expected 0x{:08x}", labelsPath,
                      labelsMagic, kLabelsMagic);
  const int64_t labelCount = bigEndian32(header.data() + 4);
  ORPHEUS_CHECK_INPUT(labelCount == total, "{}: {} labels for the {} images of {}", labelsPath,
                      labelCount, total, path);
  if (const int64_t raw = labelsFile.rawBytes(); raw >= 0) {
    ORPHEUS_CHECK_INPUT(raw >= kLabelsHeaderBytes + total,
                        "{}: truncated: the header promises {} labels but the file has {} bytes",
                        labelsPath, total, raw);
  }
}

// `count` images from image `begin` on, as floats in [0, 1], into `dense` (features x count).
void readImages(IdxFile& images, int64_t begin, int64_t count, int64_t features, Matrix& dense) {
  std::array<float, 256> scale{};
  for (int v = 0; v < 256; ++v) scale[v] = static_cast<float>(v) / 255.0f;

  dense.resize(features, count);
  images.seek(kImagesHeaderBytes + begin * features, "shard's images");
  const int64_t chunkExamples = std::max<int64_t>(1, kReadChunkBytes / features);
  std::vector<unsigned char> buffer(std::min(count, chunkExamples) * features);
  float* out = dense.data();
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(count - done, chunkExamples);
    images.read(buffer.data(), n * features, "image data");
    for (int64_t k = 0; k < n * features; ++k) out[k] = scale[buffer[k]];
    out += n * features;
    done += n;
  }
}

}  // namespace

Dataset readIdx(const std::string& path, const ReadOptions& options) {
  IdxFile images(path);
  const auto [total, rows, cols, features, imageBytes] = readImagesHeader(images, options);
  const std::string labelsPath = labelsPathFor(path);
  IdxFile labelsFile(labelsPath);
  checkLabelsHeader(labelsFile, total, path);
  const int64_t begin = total * options.rank / options.worldSize;
  const int64_t end = total * (options.rank + 1) / options.worldSize;
  const int64_t count = end - begin;
  ORPHEUS_CHECK_INPUT(count > 0, "{}: shard {} of {} is empty: the file has {} examples", path,
                      options.rank, options.worldSize, total);

  // Sizes from the header are checked before anything of theirs is allocated.
  checkFitsInMemory(static_cast<double>(count) * static_cast<double>(features) * sizeof(float),
                    fmt::format("{}: the header promises {} images of {}x{}; this shard's {} as floats", path,
                                total, rows, cols, count));
  ORPHEUS_CHECK_INPUT(static_cast<double>(imageBytes) <= images.maxContentBytes(),
                      "{}: truncated: the header promises {} images of {}x{} ({} bytes) but a gzip file of {} "
                      "bytes holds at most {:.0f}",
                      path, total, rows, cols, imageBytes, std::filesystem::file_size(path),
                      images.maxContentBytes());
  ORPHEUS_CHECK_INPUT(static_cast<double>(kLabelsHeaderBytes + total) <= labelsFile.maxContentBytes(),
                      "{}: truncated: the header promises {} labels but a gzip file of {} bytes holds at most {:.0f}",
                      labelsPath, total, std::filesystem::file_size(labelsPath), labelsFile.maxContentBytes());

  Dataset data;
  data.source = path;
  data.features = features;
  data.sparse = false;
  data.globalOffset = begin;
  data.globalSize = total;

  readImages(images, begin, count, features, data.dense);
  std::vector<unsigned char> buffer(static_cast<size_t>(count));
  labelsFile.seek(kLabelsHeaderBytes + begin, "shard's labels");
  labelsFile.read(buffer.data(), count, "labels");
  data.labels.assign(buffer.begin(), buffer.end());
  return data;
}

}  // namespace orpheus::data::detail
