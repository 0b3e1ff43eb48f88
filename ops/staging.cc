#include "ops/staging.h"

#include "engine/base/error.h"

#include <cstring>

namespace orpheus::ops {

void Staging::begin(Backend& backend, size_t bytes) {
  if (backend_ != nullptr) backend_->wait(last_);
  backend_ = &backend;
  last_ = Event();
  used_ = 0;
  if (buffer_.bytes() < bytes) buffer_ = backend.allocateHost(bytes);
}

size_t Staging::reserve(size_t bytes) {
  const size_t at = used_;
  ORPHEUS_ENFORCE(backend_ != nullptr && at + bytes <= buffer_.bytes(),
                  "staging: {} bytes at byte {} do not fit a buffer of {} bytes", bytes, at, buffer_.bytes());
  used_ = at + bytes;
  return at;
}

Event Staging::up(size_t at, Tensor& dst) {
  last_ = backend_->copyToDeviceAsync(buffer_, at, dst).done;
  return last_;
}

Event Staging::up(const float* host, Tensor& dst) {
  const size_t bytes = static_cast<size_t>(dst.size()) * sizeof(float);
  const size_t at = reserve(bytes);
  if (bytes > 0) std::memcpy(data(at), host, bytes);
  return up(at, dst);
}

Event Staging::down(const Tensor& src, size_t at) {
  last_ = backend_->copyToHostAsync(src, buffer_, at).done;
  return last_;
}

size_t Staging::down(const Tensor& src) {
  const size_t at = reserve(static_cast<size_t>(src.size()) * sizeof(float));
  down(src, at);
  return at;
}

void Staging::wait() {
  if (backend_ != nullptr) backend_->wait(last_);
}

namespace {

using RowSparse = Eigen::SparseMatrix<float, Eigen::RowMajor, int32_t>;

// CUDA's sparse products read a host matrix's compression by rows too: its
// copySparse adds it (ops/backend.h, SparseTensor), and so does staging.
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

Event stageSparse(Backend& backend, const SparseMatrix& m, Staging& staging, StagedSparse& out) {
  ORPHEUS_ENFORCE(m.isCompressed(), "stageSparse: the matrix is not compressed");
  const bool rows = withRows(backend);
  const int64_t words = sparseWords(m, rows);
  const int64_t nnz = m.nonZeros();
  if (out.storage.size() < words) out.storage = backend.allocate(words, 1);
  const size_t offset = staging.reserve(static_cast<size_t>(words) * sizeof(float));
  std::byte* host = staging.data(offset);
  const auto put = [&](const void* from, int64_t n) {
    std::memcpy(host, from, static_cast<size_t>(n) * sizeof(float));
    host += static_cast<size_t>(n) * sizeof(float);
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
  const Event done = staging.up(offset, region);
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
