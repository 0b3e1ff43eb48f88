#include "engine/base/error.h"

#include <algorithm>
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

std::string printableMessage(const std::string& message, size_t maxBytes) {
  std::string out;
  out.reserve(std::min(message.size(), maxBytes) + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(message.data());
  const size_t n = message.size();
  for (size_t i = 0; i < n;) {
    if (out.size() >= maxBytes) {
      out += "...";
      break;
    }
    const unsigned char c = p[i];
    // The length of a valid UTF-8 sequence starting at i (0: not one).
    size_t len = 0;
    if (c >= 0x20 && c < 0x7f) {
      len = 1;
    } else if (c >= 0xc2 && c <= 0xf4) {
      const size_t want = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      len = want;
      for (size_t k = 1; k < want; ++k) {
        if (i + k >= n || (p[i + k] & 0xc0) != 0x80) {
          len = 0;
          break;
        }
      }
    }
    if (len > 0) {
      out.append(message, i, len);
      i += len;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  return out;
}

}  // namespace orpheus

namespace orpheus::detail {

void throwEnforce(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(fmt::format("{}:{}: check '{}' failed: {}", file, line, cond, msg));
}

}  // namespace orpheus::detail
