// The compute seam: every dense and sparse kernel the training loop needs, behind one
// interface with one implementation per device (after ggml's backends; one virtual
// per operation, as in c10d).
//
// Data. A Tensor is a dense, column-major float matrix (like Eigen's default
// storage) that lives on one device. It either owns its memory (made by
// Backend::allocate, freed by the backend's deleter when the tensor dies, which
// must happen before the backend itself is destroyed: a GPU's memory is freed on
// the backend's stream) or views
// memory someone else owns (Tensor::view: the caller keeps that memory alive and
// unmoved while the view is used). Columns are contiguous: the element (i, j) is at
// data()[i + j * rows()]. A SparseTensor is a view of compressed sparse columns or
// rows (CSC / CSR, 32-bit indices) with the same lifetime rule.
//
// Operations. Each takes its operands by reference, checks devices and shapes
// (orpheus::Error on mismatch: these are programming errors) and writes only its
// outputs. Inputs are never modified; outputs must not alias inputs unless an
// operation says so. Every operand of an operation must live on the backend's
// device, except for copy(), which moves data between host and device.
// An operation a backend does not implement throws
// "backend X does not support Y"; nothing is ever skipped silently.
//
// Streams and synchronisation. A backend runs its operations in the order they
// are called, on one stream of its device. Operations may return before the work
// is done (CUDA); the results are visible to later operations of the same backend
// without further ado. copy() to or from host memory returns only when the host
// side may be read or reused. synchronize() waits for everything queued so far.
// The CPU backend runs everything before returning.
//
// Asynchronous copies (after c10d's and NCCL's copy streams and ggml's async
// tensor copies). copyToHostAsync and copyToDeviceAsync move a tensor between the
// device and a HostBuffer (page-locked host memory, Backend::allocateHost) on a
// queue of their own (CUDA: a second stream), in order among themselves and beside
// the operations, so a transfer overlaps compute. Each copy begins once every
// operation queued before the call has finished, and returns an AsyncCopy whose
// `done` event completes when the data has landed. Until then:
//  - host code must not read the host bytes a copy writes, nor write the host
//    bytes it reads (wait(done), or ready(done) == true, says it may);
//  - operations must not read a copy's device destination (waitOnDevice(done)
//    orders every later operation after the copy, without blocking the host),
//    nor write its device source;
//  - both sides must stay alive.
// The strict device catches each of these (ops/strict/strict_backend.h). A backend
// whose copies are synchronous keeps the defaults: the copy is done when the call
// returns, and every event is complete when made.
//
// Threads. A backend is used by one thread at a time (one backend per worker
// thread, like GraphExecutor). Different backends are independent, also when
// several of them, in several processes, share one GPU.
#pragma once

#include "engine/base/error.h"
#include "ops/elementwise_ops.h"
#include "ops/optimizer_step.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace orpheus::ops {

enum class OpKind;  // ops/operators.h

// kStrict: host memory that host code cannot touch outside backend calls
// (ops/strict/strict_backend.h), the device CI proves residency on.
enum class Device { kCpu, kCuda, kStrict };

inline const char* deviceName(Device d) {
  switch (d) {
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
    case Device::kStrict: return "strict";
  }
  return "unknown";
}

// Bumped whenever Backend's virtual interface or Tensor's layout changes: a
// backend plugin (liborpheus_cuda.so) built against another version is refused.
inline constexpr int kBackendAbiVersion = 11;

class Tensor {
 public:
  // Releases owned memory; must not throw. May hold state (a strict device's
  // allocation registry), so it is a function object, not a plain pointer.
  using Deleter = std::function<void(float*)>;

  Tensor() = default;
  // Owns `data`, released with `deleter` (which must not throw).
  Tensor(Device device, float* data, int64_t rows, int64_t cols, Deleter deleter)
      : device_(device), rows_(rows), cols_(cols), owning_(static_cast<bool>(deleter)),
        data_(data, deleter ? std::move(deleter) : Deleter(&noDelete)) {}
  // A view of memory owned elsewhere.
  static Tensor view(Device device, float* data, int64_t rows, int64_t cols) {
    return Tensor(device, data, rows, cols, Deleter());
  }
  // Views of host memory. The const overload is for operands the backend only
  // reads; writing through it is undefined.
  static Tensor host(float* data, int64_t rows, int64_t cols) { return view(Device::kCpu, data, rows, cols); }
  static Tensor host(const float* data, int64_t rows, int64_t cols) {
    return view(Device::kCpu, const_cast<float*>(data), rows, cols);
  }

  Device device() const { return device_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t size() const { return rows_ * cols_; }
  float* data() const { return data_.get(); }
  bool owning() const { return owning_; }
  // Columns [first, first + count) as a view (contiguous in column-major storage).
  Tensor middleCols(int64_t first, int64_t count) const {
    ORPHEUS_ENFORCE(first >= 0 && count >= 0 && first + count <= cols_, "columns {}+{} of a {}x{} tensor", first,
                    count, rows_, cols_);
    return view(device_, data() + first * rows_, rows_, count);
  }

 private:
  static void noDelete(float*) {}

  Device device_ = Device::kCpu;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  bool owning_ = false;
  std::unique_ptr<float, Deleter> data_{nullptr, Deleter(&noDelete)};
};

// A rows x cols sparse matrix, compressed by columns (CSC: `outer` has cols + 1
// offsets into `inner` = row indices and `values`) or by rows (CSR: `outer` has
// rows + 1 offsets, `inner` = column indices). Indices sorted within each column
// (row); no duplicates. Views only.
struct SparseTensor {
  enum class Layout { kCsc, kCsr };
  Device device = Device::kCpu;
  Layout layout = Layout::kCsc;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t nonZeros = 0;
  const int32_t* outer = nullptr;
  const int32_t* inner = nullptr;
  const float* values = nullptr;
  // The same matrix compressed the other way (the CSR arrays of a CSC matrix and
  // back), or null. The CUDA backend's copySparse adds them, so that products with
  // s and with s^T both run one output element per thread, with no scattered
  // (atomic) sums: deterministic, run after run.
  const int32_t* otherOuter = nullptr;
  const int32_t* otherInner = nullptr;
  const float* otherValues = nullptr;
};

// A sparse matrix copied to a backend's device: `view` stays valid while `storage`
// lives. `capacity`: the bytes `storage` holds, which a later copySparse into this
// copy reuses while they suffice.
struct SparseCopy {
  SparseTensor view;
  std::shared_ptr<void> storage;
  size_t capacity = 0;
};

// Host memory for asynchronous copies: page-locked on CUDA (a copy from pageable
// memory would not return before it is done). Host code reads and writes it as any
// memory, within the rules above. Copies of the handle share the memory, released
// with the last of them, which must go before the backend that made it.
class HostBuffer {
 public:
  using Release = std::function<void(void*)>;
  HostBuffer() = default;
  HostBuffer(void* data, size_t bytes, Release release)
      : bytes_(bytes), memory_(static_cast<std::byte*>(data), [release = std::move(release)](std::byte* p) {
          if (p != nullptr && release) release(p);
        }) {}

  std::byte* data() const { return memory_.get(); }
  size_t bytes() const { return bytes_; }
  // rows x cols floats from byte `offset`, as a host tensor view.
  Tensor floats(size_t offset, int64_t rows, int64_t cols) const {
    ORPHEUS_ENFORCE(offset % sizeof(float) == 0 && rows >= 0 && cols >= 0 &&
                        offset + static_cast<size_t>(rows * cols) * sizeof(float) <= bytes_,
                    "{}x{} floats at byte {} of a host buffer of {} bytes", rows, cols, offset, bytes_);
    return Tensor::host(reinterpret_cast<float*>(data() + offset), rows, cols);
  }

 private:
  size_t bytes_ = 0;
  std::shared_ptr<std::byte> memory_;
};

// A point on one of a backend's queues (CUDA's events): complete once everything
// queued there before it has finished. Only the backend that made it may be asked
// about it, while that backend lives. A default Event is complete from the start.
class Event {
 public:
  Event() = default;
  Event(const void* owner, std::shared_ptr<void> state) : owner_(owner), state_(std::move(state)) {}
  bool empty() const { return state_ == nullptr; }
  const void* owner() const { return owner_; }
  void* state() const { return state_.get(); }

 private:
  const void* owner_ = nullptr;
  std::shared_ptr<void> state_;
};

// One asynchronous copy: when it began on the copy queue and when it landed.
struct AsyncCopy {
  Event started;
  Event done;
};

enum class Trans { kNo, kYes };

// One part of Backend::copyParts: dst = src, or dst = scale * src when `scaled`
// (each element's product, the bits of scale() and of a kScale chain step). Views
// of the backend's device memory, the same number of elements.
struct CopyPart {
  Tensor src;
  Tensor dst;
  bool scaled = false;
  float scale = 1.0f;
};

// Elementwise chains: the fusion plan's runs of unary and binary elementwise
// operators (ops/graph.h FusedStep), run as one pass over memory. Step k reads
// external inputs (rows x cols, or rows x 1 broadcast across the columns) or the
// values of earlier steps, and its value is written to output k.
struct EwRef {
  enum class Kind : uint8_t { kInput, kStep } kind = Kind::kInput;
  int index = 0;  // into the chain's inputs, or an earlier step
};

struct EwStep {
  EwOp op = EwOp::kAdd;
  std::array<EwRef, 2> operand{};  // operand[1] unused by unary operators
  double attr = 1.0;               // kScale's factor (rounded to the scalar type when used)
};

struct EwChain {
  std::vector<EwStep> steps;
  int inputs = 0;  // number of external inputs the steps refer to
};


// One LSTM cell step (ops/lstm_cell.h) over B columns: the gate block's four row
// blocks (offset: first row of the input, forget, candidate and output gate) and the
// previous cell state in; the activations, the cell, its tanh and the hidden state
// out (H x B each). The backward pass reads the activations and tanhCell; cell and
// hidden may be null there.
struct LstmCellArgs {
  const Tensor* gates = nullptr;  // 4H x B pre-activations
  std::array<int64_t, 4> offset{};
  const Tensor* cPrev = nullptr;  // H x B
  std::array<Tensor*, 4> act{};   // sigmoid, sigmoid, tanh, sigmoid of the gates
  Tensor* cell = nullptr;
  Tensor* tanhCell = nullptr;
  Tensor* hidden = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  // One line for the start-up line and the metrics summary: the backend, and for
  // a GPU its index, name and memory ("cuda:0 NVIDIA H100 80GB HBM3, 79.1 GiB").
  virtual std::string describe() const { return name(); }
  // The longest elementwise chain elementwise() and elementwiseBackward() take.
  virtual ChainLimits chainLimits() const { return {}; }

  // A rows x cols tensor on this backend's device. Contents undefined.
  virtual Tensor allocate(int64_t rows, int64_t cols) = 0;
  // dst = src (same shape; any combination of host and this backend's device).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // A copy of `src` (any device) on this backend's device.
  SparseCopy copySparse(const SparseTensor& src) {
    SparseCopy copy;
    copySparse(src, copy);
    return copy;
  }
  // The same into `dst` (empty, or made by this backend): its storage reused when
  // it holds enough bytes, else replaced, so a caller that copies a sparse matrix
  // every clock into one SparseCopy allocates only when the matrix outgrows it.
  // Whatever dst held is overwritten, in stream order (earlier operations that
  // read it have finished with it).
  virtual void copySparse(const SparseTensor& src, SparseCopy& dst) = 0;
  // Waits until every operation queued so far has finished.
  virtual void synchronize() = 0;

  // c = alpha * op(a) * op(b) + beta * c. With beta == 0, c's old contents are
  // never read (NaN in c does not propagate).
  virtual void gemm(Trans ta, Trans tb, float alpha, const Tensor& a, const Tensor& b, float beta, Tensor& c) = 0;
  // c = alpha * a * op(s) + beta * c with s sparse: W x for sparse data x
  // (Trans::kNo) and U x^T for the SV product of sparse data (Trans::kYes).
  virtual void gemmSparse(float alpha, const Tensor& a, const SparseTensor& s, Trans ts, float beta, Tensor& c) = 0;

  // Runs the chain over rows x cols elements. inputs.size() == chain.inputs;
  // outputs.size() == chain.steps.size(), each rows x cols.
  virtual void elementwise(const EwChain& chain, std::span<const Tensor* const> inputs,
                           std::span<Tensor* const> outputs) = 0;
  // Reverse pass of the chain: given the forward inputs and step values and the
  // gradient of the last step, adds d(loss)/d(input k) to *inputGrads[k] for every
  // non-null entry (rows x cols; only full-shape inputs can receive gradients).
  virtual void elementwiseBackward(const EwChain& chain, std::span<const Tensor* const> inputs,
                                   std::span<const Tensor* const> values, const Tensor& upstream,
                                   std::span<Tensor* const> inputGrads) = 0;

  // Column-wise softmax of z (r x B) into p, and the cross-entropy against the
  // targets t (r x B) into loss (1 x B): loss_j = -sum_i t_ij log max(p_ij, FLT_MIN).
  virtual void softmaxCrossEntropy(const Tensor& z, const Tensor& t, Tensor& p, Tensor& loss) = 0;
  // dz = beta * dz + (p * sum_i t_ij - t) * upstream_j, column by column; upstream is 1 x B.
  virtual void softmaxCrossEntropyBackward(const Tensor& p, const Tensor& t, const Tensor& upstream, float beta,
                                           Tensor& dz) = 0;

  // dst rows [dstRow, dstRow + rows) = src rows [srcRow, srcRow + rows), in every
  // column (src and dst have the same columns): concat and slice, forward and back.
  virtual void copyRows(const Tensor& src, int64_t srcRow, Tensor& dst, int64_t dstRow, int64_t rows) = 0;
  // The fused LSTM cell step, forward: writes a's act, cell, tanhCell and hidden.
  virtual void lstmCellForward(const LstmCellArgs& a) = 0;
  // Backward: adds d loss / d gates to dGates (4H x B) and, when not null,
  // d loss / d cPrev to dCPrev, from the gradients of hidden and cell (null: zero),
  // in ops/lstm_cell.h's order.
  virtual void lstmCellBackward(const LstmCellArgs& a, const Tensor* dHidden, const Tensor* dCell, Tensor& dGates,
                                Tensor* dCPrev) = 0;

  // The operators of ops/operators.h that reduce or normalise each column
  // (isColumnOp: sq_l2, l2_norm, l1, sum, softmax, log_softmax, cross_entropy, dot,
  // sq_dist): out = op(a[, b]) as ops::forward computes it, 1 x B for a reduction and
  // r x B for a softmax. b: the second operand of a two-operand one (a's shape), else null.
  virtual void columnOp(OpKind op, const Tensor& a, const Tensor* b, Tensor& out) = 0;
  // dst (the operand's shape, overwritten) = the gradient of sum(upstream . out) with
  // respect to operand `which` (0: a, 1: b), as ops::backward computes it.
  virtual void columnOpBackward(OpKind op, int which, const Tensor& a, const Tensor* b, const Tensor& out,
                                const Tensor& upstream, Tensor& dst) = 0;

  // out (r x 1) = beta * out + the sum of a's columns.
  virtual void sumColumns(const Tensor& a, float beta, Tensor& out) = 0;
  // out (1 x c) = beta * out + the sum of a's rows (column totals).
  virtual void sumRows(const Tensor& a, float beta, Tensor& out) = 0;
  // y += alpha * x (same shape).
  virtual void axpy(float alpha, const Tensor& x, Tensor& y) = 0;
  // x *= alpha.
  virtual void scale(float alpha, Tensor& x) = 0;

  // Several copies within the device as one operation: every part's dst = src or
  // scale * src (CopyPart). No destination may overlap another part's source or
  // destination. Where a copy and a chain per part would each be a launch (the
  // rebuild gathers each batch's U and V into the columns of one GEMM's operands),
  // this is one. The default runs copy() and a one-step chain per part.
  virtual void copyParts(std::span<const CopyPart> parts);
  // y += terms[0], then y += terms[1], ... (each y's shape): the bits of
  // axpy(1, term, y) called term by term, in one operation (one launch per
  // kAddTermsPerLaunch terms). The default runs those axpy calls.
  virtual void addInOrder(std::span<const Tensor* const> terms, Tensor& y);

  // One optimizer step on one parameter matrix (ops/optimizer_step.h has the
  // formulas): param moves by the step for `gradient`, and the state buffers are
  // updated in place. buffer0 is momentum's buffer, adagrad's sum or adam's m;
  // buffer1 is adam's v. The buffers a kind uses (optimizerBuffers) must be given,
  // the same shape as param; the others are ignored and may be null. No operand
  // may alias another.
  virtual void optimizerStep(const OptimizerStep& s, const Tensor& gradient, Tensor& param, Tensor* buffer0,
                             Tensor* buffer1) = 0;

  // Asynchronous copies (see the top of this file). A HostBuffer of `bytes` bytes.
  virtual HostBuffer allocateHost(size_t bytes);
  // src (this backend's device) into dst's bytes [offset, offset + 4 src.size()).
  virtual AsyncCopy copyToHostAsync(const Tensor& src, HostBuffer& dst, size_t offset);
  // dst (this backend's device) from src's bytes [offset, offset + 4 dst.size()).
  virtual AsyncCopy copyToDeviceAsync(const HostBuffer& src, size_t offset, Tensor& dst);
  // A point on the compute queue: complete once every operation queued so far has.
  virtual Event record();
  // Operations queued after this call begin only once `e` is complete; the host goes on.
  virtual void waitOnDevice(const Event& e);
  // Whether `e` is complete, without waiting.
  virtual bool ready(const Event& e);
  // Blocks until `e` is complete.
  virtual void wait(const Event& e);
  // Seconds from `from` to `to`, both complete and made by this backend: on the
  // device's own timer where it has one (CUDA's events), else the host's clock when
  // each completed. Negative when `to` came first.
  virtual double secondsBetween(const Event& from, const Event& to);

  // Bytes copy(), copySparse() and the asynchronous copies moved from host memory to
  // this backend's device and back, since the backend was made (0 on the CPU
  // backend, whose device is the host).
  // `blocking`: the calls of copy() and copySparse() between host memory and the
  // device, each of which returns only once the device has run everything queued
  // before it (the asynchronous copies do not block).
  struct Transfers {
    uint64_t toDevice = 0;
    uint64_t toHost = 0;
    uint64_t blocking = 0;
  };
  const Transfers& transfers() const { return transfers_; }
  // Device operations queued since the backend was made: one per call of an
  // operation above (a GEMM, a sparse product, a chain or its backward, a cell
  // step, a reduction, a row copy, a copy or an asynchronous copy, an optimizer
  // step), the same count on every backend. On CUDA each is one kernel launch or
  // library call (copySparse: its few uploads, counted as one), so a pass's count
  // is what its launch overhead scales with.
  uint64_t launches() const { return launches_; }

 protected:
  // Throws "backend <name> does not support <what>".
  [[noreturn]] void unsupported(const std::string& what) const {
    throw Error(fmt::format("backend {} does not support {}", name(), what));
  }
  // Error unless `e` is empty or this backend's.
  void checkOwn(const Event& e, const char* op) const {
    ORPHEUS_ENFORCE(e.empty() || e.owner() == this, "backend {}: {} of another backend's event", name(), op);
  }
  // Checks an asynchronous copy's operands: `device` on this backend's device, the
  // bytes [offset, offset + 4 device.size()) inside `host`.
  void checkAsyncCopy(const char* op, const Tensor& device, const HostBuffer& host, size_t offset) const;
  // Counts a copy of `bytes` from `from` to `to` memory in transfers().
  void countCopy(Device from, Device to, uint64_t bytes) {
    if (from == Device::kCpu && to != Device::kCpu) transfers_.toDevice += bytes;
    if (from != Device::kCpu && to == Device::kCpu) transfers_.toHost += bytes;
  }
  // Counts a copy() or copySparse() from `from` to `to` memory that blocks the host.
  void countBlocking(Device from, Device to) {
    if ((from == Device::kCpu) != (to == Device::kCpu)) ++transfers_.blocking;
  }
  // Counts one operation queued in launches().
  void countLaunch() { ++launches_; }
  // Counts the launches of an operation whose `items` go `perLaunch` to a launch.
  void countLaunches(size_t items, size_t perLaunch) { launches_ += (items + perLaunch - 1) / perLaunch; }

 private:
  Transfers transfers_;
  uint64_t launches_ = 0;
};

}  // namespace orpheus::ops
