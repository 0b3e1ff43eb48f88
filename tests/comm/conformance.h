// One behavioural suite for every transport: each case is a body every rank of
// a job runs on its own transport. tests/comm/conformance_test.cc runs it over
// loopback groups of 1-8 ranks (threads); tests/mpi/conformance_mpi_test.cc runs
// the same bodies under mpiexec. A body reports a failure by throwing (ranks may
// be threads, and Catch2's assertions are not thread-safe).
#pragma once

#include "comm/transport.h"

#include <functional>
#include <string>
#include <vector>

namespace orpheus::comm::testing {

// What a transport promises beyond the common contract.
struct ConformanceTraits {
  // Whether a collective's TimeoutError names the rank that did not come.
  bool namesLatePeerInCollectives = true;
};

struct ConformanceCase {
  std::string name;
  std::function<void(Transport&)> body;
};

std::vector<ConformanceCase> conformanceCases(const ConformanceTraits& traits);

// A fixed sequence of data-plane calls (every kind, sizes that do not divide
// evenly); what transports count for it must agree.
void trafficSequence(Transport& t);

}  // namespace orpheus::comm::testing
