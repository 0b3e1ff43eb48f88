// Token streams: a rank's part of the file, its parallel streams and segments, the
// in-order sampler that hands every stream's next segment to the same column.
#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "engine/data/sampler.h"
#include "ops/sequence_layout.h"
#include "tests/support/temp_dir.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <set>

using namespace orpheus;
using namespace orpheus::data;

namespace {

// 20 lines of 5 ids each: id i at position i (mod 50).
std::string writeStream(const testing::TempDir& dir, const std::string& header) {
  const std::string path = dir / "s.tokens";
  std::ofstream out(path);
  out << header << "\n";
  for (int line = 0; line < 20; ++line) {
    for (int k = 0; k < 5; ++k) out << (line * 5 + k) % 50 << (k == 4 ? "\n" : " ");
  }
  return path;
}

}  // namespace

TEST_CASE("a token stream is cut into parallel streams of segments", "[data][tokens]") {
  testing::TempDir dir("tokens");
  const std::string path = writeStream(dir, "#orpheus-tokens vocabulary=50 steps=4");
  CHECK(resolveFormat(path, Format::kAuto) == Format::kTokens);
  ReadOptions options;
  options.streams = 3;
  const Dataset d = readDataset(path, options);
  // 100 tokens, 3 streams of 33, (33 - 1) / 4 = 8 segments each.
  REQUIRE(d.size() == 24);
  CHECK(d.features == ops::segmentRows(4));
  CHECK(d.steps == 4);
  CHECK(d.vocabulary == 50);
  CHECK(d.maxLabel() == 49);
  for (int64_t s = 0; s < 8; ++s) {
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t j = s * 3 + b;
      CHECK(d.dense(ops::kSegmentStreamRow, j) == b);
      CHECK(d.dense(ops::kSegmentIndexRow, j) == s);
      for (int64_t t = 0; t <= 4; ++t) CHECK(d.dense(ops::kSegmentTokenRow + t, j) == (b * 33 + s * 4 + t) % 50);
    }
  }
  SECTION("the header's fields may be split by tabs") {
    const std::string tabbed = writeStream(dir, "#orpheus-tokens vocabulary=50\tsteps=4");
    ReadOptions one;
    one.streams = 3;
    const Dataset t = readDataset(tabbed, one);
    CHECK(t.steps == 4);
    CHECK(t.vocabulary == 50);
    CHECK(t.dense == d.dense);
  }
  SECTION("the in-order sampler hands column b stream b's next segment") {
    MinibatchSampler sampler(d.size(), 3, 1, 0, MinibatchSampler::Order::kInOrder);
    for (int64_t k = 0; k < 10; ++k) {
      const std::vector<int64_t> batch = sampler.next();
      for (int64_t b = 0; b < 3; ++b) CHECK(batch[static_cast<size_t>(b)] == (k % 8) * 3 + b);
    }
  }
}

TEST_CASE("ranks read disjoint parts that cover the stream", "[data][tokens]") {
  testing::TempDir dir("tokens");
  const std::string path = writeStream(dir, "#orpheus-tokens vocabulary=50 steps=2");
  std::set<std::pair<float, float>> firstTokens;
  int64_t tokens = 0;
  for (int rank = 0; rank < 3; ++rank) {
    ReadOptions options;
    options.rank = rank;
    options.worldSize = 3;
    options.streams = 1;
    const Dataset d = readDataset(path, options);
    CHECK(d.globalSize == -1);
    tokens += d.size() * 2 + 1;
    // Each rank's stream starts at a line's first token: a multiple of 5.
    CHECK(static_cast<int>(d.dense(ops::kSegmentTokenRow, 0)) % 5 == 0);
  }
  CHECK(tokens <= 100);
  CHECK(tokens >= 100 - 3 * 2);
}

TEST_CASE("bad token streams are refused with the file and line", "[data][tokens]") {
  testing::TempDir dir("tokens");
  ReadOptions options;
  options.format = Format::kTokens;
  {
    const std::string path = writeStream(dir, "#orpheus-tokens vocabulary=40 steps=4");
    CHECK_THROWS_WITH(readDataset(path, options), Catch::Contains("s.tokens:10: '40' is not a token id below"));
  }
  {
    const std::string path = writeStream(dir, "#orpheus-tokens steps=4");
    CHECK_THROWS_WITH(readDataset(path, options), Catch::Contains("the header needs vocabulary=V"));
  }
  {
    const std::string path = writeStream(dir, "#orpheus-tokens vocabulary=50 step=4");
    CHECK_THROWS_WITH(readDataset(path, options), Catch::Contains("s.tokens:1: unknown header field 'step=4'"));
  }
  {
    const std::string path = writeStream(dir, "#orpheus-tokens vocabulary=50 steps=4 vocabulary=60");
    CHECK_THROWS_WITH(readDataset(path, options), Catch::Contains("s.tokens:1: the header gives 'vocabulary' twice"));
  }
  {
    // A NUL among a line's bytes: the message goes on past it, as \x00.
    const std::string path = writeStream(dir, "#orpheus-tokens vocabulary=50 steps=4");
    {
      std::ofstream out(path, std::ios::app | std::ios::binary);
      out << std::string("1 2\0x 3\n", 8);
    }
    CHECK_THROWS_WITH(readDataset(path, options), Catch::Contains("'2\\x00x' is not a token id below the vocabulary size 50"));
  }
  {
    const std::string path = writeStream(dir, "#orpheus-tokens vocabulary=50 steps=4");
    options.streams = 40;
    CHECK_THROWS_WITH(readDataset(path, options), Catch::Contains("too few for 40 streams"));
  }
}
