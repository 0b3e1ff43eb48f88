#include "engine/config.h"

#include "engine/base/error.h"

#include <algorithm>

namespace orpheus::engine {
namespace {

template <typename E>
const std::string& nameIn(const NamedValues<E>& table, E value) {
  const auto it = std::find_if(table.begin(), table.end(), [&](const auto& entry) { return entry.second == value; });
  ORPHEUS_ENFORCE(it != table.end(), "enum value {} has no name", static_cast<int>(value));
  return it->first;
}

}  // namespace

const NamedValues<SyncMode>& syncModeNames() {
  static const NamedValues<SyncMode> table{{"sv", SyncMode::kSv}, {"dense", SyncMode::kDense}};
  return table;
}

const NamedValues<Consistency>& consistencyNames() {
  static const NamedValues<Consistency> table{{"bsp", Consistency::kBsp}, {"ssp", Consistency::kSsp}};
  return table;
}

const NamedValues<comm::MulticastKind>& multicastNames() {
  static const NamedValues<comm::MulticastKind> table = [] {
    NamedValues<comm::MulticastKind> t;
    for (const auto kind : {comm::MulticastKind::kAll, comm::MulticastKind::kRandom, comm::MulticastKind::kFixed,
                            comm::MulticastKind::kRing}) {
      t.emplace_back(comm::multicastName(kind), kind);
    }
    return t;
  }();
  return table;
}

const NamedValues<SelectionMethod>& selectionMethodNames() {
  static const NamedValues<SelectionMethod> table = [] {
    NamedValues<SelectionMethod> t;
    for (const auto method : {SelectionMethod::kJmcss, SelectionMethod::kUniform}) t.emplace_back(toString(method), method);
    return t;
  }();
  return table;
}

std::string toString(SyncMode mode) { return nameIn(syncModeNames(), mode); }
std::string toString(Consistency c) { return nameIn(consistencyNames(), c); }

comm::ScheduleConfig scheduleConfig(const TrainConfig& c, int ranks) {
  comm::ScheduleConfig sc;
  sc.kind = c.multicast;
  sc.ranks = ranks;
  sc.fanout = c.multicast == comm::MulticastKind::kAll ? std::max(ranks - 1, 1) : std::max(c.fanout, 1);
  sc.seed = c.seed;
  sc.dropLinks = c.dropLinks;
  return sc;
}

void validate(const TrainConfig& c, int ranks) {
  ORPHEUS_CHECK_INPUT(c.select >= 0 && c.select <= c.batch,
                      "--select {} must be between 1 and the batch size --batch {} (0 sends every SVG)", c.select,
                      c.batch);
  if (c.multicast != comm::MulticastKind::kAll) {
    ORPHEUS_CHECK_INPUT(c.fanout >= 1, "--multicast {} needs --fanout Q >= 1", comm::multicastName(c.multicast));
  }
  // A flag that would do nothing in this mode is a mistake worth a line, not silence.
  ORPHEUS_CHECK_INPUT(c.fanout == 0 || c.multicast != comm::MulticastKind::kAll,
                      "--fanout {} applies to --multicast random, fixed or ring; --multicast all sends to every peer",
                      c.fanout);
  ORPHEUS_CHECK_INPUT(c.staleness == 0 || c.consistency == Consistency::kSsp,
                      "--staleness {} applies to --consistency ssp; under bsp no worker runs ahead", c.staleness);
  ORPHEUS_CHECK_INPUT(c.delayRank < ranks, "--inject-delay {}:{} names rank {}, but the job has ranks 0..{}",
                      c.delayRank, c.delayMs, c.delayRank, ranks - 1);
  ORPHEUS_CHECK_INPUT(c.fanout >= 0 && (ranks == 1 || c.fanout <= ranks - 1),
                      "--fanout {} needs at most P-1 = {} peers (P = {} ranks)", c.fanout, ranks - 1, ranks);
  ORPHEUS_CHECK_INPUT(c.targetAccuracy >= 0.0 && c.targetAccuracy <= 1.0, "--target-accuracy {} must be in [0, 1]",
                      c.targetAccuracy);
  ORPHEUS_CHECK_INPUT(c.targetAccuracy == 0.0 || (!c.test.empty() && c.evalEvery > 0),
                      "--target-accuracy needs --test and --eval-every N > 0");
  ORPHEUS_CHECK_INPUT(c.staleness >= 0, "--staleness {} must be >= 0", c.staleness);
  ORPHEUS_CHECK_INPUT(c.dropLinks >= 0.0 && c.dropLinks < 1.0, "--drop-links {} must be in [0, 1)", c.dropLinks);
  ORPHEUS_CHECK_INPUT(c.failProb >= 0.0 && c.failProb < 1.0, "--fail-prob {} must be in [0, 1)", c.failProb);
  ORPHEUS_CHECK_INPUT(c.failProb == 0.0 || c.ckptSv || c.ckptMatrix,
                      "--fail-prob needs a checkpoint to recover from (--ckpt sv or --ckpt matrix with --ckpt-dir)");
  ORPHEUS_CHECK_INPUT(!(c.ckptSv && c.ckptMatrix), "--ckpt takes one of sv, matrix");
  ORPHEUS_CHECK_INPUT(!c.ckptMatrix || !c.ckptDir.empty(), "--ckpt matrix needs --ckpt-dir DIR");
  ORPHEUS_CHECK_INPUT(c.ckptSv || (c.ckptFormat == 3 && !c.ckptWriterIdle),
                      "--ckpt-format and --ckpt-writer-idle shape the SV log: they need --ckpt sv");
  if (c.sync == SyncMode::kDense) {
    ORPHEUS_CHECK_INPUT(c.select == 0 && c.multicast == comm::MulticastKind::kAll && c.consistency == Consistency::kBsp &&
                            c.dropLinks == 0.0,
                        "--sync dense allreduces whole gradients: it takes no --select, --multicast, --consistency "
                        "ssp or --drop-links");
  }
}

}  // namespace orpheus::engine
