// The registration file: each backend is listed here once (under its build
// option, when it has one).
#include "comm/factory.h"

#include "comm/loopback/loopback_transport.h"
#include "comm/mpi/mpi_live_group.h"
#include "comm/mpi/mpi_transport.h"
#include "engine/base/error.h"

#include <fmt/ranges.h>

namespace orpheus::comm {
namespace {

struct Backend {
  const char* name;
  std::unique_ptr<Transport> (*make)();
  std::unique_ptr<LiveGroup> (*makeLive)(std::vector<std::string> argv);
  JoinedRank (*join)(std::vector<std::string> argv, std::chrono::milliseconds timeout);
};

constexpr Backend kBackends[] = {
    {"mpi", [] { return std::unique_ptr<Transport>(std::make_unique<mpi::MpiTransport>(MPI_COMM_WORLD)); },
     [](std::vector<std::string> argv) {
       return std::unique_ptr<LiveGroup>(std::make_unique<mpi::MpiLiveGroup>(MPI_COMM_WORLD, std::move(argv)));
     },
     [](std::vector<std::string> argv, std::chrono::milliseconds timeout) {
       auto live = mpi::MpiLiveGroup::join(std::move(argv), timeout);
       JoinedRank joined;
       joined.transport = live->joined();
       joined.live = std::move(live);
       return joined;
     }},
};

const Backend& backendNamed(const std::string& name) {
  checkTransport(name);
  for (const auto& b : kBackends)
    if (name == b.name) return b;
  throw Error(fmt::format("transport '{}' passed the check but has no maker", name));
}

}  // namespace

std::vector<std::string> availableTransports() {
  std::vector<std::string> names;
  for (const auto& b : kBackends) names.emplace_back(b.name);
  return names;
}

void checkTransport(const std::string& name) {
  for (const auto& b : kBackends)
    if (name == b.name) return;
  const std::string available = fmt::format("{}", fmt::join(availableTransports(), ", "));
  if (name == "loopback") {
    throw InputError(fmt::format("transport 'loopback' runs every rank as a thread of one process (tests, "
                                 "simulation) and cannot serve a job of separate processes; available: {}",
                                 available));
  }
  throw InputError(fmt::format("transport '{}' is not built; available: {}", name, available));
}

Runtime::Runtime(const std::string& transport) : mpi_(transport == "mpi") {
  checkTransport(transport);
  if (!mpi_) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
}

Runtime::~Runtime() {
  if (mpi_) MPI_Finalize();
}

std::unique_ptr<Transport> makeTransport(const std::string& name, const TransportOptions& options) {
  auto transport = backendNamed(name).make();
  transport->setTimeout(options.timeout);
  return transport;
}

std::unique_ptr<LiveGroup> makeLiveGroup(const std::string& name, std::vector<std::string> argv) {
  return backendNamed(name).makeLive(std::move(argv));
}

JoinedRank joinLiveGroup(const std::string& name, std::vector<std::string> argv, std::chrono::milliseconds timeout) {
  return backendNamed(name).join(std::move(argv), timeout);
}

std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options) {
  return makeLoopbackGroup(ranks, options, nullptr);
}

std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options,
                                                          std::shared_ptr<RunGate> gate) {
  auto hub = std::make_shared<loopback::LoopbackHub>(ranks, std::move(gate));
  std::vector<std::unique_ptr<Transport>> group;
  for (int r = 0; r < ranks; ++r) {
    group.push_back(std::make_unique<loopback::LoopbackTransport>(hub, r));
    group.back()->setTimeout(options.timeout);
  }
  return group;
}

std::vector<std::unique_ptr<LiveGroup>> makeLoopbackLiveGroup(int ranks, std::shared_ptr<RunGate> gate,
                                                              loopback::JoinRank join) {
  return loopback::LoopbackLiveGroup::make(ranks, std::move(gate), std::move(join));
}

}  // namespace orpheus::comm
