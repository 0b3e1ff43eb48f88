// Which compute backends there are, and how to get one (after ggml's backend
// registry): "cpu" (Eigen), "strict" (the CPU backend behind memory that host code
// cannot touch between calls: the test device, ops/strict/strict_backend.h) and
// "cuda" (a plugin, liborpheus_cuda.so, loaded at run time, so the orpheus binary
// links no CUDA library and runs where CUDA is absent). The only file that knows
// how each backend is made. makeBackend is called once per rank (per worker
// thread in `simulate`) and the backend is handed down; nothing else makes one.
#pragma once

#include "ops/backend.h"

#include <memory>
#include <string>
#include <vector>

namespace orpheus::ops {

// Device names --device accepts: "cpu", "strict", "cuda" and "cuda:N".
std::vector<std::string> deviceNames();

// Empty when `device` is one of deviceNames(), else why not ("unknown device 'x'
// (expected ...)"): checked when flags are parsed; whether the device exists is
// makeBackend's part. checkDeviceName throws it as an InputError naming --device.
std::string deviceNameProblem(const std::string& device);
void checkDeviceName(const std::string& device);

// This process's rank among the ranks of its host: Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK, Slurm's SLURM_LOCALID, MPICH's MPI_LOCALRANKID, else 0.
int localRankFromEnvironment();

// A backend for `device`. "cuda" picks GPU localRank modulo the visible GPUs, so
// several ranks may share one; "cuda:N" picks GPU N. Throws InputError with one
// line naming --device and why when the plugin is missing or cannot load (its
// CUDA libraries absent), no GPU is visible, N is out of range, or the name is
// unknown.
std::unique_ptr<Backend> makeBackend(const std::string& device, int localRank);
std::unique_ptr<Backend> makeBackend(const std::string& device);

// Where the CUDA plugin was found ("" when it was not), and why not.
std::string cudaPluginPath(std::string* why = nullptr);

}  // namespace orpheus::ops
