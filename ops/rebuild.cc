#include "ops/rebuild.h"

#include "engine/base/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/operators.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <vector>

namespace orpheus::ops {
namespace {

using Piece = RebuildPiece;

// dst = U diag(c) or U core.
template <class Dst>
void weightColumns(const SvMatrixView& m, const float* coeffs, Dst&& dst) {
  if (m.withCore) {
    dst.noalias() = m.uMap() * m.coreMap();
  } else {
    dst.noalias() = m.uMap() * Eigen::Map<const Vector>(coeffs, m.columns).asDiagonal();
  }
}

// Whether a rebuild on `backend` stages its host operands (DeviceOperands::staged).
bool staged(const Backend& backend, const DeviceOperands& d) { return d.staged && backend.device() != Device::kCpu; }

// W += [U_1 C_1, ...] [V_1, ...]^T: one GEMM for the dense V's, one sparse product for
// the sparse ones. `u` holds the weighted columns, the dense pieces' first. Gathering
// the V's costs O(K n) copies against the O(J K n) product; a single dense piece's V
// is used where it lies.
class ParamRebuild {
 public:
  ParamRebuild(const std::vector<Piece>& pieces, const Matrix& u, int64_t denseCols, Matrix& gathered)
      : pieces_(pieces), u_(u), denseCols_(denseCols), gathered_(gathered) {}

  // The dense pieces' V (K x denseCols), gathered when there are several.
  Tensor denseV(int64_t k) {
    int64_t densePieces = 0;
    for (const auto& p : pieces_) densePieces += p.m->sparseV ? 0 : 1;
    if (densePieces == 1) {
      for (const auto& p : pieces_) {
        if (!p.m->sparseV) return Tensor::host(p.m->vDense, k, denseCols_);
      }
    }
    gathered_.resize(k, denseCols_);
    for (const auto& p : pieces_) {
      if (!p.m->sparseV) gathered_.middleCols(p.at, p.m->columns) = p.m->vDenseMap();
    }
    return cpu::view(gathered_);
  }

  // Not staged: the operands of the columns [first, first + cols) (the dense
  // pieces', or the sparse ones') on the backend's device: their weighted columns
  // in `uStore` and, when `vStore` is given (the dense pieces), their V in it. What
  // lies in host memory is copied in (one copy per V and per run of U C); what lies
  // on the device already is gathered by one copyParts (`parts`: reused storage).
  std::pair<Tensor, Tensor> upload(Backend& backend, Tensor& uStore, Tensor* vStore, int64_t first, int64_t cols,
                                   int64_t k, std::vector<CopyPart>& parts) const {
    Tensor u = deviceBuffer(backend, uStore, u_.rows(), cols);
    Tensor v = vStore != nullptr ? deviceBuffer(backend, *vStore, k, cols) : Tensor();
    parts.clear();
    if (vStore != nullptr) {
      visitDenseV(
          k, [&](const Tensor& host, int64_t at) { copyInto(backend, host, v.middleCols(at, host.cols())); },
          [&](const Tensor& device, int64_t at) {
            parts.push_back(copied(device, v.middleCols(at, device.cols())));
          });
    }
    visitU(
        first, cols, [&](int64_t from, int64_t n) { copyInto(backend, uPart(from, n), u.middleCols(from - first, n)); },
        [&](const Piece& p, float c) { parts.push_back(scaled(p, c, u.middleCols(p.at - first, p.m->columns))); });
    backend.copyParts(parts);
    return {std::move(u), std::move(v)};
  }

  // Staged: the host operands' columns of `u` (U C, all columns) and `v` (the dense
  // V's) handed to `put(host, device columns)`, in the order the blocking path
  // copies them.
  template <class Put>
  void hostOperands(Tensor& u, Tensor& v, int64_t k, Put&& put) const {
    visitDenseV(k, [&](const Tensor& host, int64_t at) { put(host, v.middleCols(at, host.cols())); },
                [](const Tensor&, int64_t) {});
    for (const auto& [first, cols] : {std::pair{int64_t{0}, denseCols_}, std::pair{denseCols_, sparseCols()}}) {
      visitU(first, cols, [&](int64_t from, int64_t n) { put(uPart(from, n), u.middleCols(from, n)); },
             [](const Piece&, float) {});
    }
  }

  // Staged: the parts that copy the operands already on the device (and scale
  // their U) into their columns of `u` and `v`, appended to `parts`.
  void deviceParts(const Tensor& u, const Tensor& v, int64_t k, std::vector<CopyPart>& parts) const {
    visitDenseV(k, [](const Tensor&, int64_t) {},
                [&](const Tensor& device, int64_t at) {
                  parts.push_back(copied(device, v.middleCols(at, device.cols())));
                });
    visitU(0, u_.cols(), [](int64_t, int64_t) {},
           [&](const Piece& p, float c) { parts.push_back(scaled(p, c, u.middleCols(p.at, p.m->columns))); });
  }

  // Bytes of the host operands (hostOperands).
  size_t hostBytes(int64_t k) const {
    int64_t floats = 0;
    visitDenseV(k, [&](const Tensor& host, int64_t) { floats += host.size(); }, [](const Tensor&, int64_t) {});
    for (const auto& [first, cols] : {std::pair{int64_t{0}, denseCols_}, std::pair{denseCols_, sparseCols()}}) {
      visitU(first, cols, [&](int64_t, int64_t n) { floats += u_.rows() * n; }, [](const Piece&, float) {});
    }
    return static_cast<size_t>(floats) * sizeof(float);
  }

  // The sparse pieces' V (K x sparseCols), compressed by columns.
  SparseMatrix sparseV(int64_t k) const {
    SparseMatrix v(k, u_.cols() - denseCols_);
    int64_t nnz = 0;
    for (const auto& p : pieces_) {
      if (p.m->sparseV) nnz += p.m->vSparseMap().nonZeros();
    }
    v.reserve(nnz);
    for (const auto& p : pieces_) {
      if (!p.m->sparseV) continue;
      const int64_t at = p.at - denseCols_;
      const Eigen::Map<const SparseMatrix> pv = p.m->vSparseMap();
      for (int64_t j = 0; j < p.m->columns; ++j) {
        v.startVec(static_cast<int32_t>(at + j));
        for (Eigen::Map<const SparseMatrix>::InnerIterator it(pv, j); it; ++it) {
          v.insertBack(it.row(), at + j) = it.value();
        }
      }
    }
    v.finalize();
    v.makeCompressed();
    return v;
  }

  // The one coefficient of a piece whose U is on the device, or null.
  static const float* uniformCoefficient(const Piece& p) {
    if (p.onDevice == nullptr || p.onDevice->u == nullptr || p.m->withCore || p.m->columns == 0) return nullptr;
    return oneCoefficient(p.coeffs, p.m->columns) ? p.coeffs : nullptr;
  }

  // The dense pieces' V in column order: host(V, at) for a V in host memory,
  // device(V, at) for one on the device.
  template <class Host, class Device>
  void visitDenseV(int64_t k, Host&& host, Device&& device) const {
    for (const auto& p : pieces_) {
      if (p.m->sparseV) continue;
      if (p.onDevice != nullptr && p.onDevice->vDense != nullptr) {
        device(*p.onDevice->vDense, p.at);
      } else {
        host(Tensor::host(p.m->vDense, k, p.m->columns), p.at);
      }
    }
  }

  // The weighted columns [first, first + cols) in column order: host(from, n) for
  // each run copied from the host's U C, device(piece, c) for each piece whose U
  // is on the device with the one coefficient c.
  template <class Host, class Device>
  void visitU(int64_t first, int64_t cols, Host&& host, Device&& device) const {
    int64_t from = first;  // the host run not visited yet: [from, at)
    for (const auto& p : pieces_) {
      const float* c = uniformCoefficient(p);
      if (c == nullptr || p.at < first || p.at >= first + cols) continue;
      if (p.at > from) host(from, p.at - from);
      device(p, *c);
      from = p.at + p.m->columns;
    }
    if (first + cols > from) host(from, first + cols - from);
  }

  static void copyInto(Backend& backend, const Tensor& src, Tensor dst) { backend.copy(src, dst); }
  static CopyPart copied(const Tensor& device, Tensor dst) { return CopyPart{viewOf(device), std::move(dst)}; }
  static CopyPart scaled(const Piece& p, float c, Tensor dst) {
    return CopyPart{viewOf(*p.onDevice->u), std::move(dst), true, c};
  }
  static Tensor viewOf(const Tensor& t) { return Tensor::view(t.device(), t.data(), t.rows(), t.cols()); }

  Tensor uPart(int64_t first, int64_t cols) const {
    return Tensor::host(u_.data() + u_.rows() * first, u_.rows(), cols);
  }
  int64_t denseCols() const { return denseCols_; }
  int64_t sparseCols() const { return u_.cols() - denseCols_; }

 private:
  const std::vector<Piece>& pieces_;
  const Matrix& u_;
  int64_t denseCols_;
  Matrix& gathered_;
};

// On the CPU backend: the products run on the operands where they lie.
void applyOnHost(ParamRebuild& r, Matrix& w, Backend& backend) {
  Tensor target = cpu::view(w);
  if (r.denseCols() > 0) {
    backend.gemm(Trans::kNo, Trans::kYes, 1.0f, r.uPart(0, r.denseCols()), r.denseV(w.cols()), 1.0f, target);
  }
  if (r.sparseCols() > 0) {
    const SparseMatrix v = r.sparseV(w.cols());
    backend.gemmSparse(1.0f, r.uPart(r.denseCols(), r.sparseCols()), cpu::view(v), Trans::kYes, 1.0f, target);
  }
}

// `param`'s W slot on the device, (re)allocated at W's shape.
Tensor& deviceParam(Backend& backend, DeviceOperands& d, size_t param, const Matrix& w) {
  if (d.w.size() <= param) d.w.resize(param + 1);
  Tensor& t = d.w[param];
  if (t.rows() != w.rows() || t.cols() != w.cols() || t.device() != backend.device()) {
    t = backend.allocate(w.rows(), w.cols());
  }
  return t;
}

// Staged uploads (DeviceOperands::staged): every parameter's host operands
// queued to its own device buffers through the staging buffer, before any product.
// `rebuilds` and `k` (each parameter's V rows) are indexed by parameter; a null
// rebuild has no pieces.
void stageUploads(std::span<ParamRebuild* const> rebuilds, std::span<const int64_t> k, std::span<const int64_t> rows,
                  Backend& backend, DeviceOperands& d) {
  // The sparse V's, compressed on the host, and the bias updates formed there.
  std::vector<SparseMatrix> sparse(rebuilds.size());
  size_t bytes = d.biasHost.size() * sizeof(float);
  for (size_t i = 0; i < rebuilds.size(); ++i) {
    if (rebuilds[i] == nullptr) continue;
    bytes += rebuilds[i]->hostBytes(k[i]);
    if (rebuilds[i]->sparseCols() > 0) {
      sparse[i] = rebuilds[i]->sparseV(k[i]);
      bytes += stagedSparseBytes(backend, sparse[i]);
    }
  }
  // The copies that read the buffer last (the previous rebuild's) land before it is written.
  d.staging.begin(backend, bytes);
  d.stagedU.resize(rebuilds.size());
  d.stagedV.resize(rebuilds.size());
  d.stagedSparseV.resize(rebuilds.size());
  d.landed.assign(rebuilds.size(), Event());
  d.biasLanded = Event();
  if (!d.biasHost.empty()) {
    Tensor to = deviceBuffer(backend, d.stagedBias, static_cast<int64_t>(d.biasHost.size()), 1);
    d.biasLanded = d.staging.up(d.biasHost.data(), to);
  }
  for (size_t i = 0; i < rebuilds.size(); ++i) {
    ParamRebuild* r = rebuilds[i];
    if (r == nullptr) continue;
    Tensor u = deviceBuffer(backend, d.stagedU[i], rows[i], r->denseCols() + r->sparseCols());
    Tensor v = deviceBuffer(backend, d.stagedV[i], k[i], r->denseCols());
    // Operands whose columns follow each other in `u` or `v` (their pieces next
    // to each other in the batch order) lie back to back in the staging buffer
    // too: they cross in one copy.
    size_t runAt = 0;
    float* runStart = nullptr;
    int64_t runRows = 0, runCols = 0;
    const auto flush = [&] {
      if (runCols == 0) return;
      Tensor columns = Tensor::view(backend.device(), runStart, runRows, runCols);
      d.landed[i] = d.staging.up(runAt, columns);
      runCols = 0;
    };
    r->hostOperands(u, v, k[i], [&](const Tensor& host, const Tensor& columns) {
      const size_t n = static_cast<size_t>(host.size()) * sizeof(float);
      if (n == 0) return;
      // Within one of the two buffers: two allocations may also lie back to back.
      const float* base = columns.data() >= u.data() && columns.data() < u.data() + u.size() ? u.data() : v.data();
      const float* runBase = runStart >= u.data() && runStart < u.data() + u.size() ? u.data() : v.data();
      const bool follows = runCols > 0 && base == runBase && columns.rows() == runRows &&
                           columns.data() == runStart + runRows * runCols;
      const size_t at = d.staging.reserve(n);  // right after the run's last operand
      if (!follows) {
        flush();
        runAt = at;
        runStart = columns.data();
        runRows = columns.rows();
      }
      std::memcpy(d.staging.data(at), host.data(), n);
      runCols += columns.cols();
    });
    flush();
    if (r->sparseCols() > 0) d.landed[i] = stageSparse(backend, sparse[i], d.staging, d.stagedSparseV[i]);
  }
}

// target += the products of parameter `param`, on the device from its staged
// buffers: ordered after its copies (the host goes on), the operands on the
// device copied in there.
void stagedProducts(ParamRebuild& r, size_t param, Tensor& target, Backend& backend, DeviceOperands& d) {
  ORPHEUS_ENFORCE(param < d.landed.size(), "parameter #{} has no staged operands", param);
  backend.waitOnDevice(d.landed[param]);
  const int64_t k = target.cols();
  Tensor u = Tensor::view(backend.device(), d.stagedU[param].data(), target.rows(), r.denseCols() + r.sparseCols());
  Tensor v = Tensor::view(backend.device(), d.stagedV[param].data(), k, r.denseCols());
  d.parts.clear();
  r.deviceParts(u, v, k, d.parts);
  backend.copyParts(d.parts);
  if (r.denseCols() > 0) backend.gemm(Trans::kNo, Trans::kYes, 1.0f, u.middleCols(0, r.denseCols()), v, 1.0f, target);
  if (r.sparseCols() > 0) {
    backend.gemmSparse(1.0f, u.middleCols(r.denseCols(), r.sparseCols()), d.stagedSparseV[param].view, Trans::kYes,
                       1.0f, target);
  }
}

// target += the products, on the device: U and V in the persistent buffers.
void productsOnDevice(ParamRebuild& r, size_t param, Tensor& target, Backend& backend, DeviceOperands& d) {
  if (staged(backend, d)) {
    stagedProducts(r, param, target, backend, d);
    return;
  }
  if (r.denseCols() > 0) {
    const auto [u, v] = r.upload(backend, d.u, &d.v, 0, r.denseCols(), target.cols(), d.parts);
    backend.gemm(Trans::kNo, Trans::kYes, 1.0f, u, v, 1.0f, target);
  }
  if (r.sparseCols() > 0) {
    const SparseMatrix host = r.sparseV(target.cols());
    backend.copySparse(cpu::view(host), d.sparseV);
    const auto [u, v] = r.upload(backend, d.u, nullptr, r.denseCols(), r.sparseCols(), target.cols(), d.parts);
    backend.gemmSparse(1.0f, u, d.sparseV.view, Trans::kYes, 1.0f, target);
  }
}

// On a device: W copied into its buffer, the products there, W back.
void applyOnDevice(ParamRebuild& r, Matrix& w, size_t param, Backend& backend, DeviceOperands& d) {
  Tensor& target = deviceParam(backend, d, param, w);
  Tensor host = cpu::view(w);
  backend.copy(host, target);
  productsOnDevice(r, param, target, backend, d);
  backend.copy(target, host);
}

std::vector<SvBatchView> viewsOf(std::span<const SvBatch* const> batches, std::vector<const SvBatchView*>& pointers) {
  std::vector<SvBatchView> views;
  views.reserve(batches.size());
  for (const SvBatch* b : batches) views.push_back(viewOf(*b));
  for (const SvBatchView& v : views) pointers.push_back(&v);
  return views;
}

}  // namespace

void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w) {
  cpu::CpuBackend backend;
  applySvBatches(batches, w, backend);
}

void applySvBatches(std::span<const SvBatch* const> batches, ParamSet& w, Backend& backend) {
  std::vector<const SvBatchView*> pointers;
  const std::vector<SvBatchView> views = viewsOf(batches, pointers);
  RebuildBuffers buffers;
  applySvBatches(pointers, w, backend, buffers);
}

void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, RebuildBuffers& buffers) {
  cpu::CpuBackend backend;
  applySvBatches(batches, w, backend, buffers);
}

namespace {

// Where a rebuild writes: the host parameters (their products on the CPU backend
// where they lie, or through a device's buffers), or tensors on the backend's
// device (a resident replica).
class HostTargets {
 public:
  explicit HostTargets(ParamSet& w) : w_(w) {}
  // A gradient whose parameters are stepped tile by tile as their rebuild ends.
  HostTargets(ParamSet& w, int64_t tileFloats, const GradientStep& step, std::vector<bool>& stepped)
      : w_(w), tileFloats_(tileFloats), step_(&step), stepped_(&stepped) {
    stepped.assign(w.size(), false);
  }
  size_t size() const { return w_.size(); }
  int64_t rows(size_t i) const { return w_[i].rows(); }
  int64_t cols(size_t i) const { return w_[i].cols(); }
  const std::string& name(size_t i) const { return w_.params[i].name; }
  static constexpr bool kOnDevice = false;
  void addBias(size_t i, const Vector& delta, Backend&, DeviceOperands&) { w_[i].col(0) += delta; }
  void applyBiases(Backend&, DeviceOperands&) {}
  void apply(size_t i, ParamRebuild& r, Backend& backend, DeviceOperands& d) {
    if (backend.device() != Device::kCpu) {
      applyOnDevice(r, w_[i], i, backend, d);
    } else if (step_ == nullptr || r.sparseCols() > 0 || !applyStepping(i, r)) {
      applyOnHost(r, w_[i], backend);
    }
  }

 private:
  bool applyStepping(size_t i, ParamRebuild& r) {
    Matrix& w = w_[i];
    const int64_t rows = w.rows();
    Tensor target = cpu::view(w);
    const bool done = cpu::gemmByColumnTiles(
        r.uPart(0, r.denseCols()), r.denseV(w.cols()), target, tileFloats_ / std::max<int64_t>(1, rows),
        [&](int64_t first, int64_t cols) { (*step_)(i, first * rows, cols * rows); });
    (*stepped_)[i] = done;
    return done;
  }

  ParamSet& w_;
  int64_t tileFloats_ = 0;
  const GradientStep* step_ = nullptr;
  std::vector<bool>* stepped_ = nullptr;
};

class DeviceTargets {
 public:
  explicit DeviceTargets(std::span<Tensor> w) : w_(w) {}
  size_t size() const { return w_.size(); }
  int64_t rows(size_t i) const { return w_[i].rows(); }
  int64_t cols(size_t i) const { return w_[i].cols(); }
  std::string name(size_t i) const { return fmt::format("#{}", i); }
  static constexpr bool kOnDevice = true;
  // The bias's delta uploaded and added where the bias lies (y += 1 * x: the host's
  // sum). Staged: kept, to cross with the rebuild's other operands (applyBiases).
  void addBias(size_t i, const Vector& delta, Backend& backend, DeviceOperands& d) {
    if (staged(backend, d)) {
      d.biasOps.push_back({i, false, 0, d.biasHost.size(), delta.size()});
      d.biasHost.insert(d.biasHost.end(), delta.data(), delta.data() + delta.size());
      return;
    }
    const Tensor t = uploaded(backend, d.bias, Tensor::host(delta.data(), delta.size(), 1));
    backend.axpy(1.0f, t, w_[i]);
  }
  // The same from a piece whose U lies on the device with the one coefficient c: its
  // delta (U c) 1 formed there, as the host forms it (each product, then the row
  // sums). Staged: the row sums of the piece's columns U c, which its parameter's
  // products gather (stagedProducts), once they have (applyBiases).
  void addBias(size_t i, const Piece& p, float c, Backend& backend, DeviceOperands& d) {
    if (staged(backend, d)) {
      DeviceOperands::BiasOp op;
      op.param = i;
      op.fromDevice = true;
      op.uParam = p.m->paramId;
      op.at = static_cast<size_t>(p.at);
      op.count = p.m->columns;
      d.biasOps.push_back(op);
      return;
    }
    addDeviceBias(i, *p.onDevice->u, c, backend, d);
  }
  // Staged, after the products: each bias's updates added in batch order by one
  // addInOrder, those formed on the device summed from their weighted columns
  // first, those formed on the host once their copy landed.
  void applyBiases(Backend& backend, DeviceOperands& d) {
    if (d.biasOps.empty()) return;
    if (!d.biasLanded.empty()) backend.waitOnDevice(d.biasLanded);
    int64_t deviceRows = 0;
    for (const DeviceOperands::BiasOp& op : d.biasOps) deviceRows += op.fromDevice ? w_[op.param].rows() : 0;
    Tensor sums = deviceBuffer(backend, d.biasU, deviceRows, 1);
    std::vector<Tensor> deltas;
    deltas.reserve(d.biasOps.size());
    int64_t sumAt = 0;
    for (const DeviceOperands::BiasOp& op : d.biasOps) {
      const int64_t rows = w_[op.param].rows();
      if (op.fromDevice) {
        const Tensor columns =
            Tensor::view(backend.device(), d.stagedU[op.uParam].data() + op.at * rows, rows, op.count);
        deltas.push_back(Tensor::view(backend.device(), sums.data() + sumAt, rows, 1));
        backend.sumColumns(columns, 0.0f, deltas.back());
        sumAt += rows;
      } else {
        deltas.push_back(Tensor::view(backend.device(), d.stagedBias.data() + op.at, op.count, 1));
      }
    }
    std::vector<const Tensor*> terms;
    std::vector<bool> done(d.biasOps.size(), false);
    for (size_t first = 0; first < d.biasOps.size(); ++first) {
      if (done[first]) continue;
      terms.clear();
      for (size_t j = first; j < d.biasOps.size(); ++j) {
        if (d.biasOps[j].param != d.biasOps[first].param) continue;
        terms.push_back(&deltas[j]);
        done[j] = true;
      }
      backend.addInOrder(terms, w_[d.biasOps[first].param]);
    }
  }
  void apply(size_t i, ParamRebuild& r, Backend& backend, DeviceOperands& d) {
    Tensor& target = w_[i];
    ORPHEUS_ENFORCE(target.device() == backend.device(), "parameter #{} is on {}, the rebuild on {}", i,
                    deviceName(target.device()), backend.name());
    productsOnDevice(r, i, target, backend, d);
  }

 private:
  void addDeviceBias(size_t i, const Tensor& u, float c, Backend& backend, DeviceOperands& d) {
    Tensor scaled = deviceBuffer(backend, d.biasU, u.rows(), u.cols());
    scaledCopy(backend, u, c, scaled);
    Tensor delta = deviceBuffer(backend, d.bias, u.rows(), 1);
    backend.sumColumns(scaled, 0.0f, delta);
    backend.axpy(1.0f, delta, w_[i]);
  }

  std::span<Tensor> w_;
};

// The device copy of `m` in `onDevice` (same U, same shapes), or null.
const DeviceSvs* onDeviceOf(const SvMatrixView& m, std::span<const DeviceSvs> onDevice) {
  for (const DeviceSvs& d : onDevice) {
    if (d.hostU != m.u) continue;
    const bool uFits = d.u == nullptr || (d.u->rows() == m.rows && d.u->cols() == m.columns);
    const bool vFits = d.vDense == nullptr || (!m.sparseV && d.vDense->rows() == m.vRows && d.vDense->cols() == m.columns);
    ORPHEUS_ENFORCE(uFits && vFits, "the device copy of a {}x{} SV matrix has another shape", m.rows, m.columns);
    return &d;
  }
  return nullptr;
}

template <class Targets>
void rebuildInto(std::span<const SvBatchView* const> batches, Targets& w, Backend& backend, RebuildBuffers& buffers,
                 std::span<const DeviceSvs> onDevice = {}) {
  const size_t params = w.size();
  std::vector<std::vector<Piece>>& byParam = buffers.pieces;
  byParam.resize(params);
  for (auto& pieces : byParam) pieces.clear();
  // Each parameter's columns: the dense V's first, then the sparse ones.
  std::vector<int64_t>& denseCols = buffers.denseCols;
  std::vector<int64_t>& sparseAt = buffers.sparseAt;
  denseCols.assign(params, 0);
  sparseAt.assign(params, 0);
  for (const SvBatchView* b : batches) {
    for (const SvMatrixView& m : b->matrices) {
      ORPHEUS_ENFORCE(m.paramId < params, "SV matrix refers to parameter {} of {}", m.paramId, params);
      ORPHEUS_ENFORCE(m.rows == w.rows(m.paramId) && m.vRows == w.cols(m.paramId),
                      "SVs of shape {}x{} do not fit parameter '{}' of shape {}x{}", m.rows, m.vRows,
                      w.name(m.paramId), w.rows(m.paramId), w.cols(m.paramId));
      (m.sparseV ? sparseAt : denseCols)[m.paramId] += m.columns;
    }
  }
  buffers.u.resize(params);
  for (size_t i = 0; i < params; ++i) {
    buffers.u[i].resize(w.rows(i), denseCols[i] + sparseAt[i]);
    sparseAt[i] = denseCols[i];
  }
  std::vector<int64_t>& denseAt = buffers.denseAt;
  denseAt.assign(params, 0);
  buffers.device.biasOps.clear();
  buffers.device.biasHost.clear();
  // In batch order, as the bias updates are summed.
  for (const SvBatchView* b : batches) {
    for (const SvMatrixView& m : b->matrices) {
      int64_t& at = (m.sparseV ? sparseAt : denseAt)[m.paramId];
      const Piece piece{&m, at, b->coeffs, onDeviceOf(m, onDevice)};
      // A piece whose U is on the device with one coefficient is weighted there
      // (ParamRebuild::visitU): its host columns are neither formed nor read.
      const float* uniform = nullptr;
      if constexpr (Targets::kOnDevice) uniform = ParamRebuild::uniformCoefficient(piece);
      auto weighted = buffers.u[m.paramId].middleCols(at, m.columns);
      if (uniform == nullptr) weightColumns(m, b->coeffs, weighted);
      if (m.biasId >= 0) {
        const auto bias = static_cast<size_t>(m.biasId);
        ORPHEUS_ENFORCE(bias < params && w.rows(bias) == m.rows && w.cols(bias) == 1,
                        "bias {} does not fit SVs with {} rows", m.biasId, m.rows);
        if (m.withCore) {
          // With a core the bias is not U core 1: selection fits the bias update on its own.
          ORPHEUS_ENFORCE(m.biasCoeffs != nullptr,
                          "SV matrix for parameter '{}' has a core and bias {} but no bias coefficients for {} columns",
                          w.name(m.paramId), m.biasId, m.columns);
          buffers.biasDelta.noalias() = m.uMap() * m.biasCoeffsMap();
          w.addBias(bias, buffers.biasDelta, backend, buffers.device);
        } else if (uniform != nullptr) {
          if constexpr (Targets::kOnDevice) w.addBias(bias, piece, *uniform, backend, buffers.device);
        } else {
          buffers.biasDelta = sumColumnsInOrder(weighted);
          w.addBias(bias, buffers.biasDelta, backend, buffers.device);
        }
      }
      byParam[m.paramId].push_back(piece);
      at += m.columns;
    }
  }
  std::vector<std::optional<ParamRebuild>> rebuilds(params);
  for (size_t i = 0; i < params; ++i) {
    if (!byParam[i].empty()) rebuilds[i].emplace(byParam[i], buffers.u[i], denseCols[i], buffers.v);
  }
  if (staged(backend, buffers.device)) {
    std::vector<ParamRebuild*> toStage(params, nullptr);
    std::vector<int64_t> k(params), rows(params);
    for (size_t i = 0; i < params; ++i) {
      if (rebuilds[i]) toStage[i] = &*rebuilds[i];
      k[i] = w.cols(i);
      rows[i] = w.rows(i);
    }
    stageUploads(toStage, k, rows, backend, buffers.device);
  }
  for (size_t i = 0; i < params; ++i) {
    if (rebuilds[i]) w.apply(i, *rebuilds[i], backend, buffers.device);
  }
  w.applyBiases(backend, buffers.device);
}

}  // namespace

void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& w, Backend& backend,
                    RebuildBuffers& buffers) {
  HostTargets targets(w);
  rebuildInto(batches, targets, backend, buffers);
}

void applySvBatches(std::span<const SvBatchView* const> batches, ParamSet& gradient, Backend& backend,
                    RebuildBuffers& buffers, int64_t tileFloats, const GradientStep& step,
                    std::vector<bool>& stepped) {
  HostTargets targets(gradient, tileFloats, step, stepped);
  rebuildInto(batches, targets, backend, buffers);
}

void applySvBatches(std::span<const SvBatchView* const> batches, std::span<Tensor> w, Backend& backend,
                    RebuildBuffers& buffers, std::span<const DeviceSvs> onDevice) {
  DeviceTargets targets(w);
  rebuildInto(batches, targets, backend, buffers, onDevice);
}

void outerProduct(Backend& backend, DeviceOperands& device, size_t param, const Matrix& u, const Matrix* vDense,
                  const SparseMatrix* vSparse, Matrix& target) {
  ORPHEUS_ENFORCE((vDense == nullptr) != (vSparse == nullptr), "outerProduct: V must be dense or sparse");
  Tensor host = cpu::view(target);
  if (backend.device() == Device::kCpu) {
    if (vSparse != nullptr) {
      backend.gemmSparse(1.0f, cpu::view(u), cpu::view(*vSparse), Trans::kYes, 0.0f, host);
    } else {
      backend.gemm(Trans::kNo, Trans::kYes, 1.0f, cpu::view(u), cpu::view(*vDense), 0.0f, host);
    }
    return;
  }
  Tensor& t = deviceParam(backend, device, param, target);
  const Tensor du = uploaded(backend, device.u, cpu::view(u));
  if (vSparse != nullptr) {
    backend.copySparse(cpu::view(*vSparse), device.sparseV);
    backend.gemmSparse(1.0f, du, device.sparseV.view, Trans::kYes, 0.0f, t);
  } else {
    backend.gemm(Trans::kNo, Trans::kYes, 1.0f, du, uploaded(backend, device.v, cpu::view(*vDense)), 0.0f, t);
  }
  backend.copy(t, host);
}

Tensor deviceBuffer(Backend& backend, Tensor& store, int64_t rows, int64_t cols) {
  if (store.size() < rows * cols || store.device() != backend.device()) {
    store = backend.allocate(1, std::max<int64_t>(rows * cols, 1));
  }
  return Tensor::view(backend.device(), store.data(), rows, cols);
}

Tensor uploaded(Backend& backend, Tensor& store, const Tensor& host) {
  Tensor t = deviceBuffer(backend, store, host.rows(), host.cols());
  backend.copy(host, t);
  return t;
}

void scaledCopy(Backend& backend, const Tensor& src, float c, Tensor& dst) {
  EwChain chain;
  chain.inputs = 1;
  chain.steps.push_back(EwStep{EwOp::kScale, {EwRef{EwRef::Kind::kInput, 0}, EwRef{}}, static_cast<double>(c)});
  const Tensor* in[] = {&src};
  Tensor* out[] = {&dst};
  backend.elementwise(chain, in, out);
}

bool oneCoefficient(const float* c, int64_t n) {
  const auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  for (int64_t j = 1; j < n; ++j) {
    if (bits(c[j]) != bits(c[0])) return false;
  }
  return true;
}

void scaleCoefficients(SvBatch& batch, float factor) {
  batch.coeffs *= factor;
  for (auto& m : batch.matrices) {
    if (m.core.size() > 0) m.core *= factor;
    m.biasCoeffs *= factor;  // empty unless a core is present
  }
}

}  // namespace orpheus::ops
