// Optimizers on rebuilt updates, and learning-rate schedules.
//
// Sufficient vectors constrain what travels, not what a replica does with the
// update it rebuilds: each replica runs its own optimizer on the gradient rebuilt
// from its own and the received SV batches (or on the allreduced dense gradient),
// and keeps the optimizer's state with it.
//
// The formulas are PyTorch's (torch.optim), per parameter matrix, with g the mean
// gradient of a clock (the examples a replica hears of), w the parameters, lr the
// clock's learning rate and t the step count (1 at the first step):
//   sgd       d = g + wd w;                                     w -= lr d
//   momentum  d = g + wd w; b = mu b + d;                       w -= lr b
//   nesterov  d = g + wd w; b = mu b + d;                       w -= lr (d + mu b)
//   adagrad   d = g + wd w; s += d*d;                           w -= lr d / (sqrt(s) + eps)
//   adam      d = g + wd w; m = b1 m + (1-b1) d; v = b2 v + (1-b2) d*d;
//             w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// (dampening 0, buffers start at zero so PyTorch's first-step copy b = d is the
// same; weight decay is L2 added to the gradient, not AdamW's decoupled decay).
//
// Quasi-Newton (paper section 3.1.1), on x, every parameter flattened into one
// vector of n entries, with an n x n approximation W of the inverse Hessian
// (ops/quasi_newton.h):   x -= lr W d   for both bfgs and dfp.
// At every step after the first, s = x - x_prev and y = d - d_prev update W by
// the rank-2 SVs of ops::planQnUpdate (bfgs's inverse update or dfp's), rebuilt
// into W as W += U C U^T; the update is skipped (and counted, skips()) when the
// curvature condition y^T s > 0 fails. W starts as I and, before its first update,
// is scaled to the pair's curvature, (y^T s / y^T y) I (Nocedal and Wright, eq.
// 6.20), so that lr 1 is a sound first step. x_prev, d_prev and W are the state
// (float32, like everything else). On the host the step's arithmetic is in double;
// on a device (DeviceReplica) in float through the backend, deciding from the same
// scalars, so the two differ by rounding only. The
// pair is the same on every replica only when every replica rebuilds the same
// gradient: full broadcast, bsp, no selection (engine/config.cc refuses the rest),
// so every replica derives the same SVs of W's update and none travel.
// State buffers are float32, like the parameters; the scalar factors are computed
// in double and rounded once.

// Plain sgd without weight decay keeps the original path: -lr/(B(Q+1)) folded into
// the SV coefficients and rebuilt straight into the replica, so its cost per
// clock stays proportional to what changed (sparse inputs) and its iterates,
// logs and equivalence are what they were. Every other optimizer rebuilds the
// batches a clock applies (coefficient 1/(B(Q+1)), no lr) into a gradient buffer,
// then takes one step per local clock. Under SSP that is every group the log
// records at that local clock, so replaying the log takes the same steps.
//
// The learning rate of a clock is a pure function of the clock number (1-based),
// so a replay reproduces it:
//   constant  lr
//   step      lr * gamma^floor((c - 1) / every)
//   cosine    lr * (1 + cos(pi * (c - 1 - warmup) / (clocks - warmup))) / 2, after warmup
// times a linear warmup c / warmup for c <= warmup (any schedule).
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/model.h"
#include "ops/optimizer_step.h"
#include "ops/quasi_newton.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::engine {

enum class OptimizerKind { kSgd, kMomentum, kNesterov, kAdagrad, kAdam, kBfgs, kDfp };

// bfgs and dfp: the step multiplies by an n x n matrix.
inline bool isQuasiNewton(OptimizerKind kind) { return kind == OptimizerKind::kBfgs || kind == OptimizerKind::kDfp; }
inline ops::QuasiNewtonMethod quasiNewtonMethod(OptimizerKind kind) {
  return kind == OptimizerKind::kBfgs ? ops::QuasiNewtonMethod::kBfgs : ops::QuasiNewtonMethod::kDfp;
}
// The largest n (parameter entries in all) a quasi-Newton job takes: W is n x n
// floats (64 MiB here), held in double on the host during a step.
inline constexpr int64_t kQuasiNewtonMaxEntries = 4096;
enum class LrScheduleKind { kConstant, kStep, kCosine };

// The --lr a user who gives none gets: what works out of the box for each
// optimizer on the mean loss (PyTorch's defaults where it has one).
double defaultLearningRate(OptimizerKind kind);

// Everything an optimizer and its schedule are, with every default resolved
// (engine/config.h: optimizerSettings). Recorded with a checkpoint so a replay
// takes the same steps.
struct OptimizerSettings {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.1;
  double momentum = 0.9;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.0;
  LrScheduleKind schedule = LrScheduleKind::kConstant;
  int64_t warmup = 0;
  int64_t stepEvery = 0;  // step: clocks between decays
  double gamma = 0.1;     // step: the decay factor
  int64_t clocks = 0;     // cosine: the horizon
  // Not the optimizer's, but the job's snapshots': with the outer step (--outer-lr,
  // engine/coordinator/outer_step.h) they hold its momentum after this state.
  bool outerMomentumInSnapshots = false;

  // sgd without weight decay: lr folded into the SV coefficients, no state, no buffer.
  bool foldsLearningRate() const { return kind == OptimizerKind::kSgd && weightDecay == 0.0; }
  // adagrad without weight decay: where the gradient is zero its step changes
  // nothing, so a step visits only the columns a clock's SVs touched.
  bool stepsTouchedColumns() const { return kind == OptimizerKind::kAdagrad && weightDecay == 0.0; }
  // Whether an update touches every entry of the parameters, whatever the input's
  // sparsity (momentum and Adam move every entry their state has seen; weight
  // decay shrinks every entry).
  bool touchesEveryEntry() const { return !foldsLearningRate() && !stepsTouchedColumns(); }
};

// The learning rate of clock `clock` (1-based): a pure function of the clock.
double learningRate(const OptimizerSettings& s, uint64_t clock);

// The settings of one whole-matrix step of a first-order optimizer (not bfgs or
// dfp) at local clock `clock`, the optimizer's `step`-th step (1-based): what
// Optimizer::step takes on each parameter matrix, and what a backend's
// optimizerStep takes to give the same step (ops/optimizer_step.h).
ops::OptimizerStep stepSettings(const OptimizerSettings& s, uint64_t clock, int64_t step);

// One replica's optimizer and its state: ParamSet-shaped buffers (none for sgd)
// and the step count. Copyable; not thread-safe.
class Optimizer {
 public:
  Optimizer(const OptimizerSettings& settings, const ParamSet& shapes);

  // The columns of one parameter a step visits: all, or the listed ones.
  struct Columns {
    bool all = true;
    std::vector<int64_t> list;
  };
  // One step at local clock `clock`: `gradient` is the clock's mean gradient.
  // With `columns` (one entry per parameter; only when stepsTouchedColumns()),
  // the step visits only those columns: bitwise the same as a whole step when the
  // gradient is zero elsewhere.
  void step(uint64_t clock, const ParamSet& gradient, ParamSet& params,
            const std::vector<Columns>* columns = nullptr);

  // A whole step taken a range of elements at a time (the rebuild fused with the
  // step, ReplicaUpdater::applyLastGroup), for the kinds whose step is element by
  // element (not bfgs or dfp): beginStep counts the step and gives its settings;
  // stepRange steps `count` elements of parameter `i` from `offset` with them. Once
  // every element of every parameter is stepped, bitwise step(clock, gradient, params).
  ops::OptimizerStep beginStep(uint64_t clock);
  void stepRange(const ops::OptimizerStep& kernel, size_t i, int64_t offset, int64_t count, const Matrix& gradient,
                 Matrix& param);

  const OptimizerSettings& settings() const { return settings_; }
  int64_t steps() const { return steps_; }
  void setSteps(int64_t steps) { steps_ = steps; }
  // Every state buffer, in a fixed order (what averaging averages, rotation moves).
  std::vector<Matrix*> buffers();
  bool hasState() const { return settings_.kind != OptimizerKind::kSgd; }
  // bfgs, dfp: the updates of W skipped because the curvature condition failed.
  int64_t skips() const { return skips_; }
  void noteSkip() { ++skips_; }
  // bfgs, dfp, during step number steps(): whether W has had no update yet (every
  // earlier pair was skipped), so that this one scales it first.
  bool firstQuasiNewtonUpdate() const { return steps_ - 2 == skips_; }

  // The state as a ParamSet in its own group: "optimizer/<param>/<buffer>" for each
  // buffer (momentum: momentum_buffer; adagrad: sum; adam: m, v; bfgs, dfp: x_prev,
  // d_prev), for bfgs and dfp "optimizer/quasi_newton/h" (W, n x n) and the 1x1
  // "optimizer/quasi_newton/skips", and the step count as the 1x1 "optimizer/steps"
  // (counts exact up to 2^24). Empty for sgd.
  ParamSet exportState() const;
  // The reverse; InputError naming the entry that is missing or misshapen. State
  // written before W approximated bfgs's inverse Hessian ("optimizer/quasi_newton/w",
  // the Hessian for bfgs) is read too, bfgs's inverted.
  void importState(const ParamSet& state);
  // exportState()'s names and shapes (values zero).
  ParamSet stateShapes() const { return exportState(); }

 private:
  struct Buffer {
    std::string name;     // momentum_buffer, sum, m, v
    ParamSet values;      // shaped like the parameters
  };

  // bfgs, dfp: moves `params` by one step from the clock's mean gradient `d`.
  void quasiNewtonStep(uint64_t clock, const std::vector<Eigen::ArrayXXf>& d, ParamSet& params);

  OptimizerSettings settings_;
  std::vector<Buffer> buffers_;
  int64_t steps_ = 0;
  Matrix w_;           // bfgs, dfp: W (the inverse Hessian's approximation), n x n; empty otherwise
  int64_t skips_ = 0;  // bfgs, dfp
};

// Applies the groups of SV batches of each local clock to a replica through its
// optimizer: the one place where live training and the log's replay turn applied
// groups into parameters, so both take the same steps.
//  - folding (sgd): each group is rebuilt straight into the replica;
//  - otherwise each group is rebuilt into the gradient buffer, and the step of a
//    local clock is taken once no more groups of it can come: at the first group
//    of a later clock, or when finishClock() is called (before averaging,
//    rotation, a reset, a snapshot, at the end).
class DeviceReplica;

class ReplicaUpdater {
 public:
  // The rebuilds run on `backend`, the job's (ops/backends.h), which must outlive the updater.
  ReplicaUpdater(const OptimizerSettings& settings, const ops::Model& model, ops::Backend& backend);
  ~ReplicaUpdater();

  // The factor the SV coefficients of a batch computed at `clock` carry, for
  // updates averaged over `heard` examples: -lr(clock)/heard when folding, else 1/heard.
  float coefficientScale(uint64_t clock, double heard) const;

  // A group of batches applied together at local clock `clock`.
  void applyGroup(uint64_t clock, std::span<const SvBatchView* const> batches, ParamSet& params);
  void applyGroup(uint64_t clock, std::span<const SvBatch* const> batches, ParamSet& params);
  // --sync dense: the clock's summed gradient, times `scale` (coefficientScale()), one step.
  void applyDense(uint64_t clock, ParamSet& gradient, float scale, ParamSet& params);
  // The same from a gradient on the device (resident only): a job of one rank has
  // no collective, so its gradient need not cross to the host.
  void applyDense(uint64_t clock, std::span<const ops::Tensor> gradient, float scale, ParamSet& params);
  // applyGroup and then finishClock: the last group of its clock (a BSP clock's
  // one group). On the host the step of each parameter rebuilt from dense V's runs
  // tile by tile behind its rebuild (ops::applySvBatches with a GradientStep), so
  // the step reads the gradient while it is in cache: the same bits.
  void applyLastGroup(uint64_t clock, std::span<const SvBatchView* const> batches, ParamSet& params);
  // Takes the pending clock's step, if any.
  void finishClock(ParamSet& params);
  // Drops a pending step (the replica was replaced).
  void discardPending();
  bool pending() const { return pendingClock_ != 0; }
  // `params` as finishClock() would leave them, without changing anything.
  ParamSet peek(const ParamSet& params) const;

  Optimizer& optimizer() { return optimizer_; }
  ops::Backend& backend() const { return backend_; }
  // Bytes the groups' rebuilds copied from host memory to the backend's device
  // since the updater was made: the batches' U C and V and the bias updates (and
  // W, where the replica is not resident); 0 on the CPU backend.
  uint64_t rebuildToDeviceBytes() const { return rebuildToDevice_; }
  const Optimizer& optimizer() const { return optimizer_; }

  // Device residency (engine/worker/device_replica.h): from here on the replica
  // `params`, the gradient and the optimizer's state live on the backend's device,
  // and the ParamSet every call passes is the host's mirror of the parameters.
  // `stagedUploads`: the rebuilds' host operands cross on the device's copy queue
  // (DeviceReplica's, --transfer staged), else with blocking copies.
  void reside(const ParamSet& params, bool stagedUploads = true);
  bool resident() const { return device_ != nullptr; }
  // The parameters on the device (resident only).
  std::span<const ops::Tensor> deviceParams(ParamSet& params);
  // The local batch's SVs where the device pass left them (Model::lastDeviceSvs,
  // named by the host batch's U): the rebuilds read them there until this is
  // called again (with {} once they are applied or no longer the batch's values).
  void keepLocalOnDevice(std::vector<ops::DeviceSvs> svs) { localOnDevice_ = std::move(svs); }
  // The mirrors of the parameters and of the optimizer's state made current
  // (nothing to do unless resident).
  void toHost(ParamSet& params);
  // The host changed the parameters or the optimizer's state (averaging, rotation,
  // a resume): the device takes them before its next operation.
  void hostChanged();
  // The pending step taken and the mirrors made current: before the host reads the replica.
  void settle(ParamSet& params) {
    finishClock(params);
    toHost(params);
  }

 private:
  void applyGroupOn(uint64_t clock, std::span<const SvBatchView* const> batches, ParamSet& params);
  // applyDense on the resident replica, the gradient a host ParamSet or device tensors.
  template <class Gradient>
  void applyDenseOnDevice(uint64_t clock, const Gradient& gradient, float scale, ParamSet& params);
  void noteTouched(std::span<const SvBatchView* const> batches);
  void trimBuffers();
  void clearGradient();

  const ops::Model& model_;
  ops::Backend& backend_;
  Optimizer optimizer_;
  ParamSet gradient_;  // empty when folding
  ops::RebuildBuffers rebuild_;  // the rebuild's operands, reused every clock (trimBuffers)
  size_t weightBytes_ = 0;       // the model's parameters, in bytes
  uint64_t pendingClock_ = 0;
  // stepsTouchedColumns(): the columns the pending clock's groups touched.
  std::vector<Optimizer::Columns> touched_;
  std::vector<std::vector<char>> touchedMask_;
  std::unique_ptr<DeviceReplica> device_;  // resident: the replica on the device
  std::vector<ops::DeviceSvs> localOnDevice_;
  uint64_t rebuildToDevice_ = 0;
  std::vector<bool> steppedParams_;  // applyLastGroup's (reused storage)
};

// The parameters and the optimizer state as one ParamSet (snapshots, files):
// `params` followed by `state` (exportState()).
ParamSet withState(const ParamSet& params, const ParamSet& state);
// The reverse: the first `paramCount` entries are the parameters.
std::pair<ParamSet, ParamSet> splitState(ParamSet combined, size_t paramCount);
// What a snapshot of a job with `settings` holds, names and shapes (values zero):
// `params`, the optimizer's state, and the outer step's momentum where the job
// has one (settings.outerMomentumInSnapshots).
ParamSet snapshotShapes(const ParamSet& params, const OptimizerSettings& settings);

}  // namespace orpheus::engine
