// The SV batch the wire-format tests encode: n = 3 columns; matrix 0: param 0
// (4x5), bias param 1 (4x1), dense V, per-column coefficients; matrix 1: param 2
// (3x6), sparse V (4 non-zeros, column 1 empty), a 3x3 core. Sender 3, clock 17.
#pragma once

#include "engine/base/rng.h"
#include "engine/base/sv_batch.h"

namespace orpheus::testing {

inline constexpr uint32_t kSender = 3;
inline constexpr uint64_t kClock = 17;

inline Matrix randomMatrix(CounterRng& rng, int64_t rows, int64_t cols) {
  Matrix m(rows, cols);
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) m(i, j) = static_cast<float>(rng.normal());
  }
  return m;
}

inline SvBatch makeBatch() {
  CounterRng rng(7, RngPurpose::kTest, 0, 0);
  SvBatch b;
  b.header = {.jobId = 0x1122334455667788ULL, .sender = kSender, .replica = 2, .clock = kClock, .epoch = 4};
  b.coeffs = Vector(3);
  b.coeffs << 0.5f, -1.25f, 2.0f;

  SvMatrix dense;
  dense.paramId = 0;
  dense.biasId = 1;
  dense.u = randomMatrix(rng, 4, 3);
  dense.vDense = randomMatrix(rng, 5, 3);
  dense.vDense(2, 1) = -0.0f;  // sign of zero must survive
  b.matrices.push_back(dense);

  SvMatrix sparse;
  sparse.paramId = 2;
  sparse.u = randomMatrix(rng, 3, 3);
  sparse.sparseV = true;
  sparse.vSparse = SparseMatrix(6, 3);
  sparse.vSparse.insert(0, 0) = 1.5f;
  sparse.vSparse.insert(4, 0) = -2.0f;
  sparse.vSparse.insert(5, 2) = 3.25f;  // column 1 stays empty
  sparse.vSparse.insert(1, 2) = 0.75f;
  sparse.vSparse.makeCompressed();
  sparse.core = randomMatrix(rng, 3, 3);
  b.matrices.push_back(sparse);
  return b;
}

inline SvBatchExpectation makeExpectation() {
  SvBatchExpectation e;
  e.sender = kSender;
  e.clock = kClock;
  e.paramShapes = {{4, 5}, {4, 1}, {3, 6}};
  return e;
}

}  // namespace orpheus::testing
