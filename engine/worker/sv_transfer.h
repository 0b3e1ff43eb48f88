// How a resident replica's SV batch (engine/worker/device_replica.h) reaches host
// memory each clock, for the wire and the log (--transfer):
//
//  - staged (the default): as the backward pass makes each site's U and V final
//    (top layer first, ops::Model::computeSvgOnDeviceStreamed), they are queued to
//    page-locked host buffers on the device's copy queue (ops/backend.h's
//    asynchronous copies: on CUDA a second stream), so the copies run while the
//    rest of the pass computes. After the pass each site is copied into the batch
//    as soon as its copy has landed, and handed on (to a streaming exchange, which
//    sends it at once) before the next one is waited for;
//  - sync: after the pass, one blocking copy per array, straight into the batch.
//
// Both fill the same batch, bit for bit. The transport never takes device memory
// here: where the MPI library says it is CUDA-aware (comm::Transport::
// deviceMemoryAware) the batch is still staged through host memory.
//
// What moved is counted for the metrics: the bytes copied to the host, the copies'
// device time and the part of it that overlapped the pass (CUDA's event timer).
// On the strict device a copy runs when waited for, after the pass, so nothing is
// hidden there (transfer_hidden_share 0); sync copies hide nothing by definition.
//
// One per worker, on its thread; the staging buffers grow to the largest site
// seen and are reused, so a clock allocates none.
#pragma once

#include "engine/base/sv_batch.h"
#include "engine/sync_modes.h"
#include "ops/backend.h"
#include "ops/model.h"

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace orpheus::engine {

class SvTransfer {
 public:
  // `backend` is the job's, which must outlive this.
  SvTransfer(ops::Backend& backend, TransferMode mode);

  // computeSvg of `model` on the device parameters `w` into `batch`, its device
  // arrays brought to the host as the mode says. `landed(i)` is told once matrix
  // i of `batch` is complete in host memory: every matrix once, those the pass
  // handed out in the order it made them final, the others (a sequence model's)
  // after them, last to first.
  // `toHost` false: nothing on the host reads the batch's U and V this clock
  // (--sv-rank reads them on the device), so the handed-out sites are only recorded,
  // their host arrays left unset (NaN on the strict device), and land() brings one
  // over where it is needed after all.
  void computeSvg(const ops::Model& model, std::span<const ops::Tensor> w, const ops::ExampleBatch& x,
                  double* meanLoss, SvBatch& batch, const std::function<void(size_t)>& landed, bool toHost = true);
  // After computeSvg(toHost = false): matrix i of its batch, `m`, filled from the
  // device by a blocking copy (nothing to do for a matrix the pass did not hand out:
  // the batch already holds it).
  void land(size_t i, SvMatrix& m);

  TransferMode mode() const { return mode_; }

  // Since the transfer was made.
  struct Totals {
    uint64_t toHostBytes = 0;     // U and V copied from the device
    double copySeconds = 0.0;     // the copies' time (staged: on the device's timer)
    double hiddenSeconds = 0.0;   // the part of it during the pass (staged only)
  };
  const Totals& totals() const { return totals_; }

 private:
  // A site the pass handed out: its device arrays and, staged, their copies.
  struct Site {
    size_t index = 0;
    const ops::Tensor* u = nullptr;
    const ops::Tensor* v = nullptr;  // null: V is host data the batch holds
    ops::AsyncCopy copyU, copyV;
  };
  void siteFinal(size_t index, const ops::Tensor& u, const ops::Tensor* v);
  void landStaged(const Site& site, SvMatrix& m);
  void landSync(const Site& site, SvMatrix& m);

  ops::Backend& backend_;
  TransferMode mode_;
  bool toHost_ = true;                     // this clock's computeSvg copies every site to the host
  std::vector<Site> sites_;                // this clock's, in the order the pass made them final
  std::vector<ops::HostBuffer> staging_;   // per site index: U, then V
  Totals totals_;
};

}  // namespace orpheus::engine
