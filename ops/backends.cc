#include "ops/backends.h"

#include "ops/cpu/cpu_backend.h"
#include "orpheus/config.h"

#if ORPHEUS_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

#include <cstdlib>
#include <string>

namespace orpheus::ops {
namespace {

int localRankFromEnvironment() {
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long rank = std::strtol(v, &end, 10);
  return (*end == '\0' && rank >= 0 && rank < (1L << 30)) ? static_cast<int>(rank) : 0;
}

std::unique_ptr<Backend> makeCuda(int localRank) {
#if ORPHEUS_HAVE_CUDA
  std::string why;
  const int devices = cuda::visibleDevices(&why);
  ORPHEUS_CHECK_INPUT(devices > 0, "--device cuda: no CUDA GPU is visible ({})", why);
  return cuda::makeCudaBackend(localRank % devices);
#else
  static_cast<void>(localRank);
  throw InputError("--device cuda: this build has no CUDA backend");
#endif
}

}  // namespace

std::vector<std::string> builtBackends() {
  std::vector<std::string> names{"cpu"};
  if (ORPHEUS_HAVE_CUDA) names.push_back("cuda");
  return names;
}

std::unique_ptr<Backend> makeBackend(const std::string& device) {
  return makeBackend(device, localRankFromEnvironment());
}

std::unique_ptr<Backend> makeBackend(const std::string& device, int localRank) {
  if (device == "cpu") return std::make_unique<cpu::CpuBackend>();
  if (device == "cuda") return makeCuda(localRank);
  throw InputError(fmt::format("--device {}: unknown device (expected cpu or cuda)", device));
}

}  // namespace orpheus::ops
