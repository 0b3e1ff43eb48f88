#include "engine/data/dataset.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace orpheus::data {

// Format readers, defined in idx_reader.cc and text_readers.cc. Each reads shard
// `options.rank` of `options.worldSize`; the options are already validated.
namespace detail {
Dataset readIdx(const std::string& path, const ReadOptions& options);
Dataset readLibsvm(const std::string& path, const ReadOptions& options, int indexBase);
Dataset readCsv(const std::string& path, const ReadOptions& options);
Dataset readHdf5(const std::string& path, const ReadOptions& options);
Dataset readTokens(const std::string& path, const ReadOptions& options);
}  // namespace detail

bool hasTokenHeader(const std::string& path);  // token_reader.cc

namespace {

bool endsWithNoCase(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), s.end() - static_cast<ptrdiff_t>(suffix.size()),
                    [](char a, char b) {
                      return std::tolower(static_cast<unsigned char>(a)) ==
                             std::tolower(static_cast<unsigned char>(b));
                    });
}

// The MNIST family's names: "...-images-idx3-ubyte", "...-labels.idx1-ubyte",
// optionally ".gz".
bool hasIdxName(std::string name) {
  if (endsWithNoCase(name, ".gz")) name.resize(name.size() - 3);
  if (!endsWithNoCase(name, "-ubyte") || name.size() < std::strlen("-idx1-ubyte")) return false;
  const std::string idx = name.substr(name.size() - std::strlen("-idx1-ubyte"), 5);
  return (idx[0] == '-' || idx[0] == '.') && endsWithNoCase(idx.substr(0, 4), "idx") &&
         std::isdigit(static_cast<unsigned char>(idx[4]));
}

// Whether the content (gzipped or raw) starts with an IDX magic number: two zero
// bytes, a type code, and 1 to 4 dimensions. No text file starts with a zero byte.
bool hasIdxMagic(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char magic[4] = {};
  const int got = gzread(f, magic, sizeof magic);
  gzclose(f);
  if (got != static_cast<int>(sizeof magic)) return false;
  const bool knownType = magic[2] == 0x08 || magic[2] == 0x09 || (magic[2] >= 0x0b && magic[2] <= 0x0e);
  return magic[0] == 0 && magic[1] == 0 && knownType && magic[3] >= 1 && magic[3] <= 4;
}

// Whether the file starts with the HDF5 signature. (HDF5 also allows it after a
// user block of 512, 1024, ... bytes; such a file needs its name or --format.)
bool hasHdf5Signature(const std::string& path) {
  static constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char head[sizeof kSignature] = {};
  const size_t got = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  return got == sizeof head && std::memcmp(head, kSignature, sizeof head) == 0;
}

// Examples in column `j` of a sparse matrix, compressed or not.
int64_t columnNonZeros(const SparseMatrix& m, int64_t j) {
  if (m.isCompressed()) return m.outerIndexPtr()[j + 1] - m.outerIndexPtr()[j];
  return m.innerNonZeroPtr()[j];
}

void checkConsistent(const Dataset& data) {
  const int64_t cols = data.sparse ? data.sparseX.cols() : data.dense.cols();
  const int64_t rows = data.sparse ? data.sparseX.rows() : data.dense.rows();
  ORPHEUS_ENFORCE(cols == data.size() && rows == data.features,
                  "dataset {} holds a {}x{} matrix for {} features and {} labels", data.source,
                  rows, cols, data.features, data.size());
}

}  // namespace

int32_t Dataset::maxLabel() const {
  if (vocabulary > 0) return static_cast<int32_t>(vocabulary - 1);
  if (labels.empty()) return -1;
  return *std::max_element(labels.begin(), labels.end());
}

Format parseFormat(const std::string& name) {
  if (name == "auto") return Format::kAuto;
  if (name == "idx") return Format::kIdx;
  if (name == "libsvm") return Format::kLibsvm;
  if (name == "csv") return Format::kCsv;
  if (name == "hdf5") return Format::kHdf5;
  if (name == "tokens") return Format::kTokens;
  throw InputError(
      fmt::format("unknown data format '{}': expected one of auto, idx, libsvm, csv, hdf5, tokens", name));
}

Format resolveFormat(const std::string& path, Format format) {
  if (format != Format::kAuto) return format;
  // Only the file name's ending counts, then the content: neither a directory
  // called "idx" nor "idx" inside a name makes a file IDX.
  const std::string name = std::filesystem::path(path).filename().string();
  if (hasIdxName(name)) return Format::kIdx;
  if (endsWithNoCase(name, ".csv")) return Format::kCsv;
  if (endsWithNoCase(name, ".h5") || endsWithNoCase(name, ".hdf5")) return Format::kHdf5;
  if (hasIdxMagic(path)) return Format::kIdx;
  if (hasHdf5Signature(path)) return Format::kHdf5;
  if (hasTokenHeader(path)) return Format::kTokens;
  return Format::kLibsvm;
}

Dataset readDataset(const std::string& path, const ReadOptions& options) {
  ORPHEUS_ENFORCE(options.worldSize >= 1 && options.rank >= 0 && options.rank < options.worldSize,
                  "rank {} of {}", options.rank, options.worldSize);
  ORPHEUS_CHECK_INPUT(options.indexBase >= -1 && options.indexBase <= 1,
                      "{}: the feature index base must be 0 or 1, got {}", path, options.indexBase);
  switch (resolveFormat(path, options.format)) {
    case Format::kIdx:
      return detail::readIdx(path, options);
    case Format::kCsv:
      return detail::readCsv(path, options);
    case Format::kHdf5:
      return detail::readHdf5(path, options);
    case Format::kTokens:
      return detail::readTokens(path, options);
    case Format::kLibsvm:
    case Format::kAuto:
      break;
  }
  const int base =
      options.indexBase >= 0 ? options.indexBase : detectIndexBase(path, Format::kLibsvm);
  return detail::readLibsvm(path, options, base);
}

void widen(Dataset& data, int64_t features) {
  ORPHEUS_CHECK_INPUT(features >= data.features,
                      "{}: the data has {} features, more than the {} expected", data.source,
                      data.features, features);
  ORPHEUS_CHECK_INPUT(features <= INT32_MAX, "{}: {} features is too many", data.source, features);
  if (features == data.features) return;
  if (data.sparse) {
    // Column-major: growing the inner dimension keeps every stored entry as is.
    data.sparseX.conservativeResize(features, data.size());
  } else {
    checkFitsInMemory(static_cast<double>(features) * static_cast<double>(data.dense.cols()) * sizeof(float),
                      fmt::format("{}: {} examples widened to {} dense features", data.source, data.dense.cols(),
                                  features));
    Matrix grown = Matrix::Zero(features, data.dense.cols());
    grown.topRows(data.dense.rows()) = data.dense;
    data.dense.swap(grown);
  }
  data.features = features;
}

Batch gather(const Dataset& data, const std::vector<int64_t>& indices) {
  checkConsistent(data);
  const int64_t n = data.size();
  const auto count = static_cast<int64_t>(indices.size());
  Batch batch;
  batch.sparse = data.sparse;
  batch.indices = indices;
  batch.labels.resize(count);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t i = indices[j];
    ORPHEUS_ENFORCE(i >= 0 && i < n, "example {} is outside the shard of {}", i, n);
    batch.labels[j] = data.labels[i];
  }
  if (!data.sparse) {
    batch.dense.resize(data.features, count);
    for (int64_t j = 0; j < count; ++j) batch.dense.col(j) = data.dense.col(indices[j]);
    return batch;
  }

  const SparseMatrix& x = data.sparseX;
  int64_t nnz = 0;
  for (int64_t i : indices) nnz += columnNonZeros(x, i);
  ORPHEUS_ENFORCE(nnz <= INT32_MAX, "a batch of {} examples holds {} nonzeros", count, nnz);
  SparseMatrix& out = batch.sparseX;
  out.resize(data.features, count);
  out.resizeNonZeros(nnz);
  int32_t* outStart = out.outerIndexPtr();
  int64_t pos = 0;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t i = indices[j];
    const int64_t begin = x.outerIndexPtr()[i];
    const int64_t len = columnNonZeros(x, i);
    outStart[j] = static_cast<int32_t>(pos);
    if (len == 0) continue;  // a batch without nonzeros has no index or value arrays to copy
    std::memcpy(out.innerIndexPtr() + pos, x.innerIndexPtr() + begin, len * sizeof(int32_t));
    std::memcpy(out.valuePtr() + pos, x.valuePtr() + begin, len * sizeof(float));
    pos += len;
  }
  outStart[count] = static_cast<int32_t>(pos);
  return batch;
}

Batch slice(const Dataset& data, int64_t begin, int64_t end) {
  ORPHEUS_ENFORCE(begin >= 0 && begin <= end && end <= data.size(),
                  "slice [{}, {}) of a shard of {}", begin, end, data.size());
  checkConsistent(data);
  if (!data.sparse) {
    Batch batch;
    batch.dense = data.dense.middleCols(begin, end - begin);
    batch.labels = Eigen::Map<const Eigen::VectorXi>(data.labels.data() + begin, end - begin);
    batch.indices.resize(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) batch.indices[static_cast<size_t>(i - begin)] = i;
    return batch;
  }
  std::vector<int64_t> indices(end - begin);
  for (int64_t i = begin; i < end; ++i) indices[i - begin] = i;
  return gather(data, indices);
}

}  // namespace orpheus::data
