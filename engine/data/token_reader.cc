// Token streams: a text of word ids, cut into segments for a recurrent model.
//
// File format (written by scripts/data/make_tokens.sh):
//   #orpheus-tokens vocabulary=V steps=T
//   ids of one line of the text (a verse), separated by spaces, ending with <eos>
//   ...
// The stream is all ids in file order. Rank r of P owns the lines whose first
// byte lies in [r*size/P, (r+1)*size/P) of the body (as the text readers split
// files), so it reads only its part. Its n tokens become S parallel streams of
// n/S consecutive tokens (S = ReadOptions::streams: the minibatch size for
// training, so column b of every minibatch continues stream b), each cut into
// segments of T steps; a segment holds T + 1 tokens (its last is the next
// segment's first) laid out as in ops/sequence_layout.h. Example s*S + b is
// segment s of stream b, so examples read in order give every stream's next
// segment together. The tail that fills no whole segment is left out.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "ops/sequence_layout.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

namespace orpheus::data {
namespace {

constexpr std::string_view kMagic = "#orpheus-tokens";
// Test and validation streams per rank when the caller gives none: enough
// columns for a fast evaluation, few enough that short shards still fill them.
constexpr int64_t kDefaultStreams = 16;
constexpr int64_t kMaxSteps = 1000;

// Reads "key=INT" from the header; -1 when absent.
int64_t headerValue(const std::string& header, const std::string& key, const std::string& path) {
  // key= after a space or a tab (the fields split as checkHeaderFields splits them)
  const std::string needle = key + "=";
  size_t at = header.find(needle);
  while (at != std::string::npos && (at == 0 || (header[at - 1] != ' ' && header[at - 1] != '\t'))) {
    at = header.find(needle, at + 1);
  }
  if (at == std::string::npos) return -1;
  const char* begin = header.data() + at + needle.size();
  const char* end = header.data() + header.size();
  int64_t v = 0;
  const auto [stop, ec] = std::from_chars(begin, end, v);
  ORPHEUS_CHECK_INPUT(ec != std::errc::result_out_of_range, "{}:1: '{}' is too large (vocabulary < 2^24, steps <= {})",
                      path, key, kMaxSteps);
  ORPHEUS_CHECK_INPUT(ec == std::errc() && v > 0 && (stop == end || *stop == ' ' || *stop == '\t'),
                      "{}:1: '{}' must be a positive integer", path, key);
  return v;
}

// The header's fields after the magic are vocabulary=V and steps=T, each once: a
// typo ('step=35') or a repeated field is named, not ignored.
void checkHeaderFields(const std::string& header, const std::string& path) {
  std::istringstream fields(header.substr(kMagic.size()));
  std::set<std::string> seen;
  for (std::string field; fields >> field;) {
    const std::string key = field.substr(0, field.find('='));
    ORPHEUS_CHECK_INPUT(key == "vocabulary" || key == "steps",
                        "{}:1: unknown header field '{}' (a token stream starts '{} vocabulary=V steps=T')", path,
                        field, kMagic);
    ORPHEUS_CHECK_INPUT(seen.insert(key).second, "{}:1: the header gives '{}' twice", path, key);
  }
}

// The line number in `path` of the line that starts at byte `offset`: counted
// only for a message (a rank past the first starts reading mid-file).
int64_t fileLineAt(const std::string& path, int64_t offset) {
  std::ifstream in(path, std::ios::binary);
  int64_t line = 1;
  char buffer[1 << 16];
  for (int64_t left = offset; left > 0 && in;) {
    in.read(buffer, static_cast<std::streamsize>(std::min<int64_t>(left, sizeof buffer)));
    const std::streamsize got = in.gcount();
    line += std::count(buffer, buffer + got, '\n');
    left -= got;
    if (got == 0) break;
  }
  return line;
}

// This rank's tokens: those of the lines that start in its part of the body,
// which starts where `in` stands (after the header).
std::vector<int32_t> readRankTokens(std::ifstream& in, const std::string& path, const ReadOptions& options,
                                    int64_t vocabulary) {
  const auto bodyStart = static_cast<int64_t>(in.tellg());
  in.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(in.tellg());
  const int64_t body = size - bodyStart;
  const int64_t begin = bodyStart + body * options.rank / options.worldSize;
  const int64_t end = bodyStart + body * (options.rank + 1) / options.worldSize;
  // Our first line is the first that starts at or after `begin`.
  int64_t pos = begin;
  int64_t lineNo = 0;  // counted only for messages; exact for rank 0 (fileLineAt for the others)
  in.clear();
  if (begin > bodyStart) {
    in.seekg(begin - 1);
    std::string rest;
    std::getline(in, rest);  // the end of the line that started before `begin`
    pos = static_cast<int64_t>(in.tellg());
    if (!in) pos = size;
  } else {
    in.seekg(bodyStart);
    lineNo = 1;
  }
  std::vector<int32_t> tokens;
  std::string line;
  while (pos < end && pos < size && std::getline(in, line)) {
    ++lineNo;
    const int64_t lineStart = pos;
    const char* p = line.data();
    const char* stop = line.data() + line.size();
    while (p < stop) {
      if (*p == ' ' || *p == '\r' || *p == '\t') {
        ++p;
        continue;
      }
      int64_t id = -1;
      const auto [next, ec] = std::from_chars(p, stop, id);
      ORPHEUS_CHECK_INPUT(ec == std::errc() && id >= 0 && id < vocabulary && (next == stop || *next == ' ' ||
                                                                                *next == '\r' || *next == '\t'),
                          "{}:{}: '{}' is not a token id below the vocabulary size {}", path,
                          options.rank > 0 ? fileLineAt(path, lineStart) : lineNo,
                          std::string(p, static_cast<size_t>(std::find(p, stop, ' ') - p)), vocabulary);
      tokens.push_back(static_cast<int32_t>(id));
      p = next;
    }
    pos = in.tellg() < 0 ? size : static_cast<int64_t>(in.tellg());
  }

  return tokens;
}

// The tokens as `steps`-step segments of parallel streams (see the top of this file).
Dataset segmentsOf(const std::vector<int32_t>& tokens, const std::string& path, const ReadOptions& options,
                   int64_t steps, int64_t vocabulary) {
  const auto n = static_cast<int64_t>(tokens.size());
  ORPHEUS_CHECK_INPUT(n > 0 || options.worldSize == 1,
                      "{}: rank {} of {} got no tokens: a token stream is split between ranks at line ends, so "
                      "each rank needs lines of its own (break the stream into lines, or use fewer ranks)",
                      path, options.rank, options.worldSize);
  int64_t streams = options.streams;
  if (streams <= 0) streams = std::clamp<int64_t>(n / (steps + 1), 1, kDefaultStreams);
  const int64_t perStream = n / streams;
  const int64_t segments = perStream > 0 ? (perStream - 1) / steps : 0;
  ORPHEUS_CHECK_INPUT(segments > 0,
                      "{}: rank {}'s part holds {} token{}, too few for {} stream{} of one {}-step segment each "
                      "(use fewer ranks, a smaller --batch or fewer steps)",
                      path, options.rank, n, n == 1 ? "" : "s", streams, streams == 1 ? "" : "s", steps);

  Dataset data;
  data.source = path;
  data.features = ops::segmentRows(steps);
  data.vocabulary = vocabulary;
  data.steps = steps;
  data.streams = streams;
  const int64_t examples = segments * streams;
  data.dense.resize(data.features, examples);
  data.labels.resize(static_cast<size_t>(examples));
  for (int64_t s = 0; s < segments; ++s) {
    for (int64_t b = 0; b < streams; ++b) {
      const int64_t j = s * streams + b;
      const int64_t first = b * perStream + s * steps;
      data.dense(ops::kSegmentStreamRow, j) = static_cast<float>(b);
      data.dense(ops::kSegmentIndexRow, j) = static_cast<float>(s);
      for (int64_t t = 0; t <= steps; ++t) {
        data.dense(ops::kSegmentTokenRow + t, j) = static_cast<float>(tokens[static_cast<size_t>(first + t)]);
      }
      // Any valid class id; the targets are the segment's tokens 1..T.
      data.labels[static_cast<size_t>(j)] = tokens[static_cast<size_t>(first + steps)];
    }
  }
  data.globalOffset = options.worldSize > 1 ? -1 : 0;
  data.globalSize = options.worldSize > 1 ? -1 : examples;
  return data;
}

}  // namespace

bool hasTokenHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[kMagic.size()] = {};
  in.read(head, static_cast<std::streamsize>(kMagic.size()));
  return in.gcount() == static_cast<std::streamsize>(kMagic.size()) &&
         std::string_view(head, kMagic.size()) == kMagic;
}

namespace detail {

Dataset readTokens(const std::string& path, const ReadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throwFileError(path, "cannot open", errno);
  std::string header;
  std::getline(in, header);
  if (!header.empty() && header.back() == '\r') header.pop_back();  // CRLF line ends (the lines' \r is whitespace)
  ORPHEUS_CHECK_INPUT(header.rfind(kMagic, 0) == 0, "{}:1: not a token stream (expected '{}')", path, kMagic);
  checkHeaderFields(header, path);
  const int64_t vocabulary = headerValue(header, "vocabulary", path);
  ORPHEUS_CHECK_INPUT(vocabulary > 0 && vocabulary < (int64_t{1} << 24),
                      "{}:1: the header needs vocabulary=V (1 <= V < 2^24, ids exact as floats)", path);
  const int64_t steps = options.steps > 0 ? options.steps : headerValue(header, "steps", path);
  ORPHEUS_CHECK_INPUT(steps > 0 && steps <= kMaxSteps, "{}:1: the header needs steps=T (1 <= T <= {})", path,
                      kMaxSteps);

  const std::vector<int32_t> tokens = readRankTokens(in, path, options, vocabulary);
  return segmentsOf(tokens, path, options, steps, vocabulary);
}

}  // namespace detail
}  // namespace orpheus::data
