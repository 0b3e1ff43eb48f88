// Parameter sets equal bit for bit: the same names' shapes and the same bytes.
#pragma once

#include "engine/base/params.h"

#include <cstring>

namespace orpheus::testing {

inline bool bitwiseEqual(const ParamSet& a, const ParamSet& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].rows() != b[i].rows() || a[i].cols() != b[i].cols()) return false;
    if (std::memcmp(a[i].data(), b[i].data(), static_cast<size_t>(a[i].size()) * sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace orpheus::testing
