// Our LSTM on the CUDA backend (the recurrent GEMM per step on cuBLAS, the fused
// cell step forward and backward; lstm_layer.h's runLstmLayer) against cuDNN's
// LSTM (cudnnRNNForward in training mode, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8) on the same weights, inputs, initial states and
// upstream gradients: every step's output and the weight gradients within 1e-4,
// relative Frobenius. The host side (weight packing, data layout) is checked
// without a GPU by lstm_layer_test.cc; this file adds only the cuDNN calls.
//
// Exits 77, which ctest reports as skipped, when this build has no CUDA backend
// or no GPU is visible, and says which. Linked to cuDNN itself: the orpheus
// binary and liborpheus_cuda.so have no cuDNN dependency.
#define CATCH_CONFIG_RUNNER
#include "gpu_main.h"
#include "lstm_layer.h"

#include "engine/base/error.h"
#include "ops/backends.h"

#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <memory>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::test;

namespace {

#define LSTM_CUDNN_CHECK(call)                                                                              \
  do {                                                                                                      \
    const cudnnStatus_t status_ = (call);                                                                   \
    ORPHEUS_ENFORCE(status_ == CUDNN_STATUS_SUCCESS, "{} failed: {}", #call, cudnnGetErrorString(status_)); \
  } while (0)
#define LSTM_CUDA_CHECK(call)                                                                              \
  do {                                                                                                     \
    const cudaError_t status_ = (call);                                                                    \
    ORPHEUS_ENFORCE(status_ == cudaSuccess, "{} failed: {}", #call, cudaGetErrorString(status_));          \
  } while (0)

// Device memory of `bytes`, freed with the handle.
std::shared_ptr<void> deviceBuffer(size_t bytes) {
  void* p = nullptr;
  LSTM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 4)));
  return std::shared_ptr<void>(p, [](void* q) { static_cast<void>(cudaFree(q)); });
}

std::shared_ptr<void> deviceCopy(const std::vector<float>& host) {
  auto d = deviceBuffer(host.size() * sizeof(float));
  LSTM_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> hostCopy(const std::shared_ptr<void>& d, size_t floats) {
  std::vector<float> host(floats);
  LSTM_CUDA_CHECK(cudaMemcpy(host.data(), d.get(), floats * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<float> flat(const MatF& m) { return std::vector<float>(m.data(), m.data() + m.size()); }

// One cuDNN LSTM layer and its descriptors, for a problem's sizes.
class CudnnLstm {
 public:
  explicit CudnnLstm(const LstmProblem& p) : p_(p) {
    LSTM_CUDNN_CHECK(cudnnCreate(&handle_));
    LSTM_CUDNN_CHECK(cudnnCreateDropoutDescriptor(&dropout_));
    size_t stateBytes = 0;
    LSTM_CUDNN_CHECK(cudnnDropoutGetStatesSize(handle_, &stateBytes));
    dropoutStates_ = deviceBuffer(stateBytes);
    LSTM_CUDNN_CHECK(cudnnSetDropoutDescriptor(dropout_, handle_, 0.0f, dropoutStates_.get(), stateBytes, 1));
    LSTM_CUDNN_CHECK(cudnnCreateRNNDescriptor(&rnn_));
    // FP32 data and arithmetic, FMA kernels only: CUDNN_DEFAULT_MATH lets cuDNN use
    // TF32 tensor cores on A100 and later, whose 10-bit mantissas would not meet 1e-4.
    LSTM_CUDNN_CHECK(cudnnSetRNNDescriptor_v8(
        rnn_, CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS, CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT,
        CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, static_cast<int32_t>(p.input),
        static_cast<int32_t>(p.hidden), static_cast<int32_t>(p.hidden), 1, dropout_, CUDNN_RNN_PADDED_IO_DISABLED));
    const std::vector<int> lengths(static_cast<size_t>(p.batch), static_cast<int>(p.steps));
    devLengths_ = deviceBuffer(lengths.size() * sizeof(int32_t));
    LSTM_CUDA_CHECK(cudaMemcpy(devLengths_.get(), lengths.data(), lengths.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
    xDesc_ = dataDescriptor(p.input, lengths);
    yDesc_ = dataDescriptor(p.hidden, lengths);
    const int dims[3] = {1, static_cast<int>(p.batch), static_cast<int>(p.hidden)};
    const int strides[3] = {dims[1] * dims[2], dims[2], 1};
    LSTM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&stateDesc_));
    LSTM_CUDNN_CHECK(cudnnSetTensorNdDescriptor(stateDesc_, CUDNN_DATA_FLOAT, 3, dims, strides));
    size_t weightBytes = 0;
    LSTM_CUDNN_CHECK(cudnnGetRNNWeightSpaceSize(handle_, rnn_, &weightBytes));
    weightBytes_ = weightBytes;
    weights_ = deviceBuffer(weightBytes);
    LSTM_CUDNN_CHECK(cudnnGetRNNTempSpaceSizes(handle_, rnn_, CUDNN_FWD_MODE_TRAINING, xDesc_, &workBytes_,
                                               &reserveBytes_));
    work_ = deviceBuffer(workBytes_);
    reserve_ = deviceBuffer(reserveBytes_);
    layout_ = readLayout();
  }
  ~CudnnLstm() {
    static_cast<void>(cudnnDestroyTensorDescriptor(stateDesc_));
    static_cast<void>(cudnnDestroyRNNDataDescriptor(xDesc_));
    static_cast<void>(cudnnDestroyRNNDataDescriptor(yDesc_));
    static_cast<void>(cudnnDestroyRNNDescriptor(rnn_));
    static_cast<void>(cudnnDestroyDropoutDescriptor(dropout_));
    static_cast<void>(cudnnDestroy(handle_));
  }
  CudnnLstm(const CudnnLstm&) = delete;
  CudnnLstm& operator=(const CudnnLstm&) = delete;

  const CudnnLstmLayout& layout() const { return layout_; }

  // Forward in training mode, then the data and weight gradients for the upstream
  // gradients p.dy (none for the final states).
  LstmResult run() {
    const LstmProblem& p = p_;
    const std::vector<float> space = packCudnnWeights(p, layout_);
    LSTM_CUDA_CHECK(cudaMemcpy(weights_.get(), space.data(), space.size() * sizeof(float), cudaMemcpyHostToDevice));
    const size_t outFloats = static_cast<size_t>(p.hidden * p.batch * p.steps);
    const size_t stateFloats = static_cast<size_t>(p.hidden * p.batch);
    const auto x = deviceCopy(seqMajor(p.x));
    const auto hx = deviceCopy(flat(p.h0));
    const auto cx = deviceCopy(flat(p.c0));
    const auto y = deviceBuffer(outFloats * sizeof(float));
    const auto hy = deviceBuffer(stateFloats * sizeof(float));
    const auto cy = deviceBuffer(stateFloats * sizeof(float));
    LSTM_CUDNN_CHECK(cudnnRNNForward(handle_, rnn_, CUDNN_FWD_MODE_TRAINING, lengths(), xDesc_, x.get(), yDesc_,
                                     y.get(), stateDesc_, hx.get(), hy.get(), stateDesc_, cx.get(), cy.get(),
                                     weightBytes_, weights_.get(), workBytes_, work_.get(), reserveBytes_,
                                     reserve_.get()));
    const auto dy = deviceCopy(seqMajor(p.dy));
    const auto zeros = deviceCopy(std::vector<float>(stateFloats, 0.0f));
    const auto dx = deviceBuffer(static_cast<size_t>(p.input * p.batch * p.steps) * sizeof(float));
    const auto dhx = deviceBuffer(stateFloats * sizeof(float));
    const auto dcx = deviceBuffer(stateFloats * sizeof(float));
    LSTM_CUDNN_CHECK(cudnnRNNBackwardData_v8(handle_, rnn_, lengths(), yDesc_, y.get(), dy.get(), xDesc_, dx.get(),
                                             stateDesc_, hx.get(), zeros.get(), dhx.get(), stateDesc_, cx.get(),
                                             zeros.get(), dcx.get(), weightBytes_, weights_.get(), workBytes_,
                                             work_.get(), reserveBytes_, reserve_.get()));
    // Weight gradients are added to the space given (CUDNN_WGRAD_MODE_ADD): start from zeros.
    const auto dweights = deviceBuffer(weightBytes_);
    LSTM_CUDA_CHECK(cudaMemset(dweights.get(), 0, weightBytes_));
    LSTM_CUDNN_CHECK(cudnnRNNBackwardWeights_v8(handle_, rnn_, CUDNN_WGRAD_MODE_ADD, lengths(), xDesc_, x.get(),
                                                stateDesc_, hx.get(), yDesc_, y.get(), weightBytes_, dweights.get(),
                                                workBytes_, work_.get(), reserveBytes_, reserve_.get()));
    LSTM_CUDA_CHECK(cudaDeviceSynchronize());
    LstmResult r;
    r.h = fromSeqMajor(hostCopy(y, outFloats), p.hidden, p.batch, p.steps);
    unpackCudnnGradients(hostCopy(dweights, weightBytes_ / sizeof(float)), layout_, p, r.dw, r.db, dbRecurrent_);
    r.dh0 = fromSeqMajor(hostCopy(dhx, stateFloats), p.hidden, p.batch, 1)[0];
    r.dc0 = fromSeqMajor(hostCopy(dcx, stateFloats), p.hidden, p.batch, 1)[0];
    return r;
  }
  // After run(): the recurrent biases' gradient, which should be the input biases'.
  const MatD& dbRecurrent() const { return dbRecurrent_; }

 private:
  const int32_t* lengths() const { return static_cast<const int32_t*>(devLengths_.get()); }

  cudnnRNNDataDescriptor_t dataDescriptor(int64_t vector, const std::vector<int>& lengths) {
    cudnnRNNDataDescriptor_t d = nullptr;
    LSTM_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(&d));
    float fill = 0.0f;
    LSTM_CUDNN_CHECK(cudnnSetRNNDataDescriptor(d, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED,
                                               static_cast<int>(p_.steps), static_cast<int>(p_.batch),
                                               static_cast<int>(vector), lengths.data(), &fill));
    return d;
  }

  // Where each gate's matrices and biases lie in the weight space.
  CudnnLstmLayout readLayout() {
    CudnnLstmLayout l;
    l.floats = static_cast<int64_t>(weightBytes_ / sizeof(float));
    cudnnTensorDescriptor_t m = nullptr;
    cudnnTensorDescriptor_t b = nullptr;
    LSTM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&m));
    LSTM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&b));
    const auto block = [&](cudnnTensorDescriptor_t d, void* addr) {
      cudnnDataType_t type{};
      int nbDims = 0;
      int dims[3] = {0, 0, 0};
      int strides[3] = {0, 0, 0};
      LSTM_CUDNN_CHECK(cudnnGetTensorNdDescriptor(d, 3, &type, &nbDims, dims, strides));
      ORPHEUS_ENFORCE(type == CUDNN_DATA_FLOAT && nbDims >= 2 && nbDims <= 3,
                      "cuDNN weight block: type {}, {} dimensions", static_cast<int>(type), nbDims);
      const auto bytes = static_cast<const char*>(addr) - static_cast<const char*>(weights_.get());
      // The last two dimensions are the matrix's rows and columns (a bias: H x 1).
      const int r = nbDims - 2;
      const int c = nbDims - 1;
      return CudnnBlock{static_cast<int64_t>(bytes) / static_cast<int64_t>(sizeof(float)), dims[r], dims[c],
                        strides[r], strides[c]};
    };
    for (int k = 0; k < 8; ++k) {
      void* mAddr = nullptr;
      void* bAddr = nullptr;
      LSTM_CUDNN_CHECK(
          cudnnGetRNNWeightParams(handle_, rnn_, 0, weightBytes_, weights_.get(), k, m, &mAddr, b, &bAddr));
      ORPHEUS_ENFORCE(mAddr != nullptr && bAddr != nullptr, "cuDNN linear layer {} has no matrix or no bias", k);
      l.matrix[static_cast<size_t>(k)] = block(m, mAddr);
      l.bias[static_cast<size_t>(k)] = block(b, bAddr);
    }
    static_cast<void>(cudnnDestroyTensorDescriptor(m));
    static_cast<void>(cudnnDestroyTensorDescriptor(b));
    checkLayout(l, p_.input, p_.hidden);
    return l;
  }

  const LstmProblem& p_;
  cudnnHandle_t handle_ = nullptr;
  cudnnDropoutDescriptor_t dropout_ = nullptr;
  cudnnRNNDescriptor_t rnn_ = nullptr;
  cudnnRNNDataDescriptor_t xDesc_ = nullptr;
  cudnnRNNDataDescriptor_t yDesc_ = nullptr;
  cudnnTensorDescriptor_t stateDesc_ = nullptr;
  std::shared_ptr<void> dropoutStates_, devLengths_, weights_, work_, reserve_;
  size_t weightBytes_ = 0;
  size_t workBytes_ = 0;
  size_t reserveBytes_ = 0;
  CudnnLstmLayout layout_;
  MatD dbRecurrent_;
};

void compare(int64_t input, int64_t hidden, bool withReference) {
  const auto gpu = makeBackend("cuda", 0);
  std::mt19937 rng(static_cast<unsigned>(71 + hidden));
  const LstmProblem p = randomLstmProblem(rng, input, hidden, 32, 20, {0, hidden, 2 * hidden, 3 * hidden});
  const LstmResult ours = runLstmLayer(*gpu, p);
  CudnnLstm cudnn(p);
  const LstmResult theirs = cudnn.run();
  const double h = relativeFrobenius(stacked(ours.h), stacked(theirs.h));
  const double dw = relativeFrobenius(ours.dw, theirs.dw);
  const double db = relativeFrobenius(ours.db, theirs.db);
  const double dh0 = relativeFrobenius(ours.dh0, theirs.dh0);
  const double dc0 = relativeFrobenius(ours.dc0, theirs.dc0);
  std::printf("LSTM E=%lld H=%lld B=32 T=20, ours against cuDNN (relative Frobenius): outputs %.2e, dW %.2e, "
              "db %.2e, dh0 %.2e, dc0 %.2e\n",
              static_cast<long long>(input), static_cast<long long>(hidden), h, dw, db, dh0, dc0);
  CHECK(h <= 1e-4);
  CHECK(dw <= 1e-4);
  CHECK(db <= 1e-4);
  CHECK(dh0 <= 1e-4);
  CHECK(dc0 <= 1e-4);
  CHECK(relativeFrobenius(cudnn.dbRecurrent(), theirs.db) <= 1e-6);
  if (withReference) {
    // Both against float64: which side drifts, if one does.
    const LstmResult want = referenceLstm(p);
    const double oursRef = relativeFrobenius(ours.dw, want.dw);
    const double theirsRef = relativeFrobenius(theirs.dw, want.dw);
    std::printf("  dW against float64: ours %.2e, cuDNN %.2e; outputs: ours %.2e, cuDNN %.2e\n", oursRef, theirsRef,
                relativeFrobenius(stacked(ours.h), stacked(want.h)),
                relativeFrobenius(stacked(theirs.h), stacked(want.h)));
    CHECK(oursRef <= 1e-4);
    CHECK(theirsRef <= 1e-4);
  }
}

}  // namespace

TEST_CASE("cuda LSTM matches cuDNN's LSTM, H 256", "[gpu][lstm]") { compare(128, 256, true); }

TEST_CASE("cuda LSTM matches cuDNN's LSTM, H 1024", "[gpu][lstm]") { compare(512, 1024, false); }

int main(int argc, char** argv) { return orpheus::ops::test::runGpuTests(argc, argv); }
