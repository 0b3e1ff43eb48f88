// The asynchronous copies of the backend seam (ops/backend.h: host buffers, copies
// on a copy queue, events): what they deliver on the cpu and strict backends, and
// every misuse the strict device is there to catch.
#include "backend_harness.h"

#include "engine/base/error.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::test;

namespace {

MatF fromBuffer(const HostBuffer& b, size_t offset, int64_t rows, int64_t cols) {
  const Tensor t = b.floats(offset, rows, cols);
  return Eigen::Map<const MatF>(t.data(), rows, cols);
}

}  // namespace

TEST_CASE("asynchronous copies deliver the data once waited for, on cpu and strict", "[ops][strict]") {
  std::mt19937 rng(5);
  const MatF a = randomMatrix(rng, 6, 5);
  const MatF b = randomMatrix(rng, 3, 4);
  for (const std::string device : {"cpu", "strict"}) {
    INFO(device);
    std::unique_ptr<Backend> backend =
        device == "cpu" ? std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>()) : strict::makeStrictBackend();
    const Tensor da = upload(*backend, a);
    const Tensor db = upload(*backend, b);
    HostBuffer staging = backend->allocateHost((a.size() + b.size()) * sizeof(float));
    const Backend::Transfers before = backend->transfers();
    // Two copies to the host side by side in one buffer, the second at an offset.
    const AsyncCopy ca = backend->copyToHostAsync(da, staging, 0);
    const AsyncCopy cb = backend->copyToHostAsync(db, staging, a.size() * sizeof(float));
    backend->wait(cb.done);
    backend->wait(ca.done);
    CHECK(same(fromBuffer(staging, 0, 6, 5), a));
    CHECK(same(fromBuffer(staging, a.size() * sizeof(float), 3, 4), b));
    CHECK(backend->ready(ca.done));
    CHECK(backend->secondsBetween(ca.started, ca.done) >= 0.0);
    if (device == "strict") {
      CHECK(backend->transfers().toHost - before.toHost == (a.size() + b.size()) * sizeof(float));
    }
    // And back to the device, where an operation after waitOnDevice reads it.
    Tensor back = backend->allocate(6, 5);
    const AsyncCopy up = backend->copyToDeviceAsync(staging, 0, back);
    backend->waitOnDevice(up.done);
    backend->scale(2.0f, back);
    CHECK(same(download(*backend, back), 2.0f * a));
    if (device == "strict") CHECK(backend->transfers().toDevice - before.toDevice == a.size() * sizeof(float));
  }
}

TEST_CASE("strict device: a compute queue point is timed only once the host knows it complete", "[ops][strict]") {
  // A GPU's timer reads only complete events (CUDA: cudaErrorNotReady otherwise),
  // so the strict device refuses a point the host has not waited for.
  std::unique_ptr<Backend> backend = strict::makeStrictBackend();
  const Tensor t = upload(*backend, MatF::Ones(4, 3));
  HostBuffer staging = backend->allocateHost(12 * sizeof(float));
  const AsyncCopy c = backend->copyToHostAsync(t, staging, 0);
  backend->wait(c.done);
  const Event first = backend->record();
  CHECK_THROWS_WITH(backend->secondsBetween(c.started, first),
                    Catch::Matchers::Contains("not known to the host as complete"));
  backend->waitOnDevice(first);  // orders the device, tells the host nothing
  CHECK_THROWS(backend->secondsBetween(c.started, first));
  const Event second = backend->record();
  backend->wait(second);  // a later point on the same queue: both are complete
  CHECK(backend->secondsBetween(first, second) >= 0.0);
  CHECK(backend->secondsBetween(c.started, first) >= -1.0);
  const Event third = backend->record();
  CHECK_THROWS(backend->secondsBetween(second, third));
  backend->synchronize();
  CHECK(backend->secondsBetween(second, third) >= 0.0);
}

TEST_CASE("strict device: a staging buffer read before wait() holds poison", "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  std::mt19937 rng(6);
  const MatF a = randomMatrix(rng, 4, 3);
  const Tensor da = upload(*strict, a);
  HostBuffer staging = strict->allocateHost(a.size() * sizeof(float));
  const AsyncCopy c = strict->copyToHostAsync(da, staging, 0);
  // Read early, the copy has not landed: every float is the poison NaN.
  const MatF early = fromBuffer(staging, 0, 4, 3);
  CHECK(early.array().isNaN().all());
  uint32_t bits = 0;
  std::memcpy(&bits, staging.data(), sizeof bits);
  CHECK(bits == 0x7fbadbadU);
  // The first ready() says no, so callers take their not-ready path; the second lands it.
  CHECK_FALSE(strict->ready(c.done));
  CHECK(strict->ready(c.done));
  CHECK(same(fromBuffer(staging, 0, 4, 3), a));
}

TEST_CASE("strict device: an operation on a copy's destination before waitOnDevice is an error", "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  HostBuffer staging = strict->allocateHost(8 * sizeof(float));
  std::memset(staging.data(), 0, staging.bytes());
  Tensor t = strict->allocate(2, 4);
  const AsyncCopy c = strict->copyToDeviceAsync(staging, 0, t);
  CHECK_THROWS_WITH(strict->scale(2.0f, t), Catch::Contains("asynchronous copy from the host has not landed"));
  strict->waitOnDevice(c.done);
  CHECK_NOTHROW(strict->scale(2.0f, t));
}

TEST_CASE("strict device: copies into one tensor's columns land in turn, used once all have", "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  HostBuffer staging = strict->allocateHost(8 * sizeof(float));
  for (int k = 0; k < 8; ++k) reinterpret_cast<float*>(staging.data())[k] = static_cast<float>(k);
  Tensor t = strict->allocate(2, 4);
  Tensor left = t.middleCols(0, 2);
  Tensor right = t.middleCols(2, 2);
  const AsyncCopy first = strict->copyToDeviceAsync(staging, 0, left);
  const AsyncCopy second = strict->copyToDeviceAsync(staging, 4 * sizeof(float), right);
  strict->wait(first.done);  // lands the first while the second is still due
  CHECK_THROWS_WITH(strict->scale(2.0f, t), Catch::Contains("asynchronous copy from the host has not landed"));
  strict->waitOnDevice(second.done);
  std::vector<float> back(8);
  Tensor host = Tensor::host(back.data(), 2, 4);
  strict->copy(t, host);
  for (int k = 0; k < 8; ++k) CHECK(back[k] == static_cast<float>(k));
}

TEST_CASE("strict device: a copy's source changed or freed before it lands is an error", "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  std::mt19937 rng(7);
  const MatF a = randomMatrix(rng, 3, 3);
  HostBuffer staging = strict->allocateHost(a.size() * sizeof(float));
  SECTION("an operation writes the device source") {
    Tensor t = upload(*strict, a);
    const AsyncCopy c = strict->copyToHostAsync(t, staging, 0);
    strict->scale(3.0f, t);
    CHECK_THROWS_WITH(strict->wait(c.done), Catch::Contains("an operation wrote the source of an asynchronous copy"));
  }
  SECTION("host code writes the host source") {
    std::memcpy(staging.data(), a.data(), staging.bytes());
    Tensor t = strict->allocate(3, 3);
    const AsyncCopy c = strict->copyToDeviceAsync(staging, 0, t);
    reinterpret_cast<float*>(staging.data())[4] += 1.0f;
    CHECK_THROWS_WITH(strict->wait(c.done), Catch::Contains("host code wrote the source of an asynchronous copy"));
  }
  SECTION("the device source is freed") {
    AsyncCopy c;
    {
      const Tensor t = upload(*strict, a);
      c = strict->copyToHostAsync(t, staging, 0);
    }
    CHECK_THROWS_WITH(strict->wait(c.done), Catch::Contains("was freed before the copy landed"));
  }
  SECTION("another backend's event") {
    const auto other = strict::makeStrictBackend();
    const Tensor t = upload(*other, a);
    const AsyncCopy c = other->copyToHostAsync(t, staging, 0);
    CHECK_THROWS_WITH(strict->wait(c.done), Catch::Contains("another backend's event"));
    other->wait(c.done);
  }
  SECTION("a copy past the buffer's end") {
    const Tensor t = upload(*strict, a);
    CHECK_THROWS_WITH(strict->copyToHostAsync(t, staging, sizeof(float)), Catch::Contains("of a host buffer of"));
  }
}
