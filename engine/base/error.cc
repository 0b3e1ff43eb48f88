#include "engine/base/error.h"

#include <cerrno>
#include <cstring>

namespace orpheus {

void throwFileError(const std::string& path, const char* what, int err) {
  const std::string message = fmt::format("{}: {}: {}", path, what, std::strerror(err));
  switch (err) {
    case ENOENT:
    case EACCES:
    case EISDIR:
    case ENOTDIR:
    case ELOOP:
    case ENAMETOOLONG:
      throw InputError(message);
    default:
      throw IoError(message);
  }
}

}  // namespace orpheus

namespace orpheus::detail {

void throwEnforce(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(fmt::format("{}:{}: check '{}' failed: {}", file, line, cond, msg));
}

}  // namespace orpheus::detail
