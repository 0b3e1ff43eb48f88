// LIBSVM/svmlight and CSV readers. A text file is split between ranks by byte
// range: rank r owns the lines whose first byte lies in [r*size/P, (r+1)*size/P),
// so each rank reads only its part and every line belongs to exactly one rank.

#include "engine/base/error.h"
#include "engine/data/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace orpheus::data {
namespace {

constexpr size_t kReadBlockBytes = size_t{1} << 20;
// detectIndexBase looks at the lines that start within this prefix of the file.
constexpr int64_t kDetectBytes = int64_t{1} << 20;

// Reads the lines that start in a byte range of a file, with their true line numbers.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throwFileError(path, "cannot open", errno);
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || S_ISDIR(st.st_mode)) {
      const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
      ::close(fd_);
      throwFileError(path, "cannot read", err);
    }
    size_ = st.st_size;
    end_ = size_;
    // gzip's magic bytes: a compressed text file would be parsed as garbage.
    unsigned char magic[2] = {};
    if (::pread(fd_, magic, sizeof magic, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      ::close(fd_);
      throw InputError(fmt::format("{}: the file is gzip-compressed: LIBSVM, CSV and token files are read "
                                   "uncompressed (gunzip it first); IDX files may be compressed",
                                   path));
    }
    // A small file needs no more than its size; a longer line grows the buffer.
    buffer_.resize(static_cast<size_t>(std::clamp<int64_t>(size_, 64, kReadBlockBytes)));
  }
  ~LineReader() { ::close(fd_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  int64_t fileSize() const { return size_; }

  // Restricts reading to the lines whose first byte lies in [begin, end). Ranges
  // that tile the file hand every line to exactly one of them. Costs a scan of
  // [0, begin) to count the lines before it.
  void setRange(int64_t begin, int64_t end) {
    begin = std::clamp<int64_t>(begin, 0, size_);
    end_ = std::clamp<int64_t>(end, begin, size_);
    char last = '\n';
    const int64_t before = countNewlines(begin, last);
    pos_ = begin;
    bufferStart_ = begin;
    bufferLength_ = 0;
    nextLine_ = before + 1;
    if (last != '\n' && pos_ < end_) {
      // The line under `begin` started in the previous range.
      std::string_view partial;
      readLine(partial);
    } else if (last != '\n') {
      pos_ = end_;
    }
  }

  // The next line in range, without its line terminator; false after the last.
  bool next(std::string_view& line) {
    if (pos_ >= end_) return false;
    readLine(line);
    return true;
  }

  // The 1-based line number of the line `next` returned last.
  int64_t lineNumber() const { return nextLine_ - 1; }

 private:
  // Number of '\n' in [0, end); `last` receives the byte before `end`.
  int64_t countNewlines(int64_t end, char& last) {
    int64_t count = 0;
    for (int64_t at = 0; at < end;) {
      const size_t want = static_cast<size_t>(std::min<int64_t>(end - at, buffer_.size()));
      const size_t got = readAt(at, buffer_.data(), want);
      if (got == 0) break;
      count += std::count(buffer_.data(), buffer_.data() + got, '\n');
      last = buffer_[got - 1];
      at += static_cast<int64_t>(got);
    }
    return count;
  }

  size_t readAt(int64_t offset, char* dst, size_t n) {
    for (;;) {
      const ssize_t got = ::pread(fd_, dst, n, offset);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) throwFileError(path_, "cannot read", errno);
    }
  }

  // Reads the line starting at pos_ (which may extend past end_) and moves past it.
  void readLine(std::string_view& line) {
    size_t offset = static_cast<size_t>(pos_ - bufferStart_);
    size_t scanned = 0;
    for (;;) {
      const char* from = buffer_.data() + offset + scanned;
      const auto* newline =
          static_cast<const char*>(std::memchr(from, '\n', bufferLength_ - offset - scanned));
      const bool atEof = bufferStart_ + static_cast<int64_t>(bufferLength_) >= size_;
      if (newline != nullptr || atEof) {
        const char* lineEnd = newline != nullptr ? newline : buffer_.data() + bufferLength_;
        line = std::string_view(buffer_.data() + offset, lineEnd - (buffer_.data() + offset));
        pos_ += static_cast<int64_t>(line.size()) + (newline != nullptr ? 1 : 0);
        if (newline == nullptr) pos_ = std::max(pos_, size_);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        ++nextLine_;
        return;
      }
      // Keep the partial line, grow the buffer if it fills it, and read on.
      scanned = bufferLength_ - offset;
      std::memmove(buffer_.data(), buffer_.data() + offset, scanned);
      bufferStart_ += static_cast<int64_t>(offset);
      bufferLength_ = scanned;
      offset = 0;
      if (bufferLength_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
      const size_t got = readAt(bufferStart_ + static_cast<int64_t>(bufferLength_),
                                buffer_.data() + bufferLength_, buffer_.size() - bufferLength_);
      // A file that shrank while being read ends where the data ends.
      if (got == 0) size_ = bufferStart_ + static_cast<int64_t>(bufferLength_);
      bufferLength_ += got;
    }
  }

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  int64_t end_ = 0;
  int64_t pos_ = 0;             // file offset of the next line
  int64_t nextLine_ = 1;        // its 1-based line number
  std::vector<char> buffer_;    // file bytes from bufferStart_
  int64_t bufferStart_ = 0;
  size_t bufferLength_ = 0;
};

bool isBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && isBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && isBlank(s.back())) s.remove_suffix(1);
  return s;
}

// Splits off the next whitespace-separated token; empty at the end.
std::string_view nextToken(std::string_view& rest) {
  size_t i = 0;
  while (i < rest.size() && isBlank(rest[i])) ++i;
  size_t j = i;
  while (j < rest.size() && !isBlank(rest[j])) ++j;
  const std::string_view token = rest.substr(i, j - i);
  rest.remove_prefix(j);
  return token;
}

// from_chars does not take a leading '+', which text data often has.
std::string_view dropPlus(std::string_view s) {
  if (s.size() >= 2 && s[0] == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
  return s;
}

bool parseInt(std::string_view s, int64_t& out) {
  s = dropPlus(s);
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

enum class Parsed { kOk, kMalformed, kNonFinite };

Parsed parseFloat(std::string_view s, float& out) {
  s = dropPlus(s);
  if (s.empty()) return Parsed::kMalformed;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (end != s.data() + s.size() || ec == std::errc::invalid_argument) return Parsed::kMalformed;
  if (ec == std::errc::result_out_of_range) {
    // Overflow is non-finite; underflow rounds towards zero as strtof does.
    out = std::strtof(std::string(s).c_str(), nullptr);
  }
  return std::isfinite(out) ? Parsed::kOk : Parsed::kNonFinite;
}

// Parses a class id; integral floats ("1.0") are accepted. Returns false and
// fills `why` when the token is not one.
bool parseLabel(std::string_view token, int32_t& out, std::string& why) {
  int64_t value = 0;
  if (!parseInt(token, value)) {
    float f = 0;
    switch (parseFloat(token, f)) {
      case Parsed::kMalformed:
        why = fmt::format("expected a class id (an integer 0..K-1) as the label, got '{}'", token);
        return false;
      case Parsed::kNonFinite:
        why = fmt::format("non-finite value '{}' as the label", token);
        return false;
      case Parsed::kOk:
        break;
    }
    if (f != std::floor(f) || std::fabs(f) > static_cast<float>(INT32_MAX)) {
      why = fmt::format("label '{}' is not an integer: labels must be class ids 0..K-1", token);
      return false;
    }
    value = static_cast<int64_t>(f);
  }
  if (value < 0) {
    why = fmt::format("negative label '{}': labels must be class ids 0..K-1", token);
    return false;
  }
  if (value > INT32_MAX) {
    why = fmt::format("label '{}' is too large for a class id", token);
    return false;
  }
  out = static_cast<int32_t>(value);
  return true;
}

// The byte range of shard `rank` of `worldSize` in a file of `size` bytes.
void shardRange(int64_t size, int rank, int worldSize, int64_t& begin, int64_t& end) {
  begin = size * rank / worldSize;
  end = size * (rank + 1) / worldSize;
}

void finishText(Dataset& data, const std::string& path, const ReadOptions& options) {
  ORPHEUS_CHECK_INPUT(data.size() > 0,
                      "{}: shard {} of {} is empty: no examples start in its part of the file",
                      path, options.rank, options.worldSize);
  // With one shard the whole file is known; otherwise only the caller can agree
  // the offsets across ranks.
  data.globalOffset = options.worldSize == 1 ? 0 : -1;
  data.globalSize = options.worldSize == 1 ? data.size() : -1;
}

// The width of a CSV file: fields of its first non-blank line, minus the label.
int64_t csvWidth(const std::string& path) {
  LineReader reader(path);
  std::string_view line;
  while (reader.next(line)) {
    line = trim(line);
    if (line.empty()) continue;
    const int64_t width = std::count(line.begin(), line.end(), ',');
    ORPHEUS_CHECK_INPUT(width > 0, "{}:{}: expected a label and at least one feature", path,
                        reader.lineNumber());
    return width;
  }
  throw InputError(fmt::format("{}: the file has no data lines", path));
}

// One 'index:value' token of a LIBSVM line whose last feature so far is `previous`
// (-1: none): its row (index - indexBase) and its value. `features` < 0: the width
// is not fixed. A malformed token throws fail(why).
template <class Fail>
std::pair<int64_t, float> parseLibsvmFeature(std::string_view token, int indexBase, int64_t previous,
                                             int64_t features, const Fail& fail) {
  const size_t colon = token.find(':');
  if (colon == std::string_view::npos) {
    throw fail(fmt::format("expected 'index:value', got '{}'", token));
  }
  int64_t index = 0;
  if (!parseInt(token.substr(0, colon), index) || index < 0) {
    throw fail(fmt::format("expected a non-negative integer feature index, got '{}'", token));
  }
  float value = 0;
  const std::string_view valueText = token.substr(colon + 1);
  switch (parseFloat(valueText, value)) {
    case Parsed::kMalformed:
      throw fail(fmt::format("expected a number as the value of feature {}, got '{}'", index,
                             valueText));
    case Parsed::kNonFinite:
      throw fail(fmt::format("non-finite value '{}' for feature {}", valueText, index));
    case Parsed::kOk:
      break;
  }
  if (index < indexBase) {
    throw fail(fmt::format("feature index {} in a file read as {}-based (the index base was "
                           "detected from the file's first lines; pass it explicitly)",
                           index, indexBase));
  }
  const int64_t row = index - indexBase;
  if (row <= previous) {
    throw fail(fmt::format("feature indices must be strictly increasing, got {} after {}",
                           index, previous + indexBase));
  }
  if (features >= 0 && row >= features) {
    throw fail(fmt::format("feature index {} is beyond the width of {} features ({}-based "
                           "indices stop at {})",
                           index, features, indexBase,
                           features - 1 + indexBase));
  }
  if (row > INT32_MAX - 1) throw fail(fmt::format("feature index {} is too large", index));
  return {row, value};
}

}  // namespace

int detectIndexBase(const std::string& path, Format format) {
  if (resolveFormat(path, format) != Format::kLibsvm) return -1;
  LineReader reader(path);
  reader.setRange(0, kDetectBytes);
  std::string_view line;
  while (reader.next(line)) {
    line = line.substr(0, line.find('#'));
    nextToken(line);  // label
    for (std::string_view token = nextToken(line); !token.empty(); token = nextToken(line)) {
      const size_t colon = token.find(':');
      int64_t index = 0;
      if (colon != std::string_view::npos && parseInt(token.substr(0, colon), index) && index == 0) {
        return 0;
      }
    }
  }
  return 1;
}

namespace detail {

Dataset readLibsvm(const std::string& path, const ReadOptions& options, int indexBase) {
  LineReader reader(path);
  int64_t begin = 0;
  int64_t end = 0;
  shardRange(reader.fileSize(), options.rank, options.worldSize, begin, end);
  reader.setRange(begin, end);

  const bool fixedWidth = options.features >= 0;
  ORPHEUS_CHECK_INPUT(options.features <= INT32_MAX, "{}: {} features is too many", path,
                      options.features);
  std::vector<int32_t> columnStarts{0};
  std::vector<int32_t> rowIndices;
  std::vector<float> values;
  std::vector<int32_t> labels;
  int64_t maxRow = -1;
  std::string why;

  std::string_view line;
  while (reader.next(line)) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const int64_t lineNo = reader.lineNumber();
    auto fail = [&](const std::string& what) {
      return InputError(fmt::format("{}:{}: {}", path, lineNo, what));
    };

    int32_t label = 0;
    if (!parseLabel(nextToken(line), label, why)) throw fail(why);
    int64_t previous = -1;
    for (std::string_view token = nextToken(line); !token.empty(); token = nextToken(line)) {
      if (token.starts_with("qid:")) continue;  // svmlight query ids carry no feature
      const auto [row, value] = parseLibsvmFeature(token, indexBase, previous, options.features, fail);
      previous = row;
      rowIndices.push_back(static_cast<int32_t>(row));
      values.push_back(value);
    }
    if (rowIndices.size() > static_cast<size_t>(INT32_MAX)) {
      throw fail("the shard holds more than 2^31 nonzeros; use more ranks");
    }
    maxRow = std::max(maxRow, previous);
    labels.push_back(label);
    columnStarts.push_back(static_cast<int32_t>(rowIndices.size()));
  }

  Dataset data;
  data.source = path;
  data.sparse = true;
  data.features = fixedWidth ? options.features : maxRow + 1;
  data.labels = std::move(labels);
  finishText(data, path, options);
  const auto count = static_cast<int64_t>(data.labels.size());
  SparseMatrix& x = data.sparseX;
  x.resize(data.features, count);
  x.resizeNonZeros(static_cast<int64_t>(values.size()));
  std::copy(columnStarts.begin(), columnStarts.end(), x.outerIndexPtr());
  std::copy(rowIndices.begin(), rowIndices.end(), x.innerIndexPtr());
  std::copy(values.begin(), values.end(), x.valuePtr());
  return data;
}

Dataset readCsv(const std::string& path, const ReadOptions& options) {
  const bool fixedWidth = options.features >= 0;
  const int64_t width = fixedWidth ? options.features : csvWidth(path);
  const std::string widthSource = fixedWidth ? "were expected" : "are on the file's first line";

  LineReader reader(path);
  int64_t begin = 0;
  int64_t end = 0;
  shardRange(reader.fileSize(), options.rank, options.worldSize, begin, end);
  reader.setRange(begin, end);

  std::vector<float> values;
  std::vector<int32_t> labels;
  std::string why;
  std::string_view line;
  while (reader.next(line)) {
    line = trim(line);
    if (line.empty()) continue;
    const int64_t lineNo = reader.lineNumber();
    auto fail = [&](const std::string& what) {
      return InputError(fmt::format("{}:{}: {}", path, lineNo, what));
    };
    const std::string headerHint = lineNo == 1 ? " (a CSV file must not have a header line)" : "";

    int64_t field = 0;
    for (;;) {
      const size_t comma = line.find(',');
      const std::string_view text = trim(line.substr(0, comma));
      ++field;
      if (field == 1) {
        int32_t label = 0;
        if (!parseLabel(text, label, why)) throw fail(fmt::format("field 1: {}{}", why, headerHint));
        labels.push_back(label);
      } else {
        float value = 0;
        switch (parseFloat(text, value)) {
          case Parsed::kMalformed:
            throw fail(fmt::format("field {}: expected a number, got '{}'{}", field, text, headerHint));
          case Parsed::kNonFinite:
            throw fail(fmt::format("non-finite value '{}' in field {}", text, field));
          case Parsed::kOk:
            break;
        }
        if (field - 1 > width) {
          const int64_t fields = field + std::count(line.begin(), line.end(), ',');
          throw fail(fmt::format("ragged row: {} features, but {} {}", fields - 1, width, widthSource));
        }
        values.push_back(value);
      }
      if (comma == std::string_view::npos) break;
      line.remove_prefix(comma + 1);
    }
    if (field - 1 != width) {
      throw fail(fmt::format("ragged row: {} features, but {} {}", field - 1, width, widthSource));
    }
  }

  Dataset data;
  data.source = path;
  data.sparse = false;
  data.features = width;
  data.labels = std::move(labels);
  finishText(data, path, options);
  data.dense = Eigen::Map<const Matrix>(values.data(), width, data.size());
  return data;
}

}  // namespace detail
}  // namespace orpheus::data
