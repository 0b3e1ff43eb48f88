#include "engine/data/chunks.h"

#include "engine/base/crc32c.h"
#include "engine/base/error.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>

namespace orpheus::data {
namespace {

// A moved chunk's record: magic, total bytes, chunk, rows, features, sparse flag,
// then the labels (int32 each), then dense values (features x rows, column-major)
// or, sparse, each column's nonzero count, every inner index and every value.
constexpr uint32_t kRowsMagic = 0x4b484f43;  // "COHK"

template <typename T>
void put(std::vector<std::byte>& out, const T* values, size_t count) {
  const size_t at = out.size();
  out.resize(at + count * sizeof(T));
  if (count > 0) std::memcpy(out.data() + at, values, count * sizeof(T));
}

template <typename T>
void put(std::vector<std::byte>& out, T value) {
  put(out, &value, 1);
}

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <typename T>
  void get(T* values, size_t count) {
    ORPHEUS_CHECK_INPUT(count <= (bytes_.size() - pos_) / sizeof(T), "a moved data chunk's record is truncated");
    if (count > 0) std::memcpy(values, bytes_.data() + pos_, count * sizeof(T));
    pos_ += count * sizeof(T);
  }
  template <typename T>
  T get() {
    T v{};
    get(&v, 1);
    return v;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

int64_t columnNonZeros(const SparseMatrix& m, int64_t j) {
  if (m.isCompressed()) return m.outerIndexPtr()[j + 1] - m.outerIndexPtr()[j];
  return m.innerNonZeroPtr()[j];
}

// A sparse dataset from each column's nonzero count, indices and values, compressed.
void fillSparse(Dataset& d, int64_t rows, const std::vector<int32_t>& counts, const std::vector<int32_t>& indices,
                const std::vector<float>& values) {
  SparseMatrix& x = d.sparseX;
  x.resize(d.features, rows);
  x.resizeNonZeros(static_cast<Eigen::Index>(values.size()));
  int64_t pos = 0;
  for (int64_t j = 0; j < rows; ++j) {
    x.outerIndexPtr()[j] = static_cast<int32_t>(pos);
    pos += counts[static_cast<size_t>(j)];
  }
  x.outerIndexPtr()[rows] = static_cast<int32_t>(pos);
  if (!values.empty()) {
    std::memcpy(x.innerIndexPtr(), indices.data(), indices.size() * sizeof(int32_t));
    std::memcpy(x.valuePtr(), values.data(), values.size() * sizeof(float));
  }
}

}  // namespace

ChunkLayout::ChunkLayout(std::span<const int64_t> shardRows, int64_t chunkRows)
    : chunkRows_(chunkRows), shardRows_(shardRows.begin(), shardRows.end()) {
  ORPHEUS_CHECK_INPUT(chunkRows >= 1, "--chunk-rows {} must be >= 1", chunkRows);
  ORPHEUS_ENFORCE(!shardRows.empty(), "a chunk layout of no ranks");
  for (const int64_t n : shardRows) {
    ORPHEUS_ENFORCE(n >= 1, "a shard of {} rows", n);
    firstChunk_.push_back(firstChunk_.back() + (n + chunkRows - 1) / chunkRows);
    totalRows_ += n;
  }
}

int ChunkLayout::origin(int64_t chunk) const {
  ORPHEUS_ENFORCE(chunk >= 0 && chunk < chunks(), "chunk {} of {}", chunk, chunks());
  const auto it = std::upper_bound(firstChunk_.begin(), firstChunk_.end(), chunk);
  return static_cast<int>(it - firstChunk_.begin()) - 1;
}

int64_t ChunkLayout::beginRow(int64_t chunk) const { return (chunk - firstChunk(origin(chunk))) * chunkRows_; }

int64_t ChunkLayout::endRow(int64_t chunk) const {
  const int r = origin(chunk);
  return std::min(shardRows_[static_cast<size_t>(r)], beginRow(chunk) + chunkRows_);
}

ChunkOwnership::ChunkOwnership(const ChunkLayout& layout) : ranks_(layout.ranks()) {
  for (int64_t c = 0; c < layout.chunks(); ++c) {
    origin_.push_back(layout.origin(c));
    rows_.push_back(layout.rows(c));
  }
  owner_ = origin_;
}

void ChunkOwnership::apply(std::span<const ChunkMove> moves) {
  for (const ChunkMove& m : moves) {
    ORPHEUS_ENFORCE(m.chunk >= 0 && m.chunk < static_cast<int64_t>(owner_.size()) && m.to >= 0 && m.to < ranks_,
                    "chunk move {}: {} -> {} is outside {} chunks on {} ranks", m.chunk, m.from, m.to, owner_.size(),
                    ranks_);
    ORPHEUS_ENFORCE(owner_[static_cast<size_t>(m.chunk)] == m.from, "chunk {} moves from rank {}, but rank {} owns it",
                    m.chunk, m.from, owner_[static_cast<size_t>(m.chunk)]);
    owner_[static_cast<size_t>(m.chunk)] = m.to;
  }
}

std::vector<int64_t> ChunkOwnership::chunksOf(int rank) const {
  std::vector<int64_t> out;
  for (size_t c = 0; c < owner_.size(); ++c) {
    if (owner_[c] == rank) out.push_back(static_cast<int64_t>(c));
  }
  return out;
}

std::vector<int64_t> ChunkOwnership::chunkCounts() const {
  std::vector<int64_t> n(static_cast<size_t>(ranks_), 0);
  for (const int o : owner_) ++n[static_cast<size_t>(o)];
  return n;
}

std::vector<int64_t> ChunkOwnership::rowCounts() const {
  std::vector<int64_t> n(static_cast<size_t>(ranks_), 0);
  for (size_t c = 0; c < owner_.size(); ++c) n[static_cast<size_t>(owner_[c])] += rows_[c];
  return n;
}

bool ChunkOwnership::moved() const { return owner_ != origin_; }

std::string ChunkOwnership::digest() const {
  std::vector<int32_t> owners(owner_.begin(), owner_.end());
  return fmt::format("{}:{:08x}", owners.size(), crc32c(0, owners.data(), owners.size() * sizeof(int32_t)));
}

std::vector<int64_t> batchShares(std::span<const int64_t> rowCounts, int64_t globalBatch) {
  const auto ranks = static_cast<int64_t>(rowCounts.size());
  const int64_t total = std::accumulate(rowCounts.begin(), rowCounts.end(), int64_t{0});
  ORPHEUS_ENFORCE(total > 0 && globalBatch >= ranks && total <= INT64_MAX / globalBatch,
                  "a batch of {} over {} ranks owning {} rows", globalBatch, ranks, total);
  // Integer arithmetic, so every rank gets the same shares: floors of the exact
  // proportions, the rest by largest remainder, then a rank left with none takes
  // one from the largest share.
  std::vector<int64_t> share(rowCounts.size());
  std::vector<std::pair<int64_t, int64_t>> remainders;  // (remainder, rank)
  int64_t given = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t scaled = globalBatch * rowCounts[static_cast<size_t>(r)];
    share[static_cast<size_t>(r)] = scaled / total;
    given += share[static_cast<size_t>(r)];
    remainders.emplace_back(scaled % total, r);
  }
  std::sort(remainders.begin(), remainders.end(),
            [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  for (size_t k = 0; given < globalBatch; ++k, ++given) ++share[static_cast<size_t>(remainders[k].second)];
  for (int64_t& s : share) {
    if (s > 0) continue;
    auto largest = std::max_element(share.begin(), share.end());
    --*largest;
    ++s;
  }
  return share;
}

void encodeRows(const Dataset& shard, int64_t chunk, int64_t begin, int64_t end, std::vector<std::byte>& out) {
  ORPHEUS_ENFORCE(begin >= 0 && begin < end && end <= shard.size(), "rows [{}, {}) of a shard of {}", begin, end,
                  shard.size());
  const size_t start = out.size();
  const int64_t rows = end - begin;
  put(out, kRowsMagic);
  put(out, uint64_t{0});  // the record's length, filled in below
  put(out, chunk);
  put(out, rows);
  put(out, shard.features);
  put(out, static_cast<uint8_t>(shard.sparse ? 1 : 0));
  put(out, shard.labels.data() + begin, static_cast<size_t>(rows));
  if (!shard.sparse) {
    put(out, shard.dense.col(begin).data(), static_cast<size_t>(rows * shard.features));
  } else {
    const SparseMatrix& x = shard.sparseX;
    std::vector<int32_t> counts;
    for (int64_t j = begin; j < end; ++j) counts.push_back(static_cast<int32_t>(columnNonZeros(x, j)));
    put(out, counts.data(), counts.size());
    for (int64_t j = begin; j < end; ++j) {
      put(out, x.innerIndexPtr() + x.outerIndexPtr()[j], static_cast<size_t>(columnNonZeros(x, j)));
    }
    for (int64_t j = begin; j < end; ++j) {
      put(out, x.valuePtr() + x.outerIndexPtr()[j], static_cast<size_t>(columnNonZeros(x, j)));
    }
  }
  const uint64_t length = out.size() - start;
  std::memcpy(out.data() + start + sizeof(kRowsMagic), &length, sizeof length);
}

DecodedRows decodeRows(std::span<const std::byte> record, int64_t features, bool sparse) {
  Reader in(record);
  ORPHEUS_CHECK_INPUT(in.get<uint32_t>() == kRowsMagic, "a moved data chunk's record has a bad magic number");
  const auto length = in.get<uint64_t>();
  ORPHEUS_CHECK_INPUT(length <= record.size(), "a moved data chunk's record is truncated");
  DecodedRows d;
  d.bytes = static_cast<size_t>(length);
  d.chunk = in.get<int64_t>();
  const auto rows = in.get<int64_t>();
  const auto width = in.get<int64_t>();
  const bool isSparse = in.get<uint8_t>() != 0;
  ORPHEUS_CHECK_INPUT(rows >= 1 && rows <= INT32_MAX && width == features && isSparse == sparse,
                      "moved data chunk {} holds {} rows of {} {} features, expected {} {}", d.chunk, rows, width,
                      isSparse ? "sparse" : "dense", features, sparse ? "sparse" : "dense");
  Dataset& out = d.rows;
  out.features = features;
  out.sparse = sparse;
  out.labels.resize(static_cast<size_t>(rows));
  in.get(out.labels.data(), out.labels.size());
  for (const int32_t label : out.labels) ORPHEUS_CHECK_INPUT(label >= 0, "moved data chunk {}: label {}", d.chunk, label);
  if (!sparse) {
    ORPHEUS_CHECK_INPUT(static_cast<uint64_t>(rows) * static_cast<uint64_t>(features) <= record.size() / sizeof(float),
                        "a moved data chunk's record is truncated");
    out.dense.resize(features, rows);
    in.get(out.dense.data(), static_cast<size_t>(rows * features));
    ORPHEUS_CHECK_INPUT(out.dense.allFinite(), "moved data chunk {} holds a value that is not finite", d.chunk);
  } else {
    std::vector<int32_t> counts(static_cast<size_t>(rows));
    in.get(counts.data(), counts.size());
    int64_t nnz = 0;
    for (const int32_t n : counts) {
      ORPHEUS_CHECK_INPUT(n >= 0 && n <= features, "moved data chunk {}: a row of {} nonzeros", d.chunk, n);
      nnz += n;
    }
    ORPHEUS_CHECK_INPUT(nnz <= static_cast<int64_t>(record.size()), "a moved data chunk's record is truncated");
    std::vector<int32_t> indices(static_cast<size_t>(nnz));
    std::vector<float> values(static_cast<size_t>(nnz));
    in.get(indices.data(), indices.size());
    in.get(values.data(), values.size());
    for (const int32_t i : indices) {
      ORPHEUS_CHECK_INPUT(i >= 0 && i < features, "moved data chunk {}: feature index {}", d.chunk, i);
    }
    for (const float v : values) ORPHEUS_CHECK_INPUT(std::isfinite(v), "moved data chunk {}: a value is not finite", d.chunk);
    fillSparse(out, rows, counts, indices, values);
  }
  ORPHEUS_CHECK_INPUT(in.pos() == d.bytes, "moved data chunk {}: its record's length does not match", d.chunk);
  return d;
}

Dataset takeRows(const Dataset& shard, int64_t begin, int64_t end) {
  std::vector<std::byte> bytes;
  encodeRows(shard, 0, begin, end, bytes);
  Dataset out = decodeRows(bytes, shard.features, shard.sparse).rows;
  out.source = shard.source;
  return out;
}

Dataset concatRows(const Dataset& like, std::span<const Dataset* const> pieces) {
  Dataset out;
  out.source = like.source;
  out.features = like.features;
  out.sparse = like.sparse;
  int64_t rows = 0;
  for (const Dataset* p : pieces) {
    ORPHEUS_ENFORCE(p->features == like.features && p->sparse == like.sparse, "a chunk of another shape");
    rows += p->size();
  }
  out.labels.reserve(static_cast<size_t>(rows));
  for (const Dataset* p : pieces) out.labels.insert(out.labels.end(), p->labels.begin(), p->labels.end());
  if (!like.sparse) {
    out.dense.resize(like.features, rows);
    int64_t at = 0;
    for (const Dataset* p : pieces) {
      out.dense.middleCols(at, p->size()) = p->dense;
      at += p->size();
    }
    return out;
  }
  std::vector<int32_t> counts, indices;
  std::vector<float> values;
  for (const Dataset* p : pieces) {
    const SparseMatrix& x = p->sparseX;
    for (int64_t j = 0; j < p->size(); ++j) {
      const int64_t n = columnNonZeros(x, j);
      counts.push_back(static_cast<int32_t>(n));
      indices.insert(indices.end(), x.innerIndexPtr() + x.outerIndexPtr()[j], x.innerIndexPtr() + x.outerIndexPtr()[j] + n);
      values.insert(values.end(), x.valuePtr() + x.outerIndexPtr()[j], x.valuePtr() + x.outerIndexPtr()[j] + n);
    }
  }
  ORPHEUS_ENFORCE(values.size() <= static_cast<size_t>(INT32_MAX), "{} nonzeros in one shard", values.size());
  fillSparse(out, rows, counts, indices, values);
  return out;
}

}  // namespace orpheus::data
