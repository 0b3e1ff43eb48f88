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
// leaving the request active. Open MPI moves a nonblocking collective's data only
// inside MPI calls (shared memory without single copy: fragment by fragment), so
// the polling paces the transfer.
void waitFor(MPI_Request& request, std::chrono::milliseconds timeout, const std::function<std::string()>& describe);

// How waitFor polls from now on, for the whole process. Busy (the default off):
// MPI_Test then a yield, without pause, as MPI_Wait polls; for a host where each
// rank has a core of its own. Otherwise a short spin, then a test every 20 us, so
// that ranks sharing cores leave them to the ranks still computing: a 26 MB
// all-reduce of 2 ranks through shared memory without single copy took 50 ms so,
// and 3 ms polled busily.
void pollBusily(bool busy);
// Whether the ranks of `comm` on this host (MPI_COMM_TYPE_SHARED) are no more than
// its cores. Collective over `comm`.
bool coreForEachRank(MPI_Comm comm);

// A message on `tag` from any source, if one has arrived (matched and received at once).
std::optional<Message> receiveAny(MPI_Comm comm, int tag);

// An MPI datatype that lays out `pieces` at their absolute addresses: a buffer of
// MPI_BOTTOM and a count of 1 moves the pieces, back to back, as one message of
// MPI_BYTEs (what the receiver sees), without gathering them first. The type may
// be freed once the call that uses it has started; MPI keeps it for that call.
class PiecesType {
 public:
  explicit PiecesType(const Pieces& pieces);
  ~PiecesType();
  PiecesType(const PiecesType&) = delete;
  PiecesType& operator=(const PiecesType&) = delete;
  MPI_Datatype get() const { return type_; }
  // Frees the type (when the last call that uses it has started).
  void release();

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Nonblocking sends in flight on one communicator and tag, each keeping its bytes alive.
class SendQueue {
 public:
  SendQueue(MPI_Comm comm, int tag) : comm_(comm), tag_(tag) {}
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;
  // Cancels what is still in flight: it belongs to a job that is failing anyway.
  ~SendQueue();

  void post(int peer, SharedBytes bytes);
  // One message of the pieces, sent from where they lie (PiecesType).
  void post(int peer, SharedPieces pieces);
  // Completes finished sends and releases their buffers.
  void reap();
  // Waits for every send; TimeoutError "rank R: <what>: N sends to rank(s) ... did not complete".
  void flush(std::chrono::milliseconds timeout, int rank, const char* what);

 private:
  struct Pending {
    MPI_Request request;
    int peer;
    SharedBytes bytes;
    SharedPieces pieces;
  };
  MPI_Comm comm_;
  int tag_;
  std::vector<Pending> pending_;
};

}  // namespace orpheus::comm::mpi
