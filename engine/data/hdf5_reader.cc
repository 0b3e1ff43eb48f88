// HDF5 reader: examples as the rows of a dense dataset `X` (N x D) or of a CSR
// matrix (datasets `data`, `indices`, `indptr`, in a group `X` or at the root,
// with an optional `shape`), and their class ids in `y` (N). This is what h5py
// writes from a numpy array or the three arrays of a scipy.sparse.csr_matrix.
//
// Shards are contiguous row ranges, as for IDX: rank r of P owns rows
// [N*r/P, N*(r+1)/P). A rank reads only its rows by hyperslab: the dense rows; or
// its N/P + 1 entries of indptr (plus indptr's last entry, to check it), then the
// slice of data and indices they point to; and its labels. The whole file is never
// read on one rank, and sizes from the file are checked before they are allocated.
//
// Every defect is an InputError "<path>: <what>": a missing X or y, datasets of the
// wrong rank or type, X and y of different lengths, an indptr that does not start at
// 0, decreases, has the wrong length or does not end at len(data), column indices
// that are negative, repeated in a row or beyond the width, non-finite values, and
// labels that are not non-negative integers. A file HDF5 cannot read is one too (it
// is the user's input, not a failing disk), unlike the checkpoint library's IoError.

#include "ckpt/h5.h"
#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "engine/data/dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>
#include <vector>

namespace orpheus::data::detail {
namespace {

using ckpt::H5Handle;

template <typename... Args>
[[noreturn]] void fail(const std::string& path, fmt::format_string<Args...> what, Args&&... args) {
  throw InputError(fmt::format("{}: {}", path, fmt::format(what, std::forward<Args>(args)...)));
}

// A dataset of the input file: opened, its element class and its dimensions known.
class InputSet {
 public:
  // `name` is relative to `loc`; `label` is how messages name it ("X/indptr").
  InputSet(hid_t loc, const std::string& name, std::string label, const std::string& path)
      : label_(std::move(label)), path_(path), set_(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose) {
    if (!set_.valid()) fail(path_, "cannot open the dataset '{}'", label_);
    H5Handle type(H5Dget_type(set_.get()), H5Tclose);
    H5Handle space(H5Dget_space(set_.get()), H5Sclose);
    const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    if (!type.valid() || rank < 0) fail(path_, "cannot read the type and shape of the dataset '{}'", label_);
    typeClass_ = H5Tget_class(type.get());
    dims_.resize(static_cast<size_t>(rank));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims_.data(), nullptr);
  }

  const std::string& label() const { return label_; }
  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return static_cast<int64_t>(dims_[static_cast<size_t>(i)]); }
  bool isNumber() const { return typeClass_ == H5T_INTEGER || typeClass_ == H5T_FLOAT; }
  bool isInteger() const { return typeClass_ == H5T_INTEGER; }

  // Refuses anything but numbers of `rank` dimensions; `shape` describes them.
  void require(int rank, const char* shape) const {
    if (!isNumber()) fail(path_, "the dataset '{}' must hold numbers, not {}", label_, className());
    if (this->rank() != rank) {
      fail(path_, "the dataset '{}' must be {} ({}-dimensional), but it has {} dimensions", label_, shape, rank,
           this->rank());
    }
  }

  // Reads rows [begin, begin + count) (all of each row's columns) as `memType`.
  void readRows(int64_t begin, int64_t count, hid_t memType, void* out) const {
    if (count == 0) return;
    std::vector<hsize_t> start(dims_.size(), 0);
    std::vector<hsize_t> extent = dims_;
    start[0] = static_cast<hsize_t>(begin);
    extent[0] = static_cast<hsize_t>(count);
    H5Handle fileSpace(H5Dget_space(set_.get()), H5Sclose);
    H5Handle memSpace(H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr), H5Sclose);
    if (!fileSpace.valid() || !memSpace.valid() ||
        H5Sselect_hyperslab(fileSpace.get(), H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr) < 0 ||
        H5Dread(set_.get(), memType, memSpace.get(), fileSpace.get(), H5P_DEFAULT, out) < 0) {
      fail(path_, "cannot read entries {}..{} of the dataset '{}': the file is damaged or truncated", begin,
           begin + count - 1, label_);
    }
  }

  template <typename T>
  std::vector<T> readRange(int64_t begin, int64_t count, hid_t memType) const {
    std::vector<T> out(static_cast<size_t>(count));
    readRows(begin, count, memType, out.data());
    return out;
  }

 private:
  const char* className() const {
    switch (typeClass_) {
      case H5T_STRING: return "strings";
      case H5T_ENUM: return "an enum (booleans?)";
      case H5T_COMPOUND: return "compound records";
      default: return "this type";
    }
  }

  std::string label_;
  const std::string& path_;
  H5Handle set_;
  H5T_class_t typeClass_ = H5T_NO_CLASS;
  std::vector<hsize_t> dims_;
};

bool linkExists(hid_t loc, const char* name) { return H5Lexists(loc, name, H5P_DEFAULT) > 0; }

// What `name` in `loc` is: H5I_DATASET, H5I_GROUP, or H5I_BADID for no such link.
// A link that exists but leads nowhere (an external link to a missing file or
// object, a soft link to a missing path) is an error naming it, not "missing".
H5I_type_t objectType(hid_t loc, const char* name, const std::string& path) {
  if (!linkExists(loc, name)) return H5I_BADID;
  const H5Handle object(H5Oopen(loc, name, H5P_DEFAULT), H5Oclose);
  if (object.valid()) return H5Iget_type(object.get());
  H5L_info_t info{};
  if (H5Lget_info(loc, name, &info, H5P_DEFAULT) >= 0 && info.type == H5L_TYPE_EXTERNAL) {
    std::vector<char> value(info.u.val_size + 1, '\0');
    const char* file = nullptr;
    const char* target = nullptr;
    unsigned flags = 0;
    if (H5Lget_val(loc, name, value.data(), value.size(), H5P_DEFAULT) >= 0 &&
        H5Lunpack_elink_val(value.data(), value.size(), &flags, &file, &target) >= 0) {
      fail(path, "'{}' is an external link to '{}' in '{}', which cannot be opened (a missing file or object)", name,
           target != nullptr ? target : "?", file != nullptr ? file : "?");
    }
    fail(path, "'{}' is an external link that cannot be followed", name);
  }
  if (info.type == H5L_TYPE_SOFT) fail(path, "'{}' is a soft link to a path that does not exist", name);
  fail(path, "'{}' exists but cannot be opened: the file is damaged or truncated", name);
}

H5Handle openInput(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throwFileError(path, "cannot open", errno);
  ::close(fd);
  H5Handle file = ckpt::openH5ForReading(path);
  if (!file.valid()) {
    // The signature is there but the file does not open: cut short or damaged.
    if (H5Fis_hdf5(path.c_str()) > 0) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(path, ec);
      fail(path, "an HDF5 file that cannot be opened ({} bytes): truncated or damaged", ec ? 0 : size);
    }
    fail(path, "not an HDF5 file (read as HDF5 because of its name or --format hdf5)");
  }
  return file;
}

// Labels [begin, begin + count) of y, checked to be class ids.
std::vector<int32_t> readLabels(const InputSet& y, int64_t begin, int64_t count, const std::string& path) {
  std::vector<int32_t> labels(static_cast<size_t>(count));
  auto check = [&](int64_t j, double value, auto shown) {
    if (!std::isfinite(value) || value != std::floor(value)) {
      fail(path, "y[{}] = {} is not an integer: labels must be class ids 0..K-1", begin + j, shown);
    }
    if (value < 0) fail(path, "y[{}] = {} is negative: labels must be class ids 0..K-1", begin + j, shown);
    if (value > INT32_MAX) fail(path, "y[{}] = {} is too large for a class id", begin + j, shown);
    labels[static_cast<size_t>(j)] = static_cast<int32_t>(value);
  };
  if (y.isInteger()) {
    const auto values = y.readRange<int64_t>(begin, count, H5T_NATIVE_INT64);
    for (int64_t j = 0; j < count; ++j) check(j, static_cast<double>(values[j]), values[j]);
  } else {
    const auto values = y.readRange<double>(begin, count, H5T_NATIVE_DOUBLE);
    for (int64_t j = 0; j < count; ++j) check(j, values[j], values[j]);
  }
  return labels;
}

// The number of examples in X, and this shard's row range of them.
struct Rows {
  int64_t total = 0;
  int64_t begin = 0;
  int64_t count = 0;
};

Rows shardRows(int64_t total, const ReadOptions& options, const std::string& path) {
  Rows rows;
  rows.total = total;
  rows.begin = total * options.rank / options.worldSize;
  rows.count = total * (options.rank + 1) / options.worldSize - rows.begin;
  if (rows.count <= 0) {
    fail(path, "shard {} of {} is empty: the file has {} examples", options.rank, options.worldSize, total);
  }
  // Its labels and row offsets, read as int64 or double.
  checkFitsInMemory(static_cast<double>(rows.count) * 2 * sizeof(int64_t),
                    fmt::format("{}: this shard's {} labels and row offsets", path, rows.count));
  return rows;
}

void readDense(const InputSet& x, const Rows& rows, const ReadOptions& options, Dataset& data) {
  const std::string& path = data.source;
  const int64_t features = x.dim(1);
  if (features < 1 || features > INT32_MAX) fail(path, "X has {} columns: expected 1 to {}", features, INT32_MAX);
  if (options.features >= 0 && options.features != features) {
    fail(path, "X has {} columns (features), but {} were expected", features, options.features);
  }
  checkFitsInMemory(static_cast<double>(rows.count) * static_cast<double>(features) * sizeof(float),
                    fmt::format("{}: this shard's {} rows of X ({} columns) as floats", path, rows.count, features));
  data.sparse = false;
  data.features = features;
  // A row of the row-major file is a column of the column-major matrix.
  data.dense.resize(features, rows.count);
  x.readRows(rows.begin, rows.count, H5T_NATIVE_FLOAT, data.dense.data());
  for (int64_t j = 0; j < rows.count; ++j) {
    if (!data.dense.col(j).allFinite()) {
      fail(path, "row {} of X holds a value that is not a finite float32 (nan, inf, or beyond 3.4e38)", rows.begin + j);
    }
  }
}

// The CSR matrix's declared (rows, columns), from a `shape` attribute of its group
// or a `shape` dataset in it; none when it has neither.
std::optional<std::pair<int64_t, int64_t>> readShape(hid_t group, const std::string& prefix, const std::string& path) {
  std::vector<int64_t> shape;
  if (H5Aexists(group, "shape") > 0) {
    H5Handle attr(H5Aopen(group, "shape", H5P_DEFAULT), H5Aclose);
    H5Handle space(attr.valid() ? H5Aget_space(attr.get()) : -1, H5Sclose);
    const hssize_t n = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    H5Handle type(attr.valid() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    // Integers only: HDF5 would convert a shape of 2.5 to 2.
    const bool integers = type.valid() && H5Tget_class(type.get()) == H5T_INTEGER;
    if (n != 2 || !integers) fail(path, "the attribute '{}shape' must hold 2 integers (rows, columns)", prefix);
    shape.resize(2);
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, shape.data()) < 0) {
      fail(path, "cannot read the attribute '{}shape' as integers", prefix);
    }
  } else if (objectType(group, "shape", path) == H5I_DATASET) {
    const InputSet set(group, "shape", prefix + "shape", path);
    set.require(1, "(rows, columns)");
    if (set.dim(0) != 2 || !set.isInteger()) fail(path, "the dataset '{}shape' must hold 2 integers", prefix);
    shape = set.readRange<int64_t>(0, 2, H5T_NATIVE_INT64);
  } else {
    return std::nullopt;
  }
  if (shape[0] < 0 || shape[1] < 1) {
    fail(path, "'{}shape' is ({}, {}): expected rows >= 0, columns >= 1", prefix, shape[0], shape[1]);
  }
  return std::make_pair(shape[0], shape[1]);
}

// The bound on the CSR matrix's column indices, when one is known (-1 otherwise),
// from its declared shape (`hasShape`: it has one) or the expected features.
int64_t csrWidth(hid_t group, const std::string& prefix, const Rows& rows, const ReadOptions& options,
                 const InputSet& indptr, const std::string& path, bool* hasShape) {
  const auto shape = readShape(group, prefix, path);
  if (shape && shape->first != rows.total) {
    fail(path, "'{}shape' says {} rows, but '{}' has {} entries ({} rows)", prefix, shape->first, indptr.label(),
         indptr.dim(0), indptr.dim(0) - 1);
  }
  if (shape && options.features >= 0 && shape->second > options.features) {
    fail(path, "'{}shape' says {} columns (features), but {} were expected", prefix, shape->second, options.features);
  }
  const int64_t width = shape ? shape->second : options.features;
  if (std::max(width, options.features) > INT32_MAX) {
    fail(path, "{} features is too many", std::max(width, options.features));
  }
  *hasShape = shape.has_value();
  return width;
}

// This shard's row offsets, checked, and the last one, which must close `values`
// (of `nnz` entries).
std::vector<int64_t> readRowOffsets(const InputSet& indptr, const InputSet& values, const Rows& rows, int64_t nnz,
                                    const std::string& path) {
  const auto offsets = indptr.readRange<int64_t>(rows.begin, rows.count + 1, H5T_NATIVE_INT64);
  const int64_t last = indptr.readRange<int64_t>(rows.total, 1, H5T_NATIVE_INT64)[0];
  if (last != nnz) {
    fail(path, "'{}' ends at {} but '{}' has {} entries: the last offset must be len(data)", indptr.label(), last,
         values.label(), nnz);
  }
  if (rows.begin == 0 && offsets[0] != 0) fail(path, "'{}[0]' is {}: it must be 0", indptr.label(), offsets[0]);
  for (int64_t j = 0; j <= rows.count; ++j) {
    const int64_t at = rows.begin + j;
    if (offsets[j] < 0 || offsets[j] > nnz) {
      fail(path, "'{}[{}]' is {}, outside [0, {}] (the length of '{}')", indptr.label(), at, offsets[j], nnz,
           values.label());
    }
    if (j > 0 && offsets[j] < offsets[j - 1]) {
      fail(path, "'{}' decreases: entry {} is {} after {}", indptr.label(), at, offsets[j], offsets[j - 1]);
    }
  }
  return offsets;
}

// A shard's rows in CSR form, checked, each row's columns increasing.
struct CsrRows {
  std::vector<int32_t> starts;
  std::vector<int32_t> inner;
  std::vector<float> values;
  int64_t maxColumn = -1;
};

// Rows checked and their columns sorted into place (scipy keeps a row's columns in
// any order; the model wants them increasing). `columns` and `stored` hold the
// shard's entries from offsets.front() on.
CsrRows sortedRows(const std::vector<int64_t>& offsets, const std::vector<int64_t>& columns,
                   const std::vector<float>& stored, const Rows& rows, int64_t width, bool hasShape,
                   const InputSet& indices, const InputSet& values, const std::string& path) {
  const int64_t lo = offsets.front();
  const int64_t count = offsets.back() - lo;
  CsrRows csr;
  csr.starts.assign(static_cast<size_t>(rows.count) + 1, 0);
  csr.inner.resize(static_cast<size_t>(count));
  csr.values.resize(static_cast<size_t>(count));
  std::vector<int64_t> order;
  for (int64_t j = 0; j < rows.count; ++j) {
    const int64_t row = rows.begin + j;
    const int64_t begin = offsets[j] - lo;
    const int64_t end = offsets[j + 1] - lo;
    csr.starts[j] = static_cast<int32_t>(begin);
    order.resize(static_cast<size_t>(end - begin));
    std::iota(order.begin(), order.end(), begin);
    const auto byColumn = [&](int64_t a, int64_t b) { return columns[a] < columns[b]; };
    if (!std::is_sorted(order.begin(), order.end(), byColumn)) std::stable_sort(order.begin(), order.end(), byColumn);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t from = order[static_cast<size_t>(k - begin)];
      const int64_t column = columns[from];
      const int64_t at = lo + from;
      if (column < 0) {
        fail(path, "'{}[{}]' is {} (row {}): column indices must be >= 0", indices.label(), at, column, row);
      }
      if (width >= 0 && column >= width) {
        fail(path, "'{}[{}]' is {} (row {}), beyond the {} columns {}", indices.label(), at, column, row, width,
             hasShape ? "of its shape" : "expected");
      }
      if (column > INT32_MAX - 1) fail(path, "'{}[{}]' is {} (row {}): too large", indices.label(), at, column, row);
      if (k > begin && column == csr.inner[k - 1]) {
        fail(path, "row {} has column {} twice ('{}[{}]'): sum duplicates first (scipy: X.sum_duplicates())", row,
             column, indices.label(), at);
      }
      if (!std::isfinite(stored[from])) {
        fail(path, "'{}[{}]' (row {}, column {}) is not finite", values.label(), at, row, column);
      }
      csr.inner[k] = static_cast<int32_t>(column);
      csr.values[k] = stored[from];
    }
    if (end > begin) csr.maxColumn = std::max<int64_t>(csr.maxColumn, csr.inner[end - 1]);
  }
  csr.starts[rows.count] = static_cast<int32_t>(count);
  return csr;
}

// Reads this shard's rows of the CSR matrix in `group` (the file's root or X).
// `total` rows: indptr has total + 1 entries.
void readCsr(hid_t group, const std::string& prefix, const Rows& rows, const ReadOptions& options, Dataset& data) {
  const std::string& path = data.source;
  const InputSet indptr(group, "indptr", prefix + "indptr", path);
  const InputSet indices(group, "indices", prefix + "indices", path);
  const InputSet values(group, "data", prefix + "data", path);
  indptr.require(1, "N+1 row offsets");
  indices.require(1, "one column index per stored value");
  values.require(1, "the stored values");
  if (!indptr.isInteger() || !indices.isInteger()) {
    fail(path, "'{}' and '{}' must hold integers", indptr.label(), indices.label());
  }
  const int64_t nnz = values.dim(0);
  if (indices.dim(0) != nnz) {
    fail(path, "'{}' has {} entries but '{}' has {}: they must be as long", values.label(), nnz, indices.label(),
         indices.dim(0));
  }
  bool hasShape = false;
  const int64_t width = csrWidth(group, prefix, rows, options, indptr, path, &hasShape);

  const std::vector<int64_t> offsets = readRowOffsets(indptr, values, rows, nnz, path);
  const int64_t lo = offsets.front();
  const int64_t count = offsets.back() - lo;
  if (count > INT32_MAX) fail(path, "this shard holds {} stored values, more than 2^31: use more ranks", count);
  checkFitsInMemory(static_cast<double>(count) * (sizeof(float) + sizeof(int64_t) + sizeof(int32_t)),
                    fmt::format("{}: this shard's {} stored values of X", path, count));
  const auto columns = indices.readRange<int64_t>(lo, count, H5T_NATIVE_INT64);
  const auto stored = values.readRange<float>(lo, count, H5T_NATIVE_FLOAT);
  const CsrRows csr = sortedRows(offsets, columns, stored, rows, width, hasShape, indices, values, path);

  data.sparse = true;
  data.features = options.features >= 0 ? options.features : width >= 0 ? width : csr.maxColumn + 1;
  SparseMatrix& x = data.sparseX;
  x.resize(data.features, rows.count);
  x.resizeNonZeros(count);
  std::copy(csr.starts.begin(), csr.starts.end(), x.outerIndexPtr());
  std::copy(csr.inner.begin(), csr.inner.end(), x.innerIndexPtr());
  std::copy(csr.values.begin(), csr.values.end(), x.valuePtr());
}

}  // namespace

Dataset readHdf5(const std::string& path, const ReadOptions& options) {
  ckpt::silenceHdf5();
  const H5Handle file = openInput(path);
  const hid_t root = file.get();

  // X is a dense dataset or a CSR group; a CSR matrix may also sit at the root.
  const H5I_type_t xType = objectType(root, "X", path);
  const bool rootCsr = xType == H5I_BADID && linkExists(root, "indptr");
  if (xType != H5I_DATASET && xType != H5I_GROUP && !rootCsr) {
    fail(path, "no 'X': expected a dataset 'X' (N x D, one example per row) or a CSR matrix (datasets 'data', "
         "'indices', 'indptr', in a group 'X' or at the root)");
  }
  if (objectType(root, "y", path) != H5I_DATASET) fail(path, "no dataset 'y' (the N class ids)");
  const InputSet y(root, "y", "y", path);
  // A column vector (N x 1, as scikit-learn sometimes leaves it) is N labels too.
  if (!(y.isNumber() && y.rank() == 2 && y.dim(1) == 1)) y.require(1, "N class ids");

  Dataset data;
  data.source = path;
  Rows rows;
  if (xType == H5I_DATASET) {
    const InputSet x(root, "X", "X", path);
    x.require(2, "N x D, one example per row");
    if (x.dim(0) != y.dim(0)) fail(path, "X has {} rows but y has {} labels", x.dim(0), y.dim(0));
    rows = shardRows(x.dim(0), options, path);
    readDense(x, rows, options, data);
  } else {
    H5Handle group(rootCsr ? H5Gopen2(root, "/", H5P_DEFAULT) : H5Gopen2(root, "X", H5P_DEFAULT), H5Gclose);
    if (!group.valid()) fail(path, "cannot open the group '{}'", rootCsr ? "/" : "X");
    const std::string prefix = rootCsr ? "" : "X/";
    for (const char* name : {"data", "indices", "indptr"}) {
      if (objectType(group.get(), name, path) != H5I_DATASET) {
        fail(path, "the CSR matrix lacks the dataset '{}{}' (it needs 'data', 'indices' and 'indptr')", prefix, name);
      }
    }
    const InputSet indptr(group.get(), "indptr", prefix + "indptr", path);
    indptr.require(1, "N+1 row offsets");
    if (indptr.dim(0) != y.dim(0) + 1) {
      fail(path, "'{}indptr' has {} entries for the {} labels of y: it needs one more than the rows ({})", prefix,
           indptr.dim(0), y.dim(0), y.dim(0) + 1);
    }
    rows = shardRows(y.dim(0), options, path);
    readCsr(group.get(), prefix, rows, options, data);
  }
  data.labels = readLabels(y, rows.begin, rows.count, path);
  data.globalOffset = rows.begin;
  data.globalSize = rows.total;
  return data;
}

}  // namespace orpheus::data::detail
