// A replica that lives on the job's device (--device other than cpu, a model with
// a device form, ops::Model::deviceRefusal): the parameters, the gradient buffer
// of a clock and the optimizer's state are tensors of the backend, from clock to
// clock. Only SV batches (the other ranks' U C and V, for the rebuild; this rank's
// own is read where the pass made it) and the dense gradient around the host
// collective cross to the device each clock; the parameters and
// the state cross only where the host needs them (evaluation, averaging and
// rotation, snapshots, the end) and back after the host changed them.
//
// The host's ParamSet and the Optimizer's buffers are mirrors of the tensors. Which
// side is current is tracked: toHost() copies the device's values into the
// mirrors when they are behind, and hostChanged() marks the mirrors newer, so the
// next device operation copies them in first. On the strict device (ops/strict)
// a mirror that falls behind is filled with NaN, so that host code reading it
// without toHost() fails loudly in CI instead of reading old values.
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "engine/worker/optimizer.h"
#include "ops/backend.h"
#include "ops/rebuild.h"

#include <span>
#include <string>
#include <vector>

namespace orpheus::engine {

// Why a replica of `model` cannot live on `backend`'s device, or "" when it can:
// the device is the host, or the model has no device form. Every optimizer steps
// there (quasi-Newton in float, the host's in double: equal up to rounding).
std::string residencyRefusal(const ops::Model& model, const ops::Backend& backend);

class DeviceReplica {
 public:
  // Tensors of `params`' shapes on `backend`, and of the optimizer's buffers; a
  // gradient buffer when the optimizer does not fold the learning rate. The host
  // values are copied in before the first device operation. `stagedUploads`: the
  // rebuilds' host operands cross on the copy queue (ops::DeviceOperands::staged,
  // --transfer staged), else with blocking copies (--transfer sync).
  DeviceReplica(ops::Backend& backend, const ParamSet& params, Optimizer& optimizer, bool stagedUploads = true);

  // The parameters on the device, current (the host's copied in first if newer).
  std::span<const ops::Tensor> params(ParamSet& host, Optimizer& optimizer);

  // W (folding) or the gradient buffer += the batches' updates; the matrices named
  // in `onDevice` read where they lie on the device (ops::applySvBatches).
  void rebuild(std::span<const SvBatchView* const> batches, bool intoGradient, ParamSet& host, Optimizer& optimizer,
               std::span<const ops::DeviceSvs> onDevice = {});
  // The gradient buffer = `gradient` (host) * scale.
  void loadGradient(const ParamSet& gradient, float scale, ParamSet& host, Optimizer& optimizer);
  // W += scale * gradient (host): folding's dense update.
  void addScaled(const ParamSet& gradient, float scale, ParamSet& host, Optimizer& optimizer);
  // The same two from a gradient already on this device (a job of one rank: no collective).
  void loadGradient(std::span<const ops::Tensor> gradient, float scale, ParamSet& host, Optimizer& optimizer);
  void addScaled(std::span<const ops::Tensor> gradient, float scale, ParamSet& host, Optimizer& optimizer);
  // One optimizer step from the gradient buffer at local clock `clock`; the buffer
  // is zeroed for the next clock. Quasi-Newton too: W, x_prev and d_prev stay on the
  // device and only the 3 x 3 products of s, y and W y come to the host, where
  // ops::planQnUpdate decides the update as the host path does.
  void step(uint64_t clock, ParamSet& host, Optimizer& optimizer);
  void zeroGradient();
  // The gradient buffer copied to `out` (shaped like the parameters).
  void gradientToHost(ParamSet& out);

  // The mirrors made current: the parameters and the optimizer's buffers.
  void toHost(ParamSet& host, Optimizer& optimizer);
  // The mirrors changed on the host: copied in before the next device operation.
  // They must have been current (toHost()) before the host changed them.
  void hostChanged();
  bool hostCurrent() const { return current_ != Current::kDevice; }

  ops::Backend& backend() const { return backend_; }

 private:
  enum class Current { kBoth, kHost, kDevice };
  void upload(ParamSet& host, Optimizer& optimizer);
  // After a device operation: the device is ahead of the mirrors.
  void moved(ParamSet& host, Optimizer& optimizer);
  void quasiNewtonStep(uint64_t clock, Optimizer& optimizer);

  ops::Backend& backend_;
  std::vector<ops::Tensor> params_;
  std::vector<ops::Tensor> gradient_;  // empty when folding
  std::vector<ops::Tensor> state_;     // Optimizer::buffers() order
  ops::Tensor zeros_;                  // the largest parameter's size, zero: copied to clear the gradient
  ops::RebuildBuffers rebuild_;
  // Quasi-Newton's scratch (n entries in all): [x, d, W d], [s, y, W y], [a, v],
  // [a, -v] and the 3 x 3 products of [s, y, W y].
  struct QuasiNewtonScratch {
    ops::Tensor vectors, pair, svs, signedSvs, products;
  } qn_;
  Current current_ = Current::kHost;
  bool poisons_ = false;  // the strict device: mirrors that fall behind are NaN
};

}  // namespace orpheus::engine
