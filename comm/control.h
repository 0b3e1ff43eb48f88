// The control plane: agreement between ranks (sum, max, min of a few doubles),
// the control channel (metrics records to the leader) and ending the job. Kept
// apart from the data plane (comm/transport.h) as c10d keeps its Store apart from
// the ProcessGroup: control traffic is never counted as traffic, never matches a
// data-plane message (each backend gives it its own matching space), and stays
// usable after a data-plane call timed out, so ranks can still agree on an error.
//
// Contract:
//  - sum/max/min: collective; every rank calls them in the same order (that order
//    is independent of the data plane's). In place, blocking; after timeout()
//    throws TimeoutError naming the operation and, where the backend can tell,
//    the ranks still missing.
//  - send: nonblocking, not collective; the bytes stay alive until the send
//    completes. Messages from one sender arrive in the order they were sent.
//  - tryReceive: a message that has arrived from any peer, or nothing; never blocks.
//  - flush: waits until every send posted so far has completed (TimeoutError
//    naming the peers after timeout()).
//  - sendNote/tryReceiveNote: a channel of its own for comm/stall.h (a rank whose
//    wait timed out tells its peers so): never mixed with send/tryReceive or the
//    data plane, nonblocking both ways, usable after a data-plane timeout; a send
//    to a peer that is gone may throw Error.
//  - abortJob: ends every rank of the job at once with `exitCode`; for an error
//    one rank hits and the others cannot know about.
//  - Not thread-safe: the thread that drives the transport drives its control plane.
#pragma once

#include "comm/message.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>

namespace orpheus::comm {

// A note on the control plane's note channel: who sent it and its one value.
struct Note {
  int peer = -1;
  uint64_t value = 0;
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;

  virtual void sum(std::span<double> values) = 0;
  virtual void max(std::span<double> values) = 0;
  virtual void min(std::span<double> values) = 0;

  virtual void send(int peer, SharedBytes bytes) = 0;
  virtual std::optional<Message> tryReceive() = 0;
  virtual void flush() = 0;

  virtual void sendNote(int peer, uint64_t value) = 0;
  virtual std::optional<Note> tryReceiveNote() = 0;

  [[noreturn]] virtual void abortJob(int exitCode) = 0;

  void setTimeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

}  // namespace orpheus::comm
