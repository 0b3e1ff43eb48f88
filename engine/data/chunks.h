// Data in chunks (after Chicle): a job's training rows cut into fixed-size chunks
// that can change owner between clocks without any rank rereading its file.
//
// Layout. Rank r reads its shard as before (engine/data/dataset.h) and cuts it into
// ceil(n_r / R) chunks of R rows (`--chunk-rows`; the shard's last chunk may be
// shorter). Chunks are numbered globally in rank order: rank 0's first, then rank
// 1's, and so on. A chunk's origin is the rank that read it; the origin keeps its
// rows for the whole job, so it can always hand them on.
//
// Ownership. At clock 0 every chunk is owned by its origin. It changes only by
// moves (chunk, from, to) that every rank applies at the same clock boundary, so
// ownership at any clock is a pure function of the layout (the ranks and their
// shard sizes, the same for the same file and ranks) and the moves up to it.
//
// Moving rows. A moved chunk's rows travel from its origin to its new owner over
// the data plane (encodeRows / decodeRows): the origin has them in memory and the
// file is never read again, which works for every format, the text ones included
// (whose row offsets are unknown without reading the file).
#pragma once

#include "ckpt/replay.h"
#include "engine/data/dataset.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace orpheus::data {

// As the checkpoint directory records it (the chunk log, ckpt/replay.h).
using ChunkMove = ckpt::ChunkMove;

class ChunkLayout {
 public:
  ChunkLayout() = default;
  // `shardRows[r]`: the rows rank r read; every entry >= 1. `chunkRows` >= 1.
  ChunkLayout(std::span<const int64_t> shardRows, int64_t chunkRows);

  int64_t chunkRows() const { return chunkRows_; }
  int ranks() const { return static_cast<int>(firstChunk_.size()) - 1; }
  int64_t chunks() const { return firstChunk_.back(); }
  int64_t totalRows() const { return totalRows_; }
  const std::vector<int64_t>& shardRows() const { return shardRows_; }
  int origin(int64_t chunk) const;
  // The chunk's rows within its origin's shard: [begin, end).
  int64_t beginRow(int64_t chunk) const;
  int64_t endRow(int64_t chunk) const;
  int64_t rows(int64_t chunk) const { return endRow(chunk) - beginRow(chunk); }
  // The chunks rank `rank` read: [firstChunk(rank), firstChunk(rank + 1)).
  int64_t firstChunk(int rank) const { return firstChunk_[static_cast<size_t>(rank)]; }

 private:
  int64_t chunkRows_ = 1;
  int64_t totalRows_ = 0;
  std::vector<int64_t> shardRows_;
  std::vector<int64_t> firstChunk_{0};
};

// Who owns each chunk. Deterministic: the same layout and moves give the same owners.
class ChunkOwnership {
 public:
  // Every chunk with its origin (clock 0).
  explicit ChunkOwnership(const ChunkLayout& layout);

  int owner(int64_t chunk) const { return owner_[static_cast<size_t>(chunk)]; }
  const std::vector<int>& owners() const { return owner_; }
  // Throws Error when a move's chunk is out of range or not owned by its `from`.
  void apply(std::span<const ChunkMove> moves);
  // Owned chunks of `rank`, in increasing order.
  std::vector<int64_t> chunksOf(int rank) const;
  std::vector<int64_t> chunkCounts() const;
  std::vector<int64_t> rowCounts() const;
  // Whether any chunk is away from its origin.
  bool moved() const;
  // A short digest of every chunk's owner, for records that must match across runs.
  std::string digest() const;

 private:
  int ranks_ = 1;
  std::vector<int> owner_;
  std::vector<int> origin_;
  std::vector<int64_t> rows_;
};

// The per-rank minibatch sizes that split a global batch of `globalBatch` examples
// in proportion to the rows each rank owns (largest remainders, ties to the lower
// rank; each at least 1). Sums to globalBatch when globalBatch >= ranks.
std::vector<int64_t> batchShares(std::span<const int64_t> rowCounts, int64_t globalBatch);

// Rows [begin, end) of `shard` as a self-describing record (dense or sparse, with
// labels), for the data plane. decodeRows checks the record against the expected
// width and sparsity and throws InputError on a damaged one.
void encodeRows(const Dataset& shard, int64_t chunk, int64_t begin, int64_t end, std::vector<std::byte>& out);
struct DecodedRows {
  int64_t chunk = 0;
  Dataset rows;
  size_t bytes = 0;  // of the record, so records can follow one another
};
DecodedRows decodeRows(std::span<const std::byte> record, int64_t features, bool sparse);

// Rows [begin, end) of `shard` as a dataset of their own.
Dataset takeRows(const Dataset& shard, int64_t begin, int64_t end);
// The pieces' rows one after another, as one dataset (each piece as wide and as
// sparse as `like`, whose source and token settings the result takes).
Dataset concatRows(const Dataset& like, std::span<const Dataset* const> pieces);

}  // namespace orpheus::data
