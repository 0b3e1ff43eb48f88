// The asynchronous copies of a backend whose copies are synchronous (the CPU's):
// each copy is done when the call returns; events are complete when made and carry
// the host's clock at that moment.
#include "ops/backend.h"

#include "ops/backend_checks.h"

#include <chrono>
#include <cstdlib>

namespace orpheus::ops {
namespace {

// A synchronous backend's event: when it was made.
struct HostTime {
  double seconds = 0.0;
};

double hostSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void Backend::checkAsyncCopy(const char* op, const Tensor& device, const HostBuffer& host, size_t offset) const {
  ORPHEUS_ENFORCE(device.device() == this->device(), "backend {}: the tensor of {} lives in {} memory", name(), op,
                  deviceName(device.device()));
  const size_t bytes = static_cast<size_t>(device.size()) * sizeof(float);
  ORPHEUS_ENFORCE(offset % sizeof(float) == 0 && offset <= host.bytes() && bytes <= host.bytes() - offset,
                  "backend {}: {} of {} bytes at byte {} of a host buffer of {}", name(), op, bytes, offset,
                  host.bytes());
}

HostBuffer Backend::allocateHost(size_t bytes) {
  // Aligned for any float access; at least one byte, so data() is never null.
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw Error(fmt::format("backend {}: a host buffer of {} bytes: out of memory", name(), bytes));
  return HostBuffer(p, bytes, [](void* q) { std::free(q); });
}

AsyncCopy Backend::copyToHostAsync(const Tensor& src, HostBuffer& dst, size_t offset) {
  checkAsyncCopy("copyToHostAsync", src, dst, offset);
  AsyncCopy c;
  c.started = record();
  Tensor to = dst.floats(offset, src.rows(), src.cols());
  copy(src, to);
  c.done = record();
  return c;
}

AsyncCopy Backend::copyToDeviceAsync(const HostBuffer& src, size_t offset, Tensor& dst) {
  checkAsyncCopy("copyToDeviceAsync", dst, src, offset);
  AsyncCopy c;
  c.started = record();
  copy(src.floats(offset, dst.rows(), dst.cols()), dst);
  c.done = record();
  return c;
}

void Backend::copyParts(std::span<const CopyPart> parts) {
  checks::copyParts(*this, parts);
  for (const CopyPart& p : parts) {
    Tensor dst = Tensor::view(p.dst.device(), p.dst.data(), p.dst.rows(), p.dst.cols());
    const Tensor src = Tensor::view(p.src.device(), p.src.data(), p.dst.rows(), p.dst.cols());
    if (!p.scaled) {
      copy(src, dst);
      continue;
    }
    EwChain chain;
    chain.inputs = 1;
    chain.steps.push_back(EwStep{EwOp::kScale, {EwRef{EwRef::Kind::kInput, 0}, EwRef{}}, static_cast<double>(p.scale)});
    const Tensor* in[] = {&src};
    Tensor* out[] = {&dst};
    elementwise(chain, in, out);
  }
}

void Backend::addInOrder(std::span<const Tensor* const> terms, Tensor& y) {
  checks::addInOrder(*this, terms, y);
  for (const Tensor* t : terms) axpy(1.0f, *t, y);
}

Event Backend::record() { return Event(this, std::make_shared<HostTime>(HostTime{hostSeconds()})); }

void Backend::waitOnDevice(const Event& e) { checkOwn(e, "waitOnDevice"); }

bool Backend::ready(const Event& e) {
  checkOwn(e, "ready");
  return true;
}

void Backend::wait(const Event& e) { checkOwn(e, "wait"); }

double Backend::secondsBetween(const Event& from, const Event& to) {
  checkOwn(from, "secondsBetween");
  checkOwn(to, "secondsBetween");
  ORPHEUS_ENFORCE(!from.empty() && !to.empty(), "backend {}: secondsBetween of an empty event", name());
  return static_cast<const HostTime*>(to.state())->seconds - static_cast<const HostTime*>(from.state())->seconds;
}

}  // namespace orpheus::ops
