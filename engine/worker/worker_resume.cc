// The worker's side of a checkpoint: what it carries beyond its replica, and taking
// up a replica again (--resume, a membership change).
#include "engine/worker/worker.h"

#include "ckpt/replay.h"

#include <utility>
#include <vector>

namespace orpheus::engine {
namespace {

// --sv-rank's entries in a rank's state (a .loss name cannot hold ':').
constexpr const char* kLowRankPrefix = "sv-rank:";

}  // namespace

ParamSet Worker::rankState() const {
  ParamSet state = model_.carriesState() ? model_.carriedState() : ParamSet();
  if (lowRank_) {
    for (Param& p : lowRank_->state(kLowRankPrefix).params) state.params.push_back(std::move(p));
  }
  return state;
}

void Worker::restoreRankState(const ParamSet& state) {
  ParamSet own;
  for (const Param& p : state.params) {
    if (!p.name.starts_with(kLowRankPrefix)) own.params.push_back(p);
  }
  if (model_.carriesState()) model_.restoreCarriedState(own);
  if (lowRank_) {
    // Each compressed matrix's J x K, from the parameter its sites update.
    std::vector<std::pair<uint32_t, int32_t>> sites;
    for (const ops::Model::SvSiteInfo& site : model_.svSites()) sites.emplace_back(site.paramId, site.biasId);
    lowRank_->restore(state, kLowRankPrefix, LowRankSender::stateShapes(sites, model_.paramShapes()));
  }
}

void Worker::resumeFrom(uint64_t clock, ParamSet replica, const ParamSet& optimizerState, int id) {
  updater_.toHost(replica_);
  replica_ = std::move(replica);
  updater_.discardPending();
  updater_.optimizer().importState(optimizerState);
  updater_.hostChanged();
  replicaId_ = id;
  clock_ = clock;
  inbox_.resumeAt(clock);
  log_->resumeAt(id, clock);
}

void Worker::resumeOuterStep(ParamSet anchor, ParamSet momentum) {
  if (!anchor.params.empty()) coordinator_.resumeOuterStep(std::move(anchor), std::move(momentum));
}

ParamSet Worker::snapshotOfReplica() const {
  const Optimizer& optimizer = updater_.optimizer();
  ParamSet out = optimizer.hasState() ? withState(replica_, optimizer.exportState()) : replica_;
  // The anchor is the replica itself at an averaging; the momentum goes with it.
  if (coordinator_.outerStep().active()) out = withState(out, coordinator_.outerStep().momentum());
  return out;
}

void Worker::rejoinAt(uint64_t clock, ParamSet replica, const ParamSet& optimizerState, int id, bool snapshot) {
  resumeFrom(clock, std::move(replica), optimizerState, id);
  // Every replica is the new epoch's average, the same everywhere: the outer step
  // (--outer-lr) starts again from it, with its momentum at zero.
  coordinator_.startFrom(replica_);
  const ParamSet* part = nullptr;
  ParamSet withOptimizer;
  if (snapshot) {
    withOptimizer = snapshotOfReplica();
    part = &withOptimizer;
  }
  log_->rejoin(clock, part);
  // The new membership epoch, a record of every new member's log (ckpt/replay.h),
  // durable once the epoch's first clock has ended.
  log_->jobRecord(clock, ckpt::EventKind::kMembership, ckpt::epochRecord({epoch_, clock, transport_.size()}));
}

}  // namespace orpheus::engine
