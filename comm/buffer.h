// Buffer registration: the hook through which a transport learns, once, about
// memory it will move data from or into (an RDMA memory region, a device pointer
// for GPUDirect), so the data plane can later use it without a staging copy.
//
// Contract:
//  - Transport::registerBuffer(bytes, kind) returns a RegisteredBuffer naming
//    exactly `bytes`; the memory must stay valid while the handle lives, and the
//    handle must not outlive its transport.
//  - The handle is move-only; destroying it deregisters the memory. Destruction
//    never throws.
//  - A transport that cannot use memory of `kind` throws InputError
//    "transport X does not support <kind> buffers" — never a silent copy.
//  - Host memory is accepted by every transport; the host backends (mpi,
//    loopback) keep no state for it. Data-plane calls still take spans: a backend
//    that needs registered memory looks the span up among its registrations.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace orpheus::comm {

enum class MemoryKind { kHost, kDevice };

const char* memoryKindName(MemoryKind kind);

// What a backend keeps per registration (a memory region key, a device mapping);
// released when the handle is destroyed.
class BufferRegistration {
 public:
  virtual ~BufferRegistration() = default;
};

class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  RegisteredBuffer(std::span<std::byte> bytes, MemoryKind kind, std::unique_ptr<BufferRegistration> backend)
      : bytes_(bytes), kind_(kind), backend_(std::move(backend)) {}
  RegisteredBuffer(RegisteredBuffer&&) noexcept = default;
  RegisteredBuffer& operator=(RegisteredBuffer&&) noexcept = default;

  std::span<std::byte> bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  // The backend's state for this region; null where the backend keeps none.
  const BufferRegistration* backend() const { return backend_.get(); }

 private:
  std::span<std::byte> bytes_;
  MemoryKind kind_ = MemoryKind::kHost;
  std::unique_ptr<BufferRegistration> backend_;
};

}  // namespace orpheus::comm
