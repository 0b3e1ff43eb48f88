#include "engine/worker/optimizer.h"

#include "engine/coordinator/outer_step.h"

#include "engine/base/error.h"
#include "engine/worker/device_replica.h"
#include "ops/cpu/optimizer_step.h"
#include "ops/quasi_newton.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace orpheus::engine {
namespace {

constexpr const char* kStatePrefix = "optimizer/";
constexpr const char* kStepsName = "optimizer/steps";
constexpr const char* kQnWName = "optimizer/quasi_newton/h";
constexpr const char* kQnLegacyWName = "optimizer/quasi_newton/w";  // bfgs: the Hessian
constexpr const char* kQnSkipsName = "optimizer/quasi_newton/skips";
// Steps are stored as one float: exact up to here.
constexpr int64_t kMaxStoredSteps = int64_t{1} << 24;

ParamSet zerosLike(const ParamSet& shapes) {
  ParamSet out;
  for (const Param& p : shapes.params) out.params.push_back({p.name, Matrix::Zero(p.value.rows(), p.value.cols())});
  return out;
}

std::vector<std::string> bufferNames(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kMomentum:
    case OptimizerKind::kNesterov:
      return {"momentum_buffer"};
    case OptimizerKind::kAdagrad:
      return {"sum"};
    case OptimizerKind::kAdam:
      return {"m", "v"};
    case OptimizerKind::kBfgs:
    case OptimizerKind::kDfp:
      return {"x_prev", "d_prev"};
    case OptimizerKind::kSgd:
      break;
  }
  return {};
}

// A count stored as one float (steps, skipped updates): a whole number in [0, 2^24].
int64_t storedCount(const ParamSet& state, const char* name) {
  const int i = state.find(name);
  ORPHEUS_CHECK_INPUT(i >= 0 && state[static_cast<size_t>(i)].size() == 1, "optimizer state lacks '{}'", name);
  const float v = state[static_cast<size_t>(i)](0, 0);
  ORPHEUS_CHECK_INPUT(v >= 0.0f && v <= static_cast<float>(kMaxStoredSteps) && v == std::floor(v),
                      "optimizer state '{}' is {}, not a count in [0, {}]", name, v, kMaxStoredSteps);
  return static_cast<int64_t>(v);
}

}  // namespace

double defaultLearningRate(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kMomentum:
    case OptimizerKind::kNesterov:
      return 0.1;
    case OptimizerKind::kAdagrad:
      return 0.1;
    case OptimizerKind::kAdam:
      return 1e-3;
    case OptimizerKind::kBfgs:
    case OptimizerKind::kDfp:
      return 1.0;
  }
  return 0.1;
}

double learningRate(const OptimizerSettings& s, uint64_t clock) {
  const auto c = static_cast<double>(clock);
  double factor = 1.0;
  switch (s.schedule) {
    case LrScheduleKind::kConstant:
      break;
    case LrScheduleKind::kStep:
      factor = std::pow(s.gamma, std::floor((c - 1.0) / static_cast<double>(std::max<int64_t>(s.stepEvery, 1))));
      break;
    case LrScheduleKind::kCosine: {
      const auto warmup = static_cast<double>(s.warmup);
      const double span = std::max(1.0, static_cast<double>(s.clocks) - warmup);
      const double into = std::clamp(c - 1.0 - warmup, 0.0, span);
      factor = 0.5 * (1.0 + std::cos(std::numbers::pi * into / span));
      break;
    }
  }
  if (s.warmup > 0 && clock <= static_cast<uint64_t>(s.warmup)) factor *= c / static_cast<double>(s.warmup);
  return s.lr * factor;
}

ops::OptimizerStep stepSettings(const OptimizerSettings& s, uint64_t clock, int64_t step) {
  using Kind = ops::OptimizerStep::Kind;
  ops::OptimizerStep st;
  switch (s.kind) {
    case OptimizerKind::kSgd: st.kind = Kind::kSgd; break;
    case OptimizerKind::kMomentum: st.kind = Kind::kMomentum; break;
    case OptimizerKind::kNesterov: st.kind = Kind::kNesterov; break;
    case OptimizerKind::kAdagrad: st.kind = Kind::kAdagrad; break;
    case OptimizerKind::kAdam: st.kind = Kind::kAdam; break;
    case OptimizerKind::kBfgs:
    case OptimizerKind::kDfp:
      throw Error("quasi-Newton steps are not whole-matrix steps");
  }
  const double lr = learningRate(s, clock);
  st.lr = static_cast<float>(lr);
  st.weightDecay = static_cast<float>(s.weightDecay);
  st.momentum = static_cast<float>(s.momentum);
  st.eps = static_cast<float>(s.eps);
  st.beta1 = static_cast<float>(s.beta1);
  st.beta2 = static_cast<float>(s.beta2);
  if (s.kind == OptimizerKind::kAdam) {
    const auto t = static_cast<double>(step);
    st.adamStepSize = static_cast<float>(lr / (1.0 - std::pow(s.beta1, t)));
    st.adamBc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, t)));
  }
  return st;
}

Optimizer::Optimizer(const OptimizerSettings& settings, const ParamSet& shapes) : settings_(settings) {
  for (const std::string& name : bufferNames(settings.kind)) buffers_.push_back({name, zerosLike(shapes)});
  if (isQuasiNewton(settings.kind)) {
    Eigen::Index n = 0;
    for (const Param& p : shapes.params) n += p.value.size();
    ORPHEUS_ENFORCE(n <= kQuasiNewtonMaxEntries, "--optimizer {}: {} parameter entries (at most {})",
                    settings.kind == OptimizerKind::kBfgs ? "bfgs" : "dfp", n, kQuasiNewtonMaxEntries);
    w_ = Matrix::Identity(n, n);
  }
}

std::vector<Matrix*> Optimizer::buffers() {
  std::vector<Matrix*> out;
  for (Buffer& b : buffers_) {
    for (Param& p : b.values.params) out.push_back(&p.value);
  }
  if (w_.size() > 0) out.push_back(&w_);
  return out;
}

void Optimizer::step(uint64_t clock, const ParamSet& gradient, ParamSet& params, const std::vector<Columns>* columns) {
  ORPHEUS_ENFORCE(gradient.size() == params.size(), "gradient of {} parameters for {}", gradient.size(), params.size());
  ++steps_;
  const OptimizerSettings& s = settings_;
  const auto wd = static_cast<float>(s.weightDecay);
  if (columns != nullptr) {
    ORPHEUS_ENFORCE(s.stepsTouchedColumns() && columns->size() == params.size(),
                    "a step over touched columns is for adagrad without weight decay");
    // Each visited column is one call of the whole step's arithmetic: the same bits.
    const ops::OptimizerStep kernel = stepSettings(s, clock, steps_);
    for (size_t i = 0; i < params.size(); ++i) {
      const Columns& cols = (*columns)[i];
      const int64_t rows = params[i].rows();
      const auto visit = [&](Eigen::Index j) {
        ops::cpu::applyOptimizerStep(kernel, rows, gradient[i].col(j).data(), params[i].col(j).data(),
                                     buffers_[0].values[i].col(j).data(), nullptr);
      };
      if (cols.all) {
        for (Eigen::Index j = 0; j < params[i].cols(); ++j) visit(j);
      } else {
        for (const int64_t j : cols.list) visit(static_cast<Eigen::Index>(j));
      }
    }
    return;
  }
  if (isQuasiNewton(s.kind)) {
    std::vector<Eigen::ArrayXXf> d;
    for (size_t i = 0; i < params.size(); ++i) {
      d.push_back(gradient[i].array());
      if (wd != 0.0f) d.back() += wd * params[i].array();
    }
    quasiNewtonStep(clock, d, params);
    return;
  }
  const ops::OptimizerStep st = stepSettings(s, clock, steps_);
  for (size_t i = 0; i < params.size(); ++i) {
    ORPHEUS_ENFORCE(gradient[i].size() == params[i].size(), "gradient {} has {} entries, its parameter {}", i,
                    gradient[i].size(), params[i].size());
    float* b0 = buffers_.size() > 0 ? buffers_[0].values[i].data() : nullptr;
    float* b1 = buffers_.size() > 1 ? buffers_[1].values[i].data() : nullptr;
    ops::cpu::applyOptimizerStep(st, params[i].size(), gradient[i].data(), params[i].data(), b0, b1);
  }
}

ops::OptimizerStep Optimizer::beginStep(uint64_t clock) {
  ORPHEUS_ENFORCE(!isQuasiNewton(settings_.kind), "a step by ranges is for the element-wise optimizers");
  ++steps_;
  return stepSettings(settings_, clock, steps_);
}

void Optimizer::stepRange(const ops::OptimizerStep& kernel, size_t i, int64_t offset, int64_t count,
                          const Matrix& gradient, Matrix& param) {
  ORPHEUS_ENFORCE(offset >= 0 && count >= 0 && offset + count <= param.size() && gradient.size() == param.size(),
                  "a step of {} elements at {} of a parameter of {}", count, offset, param.size());
  float* b0 = buffers_.size() > 0 ? buffers_[0].values[i].data() + offset : nullptr;
  float* b1 = buffers_.size() > 1 ? buffers_[1].values[i].data() + offset : nullptr;
  ops::cpu::applyOptimizerStep(kernel, count, gradient.data() + offset, param.data() + offset, b0, b1);
}

void Optimizer::quasiNewtonStep(uint64_t clock, const std::vector<Eigen::ArrayXXf>& d, ParamSet& params) {
  using Vec = Eigen::VectorXd;
  using Mat = Eigen::MatrixXd;
  const ops::QuasiNewtonMethod method = quasiNewtonMethod(settings_.kind);
  const Eigen::Index n = w_.rows();
  // Everything flattened, parameter after parameter, column-major.
  const auto flatten = [n](auto entryOf, size_t count) {
    Vec v(n);
    Eigen::Index at = 0;
    for (size_t i = 0; i < count; ++i) {
      const auto& m = entryOf(i);
      v.segment(at, m.size()) = m.reshaped().template cast<double>();
      at += m.size();
    }
    return v;
  };
  const Vec x = flatten([&](size_t i) -> const Matrix& { return params[i]; }, params.size());
  const Vec g = flatten([&](size_t i) -> const Eigen::ArrayXXf& { return d[i]; }, d.size());
  Mat w = w_.cast<double>();
  if (steps_ > 1) {
    const Vec s = x - flatten([&](size_t i) -> const Matrix& { return buffers_[0].values[i]; }, params.size());
    const Vec y = g - flatten([&](size_t i) -> const Matrix& { return buffers_[1].values[i]; }, params.size());
    const Vec h = w * y;
    const ops::QnUpdate update = ops::planQnUpdate(method, y.dot(s), y.squaredNorm(), s.squaredNorm(), y.dot(h),
                                                   firstQuasiNewtonUpdate());
    if (update.skip) {
      noteSkip();
    } else {
      if (update.scale != 1.0) w *= update.scale;
      ops::applySvUpdate(ops::qnSvsOf<double>(update, s, h), w);
      w_ = w.cast<float>();
      w = w_.cast<double>();  // the step uses W as stored: a replay from a snapshot takes the same step
    }
  }
  const Vec step = w * g;
  const double lr = learningRate(settings_, clock);
  Eigen::Index at = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    buffers_[0].values[i] = params[i];
    buffers_[1].values[i] = d[i].matrix();
    const Eigen::Index size = params[i].size();
    params[i].reshaped() = (x.segment(at, size) - lr * step.segment(at, size)).cast<float>();
    at += size;
  }
}

ParamSet Optimizer::exportState() const {
  ParamSet out;
  if (!hasState()) return out;
  for (const Buffer& b : buffers_) {
    for (const Param& p : b.values.params) out.params.push_back({kStatePrefix + p.name + "/" + b.name, p.value});
  }
  ORPHEUS_ENFORCE(steps_ <= kMaxStoredSteps, "{} optimizer steps cannot be stored (at most {})", steps_,
                  kMaxStoredSteps);
  if (w_.size() > 0) {
    out.params.push_back({kQnWName, w_});
    out.params.push_back({kQnSkipsName, Matrix::Constant(1, 1, static_cast<float>(skips_))});
  }
  Matrix steps(1, 1);
  steps(0, 0) = static_cast<float>(steps_);
  out.params.push_back({kStepsName, steps});
  return out;
}

void Optimizer::importState(const ParamSet& state) {
  if (!hasState()) return;
  for (Buffer& b : buffers_) {
    for (Param& p : b.values.params) {
      const std::string name = kStatePrefix + p.name + "/" + b.name;
      const int i = state.find(name);
      ORPHEUS_CHECK_INPUT(i >= 0, "optimizer state lacks '{}'", name);
      const Matrix& v = state[static_cast<size_t>(i)];
      ORPHEUS_CHECK_INPUT(v.rows() == p.value.rows() && v.cols() == p.value.cols(),
                          "optimizer state '{}' is {}x{}, the parameter is {}x{}", name, v.rows(), v.cols(),
                          p.value.rows(), p.value.cols());
      p.value = v;
    }
  }
  if (w_.size() > 0) {
    int wi = state.find(kQnWName);
    const bool legacy = wi < 0 && state.find(kQnLegacyWName) >= 0;
    if (legacy) wi = state.find(kQnLegacyWName);
    ORPHEUS_CHECK_INPUT(wi >= 0, "optimizer state lacks '{}'", kQnWName);
    const Matrix& w = state[static_cast<size_t>(wi)];
    ORPHEUS_CHECK_INPUT(w.rows() == w_.rows() && w.cols() == w_.cols(), "optimizer state '{}' is {}x{}, expected {}x{}",
                        legacy ? kQnLegacyWName : kQnWName, w.rows(), w.cols(), w_.rows(), w_.cols());
    w_ = w;
    if (legacy && settings_.kind == OptimizerKind::kBfgs) {
      const Eigen::LLT<Eigen::MatrixXd> factor(w.cast<double>());
      ORPHEUS_CHECK_INPUT(factor.info() == Eigen::Success, "optimizer state '{}' is not positive definite",
                          kQnLegacyWName);
      w_ = factor.solve(Eigen::MatrixXd::Identity(w.rows(), w.cols())).cast<float>();
    }
    skips_ = storedCount(state, kQnSkipsName);
  }
  steps_ = storedCount(state, kStepsName);
}

ReplicaUpdater::ReplicaUpdater(const OptimizerSettings& settings, const ops::Model& model, ops::Backend& backend)
    : model_(model), backend_(backend), optimizer_(settings, model.zeroParams()) {
  for (const auto& [rows, cols] : model.paramShapes()) weightBytes_ += static_cast<size_t>(rows * cols) * sizeof(float);
  if (!settings.foldsLearningRate()) gradient_ = model.zeroParams();
  if (settings.stepsTouchedColumns()) {
    touched_.assign(gradient_.size(), Optimizer::Columns{false, {}});
    for (const Param& p : gradient_.params) touchedMask_.emplace_back(static_cast<size_t>(p.value.cols()), 0);
  }
}

// W += U C V^T changes the columns of W that are rows of V with a nonzero: for a
// sparse V only those; a dense V and a bias touch every column.
void ReplicaUpdater::noteTouched(std::span<const SvBatchView* const> batches) {
  for (const SvBatchView* b : batches) {
    for (const SvMatrixView& m : b->matrices) {
      Optimizer::Columns& cols = touched_[m.paramId];
      if (m.biasId >= 0) touched_[static_cast<size_t>(m.biasId)].all = true;
      if (cols.all) continue;
      if (!m.sparseV) {
        cols.all = true;
        continue;
      }
      std::vector<char>& mask = touchedMask_[m.paramId];
      const Eigen::Map<const SparseMatrix> v = m.vSparseMap();
      for (Eigen::Index k = 0; k < v.outerSize(); ++k) {
        for (Eigen::Map<const SparseMatrix>::InnerIterator it(v, k); it; ++it) {
          if (mask[static_cast<size_t>(it.row())] == 0) {
            mask[static_cast<size_t>(it.row())] = 1;
            cols.list.push_back(it.row());
          }
        }
      }
    }
  }
}

void ReplicaUpdater::clearGradient() {
  if (touched_.empty()) {
    for (Param& p : gradient_.params) p.value.setZero();
    return;
  }
  for (size_t i = 0; i < gradient_.size(); ++i) {
    Optimizer::Columns& cols = touched_[i];
    if (cols.all) {
      gradient_[i].setZero();
      std::fill(touchedMask_[i].begin(), touchedMask_[i].end(), 0);
    } else {
      for (const int64_t j : cols.list) {
        gradient_[i].col(static_cast<Eigen::Index>(j)).setZero();
        touchedMask_[i][static_cast<size_t>(j)] = 0;
      }
    }
    cols = Optimizer::Columns{false, {}};
  }
}

float ReplicaUpdater::coefficientScale(uint64_t clock, double heard) const {
  const OptimizerSettings& s = optimizer_.settings();
  // Folding with a constant schedule: the factor the engine always used, bit for bit.
  if (s.foldsLearningRate()) return static_cast<float>(-learningRate(s, clock) / heard);
  return static_cast<float>(1.0 / heard);
}

void ReplicaUpdater::applyGroup(uint64_t clock, std::span<const SvBatch* const> batches, ParamSet& params) {
  std::vector<SvBatchView> views;
  views.reserve(batches.size());
  for (const SvBatch* b : batches) views.push_back(viewOf(*b));
  std::vector<const SvBatchView*> pointers;
  for (const SvBatchView& v : views) pointers.push_back(&v);
  applyGroup(clock, pointers, params);
}

ReplicaUpdater::~ReplicaUpdater() = default;

void ReplicaUpdater::reside(const ParamSet& params, bool stagedUploads) {
  device_ = std::make_unique<DeviceReplica>(backend_, params, optimizer_, stagedUploads);
}

std::span<const ops::Tensor> ReplicaUpdater::deviceParams(ParamSet& params) {
  ORPHEUS_ENFORCE(device_ != nullptr, "the replica is not on a device");
  return device_->params(params, optimizer_);
}

void ReplicaUpdater::toHost(ParamSet& params) {
  if (device_ != nullptr) device_->toHost(params, optimizer_);
}

void ReplicaUpdater::hostChanged() {
  localOnDevice_.clear();  // a replaced replica: its clock's local batch is not applied
  if (device_ != nullptr) device_->hostChanged();
}

void ReplicaUpdater::applyGroup(uint64_t clock, std::span<const SvBatchView* const> batches, ParamSet& params) {
  const uint64_t before = backend_.transfers().toDevice;
  applyGroupOn(clock, batches, params);
  rebuildToDevice_ += backend_.transfers().toDevice - before;
}

void ReplicaUpdater::applyGroupOn(uint64_t clock, std::span<const SvBatchView* const> batches, ParamSet& params) {
  if (device_ != nullptr) {
    const bool folds = optimizer_.settings().foldsLearningRate();
    if (!folds && pendingClock_ != 0 && pendingClock_ != clock) finishClock(params);
    device_->rebuild(batches, !folds, params, optimizer_, localOnDevice_);
    if (!folds) pendingClock_ = clock;
    return;
  }
  if (optimizer_.settings().foldsLearningRate()) {
    model_.computeUpdate(batches, params, backend_, rebuild_);
    trimBuffers();
    return;
  }
  if (pendingClock_ != 0 && pendingClock_ != clock) finishClock(params);
  model_.computeUpdate(batches, gradient_, backend_, rebuild_);
  trimBuffers();
  if (!touched_.empty()) noteTouched(batches);
  pendingClock_ = clock;
}

// The rebuild's operands grow with the SVGs of a group (B (Q + 1) columns) and are
// kept for the next clock, unless they outgrow the parameters and kRebuildKeepBytes:
// then they go, so that a process running many workers (simulate, P in the
// thousands under broadcast) holds one group's operands per running worker, not P.
void ReplicaUpdater::trimBuffers() {
  constexpr size_t kRebuildKeepBytes = size_t{8} << 20;
  size_t kept = static_cast<size_t>(rebuild_.v.size());
  for (const Matrix& u : rebuild_.u) kept += static_cast<size_t>(u.size());
  kept *= sizeof(float);
  if (kept > kRebuildKeepBytes && kept > weightBytes_) {
    ops::DeviceOperands device = std::move(rebuild_.device);  // a device's buffers stay: no allocation per clock
    rebuild_ = {};
    rebuild_.device = std::move(device);
  }
}

template <class Gradient>
void ReplicaUpdater::applyDenseOnDevice(uint64_t clock, const Gradient& gradient, float scale, ParamSet& params) {
  if (optimizer_.settings().foldsLearningRate()) {
    device_->addScaled(gradient, scale, params, optimizer_);
    return;
  }
  finishClock(params);
  device_->loadGradient(gradient, scale, params, optimizer_);
  device_->step(clock, params, optimizer_);  // a dense gradient: every column
}

void ReplicaUpdater::applyDense(uint64_t clock, ParamSet& gradient, float scale, ParamSet& params) {
  if (device_ != nullptr) {
    applyDenseOnDevice(clock, gradient, scale, params);
    return;
  }
  if (optimizer_.settings().foldsLearningRate()) {
    for (size_t i = 0; i < params.size(); ++i) params[i].noalias() += scale * gradient[i];
    return;
  }
  finishClock(params);
  for (Param& p : gradient.params) p.value *= scale;
  optimizer_.step(clock, gradient, params);  // a dense gradient: every column
}

void ReplicaUpdater::applyDense(uint64_t clock, std::span<const ops::Tensor> gradient, float scale,
                                ParamSet& params) {
  ORPHEUS_ENFORCE(device_ != nullptr, "applyDense from device tensors needs a resident replica");
  applyDenseOnDevice(clock, gradient, scale, params);
}

void ReplicaUpdater::applyLastGroup(uint64_t clock, std::span<const SvBatchView* const> batches,
                                    ParamSet& params) {
  const OptimizerSettings& s = optimizer_.settings();
  if (device_ != nullptr || s.foldsLearningRate() || isQuasiNewton(s.kind) || !touched_.empty() ||
      backend_.device() != ops::Device::kCpu || batches.empty()) {
    if (!batches.empty()) applyGroup(clock, batches, params);
    finishClock(params);
    return;
  }
  if (pendingClock_ != 0 && pendingClock_ != clock) finishClock(params);
  // A tile of the gradient (with the parameter's and the state's tiles beside it) that stays in L2.
  constexpr int64_t kTileFloats = 32 << 10;
  const ops::OptimizerStep kernel = optimizer_.beginStep(clock);
  const auto stepTile = [&](size_t i, int64_t offset, int64_t count) {
    optimizer_.stepRange(kernel, i, offset, count, gradient_[i], params[i]);
    std::fill_n(gradient_[i].data() + offset, count, 0.0f);
  };
  std::vector<bool>& stepped = steppedParams_;
  ops::applySvBatches(batches, gradient_, backend_, rebuild_, kTileFloats, stepTile, stepped);
  trimBuffers();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!stepped[i]) stepTile(i, 0, params[i].size());
  }
  pendingClock_ = 0;
}

void ReplicaUpdater::finishClock(ParamSet& params) {
  if (pendingClock_ == 0) return;
  if (device_ != nullptr) {
    device_->step(pendingClock_, params, optimizer_);
    pendingClock_ = 0;
    return;
  }
  optimizer_.step(pendingClock_, gradient_, params, touched_.empty() ? nullptr : &touched_);
  clearGradient();
  pendingClock_ = 0;
}

void ReplicaUpdater::discardPending() {
  localOnDevice_.clear();
  if (device_ != nullptr) device_->zeroGradient();
  if (!touched_.empty()) {
    for (Optimizer::Columns& cols : touched_) cols.all = true;
  }
  clearGradient();
  pendingClock_ = 0;
}

ParamSet ReplicaUpdater::peek(const ParamSet& params) const {
  ParamSet out = params;
  if (pendingClock_ == 0) return out;
  Optimizer copy = optimizer_;
  if (device_ != nullptr) {
    // The mirrors are current (toHost before a peek); the pending gradient is on the device.
    ParamSet gradient = model_.zeroParams();
    device_->gradientToHost(gradient);
    copy.step(pendingClock_, gradient, out);
    return out;
  }
  copy.step(pendingClock_, gradient_, out);
  return out;
}

ParamSet withState(const ParamSet& params, const ParamSet& state) {
  ParamSet out = params;
  for (const Param& p : state.params) out.params.push_back(p);
  return out;
}

ParamSet snapshotShapes(const ParamSet& params, const OptimizerSettings& settings) {
  ParamSet zeros = params;
  for (Param& p : zeros.params) p.value.setZero();
  ParamSet out = withState(params, Optimizer(settings, zeros).stateShapes());
  if (settings.outerMomentumInSnapshots) out = withState(out, OuterStep::momentumShapes(params));
  return out;
}

std::pair<ParamSet, ParamSet> splitState(ParamSet combined, size_t paramCount) {
  ORPHEUS_ENFORCE(combined.size() >= paramCount, "{} entries for {} parameters", combined.size(), paramCount);
  ParamSet state;
  state.params.assign(std::make_move_iterator(combined.params.begin() + static_cast<ptrdiff_t>(paramCount)),
                      std::make_move_iterator(combined.params.end()));
  combined.params.resize(paramCount);
  return {std::move(combined), std::move(state)};
}

}  // namespace orpheus::engine
