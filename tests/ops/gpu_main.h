// main() of a `gpu` test binary: exits 77 (CTest's skip) saying why when the CUDA
// backend cannot be made here (no plugin in this build, no CUDA libraries, no GPU).
#pragma once

#include "engine/base/error.h"
#include "ops/backends.h"

#include <catch2/catch.hpp>

#include <cstdio>

namespace orpheus::ops::test {

inline int runGpuTests(int argc, char** argv) {
  constexpr int kSkipped = 77;
  try {
    makeBackend("cuda", 0);
  } catch (const InputError& e) {
    std::printf("SKIPPED: the CUDA backend cannot run here: %s\n", e.what());
    return kSkipped;
  }
  return Catch::Session().run(argc, argv);
}

}  // namespace orpheus::ops::test
