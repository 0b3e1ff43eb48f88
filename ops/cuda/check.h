// One checking macro per CUDA library: a failed call throws orpheus::Error naming
// the call, the library's own error string, and where it happened.
#pragma once

#include "engine/base/error.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#define ORPHEUS_CUDA_CHECK(call)                                                                 \
  do {                                                                                           \
    const cudaError_t orpheusCudaStatus = (call);                                                \
    if (orpheusCudaStatus != cudaSuccess) {                                                      \
      throw ::orpheus::Error(fmt::format("{}:{}: {} failed: {} ({})", __FILE__, __LINE__, #call, \
                                         cudaGetErrorString(orpheusCudaStatus),                  \
                                         cudaGetErrorName(orpheusCudaStatus)));                  \
    }                                                                                            \
  } while (0)

#define ORPHEUS_CUBLAS_CHECK(call)                                                               \
  do {                                                                                           \
    const cublasStatus_t orpheusCublasStatus = (call);                                           \
    if (orpheusCublasStatus != CUBLAS_STATUS_SUCCESS) {                                          \
      throw ::orpheus::Error(fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #call,      \
                                         cublasGetStatusString(orpheusCublasStatus)));           \
    }                                                                                            \
  } while (0)
