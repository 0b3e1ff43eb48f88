// Helpers of the device executor's tests: parameters to and from a backend,
// bitwise comparisons of batches and parameters, and a CPU backend that counts
// what it allocates.
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/model.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

namespace orpheus::ops::testing {

// A minibatch held both dense and sparse, with its labels.
struct ExampleData {
  Matrix dense;
  SparseMatrix sparse;
  Eigen::VectorXi labels;

  ExampleBatch batch(bool useSparse) const {
    ExampleBatch x;
    if (useSparse) {
      x.sparse = &sparse;
    } else {
      x.dense = &dense;
    }
    x.labels = &labels;
    return x;
  }
};

inline std::vector<Tensor> upload(Backend& backend, const ParamSet& w) {
  std::vector<Tensor> out;
  for (const Param& p : w.params) {
    out.push_back(backend.allocate(p.value.rows(), p.value.cols()));
    backend.copy(cpu::view(p.value), out.back());
  }
  return out;
}

inline std::vector<Tensor> allocateLike(Backend& backend, const ParamSet& w) {
  std::vector<Tensor> out;
  for (const Param& p : w.params) out.push_back(backend.allocate(p.value.rows(), p.value.cols()));
  return out;
}

inline ParamSet download(Backend& backend, const ParamSet& like, const std::vector<Tensor>& t) {
  ParamSet out = like;
  for (size_t i = 0; i < t.size(); ++i) {
    Tensor host = cpu::view(out[i]);
    backend.copy(t[i], host);
  }
  return out;
}

inline bool bitwise(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         (a.size() == 0 || std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size()) * sizeof(float)) == 0);
}

inline bool bitwise(const SparseMatrix& a, const SparseMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && bitwise(Matrix(a), Matrix(b));
}

inline void requireSameBatch(const SvBatch& a, const SvBatch& b) {
  REQUIRE(a.matrices.size() == b.matrices.size());
  CHECK(bitwise(Matrix(a.coeffs), Matrix(b.coeffs)));
  for (size_t i = 0; i < a.matrices.size(); ++i) {
    INFO("site " << i);
    const SvMatrix& x = a.matrices[i];
    const SvMatrix& y = b.matrices[i];
    CHECK(x.paramId == y.paramId);
    CHECK(x.biasId == y.biasId);
    REQUIRE(x.sparseV == y.sparseV);
    CHECK(bitwise(x.u, y.u));
    if (x.sparseV) {
      CHECK(bitwise(x.vSparse, y.vSparse));
    } else {
      CHECK(bitwise(x.vDense, y.vDense));
    }
  }
}

inline void requireSameParams(const ParamSet& a, const ParamSet& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << a.params[i].name);
    CHECK(bitwise(a[i], b[i]));
  }
}

// `model`'s SVs, loss and dense gradient on `backend`, from parameters uploaded
// there, are bitwise the host path's (`host`, `hostLoss`, `hostGrad`). Returns the
// uploaded parameters, for more checks on the device.
inline std::vector<Tensor> requireDevicePassBitwise(const Model& model, const ParamSet& w, const ExampleBatch& x,
                                                    Backend& backend, const SvBatch& host, double hostLoss,
                                                    const ParamSet& hostGrad) {
  INFO("backend " << backend.name());
  std::vector<Tensor> dw = upload(backend, w);
  double loss = 0.0;
  requireSameBatch(model.computeSvgOnDevice(dw, x, &loss, backend), host);
  CHECK(loss == hostLoss);
  std::vector<Tensor> dg = allocateLike(backend, w);
  model.denseGradientOnDevice(dw, x, &loss, backend, dg);
  requireSameParams(download(backend, w, dg), hostGrad);
  return dw;
}

// A CPU backend that counts the tensors it allocates and the sparse copies it makes.
class CountingBackend final : public cpu::CpuBackend {
 public:
  Tensor allocate(int64_t rows, int64_t cols) override {
    ++allocations;
    return cpu::CpuBackend::allocate(rows, cols);
  }
  using cpu::CpuBackend::copySparse;
  void copySparse(const SparseTensor& src, SparseCopy& dst) override {
    ++sparseCopies;
    const void* before = dst.storage.get();
    cpu::CpuBackend::copySparse(src, dst);
    if (dst.storage.get() != before) ++sparseStorages;
  }
  int allocations = 0;
  int sparseCopies = 0;
  int sparseStorages = 0;  // copies that made new storage
};

}  // namespace orpheus::ops::testing
