#include "ops/backends.h"

#include "ops/cpu/cpu_backend.h"
#include "ops/strict/strict_backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace orpheus::ops {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCudaPlugin = "liborpheus_cuda.so";

bool parseIndex(const std::string& text, int* out) {
  if (text.empty() || text.size() > 6) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  *out = std::stoi(text);
  return true;
}

std::string executableDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// The plugin's candidates, first found wins: $ORPHEUS_CUDA_PLUGIN, next to the
// binary, ../lib beside it (an install or a bundle), and the build tree.
std::vector<std::string> pluginCandidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("ORPHEUS_CUDA_PLUGIN"); env != nullptr && *env != '\0') {
    paths.emplace_back(env);
    return paths;
  }
  const std::string dir = executableDir();
  if (!dir.empty()) {
    paths.push_back(dir + "/" + kCudaPlugin);
    paths.push_back(dir + "/../lib/" + kCudaPlugin);
  }
#ifdef ORPHEUS_BUILD_PLUGIN_DIR
  paths.push_back(std::string(ORPHEUS_BUILD_PLUGIN_DIR) + "/" + kCudaPlugin);
#endif
  return paths;
}

// The plugin's entry points (ops/cuda/plugin.cc).
struct CudaPlugin {
  int (*abiVersion)() = nullptr;
  int (*visibleDevices)(char*, size_t) = nullptr;
  Backend* (*makeBackend)(int, char*, size_t) = nullptr;
};

// Loads the plugin (it stays loaded: backends it made may live to the process's
// end). Throws InputError naming --device when it is missing or does not load.
CudaPlugin loadCudaPlugin() {
  std::string why;
  const std::string path = cudaPluginPath(&why);
  ORPHEUS_CHECK_INPUT(!path.empty(), "--device cuda: this build has no CUDA backend ({})", why);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    throw InputError(fmt::format("--device cuda: cannot load the CUDA backend {}: {} (are the CUDA 13 runtime and "
                                 "cuBLAS on LD_LIBRARY_PATH?)",
                                 path, err ? err : "unknown error"));
  }
  CudaPlugin p;
  p.abiVersion = reinterpret_cast<int (*)()>(dlsym(handle, "orpheus_backend_abi_version"));
  p.visibleDevices = reinterpret_cast<int (*)(char*, size_t)>(dlsym(handle, "orpheus_cuda_visible_devices"));
  p.makeBackend = reinterpret_cast<Backend* (*)(int, char*, size_t)>(dlsym(handle, "orpheus_cuda_make_backend"));
  ORPHEUS_CHECK_INPUT(p.abiVersion && p.visibleDevices && p.makeBackend,
                      "--device cuda: {} is not an Orpheus CUDA backend (missing entry points)", path);
  ORPHEUS_CHECK_INPUT(p.abiVersion() == kBackendAbiVersion,
                      "--device cuda: {} was built for backend interface {}, this orpheus uses {}", path,
                      p.abiVersion(), kBackendAbiVersion);
  return p;
}

std::unique_ptr<Backend> makeCuda(const std::string& device, int localRank) {
  int index = -1;
  if (device != "cuda") static_cast<void>(parseIndex(device.substr(5), &index));
  const CudaPlugin plugin = loadCudaPlugin();
  char text[512] = {0};
  const int devices = plugin.visibleDevices(text, sizeof text);
  ORPHEUS_CHECK_INPUT(devices > 0, "--device {}: no CUDA GPU is visible ({})", device, text);
  ORPHEUS_CHECK_INPUT(index < devices, "--device {}: this host has {} visible GPU{}", device, devices,
                      devices == 1 ? "" : "s");
  const int chosen = index >= 0 ? index : localRank % devices;
  Backend* backend = plugin.makeBackend(chosen, text, sizeof text);
  ORPHEUS_CHECK_INPUT(backend != nullptr, "--device {}: GPU {} could not be used: {}", device, chosen, text);
  return std::unique_ptr<Backend>(backend);
}

}  // namespace

std::vector<std::string> deviceNames() { return {"cpu", "strict", "cuda", "cuda:N"}; }

std::string deviceNameProblem(const std::string& device) {
  int index = 0;
  const bool ok = device == "cpu" || device == "strict" || device == "cuda" ||
                  (device.rfind("cuda:", 0) == 0 && parseIndex(device.substr(5), &index));
  return ok ? "" : fmt::format("unknown device '{}' (expected cpu, cuda, cuda:N or strict)", device);
}

void checkDeviceName(const std::string& device) {
  const std::string problem = deviceNameProblem(device);
  ORPHEUS_CHECK_INPUT(problem.empty(), "--device: {}", problem);
}

int localRankFromEnvironment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(v, &end, 10);
    if (*end == '\0' && rank >= 0 && rank < (1L << 30)) return static_cast<int>(rank);
  }
  return 0;
}

std::string cudaPluginPath(std::string* why) {
  std::string tried;
  for (const std::string& p : pluginCandidates()) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
    tried += (tried.empty() ? "" : ", ") + p;
  }
  if (why != nullptr) *why = fmt::format("no {} at {}", kCudaPlugin, tried);
  return "";
}

std::unique_ptr<Backend> makeBackend(const std::string& device, int localRank) {
  checkDeviceName(device);
  if (device == "cpu") return std::make_unique<cpu::CpuBackend>();
  if (device == "strict") return strict::makeStrictBackend();
  return makeCuda(device, localRank);
}

std::unique_ptr<Backend> makeBackend(const std::string& device) {
  return makeBackend(device, localRankFromEnvironment());
}

}  // namespace orpheus::ops
