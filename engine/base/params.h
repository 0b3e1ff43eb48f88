// A model's parameters: named dense float matrices (a bias is an n x 1 matrix).
// Column-major, as Eigen stores them; a replica is one ParamSet.
#pragma once

#include <Eigen/Dense>

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Vector = Eigen::Matrix<float, Eigen::Dynamic, 1>;

struct Param {
  std::string name;
  Matrix value;
};

struct ParamSet {
  std::vector<Param> params;

  int find(const std::string& name) const;  // index or -1
  Matrix& operator[](size_t i) { return params[i].value; }
  const Matrix& operator[](size_t i) const { return params[i].value; }
  size_t size() const { return params.size(); }
  size_t numElements() const;
};

// CRC32C of every parameter's values (float32, column-major), in the set's order:
// two sets with the same digest hold the same bits (up to CRC collisions). The
// metrics' param_crc32c and `orpheus restore` print it, so a restored replica can
// be checked against the live one.
uint32_t paramDigest(const ParamSet& set);

// ||a - b||_F / ||b||_F over all parameters together; shapes must match.
double relativeDifference(const ParamSet& a, const ParamSet& b);

}  // namespace orpheus
