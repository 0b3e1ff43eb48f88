#include "engine/base/error.h"

namespace orpheus::detail {

void throwEnforce(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(fmt::format("{}:{}: check '{}' failed: {}", file, line, cond, msg));
}

}  // namespace orpheus::detail
