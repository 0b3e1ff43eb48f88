#include "ops/strict/strict_backend.h"

#include "ops/backend_checks.h"
#include "ops/cpu/cpu_backend.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace orpheus::ops::strict {
namespace {

size_t pageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// The mappings one backend made: start -> length. Shared with the deleters, so a
// tensor may outlive its backend.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, size_t> regions;

  void* map(size_t bytes) {
    const size_t page = pageSize();
    const size_t length = bytes == 0 ? page : (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(fmt::format("backend strict: mmap of {} bytes failed: {}", length, strerror(errno)));
    std::lock_guard lock(mutex);
    regions[reinterpret_cast<uintptr_t>(p)] = length;
    return p;
  }

  void unmap(void* p) {
    size_t length = 0;
    {
      std::lock_guard lock(mutex);
      auto it = regions.find(reinterpret_cast<uintptr_t>(p));
      if (it == regions.end()) return;
      length = it->second;
      regions.erase(it);
      inbound.erase(reinterpret_cast<uintptr_t>(p));
    }
    static_cast<void>(munmap(p, length));
  }

  // Mappings an asynchronous copy from the host is still to land in (by start):
  // no operation may use them until it has (Backend::waitOnDevice).
  std::map<uintptr_t, int> inbound;
  void markInbound(uintptr_t start, int delta) {
    std::lock_guard lock(mutex);
    if ((inbound[start] += delta) <= 0) inbound.erase(start);
  }
  bool awaitsInbound(uintptr_t start) {
    std::lock_guard lock(mutex);
    return inbound.count(start) > 0;
  }

  // The mapping that holds `p`: {start, length}, or {0, 0}.
  std::pair<uintptr_t, size_t> find(const void* p) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    std::lock_guard lock(mutex);
    auto it = regions.upper_bound(at);
    if (it == regions.begin()) return {0, 0};
    --it;
    if (at >= it->first + it->second) return {0, 0};
    return {it->first, it->second};
  }
};

// The mappings of one operation's operands, readable and writable while it lives.
class Opened {
 public:
  Opened(Registry& registry, const char* op) : registry_(registry), op_(op) {}
  ~Opened() {
    for (const auto& [start, length] : open_) {
      static_cast<void>(mprotect(reinterpret_cast<void*>(start), length, PROT_NONE));
    }
  }
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;

  // `landing`: a copy landing in the mapping, which other copies may still be due
  // to land in (their columns apart): no operation reads it until all have.
  void open(const void* p, bool landing = false) {
    if (p == nullptr) return;
    const auto region = registry_.find(p);
    ORPHEUS_ENFORCE(region.second > 0, "backend strict: an operand of {} is not memory of this strict device", op_);
    ORPHEUS_ENFORCE(landing || !registry_.awaitsInbound(region.first),
                    "backend strict: {} used a tensor whose asynchronous copy from the host has not landed (call "
                    "waitOnDevice or wait on the copy's done event first)",
                    op_);
    for (const auto& o : open_) {
      if (o.first == region.first) return;
    }
    if (mprotect(reinterpret_cast<void*>(region.first), region.second, PROT_READ | PROT_WRITE) != 0) {
      throw Error(fmt::format("backend strict: mprotect failed: {}", strerror(errno)));
    }
    open_.push_back(region);
  }
  // The operand as the CPU backend sees it (its mapping opened when it is strict).
  Tensor host(const Tensor& t) {
    if (t.device() == Device::kStrict && t.size() > 0) open(t.data());
    return Tensor::view(Device::kCpu, t.data(), t.rows(), t.cols());
  }
  SparseTensor host(const SparseTensor& s) {
    if (s.device == Device::kStrict) {
      open(s.outer);
      if (s.nonZeros > 0) {
        open(s.inner);
        open(s.values);
      }
    }
    SparseTensor h = s;
    h.device = Device::kCpu;
    return h;
  }

 private:
  Registry& registry_;
  const char* op_;
  std::vector<std::pair<uintptr_t, size_t>> open_;
};

class StrictBackend final : public Backend {
 public:
  StrictBackend() : registry_(std::make_shared<Registry>()) { installFaultReport(); }

  const char* name() const override { return "strict"; }
  Device device() const override { return Device::kStrict; }
  std::string describe() const override { return "strict (host memory closed to host code between backend calls)"; }
  // A GPU's, so that plans made for one are the plans tested here.
  ChainLimits chainLimits() const override { return kDeviceChainLimits; }

  Tensor allocate(int64_t rows, int64_t cols) override {
    ORPHEUS_ENFORCE(rows >= 0 && cols >= 0, "allocate: shape {}x{}", rows, cols);
    auto* p = static_cast<float*>(registry_->map(static_cast<size_t>(rows * cols) * sizeof(float)));
    std::shared_ptr<Registry> registry = registry_;
    return Tensor(Device::kStrict, p, rows, cols, [registry](float* q) { registry->unmap(q); });
  }

  void copy(const Tensor& src, Tensor& dst) override {
    countLaunch();
    checks::sameShape("copy", src, dst);
    ORPHEUS_ENFORCE(src.device() != Device::kCuda && dst.device() != Device::kCuda,
                    "backend strict: copy from {} to {} memory", deviceName(src.device()), deviceName(dst.device()));
    countCopy(src.device(), dst.device(), static_cast<uint64_t>(src.size()) * sizeof(float));
    countBlocking(src.device(), dst.device());
    Opened o(*registry_, "copy");
    const Tensor s = o.host(src);
    Tensor d = o.host(dst);
    if (s.size() > 0 && s.data() != d.data()) {
      std::memmove(d.data(), s.data(), static_cast<size_t>(s.size()) * sizeof(float));
    }
  }

  using Backend::copySparse;
  void copySparse(const SparseTensor& src, SparseCopy& dst) override {
    countLaunch();
    ORPHEUS_ENFORCE(src.device != Device::kCuda, "backend strict: a sparse copy from cuda memory");
    const int64_t outerSize = (src.layout == SparseTensor::Layout::kCsc ? src.cols : src.rows) + 1;
    const size_t indexBytes = static_cast<size_t>(outerSize + src.nonZeros) * sizeof(int32_t);
    const size_t bytes = indexBytes + static_cast<size_t>(src.nonZeros) * sizeof(float);
    countCopy(src.device, Device::kStrict, bytes);
    countBlocking(src.device, Device::kStrict);
    if (!dst.storage || dst.view.device != Device::kStrict || dst.capacity < bytes) {
      std::shared_ptr<Registry> registry = registry_;
      dst.storage = std::shared_ptr<void>(registry_->map(bytes), [registry](void* p) { registry->unmap(p); });
      dst.capacity = bytes;
    }
    void* block = dst.storage.get();
    auto* outer = static_cast<int32_t*>(block);
    int32_t* inner = outer + outerSize;
    auto* values = reinterpret_cast<float*>(inner + src.nonZeros);
    {
      Opened o(*registry_, "copySparse");
      const SparseTensor s = o.host(src);
      o.open(block);
      std::memcpy(outer, s.outer, static_cast<size_t>(outerSize) * sizeof(int32_t));
      if (src.nonZeros > 0) {
        std::memcpy(inner, s.inner, static_cast<size_t>(src.nonZeros) * sizeof(int32_t));
        std::memcpy(values, s.values, static_cast<size_t>(src.nonZeros) * sizeof(float));
      }
    }
    dst.view = src;
    dst.view.device = Device::kStrict;
    dst.view.outer = outer;
    dst.view.inner = inner;
    dst.view.values = values;
  }

  // The operations are done when they return; asynchronous copies are not
  // operations (they land when waited for). The host now knows every point
  // recorded on the compute queue is complete.
  void synchronize() override { computeWaited_ = computeRecorded_; }

  // Asynchronous copies run when they are waited for (wait, waitOnDevice, or the
  // second ready() about their event), in order: the latest a device may run them.
  AsyncCopy copyToHostAsync(const Tensor& src, HostBuffer& dst, size_t offset) override {
    countLaunch();
    checkAsyncCopy("copyToHostAsync", src, dst, offset);
    return queue(true, src, dst, offset);
  }
  AsyncCopy copyToDeviceAsync(const HostBuffer& src, size_t offset, Tensor& dst) override {
    countLaunch();
    checkAsyncCopy("copyToDeviceAsync", dst, src, offset);
    return queue(false, dst, src, offset);
  }
  // Operations run when called, so a point on the compute queue is reached at once;
  // but as on a GPU, the host may treat it as complete (secondsBetween) only after
  // it waited for it, for a later point, or for the whole device.
  Event record() override {
    return Event(this, std::make_shared<StrictEvent>(StrictEvent{0, now(), false, ++computeRecorded_}));
  }
  void waitOnDevice(const Event& e) override {
    checkOwn(e, "waitOnDevice");
    if (StrictEvent* s = stateOf(e)) landThrough(s->sequence);
  }
  // False the first time it is asked about a copy's event, so that callers take
  // their not-ready path; the copies through it land on the second.
  bool ready(const Event& e) override {
    checkOwn(e, "ready");
    StrictEvent* s = stateOf(e);
    if (s != nullptr && s->compute > 0) computeWaited_ = std::max(computeWaited_, s->compute);
    if (s == nullptr || s->seconds >= 0) return true;
    if (!s->asked) {
      s->asked = true;
      return false;
    }
    landThrough(s->sequence);
    return true;
  }
  void wait(const Event& e) override {
    checkOwn(e, "wait");
    StrictEvent* s = stateOf(e);
    if (s == nullptr) return;
    if (s->compute > 0) computeWaited_ = std::max(computeWaited_, s->compute);
    landThrough(s->sequence);
  }
  double secondsBetween(const Event& from, const Event& to) override {
    checkOwn(from, "secondsBetween");
    checkOwn(to, "secondsBetween");
    const StrictEvent* a = stateOf(from);
    const StrictEvent* b = stateOf(to);
    const auto complete = [this](const StrictEvent* e) {
      return e != nullptr && e->seconds >= 0 && (e->compute == 0 || e->compute <= computeWaited_);
    };
    ORPHEUS_ENFORCE(complete(a) && complete(b),
                    "backend strict: secondsBetween of an event that is empty or not known to the host as complete");
    return b->seconds - a->seconds;
  }

  void gemm(Trans ta, Trans tb, float alpha, const Tensor& a, const Tensor& b, float beta, Tensor& c) override {
    countLaunch();
    on("gemm", {&a, &b, &c});
    Opened o(*registry_, "gemm");
    Tensor hc = o.host(c);
    cpu_.gemm(ta, tb, alpha, o.host(a), o.host(b), beta, hc);
  }

  void gemmSparse(float alpha, const Tensor& a, const SparseTensor& s, Trans ts, float beta, Tensor& c) override {
    countLaunch();
    on("gemmSparse", {&a, &c});
    ORPHEUS_ENFORCE(s.device == Device::kStrict, "backend strict: the sparse operand lives in {} memory",
                    deviceName(s.device));
    Opened o(*registry_, "gemmSparse");
    Tensor hc = o.host(c);
    cpu_.gemmSparse(alpha, o.host(a), o.host(s), ts, beta, hc);
  }

  void elementwise(const EwChain& chain, std::span<const Tensor* const> inputs,
                   std::span<Tensor* const> outputs) override {
    countLaunch();
    checks::forward(*this, chain, inputs, outputs);
    Opened o(*registry_, "elementwise");
    HostList in(o, inputs);
    HostList out(o, outputs);
    cpu_.elementwise(chain, in.constPtrs, out.ptrs);
  }

  void elementwiseBackward(const EwChain& chain, std::span<const Tensor* const> inputs,
                           std::span<const Tensor* const> values, const Tensor& upstream,
                           std::span<Tensor* const> inputGrads) override {
    countLaunch();
    checks::backward(*this, chain, inputs, values, upstream, inputGrads);
    Opened o(*registry_, "elementwiseBackward");
    HostList in(o, inputs);
    HostList val(o, values);
    HostList grads(o, inputGrads);
    cpu_.elementwiseBackward(chain, in.constPtrs, val.constPtrs, o.host(upstream), grads.ptrs);
  }

  void softmaxCrossEntropy(const Tensor& z, const Tensor& t, Tensor& p, Tensor& loss) override {
    countLaunch();
    on("softmaxCrossEntropy", {&z, &t, &p, &loss});
    Opened o(*registry_, "softmaxCrossEntropy");
    Tensor hp = o.host(p);
    Tensor hl = o.host(loss);
    cpu_.softmaxCrossEntropy(o.host(z), o.host(t), hp, hl);
  }

  void softmaxCrossEntropyBackward(const Tensor& p, const Tensor& t, const Tensor& upstream, float beta,
                                   Tensor& dz) override {
    countLaunch();
    on("softmaxCrossEntropyBackward", {&p, &t, &upstream, &dz});
    Opened o(*registry_, "softmaxCrossEntropyBackward");
    Tensor hd = o.host(dz);
    cpu_.softmaxCrossEntropyBackward(o.host(p), o.host(t), o.host(upstream), beta, hd);
  }

  void copyRows(const Tensor& src, int64_t srcRow, Tensor& dst, int64_t dstRow, int64_t rows) override {
    countLaunch();
    checks::copyRows(*this, src, srcRow, dst, dstRow, rows);
    Opened o(*registry_, "copyRows");
    Tensor hd = o.host(dst);
    cpu_.copyRows(o.host(src), srcRow, hd, dstRow, rows);
  }

  void lstmCellForward(const LstmCellArgs& a) override {
    countLaunch();
    checks::lstmCell(*this, "lstmCellForward", a, true);
    Opened o(*registry_, "lstmCellForward");
    LstmCellHost h(o, a);
    cpu_.lstmCellForward(h.args);
  }

  void lstmCellBackward(const LstmCellArgs& a, const Tensor* dHidden, const Tensor* dCell, Tensor& dGates,
                        Tensor* dCPrev) override {
    countLaunch();
    checks::lstmCellBackward(*this, a, dHidden, dCell, dGates, dCPrev);
    Opened o(*registry_, "lstmCellBackward");
    LstmCellHost h(o, a);
    const Tensor hh = dHidden ? o.host(*dHidden) : Tensor();
    const Tensor hc = dCell ? o.host(*dCell) : Tensor();
    Tensor hg = o.host(dGates);
    Tensor hp = dCPrev ? o.host(*dCPrev) : Tensor();
    cpu_.lstmCellBackward(h.args, dHidden ? &hh : nullptr, dCell ? &hc : nullptr, hg, dCPrev ? &hp : nullptr);
  }

  void columnOp(OpKind op, const Tensor& a, const Tensor* b, Tensor& out) override {
    checks::columnOp(*this, "columnOp", op, a, b, out);
    countLaunch();
    Opened o(*registry_, "columnOp");
    const Tensor hb = b ? o.host(*b) : Tensor();
    Tensor h = o.host(out);
    cpu_.columnOp(op, o.host(a), b ? &hb : nullptr, h);
  }

  void columnOpBackward(OpKind op, int which, const Tensor& a, const Tensor* b, const Tensor& out,
                        const Tensor& upstream, Tensor& dst) override {
    checks::columnOpBackward(*this, op, which, a, b, out, upstream, dst);
    countLaunch();
    Opened o(*registry_, "columnOpBackward");
    const Tensor hb = b ? o.host(*b) : Tensor();
    Tensor h = o.host(dst);
    cpu_.columnOpBackward(op, which, o.host(a), b ? &hb : nullptr, o.host(out), o.host(upstream), h);
  }

  void sumColumns(const Tensor& a, float beta, Tensor& out) override {
    countLaunch();
    on("sumColumns", {&a, &out});
    Opened o(*registry_, "sumColumns");
    Tensor h = o.host(out);
    cpu_.sumColumns(o.host(a), beta, h);
  }

  void sumRows(const Tensor& a, float beta, Tensor& out) override {
    countLaunch();
    on("sumRows", {&a, &out});
    Opened o(*registry_, "sumRows");
    Tensor h = o.host(out);
    cpu_.sumRows(o.host(a), beta, h);
  }

  void axpy(float alpha, const Tensor& x, Tensor& y) override {
    countLaunch();
    on("axpy", {&x, &y});
    Opened o(*registry_, "axpy");
    Tensor h = o.host(y);
    cpu_.axpy(alpha, o.host(x), h);
  }

  void scale(float alpha, Tensor& x) override {
    countLaunch();
    on("scale", {&x});
    Opened o(*registry_, "scale");
    Tensor h = o.host(x);
    cpu_.scale(alpha, h);
  }

  void copyParts(std::span<const CopyPart> parts) override {
    countLaunches(parts.size(), kCopyPartsPerLaunch);
    checks::copyParts(*this, parts);
    Opened o(*registry_, "copyParts");
    std::vector<CopyPart> host;
    host.reserve(parts.size());
    for (const CopyPart& p : parts) host.push_back(CopyPart{o.host(p.src), o.host(p.dst), p.scaled, p.scale});
    cpu_.copyParts(host);
  }

  void addInOrder(std::span<const Tensor* const> terms, Tensor& y) override {
    countLaunches(terms.size(), kAddTermsPerLaunch);
    checks::addInOrder(*this, terms, y);
    Opened o(*registry_, "addInOrder");
    HostList in(o, terms);
    Tensor h = o.host(y);
    cpu_.addInOrder(in.constPtrs, h);
  }

  void optimizerStep(const OptimizerStep& s, const Tensor& gradient, Tensor& param, Tensor* buffer0,
                     Tensor* buffer1) override {
    countLaunch();
    const auto [b0, b1] = checks::optimizerStep(*this, s, gradient, param, buffer0, buffer1);
    Opened o(*registry_, "optimizerStep");
    Tensor hp = o.host(param);
    Tensor hb0 = b0 ? o.host(*b0) : Tensor();
    Tensor hb1 = b1 ? o.host(*b1) : Tensor();
    cpu_.optimizerStep(s, o.host(gradient), hp, b0 ? &hb0 : nullptr, b1 ? &hb1 : nullptr);
  }

 private:
  // Host views of a list of operands (null entries stay null).
  struct HostList {
    std::vector<Tensor> views;
    std::vector<const Tensor*> constPtrs;
    std::vector<Tensor*> ptrs;
    template <typename T>
    HostList(Opened& o, std::span<T* const> ts) {
      views.reserve(ts.size());
      for (const Tensor* t : ts) views.push_back(t ? o.host(*t) : Tensor());
      for (size_t i = 0; i < ts.size(); ++i) {
        constPtrs.push_back(ts[i] ? &views[i] : nullptr);
        ptrs.push_back(ts[i] ? &views[i] : nullptr);
      }
    }
  };

  // Host views of an LSTM cell step's operands (null entries stay null).
  struct LstmCellHost {
    Tensor gates, cPrev, act[4], cell, tanhCell, hidden;
    LstmCellArgs args;
    LstmCellHost(Opened& o, const LstmCellArgs& a) : gates(o.host(*a.gates)), cPrev(o.host(*a.cPrev)) {
      const auto view = [&](Tensor* t, Tensor& into) -> Tensor* {
        if (t == nullptr) return nullptr;
        into = o.host(*t);
        return &into;
      };
      args.gates = &gates;
      args.offset = a.offset;
      args.cPrev = &cPrev;
      for (size_t k = 0; k < 4; ++k) args.act[k] = view(a.act[k], act[k]);
      args.cell = view(a.cell, cell);
      args.tanhCell = view(a.tanhCell, tanhCell);
      args.hidden = view(a.hidden, hidden);
    }
  };

  void on(const char* op, std::initializer_list<const Tensor*> ts) const {
    for (const Tensor* t : ts) checks::onDevice(*this, op, *t);
  }

  // An event of this backend: its copy's place in the queue (0: the compute
  // queue's), the host's clock when it completed (-1: not yet), whether ready()
  // was asked about it, and a compute queue point's place on that queue (0: a copy's).
  struct StrictEvent {
    uint64_t sequence = 0;
    double seconds = -1.0;
    bool asked = false;
    uint64_t compute = 0;
  };
  // A copy not landed yet: its device and host ends, and the source's bytes as
  // they were when it was queued (a GPU may read them any time until it lands).
  struct PendingCopy {
    bool toHost = true;
    void* device = nullptr;
    std::byte* host = nullptr;
    size_t bytes = 0;
    std::vector<std::byte> source;
    HostBuffer buffer;  // keeps the host end alive
    std::shared_ptr<StrictEvent> started, done;
  };

  static StrictEvent* stateOf(const Event& e) { return static_cast<StrictEvent*>(e.state()); }
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  AsyncCopy queue(bool toHost, const Tensor& device, const HostBuffer& host, size_t offset) {
    const size_t bytes = static_cast<size_t>(device.size()) * sizeof(float);
    PendingCopy p;
    p.toHost = toHost;
    p.device = device.data();
    p.host = host.data() + offset;
    p.bytes = bytes;
    p.buffer = host;
    p.started = std::make_shared<StrictEvent>(StrictEvent{++queued_, -1.0, false});
    p.done = std::make_shared<StrictEvent>(StrictEvent{queued_, -1.0, false});
    if (bytes > 0) {
      const auto region = registry_->find(p.device);
      ORPHEUS_ENFORCE(region.second > 0, "backend strict: the tensor of an asynchronous copy is not memory of this "
                      "strict device");
      if (toHost) {
        Opened o(*registry_, "copyToHostAsync");
        o.open(p.device);
        p.source.assign(static_cast<const std::byte*>(p.device), static_cast<const std::byte*>(p.device) + bytes);
        // Poison where the copy will land: host code that reads it early reads NaN.
        for (size_t k = 0; k < bytes / sizeof(float); ++k) std::memcpy(p.host + k * sizeof(float), &kPoison, 4);
      } else {
        p.source.assign(p.host, p.host + bytes);
        registry_->markInbound(region.first, 1);
      }
    }
    countCopy(toHost ? Device::kStrict : Device::kCpu, toHost ? Device::kCpu : Device::kStrict, bytes);
    AsyncCopy c{Event(this, p.started), Event(this, p.done)};
    pending_.push_back(std::move(p));
    return c;
  }

  void landThrough(uint64_t sequence) {
    while (!pending_.empty() && pending_.front().done->sequence <= sequence) {
      PendingCopy p = std::move(pending_.front());
      pending_.pop_front();
      land(p);
    }
  }

  // Each end checked as a GPU would need it now: alive, and the source unchanged
  // since the copy was queued.
  void land(PendingCopy& p) {
    p.started->seconds = now();
    if (p.bytes > 0) {
      const auto region = registry_->find(p.device);
      ORPHEUS_ENFORCE(region.second > 0, "backend strict: the device {} of an asynchronous copy was freed before "
                      "the copy landed", p.toHost ? "source" : "destination");
      if (!p.toHost) registry_->markInbound(region.first, -1);
      Opened o(*registry_, p.toHost ? "copyToHostAsync" : "copyToDeviceAsync");
      o.open(p.device, !p.toHost);
      const std::byte* from = p.toHost ? static_cast<const std::byte*>(p.device) : p.host;
      ORPHEUS_ENFORCE(std::memcmp(from, p.source.data(), p.bytes) == 0,
                      "backend strict: {} wrote the source of an asynchronous copy {} before the copy landed",
                      p.toHost ? "an operation" : "host code", p.toHost ? "to the host" : "to the device");
      std::memcpy(p.toHost ? static_cast<void*>(p.host) : p.device, from, p.bytes);
    }
    p.done->seconds = now();
  }

  // A float NaN (0x7fbadbad) that names itself in a hex dump.
  static constexpr uint32_t kPoison = 0x7fbadbadU;

  std::shared_ptr<Registry> registry_;
  cpu::CpuBackend cpu_;
  std::deque<PendingCopy> pending_;
  uint64_t queued_ = 0;
  uint64_t computeRecorded_ = 0;  // compute queue points recorded
  uint64_t computeWaited_ = 0;    // those the host waited for (through)
};

void appendHex(char*& at, uintptr_t v) {
  *at++ = '0';
  *at++ = 'x';
  char digits[16];
  int n = 0;
  do {
    digits[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v != 0 && n < 16);
  while (n > 0) *at++ = digits[--n];
}

struct sigaction previousAction;

// Async-signal-safe: one line, then the previous disposition runs on the fault's
// retry (the default one ends the process with SIGSEGV).
void onFault(int, siginfo_t* info, void*) {
  char line[200];
  char* at = line;
  const char* text = "orpheus: segmentation fault at ";
  for (const char* c = text; *c != '\0'; ++c) *at++ = *c;
  appendHex(at, reinterpret_cast<uintptr_t>(info->si_addr));
  const char* why =
      " (with --device strict: host code touched device memory outside a backend call)\n";
  for (const char* c = why; *c != '\0'; ++c) *at++ = *c;
  static_cast<void>(write(STDERR_FILENO, line, static_cast<size_t>(at - line)));
  sigaction(SIGSEGV, &previousAction, nullptr);
}

}  // namespace

void installFaultReport() {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  struct sigaction current {};
  sigaction(SIGSEGV, nullptr, &current);
  // Installed again when someone replaced it since (a test framework's handler).
  if ((current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == &onFault) return;
  struct sigaction action {};
  action.sa_sigaction = &onFault;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &previousAction);
}

std::unique_ptr<Backend> makeStrictBackend() { return std::make_unique<StrictBackend>(); }

}  // namespace orpheus::ops::strict
