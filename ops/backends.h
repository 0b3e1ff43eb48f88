// Which compute backends this build has, and how to get one. The only file that
// knows about ORPHEUS_HAVE_CUDA (after ggml's backend registry).
#pragma once

#include "ops/backend.h"

#include <memory>
#include <string>
#include <vector>

namespace orpheus::ops {

// Names makeBackend accepts in this build: "cpu", and "cuda" when it was built.
std::vector<std::string> builtBackends();

// A backend for `device` ("cpu" or "cuda"). The CUDA device is this process's
// local rank (OMPI_COMM_WORLD_LOCAL_RANK, 0 when unset) modulo the number of
// visible devices, so several ranks may share one GPU. Throws InputError with one
// line naming --device when the build lacks the backend, no GPU is visible, or
// the name is unknown.
std::unique_ptr<Backend> makeBackend(const std::string& device);
// The same with an explicit local rank.
std::unique_ptr<Backend> makeBackend(const std::string& device, int localRank);

}  // namespace orpheus::ops
