// Everything a training job is configured by, in one struct built from the
// command line (engine/cli); no globals. The job and the worker hold it; each part
// the worker builds takes its own options struct, made from it in one place
// (engine/worker/part_options.h).
#pragma once

#include "comm/schedule.h"
#include "engine/data/dataset.h"
#include "engine/sync_modes.h"
#include "engine/worker/optimizer.h"
#include "engine/worker/select.h"
#include "ops/model.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace orpheus::engine {

struct TrainConfig {
  std::string model = "mlr";
  std::string train;
  std::string test;
  data::Format format = data::Format::kAuto;
  int64_t features = -1;  // -1: from the data
  int64_t classes = -1;   // -1: largest training label + 1
  int64_t clocks = 1000;
  int64_t batch = 100;    // examples per rank per clock
  double lr = 0.0;         // 0: the optimizer's default (defaultLearningRate)
  // The optimizer on rebuilt updates and its schedule (engine/worker/optimizer.h). A
  // negative value means the optimizer's default; validate() refuses a value
  // given to an optimizer or schedule that does not use it.
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double momentum = -1.0;     // momentum, nesterov: 0.9
  double beta1 = -1.0;        // adam: 0.9
  double beta2 = -1.0;        // adam: 0.999
  double eps = -1.0;          // adam: 1e-8; adagrad: 1e-10
  double weightDecay = 0.0;
  LrScheduleKind lrSchedule = LrScheduleKind::kConstant;
  int64_t warmup = 0;         // clocks of linear warmup
  int64_t lrStepEvery = 0;    // step: clocks between decays (required)
  double lrGamma = -1.0;      // step: 0.1
  uint64_t seed = 1;
  SyncMode sync = SyncMode::kSv;
  // Communication co-designs (section 3.2) and consistency.
  int64_t select = 0;  // C: SVGs sent per clock; 0 = all B
  // --sv-rank R: each matrix's update sent at rank R with error feedback; 0 = off. With
  // --sync powersgd: the rank of PowerSGD's factors (engine/worker/power_sgd.h).
  int64_t svRank = 0;
  // --sv-dtype: U and V on the wire (and in the log) as f32 or bf16 (engine/base/sv_batch.h).
  SvDtype svDtype = SvDtype::kF32;
  SelectionMethod selectMethod = SelectionMethod::kJmcssGram;
  // What one SVG is for a sequence model (ops::Model::SvgUnit): --select counts them.
  ops::Model::SvgUnit selectUnit = ops::Model::SvgUnit::kExample;
  comm::MulticastKind multicast = comm::MulticastKind::kAll;
  int fanout = 0;  // Q peers per clock; 0 = P - 1
  Consistency consistency = Consistency::kBsp;
  int staleness = 0;       // s, for SSP
  double dropLinks = 0.0;  // F: fraction of directed links broken per clock
  // Overlap the exchange with the backward pass (engine/worker/overlap.h): --sync sv
  // sends each matrix's SVs as the backward pass produces them (broadcast, BSP),
  // --sync dense all-reduces each gradient as it is complete. Bitwise the same
  // parameters as without.
  bool overlap = false;
  // Coordinator (section 3.4): barriers every R / S clocks; 0 = off.
  int64_t averageEvery = 0;  // periodic centralized synchronization: replicas averaged
  int64_t rotateEvery = 0;   // parameter-replica rotation along the ring of ranks
  // DiLoCo's outer Nesterov step at each averaging (engine/coordinator/outer_step.h):
  // learning rate L (0: off, plain averaging) and momentum M.
  double outerLr = 0.0;
  double outerMomentum = 0.0;
  // --adapt (engine/adapt): the coordinator sets C, Q, s and R every adaptEvery
  // clocks within [min, max] ranges ({-1, -1}: the defaults of adapt::boundsFor),
  // never predicting more than maxBytesPerClock (0: no budget) sent per rank per clock.
  bool adapt = false;
  int64_t adaptEvery = 50;
  std::pair<int64_t, int64_t> adaptSelect{-1, -1};
  std::pair<int64_t, int64_t> adaptRank{-1, -1};  // --adapt-rank MIN:MAX, under --sv-rank
  std::pair<int64_t, int64_t> adaptFanout{-1, -1};
  std::pair<int64_t, int64_t> adaptStaleness{-1, -1};
  std::pair<int64_t, int64_t> adaptAverageEvery{-1, -1};
  double maxBytesPerClock = 0.0;
  bool adaptBf16 = false;       // the budget may be met by sending U and V as bf16
  double adaptCommShare = 0.5;  // slack: exposed comm under half this share of compute
  std::string adaptTrace;       // testing aid: timing from a recorded metrics file
  std::string configFile;       // --config, if flags came from one: an input no output replaces
  // --balance (engine/coordinator/balance.h): every balanceEvery clocks the coordinator moves
  // chunks of chunkRows training rows from slow ranks to fast ones (BSP only).
  bool balance = false;
  int64_t balanceEvery = 20;
  int64_t chunkRows = 256;
  std::string saveReplicas;  // directory: every rank saves its replica as replica-<id>.h5
  // Incremental SV checkpoint (section 3.3).
  std::string ckptDir;
  bool ckptSv = false;            // --ckpt sv: log every applied SV batch
  int64_t snapshotEvery = 1;      // snapshot at every K-th averaging barrier
  int64_t ckptFormat = 3;         // --ckpt-format: 3 each batch logged once (references), 2 copies
  bool ckptWriterIdle = false;    // --ckpt-writer-idle: the log's IO thread under SCHED_IDLE
  bool resume = false;
  bool elastic = false;           // --resume may continue on a different number of ranks (engine/membership/elastic.h)
  bool ckptMatrix = false;        // --ckpt matrix: the baseline, whole replicas every ckptEvery clocks
  bool ckptNone = false;          // --ckpt none given: it contradicts --resume
  int64_t ckptEvery = 100;
  double failProb = 0.0;          // failure injection: each clock each rank fails with this probability
  int delayRank = -1;      // testing aid: this rank sleeps delayMs every clock
  int delayMs = 0;
  int64_t evalEvery = 100;  // 0: only at the end
  double targetAccuracy = 0.0;  // > 0: stop at the first eval clock whose test accuracy reaches it
  std::string metrics;
  bool paramDigests = false;  // each clock's metrics line carries rank 0's replica's CRC32C
  std::string save;
  double timeoutSeconds = 300.0;
  std::string transport = "mpi";  // comm/factory.h
  std::string device = "cpu";     // ops/backends.h: cpu, cuda, cuda:N, strict
  bool resident = true;           // the replica lives on a device where it can (engine/worker/device_replica.h)
  // How a resident replica's SV batches come to the host (engine/worker/sv_transfer.h).
  TransferMode transfer = TransferMode::kStaged;
  bool overwrite = false;         // a fresh job may replace the checkpoint in --ckpt-dir
  int blasThreads = 1;
  std::string logLevel = "info";
  std::string progress = "auto";  // auto (on a terminal), on, off
};

// Every value of an enum a flag takes, with its name: the one table the CLI parses
// and documents the flags from and the metrics summary names the values by.
template <typename E>
using NamedValues = std::vector<std::pair<std::string, E>>;
const NamedValues<SyncMode>& syncModeNames();
const NamedValues<Consistency>& consistencyNames();
// Names from comm::multicastName and engine::toString(SelectionMethod), so each
// value has one spelling in the whole program.
const NamedValues<comm::MulticastKind>& multicastNames();
const NamedValues<SelectionMethod>& selectionMethodNames();
const NamedValues<SvDtype>& svDtypeNames();
const NamedValues<TransferMode>& transferModeNames();
const NamedValues<ops::Model::SvgUnit>& svgUnitNames();
const NamedValues<OptimizerKind>& optimizerNames();
const NamedValues<LrScheduleKind>& lrScheduleNames();

std::string toString(SyncMode mode);
std::string toString(Consistency c);
std::string toString(OptimizerKind kind);
std::string toString(LrScheduleKind kind);

// The optimizer and schedule `config` asks for, every default resolved.
OptimizerSettings optimizerSettings(const TrainConfig& config);

// The multicast schedule of a job on `ranks` workers (Q = P - 1 for broadcast).
comm::ScheduleConfig scheduleConfig(const TrainConfig& config, int ranks);

// Refuses inconsistent settings for `ranks` workers with one clear InputError.
void validate(const TrainConfig& config, int ranks);

// The SVGs a rank computes a clock, what --select C counts: its B examples, or
// under --select-unit step its B * steps (example, step) pairs.
int64_t svgsPerClock(const TrainConfig& config, int64_t steps);

}  // namespace orpheus::engine
