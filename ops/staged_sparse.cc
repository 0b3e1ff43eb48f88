#include "ops/staged_sparse.h"

#include "engine/base/error.h"

#include <cstring>

namespace orpheus::ops {
namespace {

using RowSparse = Eigen::SparseMatrix<float, Eigen::RowMajor, int32_t>;

// CUDA's sparse products read a host matrix's compression by rows too: its
// copySparse adds it (ops/backend.h, SparseTensor), and so does the queue.
bool withRows(const Backend& backend) { return backend.device() == Device::kCuda; }

// The 4-byte words of `m` on the device: outer, inner, values, and by rows the same again.
int64_t sparseWords(const SparseMatrix& m, bool rows) {
  const int64_t nnz = m.nonZeros();
  return m.cols() + 1 + 2 * nnz + (rows ? m.rows() + 1 + 2 * nnz : 0);
}

}  // namespace

size_t stagedSparseBytes(const Backend& backend, const SparseMatrix& m) {
  return static_cast<size_t>(sparseWords(m, withRows(backend))) * sizeof(float);
}

Event stageSparse(Backend& backend, const SparseMatrix& m, HostBuffer& staging, size_t& offset, StagedSparse& out) {
  ORPHEUS_ENFORCE(m.isCompressed(), "stageSparse: the matrix is not compressed");
  const bool rows = withRows(backend);
  const int64_t words = sparseWords(m, rows);
  const int64_t nnz = m.nonZeros();
  if (out.storage.size() < words) out.storage = backend.allocate(words, 1);
  std::byte* host = staging.data() + offset;
  size_t at = 0;
  const auto put = [&](const void* from, int64_t n) {
    std::memcpy(host + at, from, static_cast<size_t>(n) * sizeof(float));
    at += static_cast<size_t>(n) * sizeof(float);
  };
  put(m.outerIndexPtr(), m.cols() + 1);
  put(m.innerIndexPtr(), nnz);
  put(m.valuePtr(), nnz);
  if (rows) {
    RowSparse byRows = m;
    byRows.makeCompressed();
    put(byRows.outerIndexPtr(), m.rows() + 1);
    put(byRows.innerIndexPtr(), nnz);
    put(byRows.valuePtr(), nnz);
  }
  Tensor region = Tensor::view(backend.device(), out.storage.data(), words, 1);
  const Event done = backend.copyToDeviceAsync(staging, offset, region).done;
  offset += at;
  const auto* base = reinterpret_cast<const int32_t*>(out.storage.data());
  SparseTensor& v = out.view;
  v = SparseTensor();
  v.device = backend.device();
  v.layout = SparseTensor::Layout::kCsc;
  v.rows = m.rows();
  v.cols = m.cols();
  v.nonZeros = nnz;
  v.outer = base;
  v.inner = base + m.cols() + 1;
  v.values = reinterpret_cast<const float*>(v.inner + nnz);
  if (rows) {
    v.otherOuter = base + m.cols() + 1 + 2 * nnz;
    v.otherInner = v.otherOuter + m.rows() + 1;
    v.otherValues = reinterpret_cast<const float*>(v.otherInner + nnz);
  }
  return done;
}

}  // namespace orpheus::ops
