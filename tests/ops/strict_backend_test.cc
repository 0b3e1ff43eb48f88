// The strict device (ops/strict/strict_backend.h): every operation bitwise the CPU
// backend's on the same operands, host operands refused, and a host access to its
// memory outside a backend call fatal, with a line that says so.
#include "backend_harness.h"

#include "engine/base/error.h"
#include "ops/strict/strict_backend.h"

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>

using namespace orpheus;
using namespace orpheus::ops;
using namespace orpheus::ops::test;

namespace {

// Runs `body` in a child process; returns its wait status and what it wrote to stderr.
template <typename Body>
std::pair<int, std::string> inChild(Body body) {
  int pipeFds[2];
  REQUIRE(pipe(pipeFds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(pipeFds[0]);
    dup2(pipeFds[1], STDERR_FILENO);
    body();
    _exit(0);
  }
  close(pipeFds[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = read(pipeFds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(pipeFds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {status, text};
}

}  // namespace

TEST_CASE("strict device: every operation is bitwise the cpu backend's", "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  cpu::CpuBackend cpu;
  std::mt19937 rng(21);
  for (const auto& [m, n] : shapes()) {
    INFO(m << "x" << n);
    const MatF a = randomMatrix(rng, m, 7);
    const MatF b = randomMatrix(rng, n, 7);
    const MatF c = randomMatrix(rng, m, n);
    CHECK(same(runGemm(*strict, Trans::kNo, Trans::kYes, 0.5f, a, b, 1.0f, c),
               runGemm(cpu, Trans::kNo, Trans::kYes, 0.5f, a, b, 1.0f, c)));
    const SparseF s = randomSparse(rng, n, 7, 0.3);
    for (bool csr : {false, true}) {
      CHECK(same(runGemmSparse(*strict, 1.0f, a, s, csr, Trans::kYes, 1.0f, c),
                 runGemmSparse(cpu, 1.0f, a, s, csr, Trans::kYes, 1.0f, c)));
    }
    const MatF x = randomMatrix(rng, m, n);
    const MatF bias = randomMatrix(rng, m, 1);
    const MatF y = randomMatrix(rng, m, n);
    const EwChain chain = everyOpChain();
    const std::vector<MatF> fs = runChain(*strict, chain, {x, bias, y}, m, n);
    const std::vector<MatF> fc = runChain(cpu, chain, {x, bias, y}, m, n);
    for (size_t k = 0; k < fs.size(); ++k) CHECK(same(fs[k], fc[k]));
    const MatF up = randomMatrix(rng, m, n);
    const std::vector<std::optional<MatF>> start{MatF::Zero(m, n), std::nullopt, randomMatrix(rng, m, n)};
    const std::vector<MatF> bs = runChainBackward(*strict, chain, {x, bias, y}, fc, up, start);
    const std::vector<MatF> bc = runChainBackward(cpu, chain, {x, bias, y}, fc, up, start);
    for (size_t k = 0; k < bs.size(); ++k) CHECK(same(bs[k], bc[k]));
    const MatF t = MatF::Identity(m, n);
    const auto [ps, ls] = runSoftmaxCrossEntropy(*strict, x, t);
    const auto [pc, lc] = runSoftmaxCrossEntropy(cpu, x, t);
    CHECK((same(ps, pc) && same(ls, lc)));
    const MatF g = randomMatrix(rng, 1, n);
    CHECK(same(runSoftmaxCrossEntropyBackward(*strict, pc, t, g, 0.5f, y),
               runSoftmaxCrossEntropyBackward(cpu, pc, t, g, 0.5f, y)));
    CHECK(same(runSumColumns(*strict, x, 1.0f, bias), runSumColumns(cpu, x, 1.0f, bias)));
    CHECK(same(runSumRows(*strict, x, 0.0f, g), runSumRows(cpu, x, 0.0f, g)));
    CHECK(same(runAxpy(*strict, -2.0f, x, y), runAxpy(cpu, -2.0f, x, y)));
    CHECK(same(runScale(*strict, 3.0f, x), runScale(cpu, 3.0f, x)));
    CHECK(same(runCopyParts(*strict, {x, y, bias}, {std::nullopt, -0.75f, 3.0f}),
               runCopyParts(cpu, {x, y, bias}, {std::nullopt, -0.75f, 3.0f})));
    CHECK(same(runAddInOrder(*strict, {x, y, up}, c), runAddInOrder(cpu, {x, y, up}, c)));
    const MatF tall = randomMatrix(rng, m + 3, n);
    CHECK(same(runCopyRows(*strict, tall, 2, x, 0, std::min<int64_t>(m, 2)),
               runCopyRows(cpu, tall, 2, x, 0, std::min<int64_t>(m, 2))));
    CHECK(same(runCopyRows(cpu, tall, 2, x, 0, m), tall.middleRows(2, m)));
    const MatF gates = randomMatrix(rng, 4 * m, n, 2.0f);
    const MatF cPrev = randomMatrix(rng, m, n);
    const MatF dGates = randomMatrix(rng, 4 * m, n);
    const std::vector<MatF> cellStrict = runLstmCell(*strict, gates, cPrev, x, y, dGates, up);
    const std::vector<MatF> cellCpu = runLstmCell(cpu, gates, cPrev, x, y, dGates, up);
    for (size_t k = 0; k < cellStrict.size(); ++k) CHECK(same(cellStrict[k], cellCpu[k]));
  }
}

TEST_CASE("strict device: each operation counts one launch, as on the cpu backend", "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  cpu::CpuBackend cpu;
  std::mt19937 rng(22);
  const MatF a = randomMatrix(rng, 5, 3);
  const MatF b = randomMatrix(rng, 3, 4);
  const MatF c = randomMatrix(rng, 5, 4);
  for (Backend* backend : {static_cast<Backend*>(strict.get()), static_cast<Backend*>(&cpu)}) {
    INFO(backend->name());
    uint64_t before = backend->launches();
    runGemm(*backend, Trans::kNo, Trans::kNo, 1.0f, a, b, 0.0f, c);
    CHECK(backend->launches() - before == 5);  // three copies in, the product, one copy out
    before = backend->launches();
    runLstmCell(*backend, randomMatrix(rng, 12, 4), c.topRows(3), c.topRows(3), c.topRows(3),
                randomMatrix(rng, 12, 4), c.topRows(3));
    CHECK(backend->launches() - before == 2 + 2 + 4 + 9);  // the two cell steps, 6 copies in, 9 out
    before = backend->launches();
    runGemmSparse(*backend, 1.0f, a, randomSparse(rng, 3, 4, 0.5), false, Trans::kNo, 0.0f, c);
    CHECK(backend->launches() - before == 5);  // the sparse copy, two copies in, the product, one out
  }
}

TEST_CASE("strict device: chains past a GPU kernel's limits are refused in one plain line, as on cuda",
          "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  EwChain chain;
  chain.inputs = 1;
  chain.steps.push_back({EwOp::kExp, {EwRef{EwRef::Kind::kInput, 0}, {}}, 1.0f});
  for (int k = 1; k <= kDeviceChainLimits.steps; ++k) {
    chain.steps.push_back({EwOp::kTanh, {EwRef{EwRef::Kind::kStep, k - 1}, {}}, 1.0f});
  }
  CHECK_THROWS_WITH(runChain(*strict, chain, {MatF::Ones(2, 2)}, 2, 2),
                    Catch::Matchers::StartsWith("backend strict does not support elementwise chains of more than 16 "
                                                "steps or 8 inputs (this one: 17 steps, 1 inputs)"));
  chain.steps.pop_back();  // 16 steps: taken
  CHECK(runChain(*strict, chain, {MatF::Ones(2, 2)}, 2, 2).size() == 16);
}

TEST_CASE("strict device: operands in host memory are refused", "[ops][strict]") {
  const auto strict = strict::makeStrictBackend();
  MatF host = MatF::Ones(3, 3);
  Tensor onDevice = strict->allocate(3, 3);
  Tensor hostView = cpu::view(host);
  CHECK_THROWS_WITH(strict->gemm(Trans::kNo, Trans::kNo, 1.0f, hostView, onDevice, 0.0f, onDevice),
                    Catch::Contains("backend strict: an operand of gemm lives in cpu memory"));
  CHECK_THROWS_AS(strict->scale(2.0f, hostView), Error);
  // A strict tensor that is not this device's memory (a view made up on the host).
  Tensor fake = Tensor::view(Device::kStrict, host.data(), 3, 3);
  CHECK_THROWS_WITH(strict->scale(2.0f, fake), Catch::Contains("is not memory of this strict device"));
  // copy() moves data both ways, and the device keeps what it was given.
  strict->copy(hostView, onDevice);
  MatF back = MatF::Zero(3, 3);
  Tensor backView = cpu::view(back);
  strict->copy(onDevice, backView);
  CHECK(same(back, host));
}

TEST_CASE("strict device: host code that reads device memory dies with a line that says so", "[ops][strict]") {
  const auto [status, text] = inChild([] {
    const auto strict = strict::makeStrictBackend();
    Tensor t = strict->allocate(4, 4);
    strict->scale(1.0f, t);  // memory is usable inside backend calls...
    volatile float x = t.data()[5];  // ...and not outside them
    static_cast<void>(x);
  });
  INFO(text);
  // Killed by SIGSEGV; under AddressSanitizer, whose handler runs after ours, a nonzero exit.
  CHECK(((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) || (WIFEXITED(status) && WEXITSTATUS(status) != 0)));
  CHECK(text.find("with --device strict: host code touched device memory outside a backend call") !=
        std::string::npos);
  // Writes are caught too; freed tensors give their memory back.
  const auto [status2, text2] = inChild([] {
    const auto strict = strict::makeStrictBackend();
    for (int i = 0; i < 1000; ++i) static_cast<void>(strict->allocate(64, 64));
    Tensor t = strict->allocate(2, 2);
    t.data()[0] = 1.0f;
  });
  INFO(text2);
  CHECK(((WIFSIGNALED(status2) && WTERMSIG(status2) == SIGSEGV) || (WIFEXITED(status2) && WEXITSTATUS(status2) != 0)));
}
