// The CUDA backend: cuBLAS for the GEMMs, axpy and scaling; the project's own
// kernels (kernels.cu) for fused elementwise chains, softmax + cross-entropy,
// reductions, sparse products and optimizer steps. One stream and one cuBLAS handle per backend,
// on one device chosen when it is made, and a second stream for the asynchronous
// copies (to and from page-locked host buffers, timed with CUDA events); see
// ops/backend.h for the contract.
// Reached only through ops/backends.h; this header needs no CUDA headers.
#pragma once

#include "ops/backend.h"

#include <memory>
#include <string>

namespace orpheus::ops::cuda {

// How many CUDA devices this process sees; 0 when there are none or the runtime
// cannot tell (no driver, driver too old), with the runtime's reason in `why`.
int visibleDevices(std::string* why);

// A backend on device `device` (0 <= device < visibleDevices()).
std::unique_ptr<Backend> makeCudaBackend(int device);

}  // namespace orpheus::ops::cuda
