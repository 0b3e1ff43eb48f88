#include "engine/recovery/job_record.h"

#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/coordinator/outer_step.h"
#include "engine/outputs.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orpheus::engine {
namespace {

namespace fs = std::filesystem;

// Names an earlier job's entries: what --overwrite may delete.
bool isEngineEntry(const std::string& name) {
  for (const char* prefix : {"replica-", "snapshot-", "matrix-", "states-"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  if (name == "chunks" || name.rfind(".chunks.", 0) == 0) return true;
  if (name == "membership" || name.rfind("membership.", 0) == 0 || name.rfind(".membership", 0) == 0) return true;
  return name == "job.h5" || name.rfind("job.h5.", 0) == 0 || name.rfind(".job.h5", 0) == 0;
}

// A recorded value that must be a number: InputError naming the flag otherwise.
double recordedNumber(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double out = 0.0;
  try {
    out = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ORPHEUS_CHECK_INPUT(used == v.size() && !v.empty(), "the job's {} is not a number: '{}'", flag, v);
  return out;
}

}  // namespace

ComputationRecord computationRecord(const TrainConfig& c, int ranks, int64_t features, int64_t classes,
                                    const std::string& modelText, const std::string& trainDigest) {
  ComputationRecord r;
  const auto add = [&r](const char* flag, const auto& value) { r.emplace_back(flag, fmt::format("{}", value)); };
  add("np", ranks);
  add("--model", modelText.empty() ? c.model : "text " + textDigest(modelText));
  add("--train", trainDigest);
  add("--features", features);
  add("--classes", classes);
  add("--batch", c.batch);
  const OptimizerSettings o = optimizerSettings(c);
  add("--optimizer", toString(o.kind));  // before --lr, whose default it sets
  add("--lr", o.lr);
  add("--seed", c.seed);
  // BLAS rounds a product differently with another thread count: restore and a
  // resume replay the log with the job's.
  add("--threads", c.blasThreads);
  add("--sync", toString(c.sync));
  add("--select", c.select);
  add("--select-method", toString(c.selectMethod));
  // Recorded only when not the default, so records of earlier jobs still match.
  if (c.selectUnit != ops::Model::SvgUnit::kExample) add("--select-unit", "step");
  if (c.svRank > 0) add("--sv-rank", c.svRank);
  if (c.svDtype != SvDtype::kF32) add("--sv-dtype", svDtypeName(c.svDtype));
  add("--multicast", comm::multicastName(c.multicast));
  add("--fanout", c.fanout);
  add("--consistency", toString(c.consistency));
  add("--staleness", c.staleness);
  add("--drop-links", c.dropLinks);
  add("--average-every", c.averageEvery);
  add("--rotate-every", c.rotateEvery);
  // The outer step (only with it, so older records read the same).
  if (c.outerLr > 0.0) {
    add("--outer-lr", c.outerLr);
    add("--outer-momentum", c.outerMomentum);
  }
  add("--fail-prob", c.failProb);
  // The optimizer's settings and its schedule, resolved: what a replay steps with.
  add("--momentum", o.momentum);
  add("--beta1", o.beta1);
  add("--beta2", o.beta2);
  add("--eps", o.eps);
  add("--weight-decay", o.weightDecay);
  add("--lr-schedule", toString(o.schedule));
  add("--warmup", o.warmup);
  add("--lr-step-every", o.stepEvery);
  add("--lr-gamma", o.gamma);
  // A cosine schedule runs over --clocks: then the length is part of the computation.
  if (o.schedule == LrScheduleKind::kCosine) add("--clocks", o.clocks);
  // The controller's settings (only with --adapt, so older records read the same).
  if (c.adapt) {
    const auto range = [](const std::pair<int64_t, int64_t>& v) { return fmt::format("{}:{}", v.first, v.second); };
    add("--adapt", std::string("on"));
    add("--adapt-every", c.adaptEvery);
    add("--adapt-select", range(c.adaptSelect));
    if (c.svRank > 0) add("--adapt-rank", range(c.adaptRank));  // refused with --adapt before
    add("--adapt-fanout", range(c.adaptFanout));
    add("--adapt-staleness", range(c.adaptStaleness));
    add("--adapt-average-every", range(c.adaptAverageEvery));
    add("--adapt-comm-share", c.adaptCommShare);
    add("--max-bytes-per-clock", c.maxBytesPerClock);
    if (c.adaptBf16) add("--adapt-bf16", std::string("on"));
  }
  // --balance sizes the minibatches from the chunk layout (only with it, as above).
  if (c.balance) {
    add("--balance", std::string("on"));
    add("--chunk-rows", c.chunkRows);
  }
  return r;
}

std::string encodeRecord(const ComputationRecord& record) {
  std::string out;
  for (const auto& [flag, value] : record) out += flag + "=" + value + "\n";
  return out;
}

ComputationRecord decodeRecord(const std::string& text, const std::string& source) {
  ComputationRecord r;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const auto eq = line.find('=');
    ORPHEUS_CHECK_INPUT(eq != std::string::npos && eq > 0, "{}: line {} of the job's flags is not 'flag=value': '{}'",
                        source, number, line);
    r.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  return r;
}

int recordedThreads(const ComputationRecord& record) {
  for (const auto& [flag, v] : record) {
    if (flag != "--threads") continue;
    const double threads = recordedNumber(flag, v);
    ORPHEUS_CHECK_INPUT(threads >= 1 && threads <= 1024 && threads == static_cast<int>(threads),
                        "the job's --threads is not a count of 1 to 1024: '{}'", v);
    return static_cast<int>(threads);
  }
  return 1;
}

OptimizerSettings recordedOptimizer(const ComputationRecord& record) {
  OptimizerSettings s;
  const auto byName = [](const auto& table, const std::string& flag, const std::string& v) {
    for (const auto& [name, value] : table) {
      if (name == v) return value;
    }
    throw InputError(fmt::format("the job's {} '{}' is unknown to this version", flag, v));
  };
  OuterStepOptions outer;
  for (const auto& [flag, v] : record) {
    if (flag == "--lr") s.lr = recordedNumber(flag, v);
    if (flag == "--optimizer") s.kind = byName(optimizerNames(), flag, v);
    if (flag == "--momentum") s.momentum = recordedNumber(flag, v);
    if (flag == "--beta1") s.beta1 = recordedNumber(flag, v);
    if (flag == "--beta2") s.beta2 = recordedNumber(flag, v);
    if (flag == "--eps") s.eps = recordedNumber(flag, v);
    if (flag == "--weight-decay") s.weightDecay = recordedNumber(flag, v);
    if (flag == "--lr-schedule") s.schedule = byName(lrScheduleNames(), flag, v);
    if (flag == "--warmup") s.warmup = static_cast<int64_t>(recordedNumber(flag, v));
    if (flag == "--lr-step-every") s.stepEvery = static_cast<int64_t>(recordedNumber(flag, v));
    if (flag == "--lr-gamma") s.gamma = recordedNumber(flag, v);
    if (flag == "--clocks") s.clocks = static_cast<int64_t>(recordedNumber(flag, v));
    if (flag == "--outer-lr") outer.lr = recordedNumber(flag, v);
    if (flag == "--outer-momentum") outer.momentum = recordedNumber(flag, v);
  }
  s.outerMomentumInSnapshots = outer.active();
  return s;
}

void checkResume(const ComputationRecord& recorded, const ComputationRecord& now, const std::string& dir) {
  // Settings recorded only while a feature is on: on one side only, the feature was
  // turned on or off. Each with what its absence means.
  constexpr std::pair<const char*, const char*> kRecordedWhileOn[] = {
      {"--adapt", "off"}, {"--outer-lr", "off"}, {"--select-unit", "example"}, {"--sv-rank", "0"},
      {"--sv-dtype", "f32"}, {"--balance", "off"}, {"--adapt-bf16", "off"}};
  const auto valueIn = [](const ComputationRecord& r, const std::string& flag) -> const std::string* {
    const auto it = std::find_if(r.begin(), r.end(), [&](const auto& entry) { return entry.first == flag; });
    return it == r.end() ? nullptr : &it->second;
  };
  for (const auto& [flag, absent] : kRecordedWhileOn) {
    const std::string* was = valueIn(recorded, flag);
    const std::string* is = valueIn(now, flag);
    if ((was == nullptr) == (is == nullptr)) continue;
    throw InputError(fmt::format("--resume: {} differs from the job in '{}' (it was {} and is now {}); a resumed job "
                                 "continues the same computation (start a new job in another --ckpt-dir to change it)",
                                 flag, dir, was ? *was : absent, is ? *is : absent));
  }
  for (const auto& [flag, value] : now) {
    for (const auto& [was, wasValue] : recorded) {
      if (was != flag || wasValue == value) continue;
      const std::string what = flag == "np" ? "the number of ranks (mpirun -np)" : flag;
      std::string detail = flag == "--train" || flag == "--model"
                               ? "its contents changed"
                               : fmt::format("it was {} and is now {}", wasValue, value);
      if (flag == "--threads") detail += ": a product's rounding depends on the thread count";
      const std::string change = flag == "np" ? "--resume --elastic continues it on another number of ranks, from "
                                                "the average of its replicas"
                                              : "start a new job in another --ckpt-dir to change it";
      throw InputError(fmt::format("--resume: {} differs from the job in '{}' ({}); a resumed job continues the same "
                                   "computation ({})",
                                   what, dir, detail, change));
    }
  }
}

std::string fileDigest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "unreadable";
  std::vector<char> buffer(size_t{1} << 20);
  uint32_t crc = 0;
  uint64_t size = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    crc = crc32c(crc, buffer.data(), n);
    size += n;
  }
  return fmt::format("{:x}:{:08x}", size, crc);
}

void claimCheckpointDir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  ORPHEUS_CHECK_INPUT(fs::is_directory(dir, ec), "--ckpt-dir '{}' exists and is not a directory", dir);
  std::vector<fs::path> ours;
  std::vector<std::string> foreign;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // Another rank's writability probe (engine/outputs.h), there for an instant.
    if (name.starts_with(kProbePrefix)) continue;
    if (isEngineEntry(name)) {
      ours.push_back(entry.path());
    } else {
      foreign.push_back(name);
    }
  }
  if (ec) throw IoError(fmt::format("cannot list --ckpt-dir '{}': {}", dir, ec.message()));
  if (ours.empty() && foreign.empty()) return;
  // Files no job of ours wrote: --overwrite would not remove them either.
  ORPHEUS_CHECK_INPUT(!ours.empty() || foreign.empty(),
                      "--ckpt-dir '{}' holds files of its own ('{}'), not a checkpoint: a job's checkpoint needs an "
                      "empty or new directory (choose another --ckpt-dir)",
                      dir, foreign.empty() ? "" : foreign.front());
  if (!overwrite) {
    throw InputError(fmt::format("--ckpt-dir '{}' is not empty (a checkpoint): it belongs to another job; continue that "
                                 "job with --resume, or replace its checkpoint with --overwrite",
                                 dir));
  }
  ORPHEUS_CHECK_INPUT(foreign.empty(),
                      "--overwrite: --ckpt-dir '{}' holds '{}', which no Orpheus job wrote; it is not removed (choose "
                      "another --ckpt-dir)",
                      dir, foreign.front());
  for (const fs::path& p : ours) {
    fs::remove_all(p, ec);
    if (ec) throw IoError(fmt::format("--overwrite: cannot remove '{}': {}", p.string(), ec.message()));
  }
}

}  // namespace orpheus::engine
