// Training and test data held by one rank: its shard of a file, examples as
// columns (so a minibatch's features are directly the V of its SVs).
#pragma once

#include "engine/base/sv_batch.h"

#include <Eigen/Dense>

#include <cstdint>
#include <string>
#include <vector>

namespace orpheus::data {

enum class Format { kAuto, kIdx, kLibsvm, kCsv, kHdf5, kTokens };

// Parses "auto", "idx", "libsvm", "csv", "hdf5", "tokens"; throws InputError otherwise.
Format parseFormat(const std::string& name);

struct Dataset {
  std::string source;           // path given by the user, for messages
  int64_t features = 0;         // D
  bool sparse = false;
  Matrix dense;                 // D x N when !sparse
  SparseMatrix sparseX;         // D x N when sparse
  std::vector<int32_t> labels;  // N class ids, >= 0
  // Index of this shard's first example in the whole file, and the examples in the
  // whole file (all shards). Known for IDX and HDF5; for text formats with more than one
  // shard both are -1 (finding them needs the whole file): the caller agrees them
  // across ranks (exclusive prefix sum and sum of size()).
  int64_t globalOffset = 0;
  int64_t globalSize = 0;
  // Token streams (engine/data/token_reader.cc): segments of `steps` steps over a
  // vocabulary of `vocabulary` words in `streams` parallel streams; 0 otherwise.
  int64_t vocabulary = 0;
  int64_t steps = 0;
  int64_t streams = 0;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int32_t maxLabel() const;     // -1 when empty; a token stream's: its vocabulary's last id
};

struct ReadOptions {
  Format format = Format::kAuto;
  int rank = 0;               // this rank reads shard `rank` of `worldSize`
  int worldSize = 1;
  // Fixes the width (LIBSVM/CSV/HDF5 CSR; IDX and HDF5 dense X check it); -1: infer
  // it from the data. CSV takes the file's first line and HDF5 its shapes, so every
  // rank agrees; LIBSVM (and a CSR matrix without a shape) takes this shard's
  // largest index, so the caller agrees the maximum and calls widen().
  int64_t features = -1;
  // LIBSVM only: how the feature indices are based. -1 detects it from the data of
  // the whole file's first chunk (0-based if any index 0 is seen, else 1-based);
  // training and test must agree, so the CLI passes the training file's choice on.
  int indexBase = -1;
  // Token streams only: parallel streams per rank (0: a default) and time steps
  // per segment (0: the file's own).
  int64_t streams = 0;
  int64_t steps = 0;
};

// Reads this rank's shard of the file at `path`.
//  - IDX: `path` is an images file (idx3, `.gz` or raw); its labels file is found
//    by replacing "images-idx3" with "labels-idx1" in the name. Pixels scale to [0,1].
//    Shards are contiguous example ranges; a raw file is read by seeking.
//  - LIBSVM/svmlight: "label idx:val idx:val ..." per line, sparse; labels are class ids.
//  - CSV: label first, then the features; dense. A header line is an error.
//  - HDF5: a dataset `X` (N x D, a row per example; dense) or a CSR matrix
//    (`data`, `indices`, `indptr` and optionally `shape`, in a group `X` or at the
//    root; sparse), and `y` (N class ids). Shards are contiguous row ranges, read
//    by hyperslab (engine/data/hdf5_reader.cc has the details and the checks).
//  - Token streams ("#orpheus-tokens" header): segments of a text for recurrent
//    models, read as described in engine/data/token_reader.cc.
//  Text formats split the file by byte range at line boundaries, so each rank
//  reads only its part. Every error is an InputError naming file:line where one
//  exists (malformed lines, NaN/Inf values, negative or non-integer labels,
//  indices beyond --features, ragged CSV rows). An empty shard is an error.
Dataset readDataset(const std::string& path, const ReadOptions& options);

// The index base a LIBSVM file uses (0 or 1), detected from its first lines; for
// other formats returns -1.
int detectIndexBase(const std::string& path, Format format);

// The detected format of a path, or `format` itself when not kAuto. By the file
// name's ending: "-idx3-ubyte" or "-idx1-ubyte" (or ".idx3-ubyte"...; each
// optionally ".gz") -> IDX, ".csv" -> CSV, ".h5" or ".hdf5" -> HDF5; otherwise by
// content: an IDX magic number (raw or gzipped) -> IDX, the HDF5 signature at the
// start of the file -> HDF5, a "#orpheus-tokens" header -> token stream; otherwise
// LIBSVM.
Format resolveFormat(const std::string& path, Format format);

// Raises the width of `data` to `features`, padding with zero features. A text
// file's width inferred by each rank from its own shard may differ between ranks;
// the caller agrees the maximum (and the test set's) and widens every shard to it.
// Throws InputError when `features` is below the width the data already has.
void widen(Dataset& data, int64_t features);

// A minibatch: examples as columns.
struct Batch {
  bool sparse = false;
  Matrix dense;                 // D x B
  SparseMatrix sparseX;         // D x B
  Eigen::VectorXi labels;       // B
  std::vector<int64_t> indices; // B: each example's index in the shard
  int64_t size() const { return labels.size(); }
};

// Copies the examples `indices` (into this shard) into a batch, in that order.
Batch gather(const Dataset& data, const std::vector<int64_t>& indices);
// Copies examples [begin, end) of this shard.
Batch slice(const Dataset& data, int64_t begin, int64_t end);

}  // namespace orpheus::data
