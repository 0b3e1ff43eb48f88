// The registration file: each backend is listed here once (under its build
// option, when it has one).
#include "comm/factory.h"

#include "comm/loopback/loopback_transport.h"
#include "comm/mpi/mpi_transport.h"
#include "engine/base/error.h"

#include <fmt/ranges.h>

namespace orpheus::comm {
namespace {

struct Backend {
  const char* name;
  std::unique_ptr<Transport> (*make)();
};

constexpr Backend kBackends[] = {
    {"mpi", [] { return std::unique_ptr<Transport>(std::make_unique<mpi::MpiTransport>(MPI_COMM_WORLD)); }},
};

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

std::unique_ptr<Transport> makeTransport(const std::string& name, const TransportOptions& options) {
  checkTransport(name);
  for (const auto& b : kBackends) {
    if (name != b.name) continue;
    auto transport = b.make();
    transport->setTimeout(options.timeout);
    return transport;
  }
  throw Error(fmt::format("transport '{}' passed the check but has no maker", name));
}

std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options) {
  return makeLoopbackGroup(ranks, options, nullptr);
}

std::vector<std::unique_ptr<Transport>> makeLoopbackGroup(int ranks, const TransportOptions& options,
                                                          std::shared_ptr<loopback::RunGate> gate) {
  auto hub = std::make_shared<loopback::LoopbackHub>(ranks, std::move(gate));
  std::vector<std::unique_ptr<Transport>> group;
  for (int r = 0; r < ranks; ++r) {
    group.push_back(std::make_unique<loopback::LoopbackTransport>(hub, r));
    group.back()->setTimeout(options.timeout);
  }
  return group;
}

}  // namespace orpheus::comm
