// Communication overlapped with the backward pass (--overlap on): wait-free
// backpropagation after Poseidon (ATC'17), for both ways of synchronizing.
//
//  - --sync sv, broadcast, BSP: as the backward pass makes each layer's SVs final
//    (top layer first, ops::Model::computeSvgStreamed), the layer's matrices leave
//    as an SV batch of their own to every peer (point to point, nonblocking) while
//    the layers below are still computed. A receiver rebuilds a layer as soon as
//    every rank's part of it is in, in rank order, while later layers are still on
//    the wire. Each layer's rebuild is the same GEMM over the same columns in the
//    same order as the rebuild of whole batches (ops/rebuild.h), and layers touch
//    disjoint parameters, so the parameters are bitwise those of --overlap off.
//    With selection (--select C < B) the joint selection needs every matrix: it
//    runs when the backward pass is done, then the selected batch leaves layer by
//    layer and receivers still rebuild each layer as it arrives.
//  - --sync dense: each layer's gradient is all-reduced (a nonblocking allreduce
//    per parameter, a bucket per layer, as DDP does) as soon as it exists; each is
//    the reduction --overlap off runs on the same parameter, so the sum is bitwise
//    the same.
//
// A "layer" here is a unit of the batch: the matrices of the parameters that one
// group of SV sites updates together (a weight and its bias; a recurrent matrix
// and all its steps), so a unit's rebuild never shares a parameter with another's.
//
// Nothing is copied on the way: a layer leaves as its record's header and the
// arrays of the local batch where they lie (comm::Pieces, scatter/gather), and a
// peer's layer is rebuilt from views into the buffer it arrived in (decodeView).
//
// MPI progress is driven without a thread of its own: each layer boundary of the
// backward pass takes in what has arrived (MPI_Improbe / MPI_Test), and the waits
// after it poll with short sleeps, as engine/consistency does.
#pragma once

#include "comm/transport.h"
#include "engine/base/sv_batch.h"
#include "engine/worker/exchange.h"
#include "engine/metrics/metrics.h"
#include "engine/sync_modes.h"
#include "ops/model.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace orpheus::engine {

// The units of a model's SV batches: sites that share a parameter (or bias) are
// in one unit. Units are numbered by their first site.
class SvUnits {
 public:
  explicit SvUnits(const std::vector<ops::Model::SvSiteInfo>& sites);
  size_t count() const { return units_.size(); }
  size_t sites() const { return unitOf_.size(); }
  size_t unitOf(size_t site) const { return unitOf_[site]; }
  // The unit's sites, in batch order.
  const std::vector<size_t>& members(size_t unit) const { return units_[unit]; }
  // The unit whose first matrix updates `paramId`, or nothing.
  std::optional<size_t> unitOfParam(uint32_t paramId) const;
  // The parameters (weights and biases) a unit updates.
  std::vector<uint32_t> params(size_t unit) const;

 private:
  std::vector<ops::Model::SvSiteInfo> sites_;
  std::vector<size_t> unitOf_;
  std::vector<std::vector<size_t>> units_;
};

// When the overlapped exchange of one clock did what, in seconds since the clock's
// compute began (negative: never).
struct OverlapTimes {
  double firstSend = -1.0;     // the first layer handed to the network
  double backwardEnd = -1.0;   // the backward pass (and selection) done
  double lastArrival = -1.0;   // the last layer of the last peer in
  double sendSeconds = 0.0;    // spent encoding and posting sends inside the backward pass
};

// What the overlapped exchange reads of the job (engine/worker/part_options.h makes
// it from the flags): whether it serves the job, and how long a wait lasts.
struct OverlapOptions {
  bool overlap = false;  // --overlap on
  SyncMode sync = SyncMode::kSv;
  Consistency consistency = Consistency::kBsp;
  double dropLinks = 0.0;
  ops::Model::SvgUnit selectUnit = ops::Model::SvgUnit::kExample;
  double timeoutSeconds = 300.0;
};

// --sync sv, broadcast, BSP, --overlap on: one per worker, reused every clock.
class OverlappedExchange final : public ClockExchange {
 public:
  // Whether the overlapped exchange serves this job: --overlap on, --sync sv, a
  // model that names its SV sites and SVGs per example. It is used on the clocks
  // that go through the broadcast (sendsPointToPoint false).
  static bool serves(const OverlapOptions& options, const ops::Model& model);

  OverlappedExchange(const OverlapOptions& options, const ops::Model& model, comm::Transport& transport,
                     ClockLog& log);

  // Streams unless the clock sends a selection: the joint selection needs every
  // matrix, so the selected batch leaves layer by layer from send().
  bool streams(bool selects) const override { return !selects; }
  // `local` owns the memory of the matrices siteReady() is given.
  void begin(uint64_t clock, const SvBatchHeader& header, float scale, Clock::time_point start,
             std::shared_ptr<const SvBatch> local) override;
  // Sends the site's unit once every matrix of the unit is final, from where the
  // arrays lie (they must stay unchanged until the sends complete), then takes in
  // what has arrived: the backward pass's hook.
  void siteReady(size_t site, const SvMatrix& matrix) override;
  // The backward pass (and the selection) is done: a selected batch leaves now,
  // unit by unit; a streamed one has left.
  void send(uint64_t clock, std::shared_ptr<const SvBatch> sent, ClockStats& stats) override;
  double sendSeconds() const override { return times_.sendSeconds; }
  // Waits for every peer's part of every unit of this clock, applying each unit's
  // batches in rank order (this rank's part from the whole local batch) as soon as
  // all are in. The group it returns has nothing left to apply.
  ClockGroup receive(uint64_t clock, const std::shared_ptr<SvBatch>& local, const ApplyFn& apply, ClockStats& stats,
                     MetricsSink& metrics) override;

 private:
  // A peer's batch of the clock: its header, and the batch whole again (matrices in
  // batch order) when it was asked for (the log keeps received batches).
  struct PeerBatch {
    SvBatchHeader header;
    std::shared_ptr<const SvBatch> whole;
  };
  std::vector<PeerBatch> finish(const SvBatch& own, const ApplyFn& apply, MetricsSink& metrics, double& rebuildSeconds,
                                bool keepWhole);
  SvBatchView unitView(const SvBatchView& from, size_t unit) const;
  // Sends the unit of `matrices` with `coeffs`, whose arrays `arrays` keeps alive.
  void sendUnit(const Vector& coeffs, std::span<const SvMatrix* const> matrices, std::shared_ptr<const void> arrays);
  void takeIn();
  double since(Clock::time_point t) const { return std::chrono::duration<double>(t - start_).count(); }

  OverlapOptions options_;
  comm::Transport& transport_;
  ClockLog& log_;
  SvUnits units_;
  std::vector<std::pair<int64_t, int64_t>> shapes_;
  uint64_t clock_ = 0;
  SvBatchHeader header_;
  float scale_ = 1.0f;
  std::shared_ptr<const void> arrays_;
  std::shared_ptr<const Vector> coeffs_;  // this clock's per-column coefficients, shared by its sends
  Clock::time_point start_;
  OverlapTimes times_;
  // This clock's local matrices as the backward pass made them final, per site,
  // and how many of each unit's are still to come.
  std::vector<const SvMatrix*> ready_;
  std::vector<size_t> missing_;
  // What has arrived, by clock, sender and unit (a fast peer may be a clock ahead).
  std::map<uint64_t, std::vector<std::vector<std::optional<SvBatchView>>>> arrived_;
  // A peer's first batch that did not decode (a peer's batches arrive in order):
  // raised in finish(), once this rank's own batches of the clock are out, when
  // that peer's part of the clock is still missing, so no peer waits on this rank.
  std::vector<std::exception_ptr> broken_;
};

// --sync dense with --overlap on: the dense gradient, each unit's parameters
// all-reduced (begun, nonblocking) as soon as the backward pass has their
// gradient, the rest after it; returns once every sum is complete. Bitwise the
// gradient and the sums of Model::denseGradient followed by allreduceSum per
// parameter (the default denseGradient, which rebuilds the batch's SVs).
ParamSet overlappedDenseGradient(const ops::Model& model, const ParamSet& w, const ops::ExampleBatch& x,
                                 double* meanLoss, comm::Transport& transport, uint64_t clock,
                                 std::chrono::steady_clock::time_point start, OverlapTimes& times,
                                 double& exposedSeconds, ops::Backend& backend, ops::RebuildBuffers& buffers);

}  // namespace orpheus::engine
