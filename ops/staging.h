// Staging: host data on its way to or from the device crosses through one
// page-locked buffer (Backend::allocateHost), copied asynchronously
// (copyToDeviceAsync, copyToHostAsync), so the host waits for the device only
// where it needs a result, not at every copy. The data queue (ops/device_exec.h),
// the staged rebuild (ops/rebuild.h), --sv-rank (engine/worker/low_rank.h),
// --sync powersgd (engine/worker/power_sgd.h) and the resident dense all-reduce
// stage this way.
//
// A run of copies: begin() waits until the last copy through the buffer has
// landed, so its bytes may be written again, and grows it when too small; then
// reserve() hands out its bytes back to back from the start, and up() and down()
// queue the copies, each remembered as the last. Host code reads what down()
// brought only after wait(); the device reads what up() took only after
// waitOnDevice(its event).
#pragma once

#include "engine/base/sv_batch.h"
#include "ops/backend.h"

#include <cstddef>

namespace orpheus::ops {

class Staging {
 public:
  // A new run of at most `bytes` on `backend`, from byte 0.
  void begin(Backend& backend, size_t bytes);
  // The next `bytes` of the run, right after the last ones: their byte offset.
  size_t reserve(size_t bytes);
  size_t reserveFloats(int64_t floats) { return reserve(static_cast<size_t>(floats) * sizeof(float)); }
  std::byte* data(size_t at = 0) const { return buffer_.data() + at; }
  float* floats(size_t at) const { return reinterpret_cast<float*>(data(at)); }
  Tensor floats(size_t at, int64_t rows, int64_t cols) const { return buffer_.floats(at, rows, cols); }

  // The bytes at `at` queued to `dst` (all of it) on the device; the copy's event.
  Event up(size_t at, Tensor& dst);
  // `dst.size()` host floats from `host` written into the next stretch and queued to `dst`.
  Event up(const float* host, Tensor& dst);
  // `src` queued to the host, into the bytes at `at`; the copy's event.
  Event down(const Tensor& src, size_t at);
  // `src` queued to the host, into the next stretch: where it lands.
  size_t down(const Tensor& src);
  // Until every copy of the run has landed.
  void wait();

  Event last() const { return last_; }  // the run's last copy: done when every copy of it is
  size_t bytes() const { return buffer_.bytes(); }  // the buffer's size

 private:
  Backend* backend_ = nullptr;
  HostBuffer buffer_;
  size_t used_ = 0;
  Event last_;  // the last copy queued through the buffer (copies land in order)
};

// A host sparse matrix staged to the device: its compressed arrays laid out as
// Backend::copySparse lays them, as 4-byte words in `storage` (outer, inner,
// values; on CUDA the compression by rows after them, which its sparse products
// read), `view` into it.
struct StagedSparse {
  Tensor storage;
  SparseTensor view;
};

// Bytes stageSparse takes of a run for `m` on `backend`.
size_t stagedSparseBytes(const Backend& backend, const SparseMatrix& m);

// `m` (compressed) written into the run's next stretch and queued to `out` on the
// device (its storage grown when too small); the copy's event. Operations that
// read `out.view` must be ordered after it (waitOnDevice).
Event stageSparse(Backend& backend, const SparseMatrix& m, Staging& staging, StagedSparse& out);

}  // namespace orpheus::ops
