#include "engine/base/params.h"

#include "engine/base/crc32c.h"

#include "engine/base/error.h"

#include <cmath>

namespace orpheus {

int ParamSet::find(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

size_t ParamSet::numElements() const {
  size_t n = 0;
  for (const auto& p : params) n += static_cast<size_t>(p.value.size());
  return n;
}

uint32_t paramDigest(const ParamSet& set) {
  uint32_t crc = 0;
  for (const Param& p : set.params) crc = crc32c(crc, p.value.data(), static_cast<size_t>(p.value.size()) * sizeof(float));
  return crc;
}

double relativeDifference(const ParamSet& a, const ParamSet& b) {
  ORPHEUS_CHECK_INPUT(a.size() == b.size(), "parameter sets differ in count: {} vs {}", a.size(), b.size());
  double diff = 0.0;
  double ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const Matrix& x = a[i];
    const Matrix& y = b[i];
    ORPHEUS_CHECK_INPUT(x.rows() == y.rows() && x.cols() == y.cols(),
                        "parameter '{}' has shape {}x{} in one set and {}x{} in the other", a.params[i].name,
                        x.rows(), x.cols(), y.rows(), y.cols());
    diff += (x.cast<double>() - y.cast<double>()).squaredNorm();
    ref += y.cast<double>().squaredNorm();
  }
  return ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

}  // namespace orpheus
