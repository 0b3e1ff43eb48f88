#include "engine/base/error.h"
#include "engine/data/dataset.h"
#include "engine/data/sampler.h"

#include <catch2/catch.hpp>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace orpheus;
using namespace orpheus::data;
using Catch::Matchers::Contains;

namespace {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      path_ = fs::temp_directory_path() /
              ("orpheus-data-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
      if (fs::create_directory(path_)) break;
      REQUIRE(attempt < 100);
    }
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void writeFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  REQUIRE(out.good());
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void putBigEndian(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

void writeMaybeGzip(const std::string& path, const std::string& bytes, bool gzip) {
  if (!gzip) {
    writeFile(path, bytes);
    return;
  }
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// Writes `dir/<prefix>-images-idx3-ubyte[.gz]` and its labels file; returns the images path.
std::string writeIdx(const TempDir& dir, const std::string& prefix, int rows, int cols,
                     const std::vector<uint8_t>& pixels, const std::vector<uint8_t>& labels, bool gzip) {
  const std::string ext = gzip ? ".gz" : "";
  std::string images;
  putBigEndian(images, 0x00000803);
  putBigEndian(images, static_cast<uint32_t>(labels.size()));
  putBigEndian(images, static_cast<uint32_t>(rows));
  putBigEndian(images, static_cast<uint32_t>(cols));
  images.append(pixels.begin(), pixels.end());
  std::string labelBytes;
  putBigEndian(labelBytes, 0x00000801);
  putBigEndian(labelBytes, static_cast<uint32_t>(labels.size()));
  labelBytes.append(labels.begin(), labels.end());
  const std::string imagesPath = dir.file(prefix + "-images-idx3-ubyte" + ext);
  writeMaybeGzip(imagesPath, images, gzip);
  writeMaybeGzip(dir.file(prefix + "-labels-idx1-ubyte" + ext), labelBytes, gzip);
  return imagesPath;
}

ReadOptions shard(int rank, int worldSize, Format format = Format::kAuto) {
  ReadOptions o;
  o.format = format;
  o.rank = rank;
  o.worldSize = worldSize;
  return o;
}

// The message of the InputError `f` throws; fails the test if it throws nothing.
template <typename F>
std::string inputErrorOf(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("expected an InputError");
  return {};
}

Matrix toDense(const SparseMatrix& m) { return Matrix(m); }

std::string fashionDir() {
  const char* env = std::getenv("FASHION_MNIST");
  return env != nullptr ? env : "/usr/share/datasets/fashion-mnist";
}

}  // namespace

TEST_CASE("format names and detection", "[data]") {
  CHECK(parseFormat("auto") == Format::kAuto);
  CHECK(parseFormat("idx") == Format::kIdx);
  CHECK(parseFormat("libsvm") == Format::kLibsvm);
  CHECK(parseFormat("csv") == Format::kCsv);
  const std::string msg = inputErrorOf([] { parseFormat("parquet"); });
  CHECK_THAT(msg, Contains("parquet") && Contains("auto, idx, libsvm, csv"));

  CHECK(resolveFormat("/d/train-images-idx3-ubyte.gz", Format::kAuto) == Format::kIdx);
  CHECK(resolveFormat("/d/train.csv", Format::kAuto) == Format::kCsv);
  CHECK(resolveFormat("/d/TRAIN.CSV", Format::kAuto) == Format::kCsv);
  CHECK(resolveFormat("/d/a9a.t", Format::kAuto) == Format::kLibsvm);
  CHECK(resolveFormat("/idx/train.csv", Format::kAuto) == Format::kCsv);
  CHECK(resolveFormat("/d/train.csv", Format::kLibsvm) == Format::kLibsvm);
  CHECK(detectIndexBase("/d/train.csv", Format::kAuto) == -1);
}

TEST_CASE("IDX on Fashion-MNIST", "[data][idx]") {
  const std::string dir = fashionDir();
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz")) {
    WARN("Fashion-MNIST not found in " << dir << "; skipping");
    return;
  }
  const Dataset train = readDataset(dir + "/train-images-idx3-ubyte.gz", {});
  CHECK(train.features == 784);
  CHECK(!train.sparse);
  CHECK(train.size() == 60000);
  CHECK(train.dense.rows() == 784);
  CHECK(train.dense.cols() == 60000);
  CHECK(train.globalOffset == 0);
  CHECK(train.globalSize == 60000);
  CHECK(train.maxLabel() == 9);
  CHECK(*std::min_element(train.labels.begin(), train.labels.end()) == 0);
  CHECK(train.dense.minCoeff() == 0.0f);
  CHECK(train.dense.maxCoeff() == 1.0f);

  const std::string test = dir + "/t10k-images-idx3-ubyte.gz";
  const Dataset whole = readDataset(test, {});
  REQUIRE(whole.size() == 10000);
  int64_t offset = 0;
  for (int r = 0; r < 4; ++r) {
    const Dataset part = readDataset(test, shard(r, 4));
    CHECK(part.globalOffset == offset);
    CHECK(part.globalSize == 10000);
    REQUIRE(part.size() == 2500);
    CHECK(part.dense == whole.dense.middleCols(offset, part.size()));
    CHECK(std::equal(part.labels.begin(), part.labels.end(), whole.labels.begin() + offset));
    offset += part.size();
  }
  CHECK(offset == whole.size());
}

TEST_CASE("IDX synthetic round trip, raw and gzip", "[data][idx]") {
  TempDir dir;
  const int rows = 3, cols = 2, n = 7;
  std::vector<uint8_t> pixels(rows * cols * n);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 37) % 256);
  pixels[0] = 255;
  std::vector<uint8_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 3);

  for (bool gzip : {false, true}) {
    const std::string path = writeIdx(dir, gzip ? "gz" : "raw", rows, cols, pixels, labels, gzip);
    for (int world = 1; world <= n; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const Dataset d = readDataset(path, shard(r, world));
        CHECK(d.features == rows * cols);
        CHECK(d.globalOffset == next);
        CHECK(d.globalSize == n);
        CHECK(d.globalOffset == int64_t{n} * r / world);
        for (int64_t j = 0; j < d.size(); ++j) {
          const int64_t example = d.globalOffset + j;
          CHECK(d.labels[j] == labels[example]);
          for (int k = 0; k < rows * cols; ++k) {
            CHECK(d.dense(k, j) == static_cast<float>(pixels[example * rows * cols + k]) / 255.0f);
          }
        }
        next += d.size();
      }
      CHECK(next == n);
    }
    CHECK(readDataset(path, {}).dense(0, 0) == 1.0f);
    // More ranks than examples leaves a shard empty.
    CHECK_THAT(inputErrorOf([&] { readDataset(path, shard(0, n + 1)); }), Contains("empty"));
  }
}

TEST_CASE("IDX errors", "[data][idx]") {
  TempDir dir;
  const int n = 5;
  std::vector<uint8_t> pixels(4 * n, 9);
  std::vector<uint8_t> labels(n, 1);

  SECTION("truncated raw images file") {
    const std::string path = writeIdx(dir, "t", 2, 2, pixels, labels, false);
    std::string bytes = readFile(path);
    writeFile(path, bytes.substr(0, bytes.size() - 3));
    for (int r = 0; r < 2; ++r) {
      CHECK_THAT(inputErrorOf([&] { readDataset(path, shard(r, 2)); }),
                 Contains(path) && Contains("truncated"));
    }
  }
  SECTION("truncated gzip images file") {
    // Large enough that the gzip stream ends in the middle of the pixel data.
    std::vector<uint8_t> noise(28 * 28 * 50);
    std::mt19937 gen(3);
    for (auto& b : noise) b = static_cast<uint8_t>(gen());
    const std::string path = writeIdx(dir, "z", 28, 28, noise, std::vector<uint8_t>(50, 2), true);
    std::string bytes = readFile(path);
    writeFile(path, bytes.substr(0, bytes.size() / 2));
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }), Contains(path));
  }
  SECTION("truncated labels file") {
    const std::string path = writeIdx(dir, "l", 2, 2, pixels, labels, false);
    const std::string labelsPath = dir.file("l-labels-idx1-ubyte");
    std::string bytes = readFile(labelsPath);
    writeFile(labelsPath, bytes.substr(0, bytes.size() - 1));
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
               Contains(labelsPath) && Contains("truncated"));
  }
  SECTION("label count differs from image count") {
    const std::string path = writeIdx(dir, "c", 2, 2, pixels, labels, false);
    writeIdx(dir, "c2", 2, 2, std::vector<uint8_t>(4 * (n - 1)), std::vector<uint8_t>(n - 1), false);
    fs::copy_file(dir.file("c2-labels-idx1-ubyte"), dir.file("c-labels-idx1-ubyte"),
                  fs::copy_options::overwrite_existing);
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }), Contains("4 labels for the 5 images"));
  }
  SECTION("bad magic") {
    const std::string path = writeIdx(dir, "m", 2, 2, pixels, labels, false);
    std::string bytes = readFile(path);
    bytes[3] = 0x01;
    writeFile(path, bytes);
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }), Contains(path) && Contains("magic"));
  }
  SECTION("missing labels file") {
    const std::string path = writeIdx(dir, "x", 2, 2, pixels, labels, false);
    fs::remove(dir.file("x-labels-idx1-ubyte"));
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
               Contains("x-labels-idx1-ubyte") && Contains("No such file"));
  }
  SECTION("missing file") {
    const std::string path = dir.file("nope-images-idx3-ubyte.gz");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
               Contains(path) && Contains("No such file or directory"));
  }
}

TEST_CASE("LIBSVM index base, width and values", "[data][libsvm]") {
  TempDir dir;
  SECTION("0-based") {
    const std::string path = dir.file("zero.svm");
    writeFile(path, "# a comment line\n1 0:0.5 3:2\n\n0 2:-1.5e1   # trailing comment\n2\n");
    CHECK(detectIndexBase(path, Format::kAuto) == 0);
    const Dataset d = readDataset(path, {});
    CHECK(d.sparse);
    CHECK(d.features == 4);
    CHECK(d.size() == 3);
    CHECK(d.labels == std::vector<int32_t>{1, 0, 2});
    CHECK(d.globalOffset == 0);
    CHECK(d.globalSize == 3);
    Matrix expected = Matrix::Zero(4, 3);
    expected(0, 0) = 0.5f;
    expected(3, 0) = 2.0f;
    expected(2, 1) = -15.0f;
    CHECK(toDense(d.sparseX) == expected);
    CHECK(d.sparseX.nonZeros() == 3);
  }
  SECTION("1-based, CRLF, integral float and '+' labels, qid") {
    const std::string path = dir.file("one.svm");
    writeFile(path, "+1 qid:3 1:1 5:+2\r\n2.0 2:3\r\n");
    CHECK(detectIndexBase(path, Format::kLibsvm) == 1);
    const Dataset d = readDataset(path, {});
    CHECK(d.features == 5);
    CHECK(d.labels == std::vector<int32_t>{1, 2});
    Matrix expected = Matrix::Zero(5, 2);
    expected(0, 0) = 1;
    expected(4, 0) = 2;
    expected(1, 1) = 3;
    CHECK(toDense(d.sparseX) == expected);

    ReadOptions zeroBased;
    zeroBased.indexBase = 0;
    CHECK(readDataset(path, zeroBased).features == 6);
  }
  SECTION("explicit width, and widen") {
    const std::string path = dir.file("w.svm");
    writeFile(path, "0 1:1\n1 4:1\n");
    ReadOptions o;
    o.features = 10;
    Dataset d = readDataset(path, o);
    CHECK(d.features == 10);
    CHECK(d.sparseX.rows() == 10);
    widen(d, 12);
    CHECK(d.features == 12);
    CHECK(d.sparseX.rows() == 12);
    CHECK(d.sparseX.coeff(3, 1) == 1.0f);
    CHECK_THAT(inputErrorOf([&] { widen(d, 11); }), Contains("12 features"));

    o.features = 3;
    CHECK_THAT(inputErrorOf([&] { readDataset(path, o); }),
               Contains(path + ":2:") && Contains("index 4") && Contains("width of 3"));
  }
  SECTION("index 0 in a file read as 1-based") {
    const std::string path = dir.file("b.svm");
    writeFile(path, "0 1:1\n1 0:1\n");
    ReadOptions o;
    o.indexBase = 1;
    CHECK_THAT(inputErrorOf([&] { readDataset(path, o); }), Contains(path + ":2:"));
  }
  SECTION("line errors name file:line") {
    const std::string path = dir.file("e.svm");
    auto errorFor = [&](const std::string& badLine) {
      writeFile(path, "0 1:1\n\n# c\n" + badLine + "\n1 2:2\n");
      return inputErrorOf([&] { readDataset(path, {}); });
    };
    CHECK_THAT(errorFor("-1 1:1"), Contains(path + ":4:") && Contains("labels must be class ids 0..K-1"));
    CHECK_THAT(errorFor("1.5 1:1"), Contains(path + ":4:") && Contains("0..K-1"));
    CHECK_THAT(errorFor("cat 1:1"), Contains(path + ":4:") && Contains("label"));
    CHECK_THAT(errorFor("1 1:1 zzz"), Contains(path + ":4:") && Contains("index:value"));
    CHECK_THAT(errorFor("1 a:1"), Contains(path + ":4:") && Contains("feature index"));
    CHECK_THAT(errorFor("1 1:x"), Contains(path + ":4:") && Contains("expected a number"));
    CHECK_THAT(errorFor("1 3:1 2:1"), Contains(path + ":4:") && Contains("strictly increasing"));
    CHECK_THAT(errorFor("1 3:1 3:1"), Contains(path + ":4:") && Contains("strictly increasing"));
    CHECK_THAT(errorFor("1 3:nan"), Contains(path + ":4: non-finite value"));
    CHECK_THAT(errorFor("1 3:-inf"), Contains(path + ":4: non-finite value"));
    CHECK_THAT(errorFor("1 3:1e60"), Contains(path + ":4: non-finite value"));
    CHECK_THAT(errorFor("nan 3:1"), Contains(path + ":4: non-finite value"));
  }
  SECTION("malformed line in a later shard reports its true line number") {
    const std::string path = dir.file("late.svm");
    std::string text;
    for (int i = 1; i <= 100; ++i) text += i == 90 ? "3 5:1 oops\n" : fmt::format("{} 1:{} 7:2\n", i % 4, i);
    writeFile(path, text);
    CHECK_NOTHROW(readDataset(path, shard(0, 4)));
    CHECK_THAT(inputErrorOf([&] { readDataset(path, shard(3, 4)); }), Contains(path + ":90:"));
  }
  SECTION("underflow rounds to zero") {
    const std::string path = dir.file("u.svm");
    writeFile(path, "0 1:1e-60\n");
    const Dataset d = readDataset(path, {});
    CHECK(d.sparseX.coeff(0, 0) == 0.0f);
  }
  SECTION("missing file and empty shard") {
    const std::string missing = dir.file("missing.svm");
    CHECK_THAT(inputErrorOf([&] { readDataset(missing, {}); }),
               Contains(missing) && Contains("No such file or directory"));
    const std::string path = dir.file("small.svm");
    writeFile(path, "0 1:1\n1 1:2\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, shard(4, 5)); }), Contains("empty"));
    writeFile(path, "# only a comment\n\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }), Contains("empty"));
  }
}

TEST_CASE("CSV", "[data][csv]") {
  TempDir dir;
  const std::string path = dir.file("d.csv");
  SECTION("round trip") {
    writeFile(path, "1, 0.5, -2\n\n0,3e2,4\r\n2 , 7 ,8");
    const Dataset d = readDataset(path, {});
    CHECK(!d.sparse);
    CHECK(d.features == 2);
    CHECK(d.labels == std::vector<int32_t>{1, 0, 2});
    Matrix expected(2, 3);
    expected << 0.5f, 300.0f, 7.0f, -2.0f, 4.0f, 8.0f;
    CHECK(d.dense == expected);
    Dataset wide = d;
    widen(wide, 4);
    CHECK(wide.dense.rows() == 4);
    CHECK(wide.dense.topRows(2) == expected);
    CHECK(wide.dense.bottomRows(2).isZero());
  }
  SECTION("ragged rows") {
    writeFile(path, "1,2,3\n1,2\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
               Contains(path + ":2:") && Contains("1 features") && Contains("2 are"));
    writeFile(path, "1,2,3\n0,1,2\n1,2,3,4\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
               Contains(path + ":3:") && Contains("3 features") && Contains("2 are"));
    ReadOptions o;
    o.features = 3;
    CHECK_THAT(inputErrorOf([&] { readDataset(path, o); }),
               Contains(path + ":1:") && Contains("2 features") && Contains("3 were expected"));
  }
  SECTION("header line") {
    writeFile(path, "label,a,b\n1,2,3\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
               Contains(path + ":1:") && Contains("header"));
    writeFile(path, "1,2,3\n1,x,3\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
               Contains(path + ":2:") && Contains("field 2") && Contains("'x'"));
  }
  SECTION("non-finite and bad labels") {
    writeFile(path, "1,2,3\n1,NaN,3\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }), Contains(path + ":2: non-finite value"));
    writeFile(path, "1,2,3\n1,2,inf\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }), Contains(path + ":2: non-finite value"));
    writeFile(path, "1,2,3\n-2,2,3\n");
    CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }), Contains(path + ":2:") && Contains("0..K-1"));
  }
}

TEST_CASE("text shards partition the lines", "[data][shard]") {
  TempDir dir;
  std::mt19937 gen(7);
  const int lines = 97;
  std::string svm, csv;
  std::vector<int32_t> expected;
  for (int i = 0; i < lines; ++i) {
    // Varied line lengths, blank lines and a missing final newline put the byte
    // boundaries everywhere: mid-line, on a '\n' and on a line start.
    if (i % 11 == 5) {
      svm += "\n";
      csv += "\n";
    }
    const int len = static_cast<int>(gen() % 5);
    svm += std::to_string(i);
    for (int k = 0; k < len; ++k) svm += fmt::format(" {}:{}", k + 1, i);
    csv += fmt::format("{},{},{}", i, std::string(1 + gen() % 6, '1'), i);
    if (i + 1 < lines) {
      svm += "\n";
      csv += "\n";
    }
    expected.push_back(i);
  }
  const std::string svmPath = dir.file("s.svm");
  const std::string csvPath = dir.file("s.csv");
  writeFile(svmPath, svm);
  writeFile(csvPath, csv);
  for (const std::string& path : {svmPath, csvPath}) {
    for (int world = 1; world <= 5; ++world) {
      std::vector<int32_t> all;
      for (int r = 0; r < world; ++r) {
        const Dataset d = readDataset(path, shard(r, world));
        CHECK(d.globalSize == (world == 1 ? lines : -1));
        all.insert(all.end(), d.labels.begin(), d.labels.end());
      }
      INFO(path << " world " << world);
      CHECK(all == expected);
    }
  }
  // Every split point of a tiny file.
  const std::string tiny = dir.file("tiny.svm");
  writeFile(tiny, "0\n1\n\n2\n3");
  for (int world = 1; world <= 4; ++world) {
    std::vector<int32_t> all;
    for (int r = 0; r < world; ++r) {
      const Dataset d = readDataset(tiny, shard(r, world));
      all.insert(all.end(), d.labels.begin(), d.labels.end());
    }
    CHECK(all == std::vector<int32_t>{0, 1, 2, 3});
  }
}

TEST_CASE("gather and slice", "[data][batch]") {
  Dataset dense;
  dense.source = "dense";
  dense.features = 3;
  dense.dense = Matrix::Random(3, 6);
  dense.labels = {0, 1, 2, 3, 4, 5};

  Dataset sparse;
  sparse.source = "sparse";
  sparse.sparse = true;
  sparse.features = 4;
  Matrix denseOfSparse = Matrix::Zero(4, 6);
  denseOfSparse(0, 0) = 1;
  denseOfSparse(3, 0) = 2;
  denseOfSparse(1, 2) = 3;
  denseOfSparse(2, 3) = 4;
  denseOfSparse(3, 3) = 5;
  denseOfSparse(0, 5) = 6;
  sparse.sparseX = denseOfSparse.sparseView();
  sparse.labels = {5, 4, 3, 2, 1, 0};

  const std::vector<int64_t> idx{3, 0, 5, 3};
  const Batch db = gather(dense, idx);
  REQUIRE(db.size() == 4);
  CHECK(!db.sparse);
  for (int j = 0; j < 4; ++j) {
    CHECK(db.dense.col(j) == dense.dense.col(idx[j]));
    CHECK(db.labels[j] == dense.labels[idx[j]]);
  }
  const Batch sb = gather(sparse, idx);
  REQUIRE(sb.size() == 4);
  CHECK(sb.sparse);
  CHECK(sb.sparseX.rows() == 4);
  CHECK(sb.sparseX.nonZeros() == 2 + 2 + 1 + 2);
  const Matrix sbDense = toDense(sb.sparseX);
  for (int j = 0; j < 4; ++j) {
    CHECK(sbDense.col(j) == denseOfSparse.col(idx[j]));
    CHECK(sb.labels[j] == sparse.labels[idx[j]]);
  }
  CHECK(gather(sparse, {}).size() == 0);

  const Batch ds = slice(dense, 2, 5);
  CHECK(ds.dense == dense.dense.middleCols(2, 3));
  CHECK(ds.labels == Eigen::Vector3i(2, 3, 4));
  const Batch ss = slice(sparse, 1, 4);
  CHECK(ss.sparse);
  CHECK(toDense(ss.sparseX) == denseOfSparse.middleCols(1, 3));
  CHECK(ss.labels == Eigen::Vector3i(4, 3, 2));
  CHECK(slice(sparse, 2, 2).size() == 0);
}

TEST_CASE("minibatch sampler", "[data][sampler]") {
  for (int64_t shardSize : {10, 7, 1}) {
    for (int64_t batchSize : {3, 4, 7, 1}) {
      if (batchSize > shardSize) continue;
      MinibatchSampler a(shardSize, batchSize, 42, 1);
      MinibatchSampler b(shardSize, batchSize, 42, 1);
      // Draw a whole number of epochs' worth of indices.
      const int64_t draws = shardSize * batchSize * 3;
      std::vector<int64_t> all;
      for (int64_t i = 0; i < draws / batchSize; ++i) {
        const auto x = a.next();
        REQUIRE(x == b.next());
        REQUIRE(static_cast<int64_t>(x.size()) == batchSize);
        CHECK(std::set<int64_t>(x.begin(), x.end()).size() == x.size());
        all.insert(all.end(), x.begin(), x.end());
      }
      CHECK(a.epoch() == batchSize * 3 - 1);
      for (int64_t e = 0; e * shardSize < static_cast<int64_t>(all.size()); ++e) {
        std::vector<int64_t> epoch(all.begin() + e * shardSize, all.begin() + (e + 1) * shardSize);
        std::sort(epoch.begin(), epoch.end());
        std::vector<int64_t> iota(shardSize);
        std::iota(iota.begin(), iota.end(), 0);
        INFO("shard " << shardSize << " batch " << batchSize << " epoch " << e);
        CHECK(epoch == iota);
      }
    }
  }
  MinibatchSampler seed1(100, 10, 1, 0), seed2(100, 10, 2, 0), rank1(100, 10, 1, 1);
  const auto s1 = seed1.next();
  CHECK(s1 != seed2.next());
  CHECK(s1 != rank1.next());
  // Larger than the shard: every batch is full even though indices repeat.
  MinibatchSampler big(3, 8, 5, 0);
  CHECK(big.next().size() == 8);
  CHECK_THROWS_AS(MinibatchSampler(10, 0, 1, 0), InputError);
}

TEST_CASE("prefetch queue", "[data][prefetch]") {
  Dataset data;
  data.source = "prefetch";
  data.features = 5;
  data.dense = Matrix::Random(5, 50);
  data.labels.resize(50);
  std::iota(data.labels.begin(), data.labels.end(), 0);

  SECTION("same batches as a direct gather") {
    MinibatchSampler direct(50, 8, 9, 2);
    PrefetchQueue queue(data, MinibatchSampler(50, 8, 9, 2), 3);
    for (int i = 0; i < 40; ++i) {
      const Batch expected = gather(data, direct.next());
      const Batch got = queue.next();
      REQUIRE(got.labels == expected.labels);
      REQUIRE(got.dense == expected.dense);
    }
  }
  SECTION("destroying it early does not hang") {
    for (int consumed = 0; consumed < 4; ++consumed) {
      PrefetchQueue queue(data, MinibatchSampler(50, 8, 9, 0), 2);
      for (int i = 0; i < consumed; ++i) queue.next();
      if (consumed == 3) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  SECTION("an error in the thread reaches next()") {
    Dataset broken = data;
    broken.labels.push_back(50);  // 51 labels for 50 columns
    PrefetchQueue queue(broken, MinibatchSampler(51, 8, 9, 0), 2);
    CHECK_THROWS_AS(queue.next(), Error);
    CHECK_THROWS_AS(queue.next(), Error);
  }
  SECTION("a slow batch times out") {
    Dataset big;
    big.source = "big";
    big.features = 1000;
    big.dense = Matrix::Zero(1000, 10000);
    big.labels.assign(10000, 0);
    // Gathering 40 MB takes far longer than a zero wait.
    PrefetchQueue queue(big, MinibatchSampler(10000, 10000, 1, 0), 1, std::chrono::milliseconds(0));
    CHECK_THROWS_AS(queue.next(), TimeoutError);
  }
}

TEST_CASE("auto format detection looks at the name's ending and the IDX magic", "[data]") {
  // Names that merely contain "idx" are not IDX.
  CHECK(resolveFormat("/d/idx_features.libsvm", Format::kAuto) == Format::kLibsvm);
  CHECK(resolveFormat("/d/rapidxml.txt", Format::kAuto) == Format::kLibsvm);
  CHECK(resolveFormat("/d/idx-train.csv", Format::kAuto) == Format::kCsv);
  // The MNIST family's names, with either separator, raw or gzipped.
  CHECK(resolveFormat("/d/t10k-images-idx3-ubyte", Format::kAuto) == Format::kIdx);
  CHECK(resolveFormat("/d/t10k-images.idx3-ubyte", Format::kAuto) == Format::kIdx);
  CHECK(resolveFormat("/d/t10k-labels-idx1-ubyte.gz", Format::kAuto) == Format::kIdx);
  CHECK(resolveFormat("/d/TRAIN-IMAGES-IDX3-UBYTE.GZ", Format::kAuto) == Format::kIdx);

  // Any name, when the content starts with the IDX magic (raw or gzipped).
  TempDir dir;
  std::string images;
  putBigEndian(images, 0x00000803);
  putBigEndian(images, 1);
  const std::string raw = dir.file("digits.bin");
  const std::string gz = dir.file("digits.bin.gz");
  writeMaybeGzip(raw, images, false);
  writeMaybeGzip(gz, images, true);
  CHECK(resolveFormat(raw, Format::kAuto) == Format::kIdx);
  CHECK(resolveFormat(gz, Format::kAuto) == Format::kIdx);
  const std::string text = dir.file("idx.data");
  writeFile(text, "1 1:0.5\n");
  CHECK(resolveFormat(text, Format::kAuto) == Format::kLibsvm);
}

TEST_CASE("an IDX header promising more than memory holds is refused before allocating", "[data][idx]") {
  TempDir dir;
  std::string images;
  putBigEndian(images, 0x00000803);
  putBigEndian(images, 0x7fffffff);
  putBigEndian(images, 28);
  putBigEndian(images, 28);
  std::string labels;
  putBigEndian(labels, 0x00000801);
  putBigEndian(labels, 0x7fffffff);
  const std::string path = dir.file("huge-images-idx3-ubyte.gz");
  writeMaybeGzip(path, images, true);
  writeMaybeGzip(dir.file("huge-labels-idx1-ubyte.gz"), labels, true);
  CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
             Contains(path) && Contains("2147483647 images of 28x28") && Contains("needs 6.1 TiB") &&
                 Contains("memory"));
}

TEST_CASE("a huge sparse LIBSVM index is read as sparse data", "[data][libsvm]") {
  // The reader keeps only the nonzeros; whether a dense model of that width fits
  // is the model's check.
  TempDir dir;
  const std::string path = dir.file("huge.libsvm");
  writeFile(path, "0 1:1 2147483647:2\n1 3:1\n");
  const Dataset d = readDataset(path, {});
  CHECK(d.features == 2147483647);
  CHECK(d.sparseX.nonZeros() == 3);
}

TEST_CASE("a gzip IDX header promising more than the file can inflate to is refused before allocating", "[data][idx]") {
  // A million 28x28 images (3 GiB as floats) would fit in memory, but a gzip file
  // of a few dozen bytes cannot hold them: deflate expands at most 1032:1.
  TempDir dir;
  std::string images;
  putBigEndian(images, 0x00000803);
  putBigEndian(images, 1000000);
  putBigEndian(images, 28);
  putBigEndian(images, 28);
  std::string labels;
  putBigEndian(labels, 0x00000801);
  putBigEndian(labels, 1000000);
  const std::string path = dir.file("big-images-idx3-ubyte.gz");
  writeMaybeGzip(path, images, true);
  writeMaybeGzip(dir.file("big-labels-idx1-ubyte.gz"), labels, true);
  CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
             Contains(path) && Contains("truncated") && Contains("1000000 images of 28x28") &&
                 Contains("holds at most"));
}

TEST_CASE("IDX image dimensions whose product overflows are refused", "[data][idx]") {
  // 0xffffffff rows and columns: their product wraps to a negative int64.
  TempDir dir;
  std::string images;
  putBigEndian(images, 0x00000803);
  putBigEndian(images, 1);
  putBigEndian(images, 0xffffffff);
  putBigEndian(images, 0xffffffff);
  images.append(64, '\0');
  const std::string path = dir.file("o-images-idx3-ubyte");
  writeFile(path, images);
  CHECK_THAT(inputErrorOf([&] { readDataset(path, {}); }),
             Contains(path) && Contains("bad IDX image dimensions 4294967295x4294967295"));
}

TEST_CASE("LIBSVM examples without any feature gather into an empty sparse batch", "[data][libsvm][batch]") {
  // Found by fuzzing under UBSan: copying zero nonzeros from a matrix that holds
  // none passed null pointers to memcpy.
  TempDir dir;
  const std::string path = dir.file("labels-only.libsvm");
  writeFile(path, "0\n1\n0.0\n");
  const Dataset d = readDataset(path, {});
  REQUIRE(d.size() == 3);
  const Batch b = slice(d, 0, 3);
  CHECK(b.sparseX.nonZeros() == 0);
  CHECK(b.labels(1) == 1);
  const Batch g = gather(d, {2, 0});
  CHECK(g.sparseX.cols() == 2);
}
