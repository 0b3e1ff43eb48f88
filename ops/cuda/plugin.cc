// The CUDA backend as a plugin: liborpheus_cuda.so exports these C entry points
// and nothing else the engine calls, so the orpheus binary links no CUDA library
// and starts on hosts without one (ops/backends.cc loads the plugin on
// --device cuda). Errors cross the boundary as text, not as exceptions.
#include "ops/cuda/cuda_backend.h"

#include <cstdio>
#include <exception>
#include <string>

namespace {

void writeText(const std::string& text, char* out, size_t size) {
  if (out != nullptr && size > 0) std::snprintf(out, size, "%s", text.c_str());
}

}  // namespace

extern "C" {

// ops::kBackendAbiVersion as this plugin was built; the loader refuses another.
__attribute__((visibility("default"))) int orpheus_backend_abi_version() { return orpheus::ops::kBackendAbiVersion; }

// How many CUDA devices this process sees; 0 with the runtime's reason in `why`.
__attribute__((visibility("default"))) int orpheus_cuda_visible_devices(char* why, size_t size) {
  try {
    std::string reason;
    const int n = orpheus::ops::cuda::visibleDevices(&reason);
    writeText(reason, why, size);
    return n;
  } catch (const std::exception& e) {
    writeText(e.what(), why, size);
    return 0;
  }
}

// A new backend on `device`, owned by the caller (deleted through Backend's
// virtual destructor, which lives in this plugin: it is never unloaded).
// Null on failure, with the reason in `error`.
__attribute__((visibility("default"))) orpheus::ops::Backend* orpheus_cuda_make_backend(int device, char* error,
                                                                                          size_t size) {
  try {
    return orpheus::ops::cuda::makeCudaBackend(device).release();
  } catch (const std::exception& e) {
    writeText(e.what(), error, size);
    return nullptr;
  }
}

}  // extern "C"
