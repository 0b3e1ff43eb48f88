// The in-memory batch and its views: viewOf and toBatch. The wire encoding is in
// sv_batch_encode.cc, decoding and validation in sv_batch_decode.cc.
#include "engine/base/sv_batch.h"
#include "engine/base/sv_batch_wire.h"

#include <algorithm>
#include <bit>
#include <cstdint>

namespace orpheus {

const char* svDtypeName(SvDtype dtype) {
  switch (dtype) {
    case SvDtype::kF32: return "f32";
    case SvDtype::kBf16: return "bf16";
  }
  return "unknown";
}

float roundToBf16(float x) {
  // Ties to even on the 16 bits dropped; finite values only (an SV batch holds no
  // others). A value above bf16's largest rounds to infinity, which the encoder refuses.
  const auto bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  return std::bit_cast<float>(rounded);
}

namespace {
void roundAll(float* p, Eigen::Index count) {
  for (Eigen::Index i = 0; i < count; ++i) p[i] = roundToBf16(p[i]);
}
}  // namespace

void roundToBf16(SvBatch& batch) {
  for (SvMatrix& m : batch.matrices) {
    roundAll(m.u.data(), m.u.size());
    if (m.sparseV) {
      roundAll(m.vSparse.valuePtr(), static_cast<Eigen::Index>(m.vSparse.data().size()));
    } else {
      roundAll(m.vDense.data(), m.vDense.size());
    }
  }
  batch.dtype = SvDtype::kBf16;
}

SvBatchView viewOf(const SvBatch& batch) {
  SvBatchView v;
  v.header = batch.header;
  v.dtype = batch.dtype;
  v.columns = batch.numColumns();
  v.coeffs = batch.coeffs.data();
  v.matrices.reserve(batch.matrices.size());
  for (const SvMatrix& m : batch.matrices) v.matrices.push_back(viewOf(m));
  return v;
}

SvMatrixView viewOf(const SvMatrix& m) {
  SvMatrixView x;
  x.paramId = m.paramId;
  x.biasId = m.biasId;
  x.rows = m.u.rows();
  x.vRows = m.vRows();
  x.columns = m.u.cols();
  x.u = m.u.data();
  x.sparseV = m.sparseV;
  if (m.sparseV) {
    const SparseMatrix& s = m.vSparse;
    x.vStarts = s.outerIndexPtr();
    x.vCounts = s.innerNonZeroPtr();
    x.vRowIndices = s.innerIndexPtr();
    x.vValues = s.valuePtr();
    x.nnz = s.isCompressed() ? s.nonZeros() : s.data().size();
  } else {
    x.vDense = m.vDense.data();
  }
  x.withCore = sv_wire::hasCore(m);
  if (x.withCore) x.core = m.core.data();
  if (m.biasCoeffs.size() > 0) x.biasCoeffs = m.biasCoeffs.data();
  return x;
}

SvBatchView viewOf(std::shared_ptr<const SvBatch> batch) {
  SvBatchView v = viewOf(*batch);
  v.owner = std::move(batch);
  return v;
}

SvBatch toBatch(const SvBatchView& view) {
  SvBatch b;
  b.header = view.header;
  b.dtype = view.dtype;
  b.coeffs = view.coeffsMap();
  b.matrices.resize(view.matrices.size());
  for (size_t i = 0; i < view.matrices.size(); ++i) {
    const SvMatrixView& x = view.matrices[i];
    SvMatrix& m = b.matrices[i];
    m.paramId = x.paramId;
    m.biasId = x.biasId;
    m.u = x.uMap();
    m.sparseV = x.sparseV;
    if (x.sparseV) {
      // The compressed arrays copied as they are: Eigen's sparse assignment would
      // reserve room by the dimensions (2·max(rows, cols)), and V's rows come from
      // the wire.
      // (A view of a local, uncompressed batch is assigned.)
      const Eigen::Map<const SparseMatrix> v = x.vSparseMap();
      if (v.isCompressed()) {
        m.vSparse.resize(v.rows(), v.cols());
        m.vSparse.resizeNonZeros(v.nonZeros());
        std::copy_n(v.outerIndexPtr(), v.cols() + 1, m.vSparse.outerIndexPtr());
        std::copy_n(v.innerIndexPtr(), v.nonZeros(), m.vSparse.innerIndexPtr());
        std::copy_n(v.valuePtr(), v.nonZeros(), m.vSparse.valuePtr());
      } else {
        m.vSparse = v;
        m.vSparse.makeCompressed();
      }
    } else {
      m.vDense = x.vDenseMap();
    }
    if (x.withCore) m.core = x.coreMap();
    if (x.biasCoeffs != nullptr) m.biasCoeffs = x.biasCoeffsMap();
  }
  return b;
}

}  // namespace orpheus
