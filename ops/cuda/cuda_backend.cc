#include "ops/cuda/cuda_backend.h"

#include "ops/backend_checks.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace orpheus::ops::cuda {

namespace {

// cuBLAS takes int dimensions.
ColumnOp columnOpCode(OpKind op) {
  switch (op) {
    case OpKind::kSquaredL2: return ColumnOp::kSquaredL2;
    case OpKind::kL2Norm: return ColumnOp::kL2Norm;
    case OpKind::kL1: return ColumnOp::kL1;
    case OpKind::kSum: return ColumnOp::kSum;
    case OpKind::kSoftmax: return ColumnOp::kSoftmax;
    case OpKind::kLogSoftmax: return ColumnOp::kLogSoftmax;
    case OpKind::kCrossEntropy: return ColumnOp::kCrossEntropy;
    case OpKind::kDot: return ColumnOp::kDot;
    case OpKind::kSquaredDistance: return ColumnOp::kSquaredDistance;
    default: throw Error(fmt::format("{} is not a column operator", opName(op)));
  }
}

int blasInt(int64_t n) {
  ORPHEUS_ENFORCE(n >= 0 && n <= INT_MAX, "dimension {} does not fit cuBLAS", n);
  return static_cast<int>(n);
}

int leading(const Tensor& t) { return blasInt(t.rows() > 0 ? t.rows() : 1); }

cublasOperation_t blasOp(Trans t) { return t == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T; }


// The other compression of src (CSR arrays of a CSC matrix, or CSC of a CSR one):
// a counting sort by inner index, stable, so each new outer run keeps the old
// outer order.
void transposeCompression(const SparseTensor& src, int64_t otherOuterCount, std::vector<int32_t>& outer,
                          std::vector<int32_t>& inner, std::vector<float>& values) {
  const int64_t outerCount = (src.layout == SparseTensor::Layout::kCsc ? src.cols : src.rows);
  outer.assign(static_cast<size_t>(otherOuterCount) + 1, 0);
  inner.resize(static_cast<size_t>(src.nonZeros));
  values.resize(static_cast<size_t>(src.nonZeros));
  for (int64_t q = 0; q < src.nonZeros; ++q) ++outer[static_cast<size_t>(src.inner[q]) + 1];
  for (int64_t k = 0; k < otherOuterCount; ++k) outer[static_cast<size_t>(k) + 1] += outer[static_cast<size_t>(k)];
  std::vector<int32_t> next(outer.begin(), outer.end() - 1);
  for (int64_t j = 0; j < outerCount; ++j) {
    for (int32_t q = src.outer[j]; q < src.outer[j + 1]; ++q) {
      const auto at = static_cast<size_t>(next[static_cast<size_t>(src.inner[q])]++);
      inner[at] = static_cast<int32_t>(j);
      values[at] = src.values[q];
    }
  }
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    ORPHEUS_CUDA_CHECK(cudaSetDevice(device_));
    ORPHEUS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (const cudaError_t e = cudaStreamCreateWithFlags(&copyStream_, cudaStreamNonBlocking); e != cudaSuccess) {
      static_cast<void>(cudaStreamDestroy(stream_));
      ORPHEUS_CUDA_CHECK(e);
    }
    const cublasStatus_t status = cublasCreate(&blas_);
    if (status != CUBLAS_STATUS_SUCCESS) {
      static_cast<void>(cudaStreamDestroy(copyStream_));
      static_cast<void>(cudaStreamDestroy(stream_));
      ORPHEUS_CUBLAS_CHECK(status);
    }
    ORPHEUS_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    cudaMemPool_t pool = nullptr;
    ORPHEUS_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t keep = UINT64_MAX;
    ORPHEUS_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    // FP32 products in FP32 (no TF32 tensor-core math): set here, not left to
    // cuBLAS's default, so results match the CPU backend's to FP32 rounding.
    ORPHEUS_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    const char* sync = std::getenv("ORPHEUS_CUDA_SYNC");
    syncEveryCall_ = sync != nullptr && std::string(sync) == "1";
  }

  ~CudaBackend() override {
    static_cast<void>(cudaSetDevice(device_));
    static_cast<void>(cudaStreamSynchronize(copyStream_));
    static_cast<void>(cudaStreamSynchronize(stream_));
    static_cast<void>(cublasDestroy(blas_));
    static_cast<void>(cudaStreamDestroy(copyStream_));
    static_cast<void>(cudaStreamDestroy(stream_));
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  ChainLimits chainLimits() const override { return kDeviceChainLimits; }
  Device device() const override { return Device::kCuda; }
  std::string describe() const override {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return fmt::format("cuda:{}", device_);
    return fmt::format("cuda:{} {}, {:.1f} GiB, sm_{}{}{}", device_, prop.name,
                       static_cast<double>(prop.totalGlobalMem) / double(1 << 30), prop.major, prop.minor,
                       syncEveryCall_ ? ", ORPHEUS_CUDA_SYNC=1" : "");
  }

  Tensor allocate(int64_t rows, int64_t cols) override {
    ORPHEUS_ENFORCE(rows >= 0 && cols >= 0, "allocate: shape {}x{}", rows, cols);
    activate();
    void* p = nullptr;
    if (rows * cols > 0) p = deviceAlloc(static_cast<size_t>(rows * cols) * sizeof(float));
    return Tensor(Device::kCuda, static_cast<float*>(p), rows, cols, deviceFree());
  }

  void copy(const Tensor& src, Tensor& dst) override {
    countLaunch();
    checks::sameShape("copy", src, dst);
    countBlocking(src.device(), dst.device());
    if (src.size() == 0) return;
    countCopy(src.device(), dst.device(), static_cast<uint64_t>(src.size()) * sizeof(float));
    activate();
    ORPHEUS_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(src.size()) * sizeof(float),
                                       cudaMemcpyDefault, stream_));
    if (src.device() == Device::kCpu || dst.device() == Device::kCpu) synchronize();
  }

  // The arrays go to the device in one block: src's compression and, when src is
  // in host memory, the other one (SparseTensor::otherOuter), built here.
  using Backend::copySparse;
  void copySparse(const SparseTensor& src, SparseCopy& dst) override {
    countLaunch();
    activate();
    const bool csc = src.layout == SparseTensor::Layout::kCsc;
    const int64_t outerSize = (csc ? src.cols : src.rows) + 1;
    const int64_t otherSize = (csc ? src.rows : src.cols) + 1;
    const bool other = src.device == Device::kCpu;
    std::vector<int32_t> otherOuter, otherInner;
    std::vector<float> otherValues;
    if (other) transposeCompression(src, otherSize - 1, otherOuter, otherInner, otherValues);
    const size_t nnz = static_cast<size_t>(src.nonZeros);
    const size_t ints = static_cast<size_t>(outerSize) + nnz + (other ? static_cast<size_t>(otherSize) + nnz : 0);
    const size_t floats = nnz * (other ? 2 : 1);
    const size_t bytes = (ints + floats + 1) * sizeof(float);
    countCopy(src.device, Device::kCuda, (ints + floats) * sizeof(float));
    countBlocking(src.device, Device::kCuda);
    // Reused in stream order: the products queued before on this stream read the old arrays first.
    if (!dst.storage || dst.view.device != Device::kCuda || dst.capacity < bytes) {
      dst.storage = std::shared_ptr<void>(deviceAlloc(bytes),
                                          [free = deviceFree()](void* p) { free(static_cast<float*>(p)); });
      dst.capacity = bytes;
    }
    void* block = dst.storage.get();
    // Indices first, values after them (both are 4 bytes wide, so values stay aligned).
    auto* outer = static_cast<int32_t*>(block);
    int32_t* inner = outer + outerSize;
    int32_t* oOuter = inner + nnz;
    int32_t* oInner = oOuter + (other ? otherSize : 0);
    auto* values = reinterpret_cast<float*>(oInner + (other ? nnz : 0));
    float* oValues = values + nnz;
    upload(outer, src.outer, static_cast<size_t>(outerSize) * sizeof(int32_t));
    upload(inner, src.inner, nnz * sizeof(int32_t));
    upload(values, src.values, nnz * sizeof(float));
    dst.view = src;
    if (other) {
      upload(oOuter, otherOuter.data(), otherOuter.size() * sizeof(int32_t));
      upload(oInner, otherInner.data(), nnz * sizeof(int32_t));
      upload(oValues, otherValues.data(), nnz * sizeof(float));
      dst.view.otherOuter = oOuter;
      dst.view.otherInner = oInner;
      dst.view.otherValues = oValues;
    }
    synchronize();
    dst.view.device = Device::kCuda;
    dst.view.outer = outer;
    dst.view.inner = inner;
    dst.view.values = values;
  }

  void synchronize() override {
    activate();
    ORPHEUS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Page-locked, so the copy engine reads and writes it while the host goes on.
  HostBuffer allocateHost(size_t bytes) override {
    activate();
    void* p = nullptr;
    ORPHEUS_CUDA_CHECK(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault));
    return HostBuffer(p, bytes, [](void* q) { static_cast<void>(cudaFreeHost(q)); });
  }

  AsyncCopy copyToHostAsync(const Tensor& src, HostBuffer& dst, size_t offset) override {
    countLaunch();
    checkAsyncCopy("copyToHostAsync", src, dst, offset);
    const size_t bytes = static_cast<size_t>(src.size()) * sizeof(float);
    countCopy(Device::kCuda, Device::kCpu, bytes);
    return onCopyStream(dst.data() + offset, src.data(), bytes, cudaMemcpyDeviceToHost);
  }

  AsyncCopy copyToDeviceAsync(const HostBuffer& src, size_t offset, Tensor& dst) override {
    countLaunch();
    checkAsyncCopy("copyToDeviceAsync", dst, src, offset);
    const size_t bytes = static_cast<size_t>(dst.size()) * sizeof(float);
    countCopy(Device::kCpu, Device::kCuda, bytes);
    return onCopyStream(dst.data(), src.data() + offset, bytes, cudaMemcpyHostToDevice);
  }

  Event record() override { return recordOn(stream_); }

  void waitOnDevice(const Event& e) override {
    checkOwn(e, "waitOnDevice");
    if (e.empty()) return;
    activate();
    ORPHEUS_CUDA_CHECK(cudaStreamWaitEvent(stream_, eventOf(e), 0));
  }

  bool ready(const Event& e) override {
    checkOwn(e, "ready");
    if (e.empty()) return true;
    const cudaError_t status = cudaEventQuery(eventOf(e));
    if (status == cudaErrorNotReady) return false;
    ORPHEUS_CUDA_CHECK(status);
    return true;
  }

  void wait(const Event& e) override {
    checkOwn(e, "wait");
    if (!e.empty()) ORPHEUS_CUDA_CHECK(cudaEventSynchronize(eventOf(e)));
  }

  double secondsBetween(const Event& from, const Event& to) override {
    checkOwn(from, "secondsBetween");
    checkOwn(to, "secondsBetween");
    ORPHEUS_ENFORCE(!from.empty() && !to.empty(), "backend cuda: secondsBetween of an empty event");
    float ms = 0.0f;
    ORPHEUS_CUDA_CHECK(cudaEventElapsedTime(&ms, eventOf(from), eventOf(to)));
    return static_cast<double>(ms) / 1000.0;
  }

  void gemm(Trans ta, Trans tb, float alpha, const Tensor& a, const Tensor& b, float beta, Tensor& c) override {
    countLaunch();
    for (const Tensor* t : {&a, &b, static_cast<const Tensor*>(&c)}) checks::onDevice(*this, "gemm", *t);
    const checks::GemmShape s = checks::gemm(ta, tb, a, b, c);
    if (s.m == 0 || s.n == 0) return;
    activate();
    ORPHEUS_CUBLAS_CHECK(cublasSgemm(blas_, blasOp(ta), blasOp(tb), blasInt(s.m), blasInt(s.n), blasInt(s.k), &alpha,
                                     a.data(), leading(a), b.data(), leading(b), &beta, c.data(), leading(c)));
  }

  void gemmSparse(float alpha, const Tensor& a, const SparseTensor& s, Trans ts, float beta, Tensor& c) override {
    countLaunch();
    checks::onDevice(*this, "gemmSparse", a);
    checks::onDevice(*this, "gemmSparse", c);
    ORPHEUS_ENFORCE(s.device == Device::kCuda, "backend cuda: the sparse operand lives in {} memory",
                    deviceName(s.device));
    const checks::CscOperand o = checks::gemmSparse(a, s, ts, c);
    activate();
    if (!o.transposed) {
      ORPHEUS_CUDA_CHECK(launchDenseTimesCsc(alpha, a.data(), a.rows(), s.outer, s.inner, s.values, o.cols, beta,
                                             c.data(), stream_));
      return;
    }
    // a M^T, M the CSC matrix of s's arrays: M^T's CSC arrays are s's other compression.
    ORPHEUS_ENFORCE(s.otherOuter != nullptr,
                    "backend cuda: a product with a transposed sparse operand needs its other compression "
                    "(copySparse of host data adds it)");
    ORPHEUS_CUDA_CHECK(launchDenseTimesCsc(alpha, a.data(), a.rows(), s.otherOuter, s.otherInner, s.otherValues,
                                           o.rows, beta, c.data(), stream_));
  }

  void elementwise(const EwChain& chain, std::span<const Tensor* const> inputs,
                   std::span<Tensor* const> outputs) override {
    countLaunch();
    const checks::ChainShape shape = checks::forward(*this, chain, inputs, outputs);
    ChainArgs args = chainArgs(chain, inputs, shape);
    for (size_t k = 0; k < outputs.size(); ++k) args.value[k] = outputs[k]->data();
    activate();
    ORPHEUS_CUDA_CHECK(launchChainForward(args, stream_));
  }

  void elementwiseBackward(const EwChain& chain, std::span<const Tensor* const> inputs,
                           std::span<const Tensor* const> values, const Tensor& upstream,
                           std::span<Tensor* const> inputGrads) override {
    countLaunch();
    const checks::ChainShape shape = checks::backward(*this, chain, inputs, values, upstream, inputGrads);
    ChainArgs args = chainArgs(chain, inputs, shape);
    for (size_t k = 0; k < values.size(); ++k) args.value[k] = values[k]->data();
    args.upstream = upstream.data();
    for (size_t k = 0; k < inputGrads.size(); ++k) args.inputGrad[k] = inputGrads[k] ? inputGrads[k]->data() : nullptr;
    activate();
    ORPHEUS_CUDA_CHECK(launchChainBackward(args, stream_));
  }

  // Rows of every column: one strided 2-D copy on the stream.
  void copyRows(const Tensor& src, int64_t srcRow, Tensor& dst, int64_t dstRow, int64_t rows) override {
    countLaunch();
    checks::copyRows(*this, src, srcRow, dst, dstRow, rows);
    if (rows == 0 || src.cols() == 0) return;
    activate();
    constexpr size_t f = sizeof(float);
    ORPHEUS_CUDA_CHECK(cudaMemcpy2DAsync(dst.data() + dstRow, static_cast<size_t>(dst.rows()) * f,
                                         src.data() + srcRow, static_cast<size_t>(src.rows()) * f,
                                         static_cast<size_t>(rows) * f, static_cast<size_t>(src.cols()),
                                         cudaMemcpyDeviceToDevice, stream_));
  }

  void lstmCellForward(const LstmCellArgs& a) override {
    countLaunch();
    checks::lstmCell(*this, "lstmCellForward", a, true);
    activate();
    ORPHEUS_CUDA_CHECK(launchLstmCellForward(lstmArgs(a), stream_));
  }

  void lstmCellBackward(const LstmCellArgs& a, const Tensor* dHidden, const Tensor* dCell, Tensor& dGates,
                        Tensor* dCPrev) override {
    countLaunch();
    checks::lstmCellBackward(*this, a, dHidden, dCell, dGates, dCPrev);
    activate();
    ORPHEUS_CUDA_CHECK(launchLstmCellBackward(lstmArgs(a), dHidden ? dHidden->data() : nullptr,
                                              dCell ? dCell->data() : nullptr, dGates.data(),
                                              dCPrev ? dCPrev->data() : nullptr, stream_));
  }

  void softmaxCrossEntropy(const Tensor& z, const Tensor& t, Tensor& p, Tensor& loss) override {
    countLaunch();
    for (const Tensor* x : {&z, &t, static_cast<const Tensor*>(&p), static_cast<const Tensor*>(&loss)}) {
      checks::onDevice(*this, "softmaxCrossEntropy", *x);
    }
    checks::sameShape("softmaxCrossEntropy", z, t);
    checks::sameShape("softmaxCrossEntropy", z, p);
    ORPHEUS_ENFORCE(loss.rows() == 1 && loss.cols() == z.cols(), "softmaxCrossEntropy: loss must be 1x{}", z.cols());
    activate();
    ORPHEUS_CUDA_CHECK(launchSoftmaxCrossEntropy(z.data(), t.data(), p.data(), loss.data(), z.rows(), z.cols(), stream_));
  }

  void softmaxCrossEntropyBackward(const Tensor& p, const Tensor& t, const Tensor& upstream, float beta,
                                   Tensor& dz) override {
    countLaunch();
    for (const Tensor* x : {&p, &t, &upstream, static_cast<const Tensor*>(&dz)}) {
      checks::onDevice(*this, "softmaxCrossEntropyBackward", *x);
    }
    checks::sameShape("softmaxCrossEntropyBackward", p, t);
    checks::sameShape("softmaxCrossEntropyBackward", p, dz);
    ORPHEUS_ENFORCE(upstream.rows() == 1 && upstream.cols() == p.cols(),
                    "softmaxCrossEntropyBackward: upstream must be 1x{}", p.cols());
    activate();
    ORPHEUS_CUDA_CHECK(launchSoftmaxCrossEntropyBackward(p.data(), t.data(), upstream.data(), beta, dz.data(),
                                                         p.rows(), p.cols(), stream_));
  }

  void columnOp(OpKind op, const Tensor& a, const Tensor* b, Tensor& out) override {
    checks::columnOp(*this, "columnOp", op, a, b, out);
    countLaunch();
    activate();
    ORPHEUS_CUDA_CHECK(launchColumnOp(columnOpCode(op), a.data(), b ? b->data() : nullptr, out.data(), a.rows(),
                                      a.cols(), stream_));
  }

  void columnOpBackward(OpKind op, int which, const Tensor& a, const Tensor* b, const Tensor& out,
                        const Tensor& upstream, Tensor& dst) override {
    checks::columnOpBackward(*this, op, which, a, b, out, upstream, dst);
    countLaunch();
    activate();
    ORPHEUS_CUDA_CHECK(launchColumnOpBackward(columnOpCode(op), which, a.data(), b ? b->data() : nullptr, out.data(),
                                              upstream.data(), dst.data(), a.rows(), a.cols(), stream_));
  }

  void sumColumns(const Tensor& a, float beta, Tensor& out) override {
    countLaunch();
    checks::onDevice(*this, "sumColumns", a);
    checks::onDevice(*this, "sumColumns", out);
    ORPHEUS_ENFORCE(out.rows() == a.rows() && out.cols() == 1, "sumColumns: out must be {}x1", a.rows());
    activate();
    ORPHEUS_CUDA_CHECK(launchSumColumns(a.data(), beta, out.data(), a.rows(), a.cols(), stream_));
  }

  void sumRows(const Tensor& a, float beta, Tensor& out) override {
    countLaunch();
    checks::onDevice(*this, "sumRows", a);
    checks::onDevice(*this, "sumRows", out);
    ORPHEUS_ENFORCE(out.rows() == 1 && out.cols() == a.cols(), "sumRows: out must be 1x{}", a.cols());
    activate();
    ORPHEUS_CUDA_CHECK(launchSumRows(a.data(), beta, out.data(), a.rows(), a.cols(), stream_));
  }

  void axpy(float alpha, const Tensor& x, Tensor& y) override {
    countLaunch();
    checks::onDevice(*this, "axpy", x);
    checks::onDevice(*this, "axpy", y);
    checks::sameShape("axpy", x, y);
    if (x.size() == 0) return;
    activate();
    ORPHEUS_CUBLAS_CHECK(cublasSaxpy(blas_, blasInt(x.size()), &alpha, x.data(), 1, y.data(), 1));
  }

  void scale(float alpha, Tensor& x) override {
    countLaunch();
    checks::onDevice(*this, "scale", x);
    if (x.size() == 0) return;
    activate();
    ORPHEUS_CUBLAS_CHECK(cublasSscal(blas_, blasInt(x.size()), &alpha, x.data(), 1));
  }

  // One launch per kCopyPartsPerLaunch parts, the table passed by value.
  void copyParts(std::span<const CopyPart> parts) override {
    countLaunches(parts.size(), kCopyPartsPerLaunch);
    checks::copyParts(*this, parts);
    activate();
    for (size_t first = 0; first < parts.size(); first += kCopyPartsPerLaunch) {
      CopyPartsArgs args;
      for (size_t k = first; k < parts.size() && args.parts < kCopyPartsPerLaunch; ++k) {
        const CopyPart& p = parts[k];
        args.part[args.parts++] = CopyPartArgs{p.src.data(), p.dst.data(), p.dst.size(), p.scale, p.scaled ? 1 : 0};
        args.longest = std::max(args.longest, p.dst.size());
      }
      ORPHEUS_CUDA_CHECK(launchCopyParts(args, stream_));
    }
  }

  // One launch per kAddTermsPerLaunch terms, in order on the stream.
  void addInOrder(std::span<const Tensor* const> terms, Tensor& y) override {
    countLaunches(terms.size(), kAddTermsPerLaunch);
    checks::addInOrder(*this, terms, y);
    if (y.size() == 0) return;
    activate();
    for (size_t first = 0; first < terms.size(); first += kAddTermsPerLaunch) {
      AddInOrderArgs args;
      args.count = y.size();
      args.y = y.data();
      for (size_t k = first; k < terms.size() && args.terms < kAddTermsPerLaunch; ++k) {
        args.term[args.terms++] = terms[k]->data();
      }
      ORPHEUS_CUDA_CHECK(launchAddInOrder(args, stream_));
    }
  }

  void optimizerStep(const OptimizerStep& s, const Tensor& gradient, Tensor& param, Tensor* buffer0,
                     Tensor* buffer1) override {
    countLaunch();
    const auto [b0, b1] = checks::optimizerStep(*this, s, gradient, param, buffer0, buffer1);
    if (param.size() == 0) return;
    activate();
    ORPHEUS_CUDA_CHECK(launchOptimizerStep(s, param.size(), gradient.data(), param.data(), b0 ? b0->data() : nullptr,
                                           b1 ? b1->data() : nullptr, stream_));
  }

 private:
  // cudaSetDevice is per host thread: set it on every entry, so a backend works
  // from whichever thread uses it (one at a time).
  // Stream-ordered memory from the device's pool, which keeps what it gets (the
  // release threshold is raised once): a freed buffer is reused by later
  // allocations of this stream without a cudaFree that would synchronise the device,
  // and never while work queued before the free still uses it.
  void* deviceAlloc(size_t bytes) {
    activate();
    void* p = nullptr;
    ORPHEUS_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream_));
    return p;
  }
  // Frees on the backend's stream; the status is ignored because a deleter must not
  // throw. Tensors must not outlive their backend (its stream).
  std::function<void(float*)> deviceFree() const {
    return [device = device_, stream = stream_](float* p) {
      static_cast<void>(cudaSetDevice(device));
      static_cast<void>(cudaFreeAsync(p, stream));
    };
  }

  static LstmCellKernelArgs lstmArgs(const LstmCellArgs& a) {
    LstmCellKernelArgs k;
    k.rows = a.cPrev->rows();
    k.cols = a.cPrev->cols();
    k.gates = a.gates->data();
    k.cPrev = a.cPrev->data();
    for (size_t g = 0; g < 4; ++g) {
      k.offset[g] = a.offset[g];
      k.act[g] = a.act[g]->data();
    }
    k.cell = a.cell ? a.cell->data() : nullptr;
    k.tanhCell = a.tanhCell->data();
    k.hidden = a.hidden ? a.hidden->data() : nullptr;
    return k;
  }

  // A timed event recorded on `stream` (CUDA's event timer measures copies).
  Event recordOn(cudaStream_t stream) {
    activate();
    cudaEvent_t e = nullptr;
    ORPHEUS_CUDA_CHECK(cudaEventCreate(&e));
    std::shared_ptr<CUevent_st> owned(e, [](cudaEvent_t q) { static_cast<void>(cudaEventDestroy(q)); });
    ORPHEUS_CUDA_CHECK(cudaEventRecord(e, stream));
    return Event(this, std::shared_ptr<void>(owned, e));
  }
  static cudaEvent_t eventOf(const Event& e) { return static_cast<cudaEvent_t>(e.state()); }

  // The copy stream first waits for everything queued on the compute stream, so the
  // copy reads (or overwrites) what those operations left; the copies keep their
  // order on it. An event that was waited on may be destroyed at once.
  AsyncCopy onCopyStream(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    activate();
    cudaEvent_t queued = nullptr;
    ORPHEUS_CUDA_CHECK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(queued, stream_);
    const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(copyStream_, queued, 0) : recorded;
    static_cast<void>(cudaEventDestroy(queued));
    ORPHEUS_CUDA_CHECK(waited);
    AsyncCopy c;
    c.started = recordOn(copyStream_);
    if (bytes > 0) ORPHEUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, copyStream_));
    c.done = recordOn(copyStream_);
    if (syncEveryCall_) {
      ORPHEUS_CUDA_CHECK(cudaStreamSynchronize(copyStream_));
      ORPHEUS_CUDA_CHECK(cudaGetLastError());
    }
    return c;
  }

  void upload(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) ORPHEUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }

  void activate() const {
    ORPHEUS_CUDA_CHECK(cudaSetDevice(device_));
    // ORPHEUS_CUDA_SYNC=1: the previous call's kernels are finished and checked
    // before the next one starts, so an error names the call that caused it.
    if (syncEveryCall_) {
      ORPHEUS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      ORPHEUS_CUDA_CHECK(cudaGetLastError());
    }
  }

  ChainArgs chainArgs(const EwChain& chain, std::span<const Tensor* const> inputs, checks::ChainShape shape) const {
    ChainArgs args{};  // checks::forward/backward held the chain to chainLimits() already
    args.steps = static_cast<int>(chain.steps.size());
    args.rows = shape.rows;
    args.cols = shape.cols;
    for (size_t k = 0; k < chain.steps.size(); ++k) {
      const EwStep& s = chain.steps[k];
      args.step[k].op = s.op;
      args.step[k].attr = static_cast<float>(s.attr);
      for (size_t o = 0; o < 2; ++o) {
        args.step[k].fromStep[o] = s.operand[o].kind == EwRef::Kind::kStep ? 1 : 0;
        args.step[k].index[o] = s.operand[o].index;
      }
    }
    for (size_t k = 0; k < inputs.size(); ++k) {
      args.input[k] = inputs[k]->data();
      args.broadcast[k] = inputs[k]->cols() == 1 && shape.cols != 1;
      args.inputGrad[k] = nullptr;
    }
    return args;
  }

  int device_ = 0;
  bool syncEveryCall_ = false;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copyStream_ = nullptr;  // the asynchronous copies (Backend::copyToHostAsync)
  cublasHandle_t blas_ = nullptr;
};

}  // namespace

int visibleDevices(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // Any failure here (no driver, a driver older than the runtime) means no usable GPU.
    if (why) *why = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(status));
    static_cast<void>(cudaGetLastError());  // clear the sticky error for later calls
    return 0;
  }
  if (count == 0 && why) *why = "cudaGetDeviceCount found 0 devices";
  return count;
}

std::unique_ptr<Backend> makeCudaBackend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace orpheus::ops::cuda
