// Choosing a transport at run time (`--transport`): the one place that knows
// which backends this binary was built with.
#pragma once

#include "comm/transport.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace orpheus::comm {

namespace loopback {
class RunGate;
}  // namespace loopback

struct TransportOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // data and control planes
};

// The names makeTransport accepts in this build, in the order help text lists them.
std::vector<std::string> availableTransports();

// Throws InputError "transport 'x' is not built; available: mpi" unless makeTransport
// can build `name`; needs no backend initialised (call it before MPI_Init).
void checkTransport(const std::string& name);

// This process's rank of the named transport.
//  - "mpi": over MPI_COMM_WORLD; collective over it. The caller initialises MPI
//    before and finalises it only after the transport is destroyed.
// An unknown or unbuilt name throws the InputError of checkTransport.
std::unique_ptr<Transport> makeTransport(const std::string& name, const TransportOptions& options = {});

// An in-process job for tests and simulation: `ranks` loopback transports on one
// hub, element r being rank r. Each must be driven by its own thread.
std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options = {});
// The same, with at most gate->capacity() of the ranks' threads running at once
// (comm/loopback/run_gate.h: each thread enters the gate before its first call).
std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options,
                                                          std::shared_ptr<loopback::RunGate> gate);

}  // namespace orpheus::comm
