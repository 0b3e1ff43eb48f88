// Choosing a transport at run time (`--transport`): the one place that knows
// which backends this binary was built with.
#pragma once

#include "comm/live_group.h"
#include "comm/loopback/loopback_live_group.h"
#include "comm/transport.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace orpheus::comm {

// What the named transport needs set up in this process, for the object's
// lifetime: MPI_Init_thread and MPI_Finalize for "mpi". Make it before any
// transport or live group of that name and destroy it after the last of them.
// Throws the InputError of checkTransport for a name that is not built.
class Runtime {
 public:
  explicit Runtime(const std::string& transport);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

 private:
  bool mpi_ = false;
};

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

// The live group (comm/live_group.h) spanning the ranks of makeTransport(name):
// collective over them, like it. `argv`: this process's command line, which a
// backend that spawns processes to grow the group gives the new ones (with
// kLiveJoinFlag and the clock).
std::unique_ptr<LiveGroup> makeLiveGroup(const std::string& name, std::vector<std::string> argv);

// A process a running job's grow() started (its argv carries kLiveJoinFlag): joins
// that job's group; its transport, ranked after the old ranks, and its live group.
struct JoinedRank {
  std::unique_ptr<Transport> transport;
  std::unique_ptr<LiveGroup> live;
};
JoinedRank joinLiveGroup(const std::string& name, std::vector<std::string> argv, std::chrono::milliseconds timeout);

// An in-process job for tests and simulation: `ranks` loopback transports on one
// hub, element r being rank r. Each must be driven by its own thread.
std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options = {});
// The same, with at most gate->capacity() of the ranks' threads running at once
// (comm/run_gate.h: each thread enters the gate before its first call).
std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options,
                                                          std::shared_ptr<RunGate> gate);

// The live groups of such a job (made with the same gate), element r rank r.
// `join` starts each rank of a grown group (comm/loopback/loopback_live_group.h);
// empty: the job cannot grow.
std::vector<std::unique_ptr<LiveGroup>> makeLoopbackLiveGroup(int ranks, std::shared_ptr<RunGate> gate,
                                                              loopback::JoinRank join = {});

}  // namespace orpheus::comm
