// A host sparse matrix staged to the device: its compressed arrays written into a
// page-locked staging buffer and queued to the device with one asynchronous copy
// (Backend::copyToDeviceAsync), laid out as Backend::copySparse lays them, so the
// host goes on while the copy runs. The data queue (ops/device_exec.h) and the
// staged rebuild (ops/rebuild.h) send sparse matrices this way.
#pragma once

#include "engine/base/sv_batch.h"
#include "ops/backend.h"

#include <cstddef>

namespace orpheus::ops {

// Its arrays as 4-byte words in `storage` (outer, inner, values; on CUDA the
// compression by rows after them, which its sparse products read), `view` into it.
struct StagedSparse {
  Tensor storage;
  SparseTensor view;
};

// Bytes stageSparse takes in the staging buffer for `m` on `backend`.
size_t stagedSparseBytes(const Backend& backend, const SparseMatrix& m);

// `m` (compressed) written into `staging` at `offset` (advanced past it) and queued
// to `out` on the device (its storage grown when too small); the copy's done event.
// Operations that read `out.view` must be ordered after it (waitOnDevice), and the
// staging bytes not written again before it is done.
Event stageSparse(Backend& backend, const SparseMatrix& m, HostBuffer& staging, size_t& offset, StagedSparse& out);

}  // namespace orpheus::ops
