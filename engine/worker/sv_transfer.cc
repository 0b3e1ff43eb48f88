#include "engine/worker/sv_transfer.h"

#include "engine/base/error.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

namespace orpheus::engine {
namespace {

size_t bytesOf(const ops::Tensor* t) { return t == nullptr ? 0 : static_cast<size_t>(t->size()) * sizeof(float); }

// The part of `copy` that ran before `passEnd`, and its whole time.
std::pair<double, double> hiddenAndTotal(ops::Backend& backend, const ops::AsyncCopy& copy, const ops::Event& passEnd) {
  const double total = std::max(0.0, backend.secondsBetween(copy.started, copy.done));
  const double before = backend.secondsBetween(copy.started, passEnd);
  return {std::clamp(before, 0.0, total), total};
}

}  // namespace

SvTransfer::SvTransfer(ops::Backend& backend, TransferMode mode) : backend_(backend), mode_(mode) {}

void SvTransfer::computeSvg(const ops::Model& model, std::span<const ops::Tensor> w, const ops::ExampleBatch& x,
                            double* meanLoss, SvBatch& batch, const std::function<void(size_t)>& landed,
                            bool toHost) {
  sites_.clear();
  toHost_ = toHost;
  batch = model.computeSvgOnDeviceStreamed(
      w, x, meanLoss, backend_, [this](size_t i, const ops::Tensor& u, const ops::Tensor* v) { siteFinal(i, u, v); });
  // Where the compute queue stands once the pass is queued: copy time before it was hidden.
  const ops::Event passEnd = mode_ == TransferMode::kStaged ? backend_.record() : ops::Event();
  std::vector<char> done(batch.matrices.size(), 0);
  for (const Site& s : sites_) {
    ORPHEUS_ENFORCE(s.index < batch.matrices.size(), "the pass handed out matrix {} of a batch of {}", s.index,
                    batch.matrices.size());
    SvMatrix& m = batch.matrices[s.index];
    if (!toHost_) {
      // Left unset: on the strict device a host read of them gives NaN, not a stale value.
      if (backend_.device() == ops::Device::kStrict) {
        m.u.setConstant(std::numeric_limits<float>::quiet_NaN());
        if (s.v != nullptr) m.vDense.setConstant(std::numeric_limits<float>::quiet_NaN());
      }
    } else if (mode_ == TransferMode::kStaged) {
      landStaged(s, m);
    } else {
      landSync(s, m);
    }
    if (toHost_) totals_.toHostBytes += bytesOf(s.u) + bytesOf(s.v);
    done[s.index] = 1;
    landed(s.index);
  }
  for (size_t i = batch.matrices.size(); i-- > 0;) {
    if (!done[i]) landed(i);
  }
  // The copies are timed against the pass's end once it is complete (a device's
  // timer reads only complete events): after every matrix was handed on.
  if (mode_ == TransferMode::kStaged && toHost_ && !sites_.empty()) {
    backend_.wait(passEnd);
    for (const Site& s : sites_) {
      for (const ops::AsyncCopy* copy : {&s.copyU, &s.copyV}) {
        if (copy->done.empty()) continue;
        const auto [hidden, total] = hiddenAndTotal(backend_, *copy, passEnd);
        totals_.hiddenSeconds += hidden;
        totals_.copySeconds += total;
      }
    }
  }
}

// Called from inside the backward pass: staged, the site's arrays are queued to
// its staging buffer now, behind the operations that made them.
void SvTransfer::siteFinal(size_t index, const ops::Tensor& u, const ops::Tensor* v) {
  Site s;
  s.index = index;
  s.u = &u;
  s.v = v;
  if (mode_ == TransferMode::kStaged && toHost_) {
    if (staging_.size() <= index) staging_.resize(index + 1);
    ops::HostBuffer& buffer = staging_[index];
    const size_t bytes = bytesOf(&u) + bytesOf(v);
    // Every copy into it landed in an earlier clock, so it may be replaced.
    if (buffer.bytes() < bytes) buffer = backend_.allocateHost(bytes);
    s.copyU = backend_.copyToHostAsync(u, buffer, 0);
    if (v != nullptr) s.copyV = backend_.copyToHostAsync(*v, buffer, bytesOf(&u));
  }
  sites_.push_back(s);
}

void SvTransfer::land(size_t i, SvMatrix& m) {
  if (toHost_) return;
  for (const Site& s : sites_) {
    if (s.index != i) continue;
    landSync(s, m);
    totals_.toHostBytes += bytesOf(s.u) + bytesOf(s.v);
  }
}

void SvTransfer::landStaged(const Site& site, SvMatrix& m) {
  ORPHEUS_ENFORCE(m.u.rows() == site.u->rows() && m.u.cols() == site.u->cols(),
                  "matrix {}'s U is {}x{}, its device copy {}x{}", site.index, m.u.rows(), m.u.cols(),
                  site.u->rows(), site.u->cols());
  const ops::HostBuffer& buffer = staging_[site.index];
  backend_.wait(site.copyU.done);
  std::memcpy(m.u.data(), buffer.data(), bytesOf(site.u));
  if (site.v != nullptr) {
    ORPHEUS_ENFORCE(!m.sparseV && m.vDense.rows() == site.v->rows() && m.vDense.cols() == site.v->cols(),
                    "matrix {}'s V does not have its device copy's shape", site.index);
    backend_.wait(site.copyV.done);
    std::memcpy(m.vDense.data(), buffer.data() + bytesOf(site.u), bytesOf(site.v));
  }
}

void SvTransfer::landSync(const Site& site, SvMatrix& m) {
  const auto t = std::chrono::steady_clock::now();
  ops::Tensor u = ops::Tensor::host(m.u.data(), m.u.rows(), m.u.cols());
  backend_.copy(*site.u, u);
  if (site.v != nullptr) {
    ops::Tensor v = ops::Tensor::host(m.vDense.data(), m.vDense.rows(), m.vDense.cols());
    backend_.copy(*site.v, v);
  }
  totals_.copySeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace orpheus::engine
