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
// Asynchronous copies (Backend::copyToHostAsync, copyToDeviceAsync) run as late as
// a device may run them: when their event is waited for (wait, waitOnDevice, or
// the second ready() about it; the first always says not ready). Until then the
// host bytes a copy to the host will write hold NaN (0x7fbadbad), so host code that
// reads them early reads poison; an operation that uses a tensor a copy from the
// host has not landed in fails with an Error naming it; and a copy whose source
// changed (an operation wrote it, or host code wrote the host buffer) or whose
// device end was freed before it landed fails naming that. Events carry the host's
// clock when they completed; a copy runs on the host thread, after the compute it
// could have hidden behind, so none of its time is hidden.
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
