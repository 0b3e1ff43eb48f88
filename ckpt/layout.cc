#include "ckpt/layout.h"

#include <fmt/format.h>

#include <algorithm>

namespace orpheus::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kReplicaPrefix = "replica-";
constexpr std::string_view kSnapshotPrefix = "snapshot-";
constexpr std::string_view kMatrixPrefix = "matrix-";
constexpr std::string_view kStatesPrefix = "states-";
constexpr std::string_view kSegmentPrefix = "seg-";
constexpr std::string_view kH5Suffix = ".h5";

// A non-empty run of decimal digits covering all of `text` (at most 19: no overflow).
std::optional<uint64_t> parseNumber(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

std::optional<uint64_t> parsePrefixed(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  return parseNumber(name.substr(prefix.size()));
}

std::vector<NumberedDir> listDirs(const std::string& dir, std::optional<uint64_t> (*parse)(std::string_view)) {
  std::vector<NumberedDir> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    if (const auto number = parse(e.path().filename().string())) out.push_back({*number, e.path()});
  }
  std::sort(out.begin(), out.end(), [](const NumberedDir& a, const NumberedDir& b) { return a.number < b.number; });
  return out;
}

}  // namespace

std::string clockName(uint64_t clock) { return fmt::format("{:012d}", clock); }

fs::path jobPath(const std::string& dir) { return fs::path(dir) / "job.h5"; }

std::string jobFileHint(const std::string& dir) {
  std::error_code ec;
  const fs::path p(dir);
  if (p.filename() != "job.h5" || !fs::is_regular_file(p, ec)) return {};
  const std::string parent = p.parent_path().empty() ? "." : p.parent_path().string();
  return "; it is a checkpoint's job file: give its directory '" + parent + "'";
}

fs::path membershipPath(const std::string& dir) { return fs::path(dir) / "membership"; }

fs::path chunksPath(const std::string& dir) { return fs::path(dir) / "chunks"; }

fs::path replicaDir(const std::string& dir, int replica) {
  return fs::path(dir) / fmt::format("{}{}", kReplicaPrefix, replica);
}

fs::path segmentPath(const std::string& dir, int replica, uint64_t first, uint64_t last) {
  return replicaDir(dir, replica) / fmt::format("{}{}-{}{}", kSegmentPrefix, clockName(first), clockName(last), kH5Suffix);
}

fs::path snapshotDir(const std::string& dir, uint64_t clock) {
  return fs::path(dir) / fmt::format("{}{}", kSnapshotPrefix, clockName(clock));
}

fs::path snapshotPartPath(const std::string& dir, uint64_t clock, int rank) {
  return snapshotDir(dir, clock) / fmt::format("part-{}{}", rank, kH5Suffix);
}

fs::path matrixDir(const std::string& dir, uint64_t clock) {
  return fs::path(dir) / fmt::format("{}{}", kMatrixPrefix, clockName(clock));
}

fs::path statesDir(const std::string& dir, uint64_t clock) {
  return fs::path(dir) / fmt::format("{}{}", kStatesPrefix, clockName(clock));
}

fs::path statesPath(const std::string& dir, uint64_t clock, int rank) {
  return statesDir(dir, clock) / fmt::format("rank-{}{}", rank, kH5Suffix);
}

fs::path discardedPath(const fs::path& path) {
  fs::path out = path;
  out += ".discarded";
  return out;
}

std::optional<SegmentName> parseSegmentName(std::string_view name) {
  if (name.size() <= kSegmentPrefix.size() + kH5Suffix.size() || !name.starts_with(kSegmentPrefix) ||
      !name.ends_with(kH5Suffix)) {
    return std::nullopt;
  }
  const std::string_view body = name.substr(kSegmentPrefix.size(), name.size() - kSegmentPrefix.size() - kH5Suffix.size());
  const size_t dash = body.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const auto first = parseNumber(body.substr(0, dash));
  const auto last = parseNumber(body.substr(dash + 1));
  if (!first || !last) return std::nullopt;
  return SegmentName{*first, *last};
}

std::optional<uint64_t> parseReplicaDirName(std::string_view name) { return parsePrefixed(name, kReplicaPrefix); }
std::optional<uint64_t> parseSnapshotDirName(std::string_view name) { return parsePrefixed(name, kSnapshotPrefix); }
std::optional<uint64_t> parseMatrixDirName(std::string_view name) { return parsePrefixed(name, kMatrixPrefix); }
std::optional<uint64_t> parseStatesDirName(std::string_view name) { return parsePrefixed(name, kStatesPrefix); }

std::vector<SegmentFile> listSegments(const fs::path& replicaDir) {
  std::vector<SegmentFile> out;
  std::error_code ec;
  if (!fs::is_directory(replicaDir, ec)) return out;
  for (const auto& e : fs::directory_iterator(replicaDir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    if (const auto name = parseSegmentName(e.path().filename().string())) {
      out.push_back({e.path().string(), name->first, name->last});
    }
  }
  std::sort(out.begin(), out.end(), [](const SegmentFile& a, const SegmentFile& b) {
    return a.first != b.first ? a.first < b.first : a.last < b.last;
  });
  return out;
}

std::vector<NumberedDir> listReplicaDirs(const std::string& dir) { return listDirs(dir, parseReplicaDirName); }
std::vector<NumberedDir> listSnapshotDirs(const std::string& dir) { return listDirs(dir, parseSnapshotDirName); }
std::vector<NumberedDir> listStatesDirs(const std::string& dir) { return listDirs(dir, parseStatesDirName); }

}  // namespace orpheus::ckpt
