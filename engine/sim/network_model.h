// The network a simulation runs on (orpheus simulate): how long messages take,
// given when each sender is ready. Deliberately small, so a prediction can be
// checked by hand:
//
//  - Every rank has one NIC. A sender puts its copies on the wire one after the
//    other (in the order given) at its send rate; the last byte of a copy reaches
//    the receiver `latency` after it left (cut-through: receiving overlaps sending).
//  - A receiver takes copies in one at a time at its NIC rate, in the order they
//    reach it: a copy is in at max(reaches, previous copy in + bytes / rate). So
//    incast serializes, and one sender to one receiver costs bytes / rate + latency.
//  - Send rate = min(link, NIC); receive rate = min(link, NIC).
//  - An oversubscribed fabric (core > 0): the senders of one exchange share the core
//    equally, each sending at most core / senders.
//  - Multicast (IP or IB multicast): one copy per message reaches every receiver.
//  - NICs stay busy across calls: a Network carries each NIC's free time on.
//  - The host's network stack (stack > 0): each byte a worker sends or receives
//    costs CPU at `stack` Gbit/s of a core (kernel TCP copies), on top of its
//    computation and slowed as that is where workers share cores (VirtualClock).
//
// Collectives the engine runs as a library call (dense allreduce, PowerSGD's
// factors, replica averaging, rotation) cost what their algorithms cost on this
// model, as closed forms below, each step paying the per-message latency: the
// all-reduce is the ring's or the binary tree's (--sim-allreduce). Times in
// seconds, sizes in bytes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace orpheus::engine::sim {

// How the model times an all-reduce (--sim-allreduce).
enum class AllreduceAlgorithm { kRing, kTree };

struct NetworkModel {
  double linkGbps = 10.0;       // per link, each direction
  double latencySeconds = 5e-6;  // per message, wire and switch
  double nicGbps = 0.0;         // each NIC's limit, each direction; 0: the link's
  double coreGbps = 0.0;        // the fabric's aggregate; 0: full bisection
  bool multicast = false;       // one send reaches all of a message's receivers
  double stackGbps = 0.0;       // CPU per byte sent or received, Gbit/s of a core; 0: free
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kRing;

  // Seconds of a core the network stack spends on `bytes`; 0 when it is free.
  double stackSeconds(double bytes) const;

  double sendBytesPerSecond() const;
  double receiveBytesPerSecond() const;
  // Refuses non-positive rates or a negative latency (InputError naming the flag).
  void validate() const;
};

// One message of an exchange: from `sender`, ready at `ready`, to `receivers`.
struct Transfer {
  int sender = 0;
  double ready = 0.0;
  uint64_t bytes = 0;
  std::vector<int> receivers;
};

class Network {
 public:
  Network(const NetworkModel& model, int ranks);

  // When each receiver of each transfer has the message in, indexed like
  // transfers[i].receivers. A sender's transfers go out in the order given.
  std::vector<std::vector<double>> deliver(std::span<const Transfer> transfers);

  const NetworkModel& model() const { return model_; }

 private:
  NetworkModel model_;
  std::vector<double> sendFree_;
  std::vector<double> receiveFree_;
};

// The ring all-reduce of `bytes` over `ranks`: 2(P-1) steps of bytes/P each.
double ringAllreduceSeconds(const NetworkModel& model, int ranks, double bytes);
// A reduce then a broadcast over a binary tree: 2 ceil(log2 P) steps, each moving
// the whole buffer one level and paying the latency. A step costs bytes / rate, as
// in a double binary tree (NCCL's), where each tree carries half the buffer and a
// parent's two children together bring it the whole buffer's worth.
double treeAllreduceSeconds(const NetworkModel& model, int ranks, double bytes);
// The all-reduce of `bytes` by the model's algorithm.
double allreduceSeconds(const NetworkModel& model, int ranks, double bytes);
// Every rank sends `bytes` to its right neighbour at once.
double ringShiftSeconds(const NetworkModel& model, int ranks, double bytes);

}  // namespace orpheus::engine::sim
