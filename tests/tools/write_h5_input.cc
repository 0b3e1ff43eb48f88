// write_h5_input KIND IN.libsvm OUT.h5: writes the examples of a 0-based LIBSVM
// file as an HDF5 input file, laid out as h5py writes numpy and scipy arrays:
//   dense     X (N x D float32, a row per example) and y (N int64)
//   dense64   X as float64, y as float64 (integral values)
//   csr       a group X with data (float32), indices (int32), indptr (int64) and a
//             shape attribute (N, D), and y; each row's indices written in reverse,
//             as scipy may leave them
//   csr-root  data, indices, indptr at the root, no shape; y
// or as a file with one defect, for the refusal tests:
//   no-x, no-y, short-y (y one shorter than X), rank-x (X one-dimensional),
//   indptr-length, indptr-decreasing (in the last row), indptr-end (last entry
//   short of len(data)), index-negative, index-range (a column past the shape),
//   index-duplicate, label-fraction (y float with 1.5), label-negative,
//   dangling-x (X an external link to a file that does not exist).
// D is the largest index + 1. Exits 0 on success, 2 on a usage or input error.
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Csr {
  std::vector<float> data;
  std::vector<int32_t> indices;
  std::vector<int64_t> indptr{0};
  std::vector<int64_t> labels;
  int64_t width = 0;
  int64_t rows() const { return static_cast<int64_t>(labels.size()); }
};

bool readLibsvm(const char* path, Csr& m) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    int64_t label = 0;
    if (!(fields >> label)) continue;
    std::string pair;
    while (fields >> pair) {
      const auto colon = pair.find(':');
      if (colon == std::string::npos) return false;
      const auto index = static_cast<int32_t>(std::stol(pair.substr(0, colon)));
      m.indices.push_back(index);
      m.data.push_back(std::stof(pair.substr(colon + 1)));
      m.width = std::max<int64_t>(m.width, index + 1);
    }
    m.labels.push_back(label);
    m.indptr.push_back(static_cast<int64_t>(m.data.size()));
  }
  return true;
}

void write(hid_t loc, const char* name, hid_t type, std::vector<hsize_t> dims, const void* values) {
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t set = H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
  H5Dclose(set);
  H5Sclose(space);
}

template <typename T>
void write(hid_t loc, const char* name, hid_t type, const std::vector<T>& values) {
  write(loc, name, type, {static_cast<hsize_t>(values.size())}, values.data());
}

void writeShape(hid_t group, int64_t rows, int64_t cols) {
  const hsize_t two = 2;
  const int64_t shape[2] = {rows, cols};
  const hid_t space = H5Screate_simple(1, &two, nullptr);
  const hid_t attr = H5Acreate2(group, "shape", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, H5T_NATIVE_INT64, shape);
  H5Aclose(attr);
  H5Sclose(space);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: write_h5_input KIND IN.libsvm OUT.h5\n");
    return 2;
  }
  const std::string kind = argv[1];
  static const std::set<std::string> kKinds = {
      "dense", "dense64", "csr", "csr-root", "no-x", "no-y", "short-y", "rank-x", "indptr-length",
      "indptr-decreasing", "indptr-end", "index-negative", "index-range", "index-duplicate", "label-fraction",
      "label-negative", "dangling-x"};
  if (kKinds.count(kind) == 0) {
    std::fprintf(stderr, "write_h5_input: unknown KIND '%s'\n", kind.c_str());
    return 2;
  }
  Csr m;
  if (!readLibsvm(argv[2], m) || m.rows() < 2) {
    std::fprintf(stderr, "write_h5_input: cannot read two or more examples from %s\n", argv[2]);
    return 2;
  }
  const int64_t n = m.rows();
  const hid_t file = H5Fcreate(argv[3], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return 2;

  std::vector<int64_t> y = m.labels;
  if (kind == "short-y") y.pop_back();
  if (kind == "label-negative") y[n / 2] = -1;
  if (kind == "label-fraction" || kind == "dense64") {
    std::vector<double> fy(y.begin(), y.end());
    if (kind == "label-fraction") fy[n / 2] = 1.5;
    write(file, "y", H5T_NATIVE_DOUBLE, fy);
  } else if (kind != "no-y") {
    write(file, "y", H5T_NATIVE_INT64, y);
  }

  if (kind == "dense" || kind == "dense64" || kind == "no-y" || kind == "short-y" || kind == "rank-x") {
    std::vector<double> x(static_cast<size_t>(n * m.width), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = m.indptr[i]; k < m.indptr[i + 1]; ++k) x[i * m.width + m.indices[k]] = m.data[k];
    }
    std::vector<float> xf(x.begin(), x.end());
    if (kind == "rank-x") {
      write(file, "X", H5T_NATIVE_FLOAT, xf);
    } else if (kind == "dense64") {
      write(file, "X", H5T_NATIVE_DOUBLE, {hsize_t(n), hsize_t(m.width)}, x.data());
    } else {
      write(file, "X", H5T_NATIVE_FLOAT, {hsize_t(n), hsize_t(m.width)}, xf.data());
    }
  } else if (kind == "dangling-x") {
    if (H5Lcreate_external("missing-data.h5", "/X", file, "X", H5P_DEFAULT, H5P_DEFAULT) < 0) return 2;
  } else if (kind != "no-x") {
    for (int64_t i = 0; i < n; ++i) {
      std::reverse(m.indices.begin() + m.indptr[i], m.indices.begin() + m.indptr[i + 1]);
      std::reverse(m.data.begin() + m.indptr[i], m.data.begin() + m.indptr[i + 1]);
    }
    if (kind == "indptr-length") m.indptr.pop_back();
    if (kind == "indptr-end") m.indptr.back() -= 1;
    if (kind == "indptr-decreasing") m.indptr[n - 1] = m.indptr[n - 2] - 1;
    if (kind == "index-negative") m.indices[m.indices.size() / 2] = -3;
    if (kind == "index-range") m.indices[m.indices.size() / 2] = static_cast<int32_t>(m.width + 5);
    if (kind == "index-duplicate") m.indices[1] = m.indices[0];  // the first row holds two or more
    const bool root = kind == "csr-root";
    const hid_t group = root ? H5Gopen2(file, "/", H5P_DEFAULT)
                             : H5Gcreate2(file, "X", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    write(group, "data", H5T_NATIVE_FLOAT, m.data);
    write(group, "indices", H5T_NATIVE_INT32, m.indices);
    write(group, "indptr", H5T_NATIVE_INT64, m.indptr);
    if (!root) writeShape(group, n, m.width);
    H5Gclose(group);
  }
  return H5Fclose(file) < 0 ? 2 : 0;
}
