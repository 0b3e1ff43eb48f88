// The HDF5 reader: dense X and CSR matrices, sharded by row range, read to the same
// Dataset the same data gives as LIBSVM or CSV; each defect an InputError naming
// the file.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "tests/support/temp_dir.h"

#include <catch2/catch.hpp>
#include <hdf5.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <functional>
#include <string>
#include <vector>

using namespace orpheus;
using namespace orpheus::data;
using Catch::Matchers::Contains;

namespace {

// A 7 x 5 matrix with empty rows and a zero column, 0-based, and its labels.
const std::vector<std::vector<std::pair<int, float>>> kRows = {
    {{0, 0.5f}, {3, -1.25f}}, {}, {{1, 2.0f}, {2, 0.125f}, {4, 3.0f}}, {{4, -0.5f}},
    {{0, 1.0f}, {1, 1.5f}},   {}, {{2, 0.75f}, {3, 0.25f}}};
const std::vector<int64_t> kLabels = {0, 2, 1, 1, 0, 3, 2};
constexpr int kWidth = 5;

// Writes HDF5 files with the C API, as h5py lays them out.
class H5Writer {
 public:
  explicit H5Writer(const std::string& path) : file_(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)) {
    REQUIRE(file_ >= 0);
  }
  ~H5Writer() { H5Fclose(file_); }
  hid_t file() const { return file_; }

  template <typename T>
  void write(hid_t loc, const char* name, hid_t type, const std::vector<T>& values, std::vector<hsize_t> dims = {}) {
    if (dims.empty()) dims = {values.size()};
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t set = H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(set >= 0);
    REQUIRE(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
    H5Dclose(set);
    H5Sclose(space);
  }

  void shapeAttr(hid_t loc, int64_t rows, int64_t cols) {
    const hsize_t two = 2;
    const int64_t shape[2] = {rows, cols};
    const hid_t space = H5Screate_simple(1, &two, nullptr);
    const hid_t attr = H5Acreate2(loc, "shape", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_INT64, shape);
    H5Aclose(attr);
    H5Sclose(space);
  }

 private:
  hid_t file_;
};

struct Csr {
  std::vector<float> data;
  std::vector<int32_t> indices;
  std::vector<int64_t> indptr{0};
};

// kRows as CSR; `reverse` stores each row's columns in decreasing order.
Csr csrOf(bool reverse) {
  Csr m;
  for (const auto& row : kRows) {
    const size_t start = m.data.size();
    for (const auto& [i, v] : row) {
      m.indices.push_back(i);
      m.data.push_back(v);
    }
    if (reverse) {
      std::reverse(m.indices.begin() + static_cast<long>(start), m.indices.end());
      std::reverse(m.data.begin() + static_cast<long>(start), m.data.end());
    }
    m.indptr.push_back(static_cast<int64_t>(m.data.size()));
  }
  return m;
}

std::vector<float> denseOf() {
  std::vector<float> x(kRows.size() * kWidth, 0.0f);
  for (size_t r = 0; r < kRows.size(); ++r) {
    for (const auto& [i, v] : kRows[r]) x[r * kWidth + static_cast<size_t>(i)] = v;
  }
  return x;
}

// Writes a CSR file; `edit` changes the arrays (or the file) before they are written.
void writeCsr(const std::string& path, const std::function<void(Csr&, std::vector<int64_t>&)>& edit = nullptr,
              bool group = true, bool shape = true) {
  Csr m = csrOf(true);
  std::vector<int64_t> y = kLabels;
  if (edit) edit(m, y);
  H5Writer w(path);
  const hid_t loc = group ? H5Gcreate2(w.file(), "X", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)
                          : H5Gopen2(w.file(), "/", H5P_DEFAULT);
  w.write(loc, "data", H5T_NATIVE_FLOAT, m.data);
  w.write(loc, "indices", H5T_NATIVE_INT32, m.indices);
  w.write(loc, "indptr", H5T_NATIVE_INT64, m.indptr);
  if (shape) w.shapeAttr(loc, static_cast<int64_t>(kRows.size()), kWidth);
  H5Gclose(loc);
  w.write(w.file(), "y", H5T_NATIVE_INT64, y);
}

void writeText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  REQUIRE(out.good());
}

std::string libsvmText() {
  std::string text;
  for (size_t r = 0; r < kRows.size(); ++r) {
    text += std::to_string(kLabels[r]);
    for (const auto& [i, v] : kRows[r]) text += fmt::format(" {}:{}", i, v);
    text += "\n";
  }
  return text;
}

ReadOptions shard(int rank, int worldSize) {
  ReadOptions o;
  o.rank = rank;
  o.worldSize = worldSize;
  return o;
}

std::string inputErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("expected an InputError");
  return {};
}

Matrix toDense(const Dataset& d) { return d.sparse ? Matrix(d.sparseX) : d.dense; }

// Every shard of `path` at `world` ranks against rows [offset, offset + size) of `whole`.
void checkShards(const std::string& path, const Dataset& whole, int world, int64_t width = -1) {
  int64_t next = 0;
  for (int r = 0; r < world; ++r) {
    ReadOptions o = shard(r, world);
    o.features = width;
    const Dataset part = readDataset(path, o);
    CHECK(part.globalOffset == next);
    CHECK(part.globalSize == whole.size());
    CHECK(part.globalOffset == whole.size() * r / world);
    REQUIRE(part.size() == whole.size() * (r + 1) / world - part.globalOffset);
    CHECK(part.sparse == whole.sparse);
    Matrix got = toDense(part);
    if (got.rows() < whole.features) got.conservativeResizeLike(Matrix::Zero(whole.features, got.cols()));
    for (int64_t i = got.rows() - 1; i >= whole.features; --i) CHECK(got.row(i).isZero());
    CHECK(got.topRows(whole.features) == toDense(whole).middleCols(next, part.size()));
    CHECK(std::equal(part.labels.begin(), part.labels.end(), whole.labels.begin() + next));
    next += part.size();
  }
  CHECK(next == whole.size());
}

}  // namespace

TEST_CASE("HDF5 format name and detection", "[data][hdf5]") {
  testing::TempDir dir("hdf5");
  CHECK(parseFormat("hdf5") == Format::kHdf5);
  CHECK(resolveFormat("/d/train.h5", Format::kAuto) == Format::kHdf5);
  CHECK(resolveFormat("/d/TRAIN.HDF5", Format::kAuto) == Format::kHdf5);
  CHECK(resolveFormat("/d/train.h5", Format::kLibsvm) == Format::kLibsvm);
  CHECK(detectIndexBase("/d/train.h5", Format::kAuto) == -1);
  // By content: an HDF5 file under any name; a text file stays LIBSVM.
  writeCsr(dir / "train.data");
  CHECK(resolveFormat(dir / "train.data", Format::kAuto) == Format::kHdf5);
  writeText(dir / "text.data", "1 1:0.5\n");
  CHECK(resolveFormat(dir / "text.data", Format::kAuto) == Format::kLibsvm);
}

TEST_CASE("HDF5 CSR reads as the same data in LIBSVM, shard by shard", "[data][hdf5]") {
  testing::TempDir dir("hdf5");
  writeText(dir / "data.libsvm", libsvmText());
  ReadOptions zeroBased;
  zeroBased.indexBase = 0;
  const Dataset text = readDataset(dir / "data.libsvm", zeroBased);
  REQUIRE(text.features == kWidth);

  writeCsr(dir / "group.h5");
  writeCsr(dir / "root.h5", nullptr, false, false);
  const Dataset whole = readDataset(dir / "group.h5", {});
  CHECK(whole.sparse);
  CHECK(whole.features == kWidth);
  CHECK(whole.labels == text.labels);
  // The same entries in the same (increasing) order, though the file lists each
  // row's columns backwards.
  CHECK(whole.sparseX.nonZeros() == text.sparseX.nonZeros());
  CHECK(std::equal(whole.sparseX.innerIndexPtr(), whole.sparseX.innerIndexPtr() + whole.sparseX.nonZeros(),
                   text.sparseX.innerIndexPtr()));
  CHECK(std::equal(whole.sparseX.outerIndexPtr(), whole.sparseX.outerIndexPtr() + whole.size() + 1,
                   text.sparseX.outerIndexPtr()));
  CHECK(toDense(whole) == toDense(text));
  for (int world = 1; world <= 7; ++world) {
    checkShards(dir / "group.h5", whole, world);
    checkShards(dir / "root.h5", whole, world);
  }
  // Without a shape a shard is as wide as its largest index, as a LIBSVM shard is;
  // with --features it is that wide.
  CHECK(readDataset(dir / "root.h5", shard(1, 7)).features == 0);
  CHECK(readDataset(dir / "root.h5", shard(3, 7)).features == 5);
  ReadOptions wide;
  wide.features = 9;
  CHECK(readDataset(dir / "group.h5", wide).features == 9);
  CHECK(readDataset(dir / "root.h5", wide).features == 9);
  checkShards(dir / "root.h5", whole, 3, 9);
}

TEST_CASE("HDF5 dense X reads as the same data in CSV, float32 or float64", "[data][hdf5]") {
  testing::TempDir dir("hdf5");
  const std::vector<float> x = denseOf();
  std::string csv;
  for (size_t r = 0; r < kRows.size(); ++r) {
    csv += std::to_string(kLabels[r]);
    for (int c = 0; c < kWidth; ++c) csv += fmt::format(",{}", x[r * kWidth + c]);
    csv += "\n";
  }
  writeText(dir / "data.csv", csv);
  const Dataset text = readDataset(dir / "data.csv", {});
  const hsize_t n = kRows.size();
  {
    H5Writer w(dir / "f32.h5");
    w.write(w.file(), "X", H5T_NATIVE_FLOAT, x, {n, kWidth});
    w.write(w.file(), "y", H5T_NATIVE_INT32, std::vector<int32_t>(kLabels.begin(), kLabels.end()));
  }
  {
    // float64 features and labels, y as a column vector.
    H5Writer w(dir / "f64.h5");
    w.write(w.file(), "X", H5T_NATIVE_DOUBLE, std::vector<double>(x.begin(), x.end()), {n, kWidth});
    w.write(w.file(), "y", H5T_NATIVE_DOUBLE, std::vector<double>(kLabels.begin(), kLabels.end()), {n, 1});
  }
  for (const char* name : {"f32.h5", "f64.h5"}) {
    const Dataset whole = readDataset(dir / name, {});
    CHECK_FALSE(whole.sparse);
    CHECK(whole.features == kWidth);
    CHECK(whole.dense == text.dense);
    CHECK(whole.labels == text.labels);
    for (int world = 1; world <= 7; ++world) checkShards(dir / name, whole, world, world % 2 == 0 ? kWidth : -1);
  }
  ReadOptions other;
  other.features = 4;
  CHECK_THAT(inputErrorOf([&] { readDataset(dir / "f32.h5", other); }),
             Contains("f32.h5: X has 5 columns (features), but 4 were expected"));
  CHECK_THAT(inputErrorOf([&] { readDataset(dir / "f32.h5", shard(0, 8)); }),
             Contains("f32.h5: shard 0 of 8 is empty: the file has 7 examples"));
}

TEST_CASE("HDF5 defects are one InputError naming the file", "[data][hdf5]") {
  testing::TempDir dir("hdf5");
  const std::string path = dir / "bad.h5";
  auto errorOf = [&](const ReadOptions& options = {}) { return inputErrorOf([&] { readDataset(path, options); }); };
  using Edit = std::function<void(Csr&, std::vector<int64_t>&)>;
  struct Case {
    const char* what;
    Edit edit;
    const char* message;
    int rank = 0;  // the shard (of 2) that sees the defect
  };
  const std::vector<Case> cases = {
      {"y too short", [](Csr&, std::vector<int64_t>& y) { y.pop_back(); },
       "'X/indptr' has 8 entries for the 6 labels of y: it needs one more than the rows (7)"},
      {"indptr too short", [](Csr& m, std::vector<int64_t>&) { m.indptr.pop_back(); },
       "'X/indptr' has 7 entries for the 7 labels of y"},
      {"indptr not from 0", [](Csr& m, std::vector<int64_t>&) { m.indptr[0] = 1; }, "'X/indptr[0]' is 1: it must be 0"},
      {"indptr decreases", [](Csr& m, std::vector<int64_t>&) { m.indptr[6] = m.indptr[5] - 1; },
       "'X/indptr' decreases: entry 6 is 7 after 8", 1},
      {"indptr past data", [](Csr& m, std::vector<int64_t>&) { m.indptr[5] = 99; },
       "'X/indptr[5]' is 99, outside [0, 10] (the length of 'X/data')", 1},
      {"indptr short of data", [](Csr& m, std::vector<int64_t>&) { m.indptr.back() = 9; },
       "'X/indptr' ends at 9 but 'X/data' has 10 entries"},
      {"data and indices differ", [](Csr& m, std::vector<int64_t>&) { m.indices.pop_back(); },
       "'X/data' has 10 entries but 'X/indices' has 9"},
      {"negative index", [](Csr& m, std::vector<int64_t>&) { m.indices[9] = -2; },
       "'X/indices[9]' is -2 (row 6): column indices must be >= 0", 1},
      {"index past the shape", [](Csr& m, std::vector<int64_t>&) { m.indices[0] = 5; },
       "'X/indices[0]' is 5 (row 0), beyond the 5 columns of its shape"},
      {"repeated column", [](Csr& m, std::vector<int64_t>&) { m.indices[3] = m.indices[2]; },
       "row 2 has column 4 twice ('X/indices[3]')"},
      {"non-finite value", [](Csr& m, std::vector<int64_t>&) { m.data[4] = std::numeric_limits<float>::infinity(); },
       "'X/data[4]' (row 2, column 1) is not finite"},
      {"negative label", [](Csr&, std::vector<int64_t>& y) { y[5] = -1; },
       "y[5] = -1 is negative: labels must be class ids 0..K-1", 1},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      writeCsr(path, c.edit);
      const std::string message = c.rank == 0 ? errorOf(shard(0, 2)) : errorOf(shard(1, 2));
      CHECK_THAT(message, Contains(path + ": ") && Contains(c.message));
      CHECK_THAT(errorOf(), Contains(c.message));
    }
  }

  SECTION("non-integer and string labels") {
    {
      H5Writer w(path);
      w.write(w.file(), "X", H5T_NATIVE_FLOAT, denseOf(), {kRows.size(), kWidth});
      w.write(w.file(), "y", H5T_NATIVE_DOUBLE, std::vector<double>{0, 1, 2, 0.5, 1, 1, 0});
    }
    CHECK_THAT(errorOf(), Contains(path + ": y[3] = 0.5 is not an integer"));
    {
      H5Writer w(path);
      w.write(w.file(), "X", H5T_NATIVE_FLOAT, denseOf(), {kRows.size(), kWidth});
      const hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, 2);
      w.write(w.file(), "y", type, std::vector<char>(kRows.size() * 2, 'a'), {kRows.size()});
      H5Tclose(type);
    }
    CHECK_THAT(errorOf(), Contains(path + ": the dataset 'y' must hold numbers, not strings"));
  }
  SECTION("missing, mismatched or misshapen datasets") {
    {
      H5Writer w(path);
      w.write(w.file(), "y", H5T_NATIVE_INT64, kLabels);
    }
    CHECK_THAT(errorOf(), Contains(path + ": no 'X': expected a dataset 'X'"));
    {
      H5Writer w(path);
      w.write(w.file(), "X", H5T_NATIVE_FLOAT, denseOf(), {kRows.size(), kWidth});
    }
    CHECK_THAT(errorOf(), Contains(path + ": no dataset 'y'"));
    {
      H5Writer w(path);
      w.write(w.file(), "X", H5T_NATIVE_FLOAT, denseOf(), {kRows.size(), kWidth});
      w.write(w.file(), "y", H5T_NATIVE_INT64, std::vector<int64_t>(kLabels.begin(), kLabels.end() - 1));
    }
    CHECK_THAT(errorOf(), Contains(path + ": X has 7 rows but y has 6 labels"));
    {
      H5Writer w(path);
      w.write(w.file(), "X", H5T_NATIVE_FLOAT, denseOf(), {kRows.size(), 1, kWidth});
      w.write(w.file(), "y", H5T_NATIVE_INT64, kLabels);
    }
    CHECK_THAT(errorOf(), Contains(path + ": the dataset 'X' must be N x D") && Contains("but it has 3 dimensions"));
    {
      H5Writer w(path);
      w.write(w.file(), "X", H5T_NATIVE_FLOAT, denseOf(), {kRows.size(), kWidth});
      w.write(w.file(), "y", H5T_NATIVE_INT64, std::vector<int64_t>(kRows.size() * 2), {kRows.size(), 2});
    }
    CHECK_THAT(errorOf(), Contains(path + ": the dataset 'y' must be N class ids") && Contains("has 2 dimensions"));
    {
      H5Writer w(path);
      const hid_t group = H5Gcreate2(w.file(), "X", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      Csr m = csrOf(false);
      w.write(group, "data", H5T_NATIVE_FLOAT, m.data);
      w.write(group, "indptr", H5T_NATIVE_INT64, m.indptr);
      w.shapeAttr(group, 6, kWidth);
      H5Gclose(group);
      w.write(w.file(), "y", H5T_NATIVE_INT64, kLabels);
    }
    CHECK_THAT(errorOf(), Contains(path + ": the CSR matrix lacks the dataset 'X/indices'"));
  }
  SECTION("a shape that disagrees") {
    {
      H5Writer w(path);
      const hid_t group = H5Gcreate2(w.file(), "X", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      Csr m = csrOf(false);
      w.write(group, "data", H5T_NATIVE_FLOAT, m.data);
      w.write(group, "indices", H5T_NATIVE_INT32, m.indices);
      w.write(group, "indptr", H5T_NATIVE_INT64, m.indptr);
      w.shapeAttr(group, 6, kWidth);
      H5Gclose(group);
      w.write(w.file(), "y", H5T_NATIVE_INT64, kLabels);
    }
    CHECK_THAT(errorOf(), Contains(path + ": 'X/shape' says 6 rows, but 'X/indptr' has 8 entries (7 rows)"));
    writeCsr(path);
    ReadOptions narrow;
    narrow.features = 4;
    CHECK_THAT(errorOf(narrow), Contains(path + ": 'X/shape' says 5 columns (features), but 4 were expected"));
    // A shape of floats (7.0, 5.5) is not converted to integers.
    writeCsr(path, nullptr, /*group=*/true, /*shape=*/false);
    {
      const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      const hid_t group = H5Gopen2(file, "X", H5P_DEFAULT);
      const hsize_t two = 2;
      const double shape[2] = {7.0, 5.5};
      const hid_t space = H5Screate_simple(1, &two, nullptr);
      const hid_t attr = H5Acreate2(group, "shape", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(attr, H5T_NATIVE_DOUBLE, shape);
      H5Aclose(attr);
      H5Sclose(space);
      H5Gclose(group);
      H5Fclose(file);
    }
    CHECK_THAT(errorOf(), Contains(path + ": the attribute 'X/shape' must hold 2 integers (rows, columns)"));
  }
  SECTION("not an HDF5 file") {
    writeText(path, "1 0:0.5\n");
    CHECK_THAT(errorOf(), Contains(path + ": not an HDF5 file"));
    CHECK_THAT(inputErrorOf([&] { readDataset(dir / "missing.h5", {}); }), Contains("missing.h5: cannot open"));
  }
}
