// The strict device: a backend whose tensors live in host memory that host code
// cannot touch outside backend calls. Every allocation is its own mapping, kept
// PROT_NONE; an operation opens the mappings of its operands, runs the CPU
// backend's kernel on them and closes them again. A host read or write of device
// memory anywhere else (a Tensor's data() dereferenced, an Eigen map of it) faults
// at once, and the fault handler names the strict device before the process dies.
// The arithmetic is the CPU backend's, on the same values in the same order, so a
// job on --device strict ends with the CPU job's parameters, bit for bit: CI runs
// the training tests on it to prove that every step of a clock reaches its
// operands through the seam (ops/backend.h), as a GPU requires.
//
// One thread per backend, as every backend; several strict backends (threads of
// one process) are independent. Slow (two mprotect calls per operand per
// operation): a test device, not a production one.
#pragma once

#include "ops/backend.h"

#include <memory>

namespace orpheus::ops::strict {

std::unique_ptr<Backend> makeStrictBackend();

// Installs the SIGSEGV handler that says a fault may be a host access to strict
// device memory, in front of whatever handler is there (makeStrictBackend calls
// it; again when another handler replaced it since).
void installFaultReport();

}  // namespace orpheus::ops::strict
