#include "engine/worker/overlap.h"

#include "comm/stall.h"
#include "engine/base/error.h"
#include "ops/rebuild.h"


#include <algorithm>
#include <numeric>
#include <thread>

namespace orpheus::engine {
namespace {

// Union-find root.
size_t rootOf(std::vector<size_t>& parent, size_t i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

}  // namespace

SvUnits::SvUnits(const std::vector<ops::Model::SvSiteInfo>& sites) : sites_(sites), unitOf_(sites.size()) {
  // Sites joined when they touch a common parameter (weight or bias).
  std::vector<size_t> parent(sites.size());
  std::iota(parent.begin(), parent.end(), size_t{0});
  std::map<int64_t, size_t> byParam;
  for (size_t i = 0; i < sites.size(); ++i) {
    for (const int64_t p : {static_cast<int64_t>(sites[i].paramId), static_cast<int64_t>(sites[i].biasId)}) {
      if (p < 0) continue;
      const auto [it, fresh] = byParam.emplace(p, i);
      if (!fresh) parent[rootOf(parent, i)] = rootOf(parent, it->second);
    }
  }
  std::map<size_t, size_t> unitOfRoot;
  for (size_t i = 0; i < sites.size(); ++i) {
    const auto [it, fresh] = unitOfRoot.emplace(rootOf(parent, i), units_.size());
    if (fresh) units_.emplace_back();
    unitOf_[i] = it->second;
    units_[it->second].push_back(i);
  }
}

std::optional<size_t> SvUnits::unitOfParam(uint32_t paramId) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (sites_[units_[u].front()].paramId == paramId) return u;
  }
  return std::nullopt;
}

std::vector<uint32_t> SvUnits::params(size_t unit) const {
  std::vector<uint32_t> out;
  for (size_t site : units_[unit]) {
    out.push_back(sites_[site].paramId);
    if (sites_[site].biasId >= 0) out.push_back(static_cast<uint32_t>(sites_[site].biasId));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool OverlappedExchange::serves(const OverlapOptions& options, const ops::Model& model) {
  // Not where batches may travel point to point whatever the knobs (SSP, broken
  // links); per-step SVGs of a sequence model are regrouped after the backward pass.
  const bool mayGoPointToPoint = options.dropLinks > 0.0 || options.consistency == Consistency::kSsp;
  return options.overlap && options.sync == SyncMode::kSv && !mayGoPointToPoint && !model.svSites().empty() &&
         options.selectUnit != ops::Model::SvgUnit::kStep;
}

OverlappedExchange::OverlappedExchange(const OverlapOptions& options, const ops::Model& model,
                                       comm::Transport& transport, ClockLog& log)
    : options_(options), transport_(transport), log_(log), units_(model.svSites()), shapes_(model.paramShapes()) {}

void OverlappedExchange::begin(uint64_t clock, const SvBatchHeader& header, float scale, Clock::time_point start,
                               std::shared_ptr<const SvBatch> local) {
  clock_ = clock;
  header_ = header;
  scale_ = scale;
  start_ = start;
  arrays_ = std::move(local);
  coeffs_.reset();
  times_ = {};
  ready_.assign(units_.sites(), nullptr);
  missing_.assign(units_.count(), 0);
  for (size_t u = 0; u < units_.count(); ++u) missing_[u] = units_.members(u).size();
}

SvBatchView OverlappedExchange::unitView(const SvBatchView& from, size_t unit) const {
  SvBatchView b;
  b.header = from.header;
  b.columns = from.columns;
  b.coeffs = from.coeffs;
  for (size_t site : units_.members(unit)) b.matrices.push_back(from.matrices[site]);
  return b;
}

namespace {

// What a sent layer's pieces point into, kept until every send of it completes.
struct SentUnit {
  SvBatchPieces record;
  std::shared_ptr<const void> arrays;
  std::shared_ptr<const Vector> coeffs;
};

}  // namespace

void OverlappedExchange::sendUnit(const Vector& coeffs, std::span<const SvMatrix* const> matrices,
                                  std::shared_ptr<const void> arrays) {
  const auto t = Clock::now();
  if (times_.firstSend < 0) times_.firstSend = since(t);
  auto unit = std::make_shared<SentUnit>();
  // Values scanned as encode() does: nothing non-finite leaves this rank.
  unit->record = encodePieces(header_, coeffs, matrices, /*scanValues=*/true);
  unit->record.seal();
  unit->arrays = std::move(arrays);
  unit->coeffs = coeffs_;
  auto pieces = std::make_shared<comm::Pieces>();
  pieces->pieces = unit->record.pieces;
  pieces->owner = std::move(unit);
  for (int peer = 0; peer < transport_.size(); ++peer) {
    if (peer != transport_.rank()) transport_.sendAsync(peer, comm::SharedPieces(pieces));
  }
  times_.sendSeconds += std::chrono::duration<double>(Clock::now() - t).count();
}

void OverlappedExchange::siteReady(size_t site, const SvMatrix& matrix) {
  ready_[site] = &matrix;
  const size_t unit = units_.unitOf(site);
  if (--missing_[unit] > 0) return;
  // The unit as computeSvgs will hold it: the model's coefficients (ones), scaled.
  if (!coeffs_ || coeffs_->size() != matrix.u.cols()) {
    auto coeffs = std::make_shared<Vector>(Vector::Ones(matrix.u.cols()));
    *coeffs *= scale_;
    coeffs_ = std::move(coeffs);
  }
  std::vector<const SvMatrix*> matrices;
  for (size_t s : units_.members(unit)) matrices.push_back(ready_[s]);
  sendUnit(*coeffs_, matrices, arrays_);
  const auto t = Clock::now();
  takeIn();  // a layer boundary: let the network move
  times_.sendSeconds += std::chrono::duration<double>(Clock::now() - t).count();
}

void OverlappedExchange::send(uint64_t clock, std::shared_ptr<const SvBatch> sent, ClockStats& stats) {
  (void)clock, (void)stats;
  const bool streamed = std::all_of(missing_.begin(), missing_.end(), [](size_t m) { return m == 0; });
  if (!streamed) {
    // A selection (or a batch the backward pass did not stream): its units leave now, from its arrays.
    for (size_t u = 0; u < units_.count(); ++u) {
      std::vector<const SvMatrix*> matrices;
      for (size_t site : units_.members(u)) matrices.push_back(&sent->matrices[site]);
      sendUnit(sent->coeffs, matrices, sent);
    }
  }
  times_.backwardEnd = since(Clock::now());
}

ClockGroup OverlappedExchange::receive(uint64_t clock, const std::shared_ptr<SvBatch>& local, const ApplyFn& apply,
                                       ClockStats& stats, MetricsSink& metrics) {
  (void)clock;
  const auto t = Clock::now();
  double rebuildSeconds = 0.0;
  const std::vector<PeerBatch> peers = finish(*local, apply, metrics, rebuildSeconds, log_.keepsRecords());
  stats.updateSeconds += rebuildSeconds;
  stats.commSeconds = times_.sendSeconds + std::chrono::duration<double>(Clock::now() - t).count() - rebuildSeconds;
  stats.firstSendAt = times_.firstSend;
  stats.backwardEndAt = times_.backwardEnd;
  stats.exchangeSeconds = std::max(0.0, times_.lastArrival - std::max(0.0, times_.firstSend));
  // The log gets what the broadcast gives it: the own batch whole, the others as they were sent.
  ClockGroup group;
  for (int rank = 0; rank < transport_.size(); ++rank) {
    const PeerBatch& peer = peers[static_cast<size_t>(rank)];
    if (rank == transport_.rank()) {
      group.records.push_back(ckpt::Record::of(local));
    } else {
      group.records.push_back(log_.received(peer.header, peer.whole ? ckpt::Record::of(peer.whole) : ckpt::Record{}));
    }
  }
  return group;
}

void OverlappedExchange::takeIn() {
  const auto p = static_cast<size_t>(transport_.size());
  if (broken_.size() != p) broken_.assign(p, nullptr);
  while (auto message = transport_.tryReceive()) {
    auto& broken = broken_[static_cast<size_t>(message->peer)];
    if (broken) continue;  // nothing after a damaged batch is trusted
    SvBatchExpectation expect;
    expect.sender = message->peer;
    expect.paramShapes = shapes_;
    SvBatchView batch;
    try {
      // Views into the message's own buffer, which the view keeps.
      auto bytes = std::make_shared<const std::vector<std::byte>>(std::move(message->bytes));
      const std::span<const std::byte> record(*bytes);
      batch = decodeView(std::move(bytes), record, expect);
    } catch (const std::exception&) {
      broken = std::current_exception();
      continue;
    }
    const uint64_t clock = batch.header.clock;
    const std::optional<size_t> unit =
        batch.matrices.empty() ? std::nullopt : units_.unitOfParam(batch.matrices.front().paramId);
    bool fits = unit.has_value() && clock >= clock_ && batch.matrices.size() == units_.members(*unit).size();
    auto& slots = arrived_[clock];
    if (slots.empty()) slots.assign(p, std::vector<std::optional<SvBatchView>>(units_.count()));
    fits = fits && !slots[static_cast<size_t>(message->peer)][*unit].has_value();
    if (!fits) {
      throw CorruptRecordError(fmt::format("unexpected SV batch from rank {} at clock {}: not a layer this rank "
                                           "waits for (or it came twice)",
                                           message->peer, clock));
    }
    slots[static_cast<size_t>(message->peer)][*unit] = std::move(batch);
  }
}

std::vector<OverlappedExchange::PeerBatch> OverlappedExchange::finish(const SvBatch& own, const ApplyFn& apply,
                                                                      MetricsSink& metrics, double& rebuildSeconds,
                                                                      bool keepWhole) {
  const auto p = static_cast<size_t>(transport_.size());
  const auto me = static_cast<size_t>(transport_.rank());
  rebuildSeconds = 0.0;
  std::vector<bool> applied(units_.count(), false);
  size_t left = units_.count();
  comm::Deadline deadline(std::chrono::milliseconds(static_cast<int64_t>(options_.timeoutSeconds * 1000)));
  auto& slots = arrived_[clock_];
  if (slots.empty()) slots.assign(p, std::vector<std::optional<SvBatchView>>(units_.count()));
  const SvBatchView ownView = viewOf(own);
  while (left > 0) {
    takeIn();
    metrics.collect();
    bool progressed = false;
    for (size_t u = 0; u < units_.count(); ++u) {
      if (applied[u]) continue;
      bool complete = true;
      for (size_t r = 0; r < p && complete; ++r) complete = r == me || slots[r][u].has_value();
      if (!complete) continue;
      times_.lastArrival = since(Clock::now());
      // This rank's part from the whole local batch: what its own replica applies.
      const SvBatchView mine = unitView(ownView, u);
      std::vector<const SvBatchView*> group;
      for (size_t r = 0; r < p; ++r) group.push_back(r == me ? &mine : &*slots[r][u]);
      const auto t = Clock::now();
      apply(group);
      rebuildSeconds += std::chrono::duration<double>(Clock::now() - t).count();
      applied[u] = true;
      --left;
      progressed = true;
    }
    if (progressed || left == 0) continue;
    for (size_t r = 0; r < p; ++r) {
      if (r == me || !broken_[r]) continue;
      for (size_t u = 0; u < units_.count(); ++u) {
        if (!applied[u] && !slots[r][u].has_value()) std::rethrow_exception(broken_[r]);
      }
    }
    if (deadline.passed()) {
      std::vector<int> missing;
      for (size_t r = 0; r < p; ++r) {
        for (size_t u = 0; u < units_.count(); ++u) {
          if (r != me && !slots[r][u].has_value()) {
            missing.push_back(static_cast<int>(r));
            break;
          }
        }
      }
      // Said as a collective's timeout is (comm/transport.h): who did not answer, last.
      // The worker names the clock at the end of the line.
      std::string message = fmt::format("rank {}: the SV batches from {} did not arrive within {} s",
                                        transport_.rank(), comm::rankList(missing), options_.timeoutSeconds);
      const comm::StallVerdict v = comm::findStalled(transport_.control(), transport_.rank(), transport_.size(), clock_);
      throw comm::StallError(message + comm::stallSuffix(v), v.reports);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  // The peers' batches, whole again (matrices in batch order) for a log that keeps them.
  std::vector<PeerBatch> peers(p);
  for (size_t r = 0; r < p; ++r) {
    if (r == me) continue;
    peers[r].header = slots[r][0]->header;
    if (!keepWhole) continue;
    auto b = std::make_shared<SvBatch>();
    b->matrices.resize(units_.sites());
    for (size_t u = 0; u < units_.count(); ++u) {
      SvBatch part = toBatch(*slots[r][u]);
      if (u == 0) {
        b->header = part.header;
        b->coeffs = std::move(part.coeffs);
      }
      const auto& members = units_.members(u);
      for (size_t i = 0; i < members.size(); ++i) b->matrices[members[i]] = std::move(part.matrices[i]);
    }
    peers[r].whole = std::move(b);
  }
  arrived_.erase(clock_);
  return peers;
}

ParamSet overlappedDenseGradient(const ops::Model& model, const ParamSet& w, const ops::ExampleBatch& x,
                                 double* meanLoss, comm::Transport& transport, uint64_t clock,
                                 std::chrono::steady_clock::time_point start, OverlapTimes& times,
                                 double& exposedSeconds, ops::Backend& backend, ops::RebuildBuffers& buffers) {
  using Clock = std::chrono::steady_clock;
  const auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - start).count(); };
  times = {};
  const SvUnits units(model.svSites());
  ParamSet grad = model.zeroParams();
  std::vector<bool> begun(grad.size(), false);
  std::vector<const SvMatrix*> ready(units.sites(), nullptr);
  std::vector<size_t> missing(units.count());
  for (size_t u = 0; u < units.count(); ++u) missing[u] = units.members(u).size();
  Vector ones;
  const auto beginSum = [&](uint32_t param) {
    Matrix& g = grad[param];
    transport.beginAllreduceSum({g.data(), static_cast<size_t>(g.size())}, clock);
    begun[param] = true;
  };
  const SvBatch svg = model.computeSvgStreamed(w, x, meanLoss, [&](size_t site, const SvMatrix& m) {
    ready[site] = &m;
    const size_t unit = units.unitOf(site);
    if (--missing[unit] > 0) return;
    // The unit's gradient, as denseGradient rebuilds it (the model's coefficients:
    // ones), read where the backward pass left the SVs.
    if (ones.size() != m.u.cols()) ones = Vector::Ones(m.u.cols());
    SvBatchView b;
    b.columns = m.u.cols();
    b.coeffs = ones.data();
    for (size_t s : units.members(unit)) b.matrices.push_back(viewOf(*ready[s]));
    const SvBatchView* one[] = {&b};
    ops::applySvBatches(one, grad, backend, buffers);
    const auto t = Clock::now();
    if (times.firstSend < 0) times.firstSend = since(t);
    for (uint32_t param : units.params(unit)) beginSum(param);
    transport.progressAllreduces();
    times.sendSeconds += std::chrono::duration<double>(Clock::now() - t).count();
  });
  times.backwardEnd = since(Clock::now());
  const auto t = Clock::now();
  // Parameters no SV site updates: zero gradients, summed all the same.
  for (size_t i = 0; i < grad.size(); ++i) {
    if (!begun[i]) beginSum(static_cast<uint32_t>(i));
  }
  transport.finishAllreduces();
  times.lastArrival = since(Clock::now());
  exposedSeconds = std::chrono::duration<double>(Clock::now() - t).count();
  return grad;
}

}  // namespace orpheus::engine
