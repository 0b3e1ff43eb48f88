// What the MPI data and control planes share: the error check, bounded waits on
// requests, and the queue of nonblocking sends.
#pragma once

#include "comm/message.h"

#include <mpi.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace orpheus::comm::mpi {

// Throws Error naming `call` and MPI's own error string unless rc is MPI_SUCCESS.
void checkMpi(int rc, const char* call);
#define ORPHEUS_MPI_CHECK(call) ::orpheus::comm::mpi::checkMpi((call), #call)

// Polls `request` until it completes; once `timeout` of running time has passed
// (comm::Deadline), throws the TimeoutError whose message `describe` returns,
// leaving the request active.
void waitFor(MPI_Request& request, std::chrono::milliseconds timeout, const std::function<std::string()>& describe);

// A message on `tag` from any source, if one has arrived (matched and received at once).
std::optional<Message> receiveAny(MPI_Comm comm, int tag);

// Nonblocking sends in flight on one communicator and tag, each keeping its bytes alive.
class SendQueue {
 public:
  SendQueue(MPI_Comm comm, int tag) : comm_(comm), tag_(tag) {}
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;
  // Cancels what is still in flight: it belongs to a job that is failing anyway.
  ~SendQueue();

  void post(int peer, SharedBytes bytes);
  // Completes finished sends and releases their buffers.
  void reap();
  // Waits for every send; TimeoutError "rank R: <what>: N sends to rank(s) ... did not complete".
  void flush(std::chrono::milliseconds timeout, int rank, const char* what);

 private:
  struct Pending {
    MPI_Request request;
    int peer;
    SharedBytes bytes;
  };
  MPI_Comm comm_;
  int tag_;
  std::vector<Pending> pending_;
};

}  // namespace orpheus::comm::mpi
