#include "engine/cli/commands.h"

#include "ckpt/layout.h"
#include "ckpt/model_file.h"
#include "engine/base/crc32c.h"
#include "engine/base/params.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/cli/flags.h"
#include "engine/coordinator/balance.h"
#include "engine/outputs.h"
#include "engine/recovery/checkpoint.h"
#include "engine/recovery/job_record.h"
#include "ops/backends.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <limits>

namespace orpheus::engine::cli {

int restoreMain(const RestoreArgs& a) {
  uint64_t clock = 0;
  if (a.clock != "latest") {
    int64_t parsed = 0;
    std::string error;
    if (!parseInteger(a.clock, 0, std::numeric_limits<int64_t>::max(), &parsed, &error)) {
      throw orpheus::InputError("--clock: " + error + " (or 'latest')");
    }
    if (parsed == 0) throw orpheus::InputError("--clock 0 is the initial state; give a clock >= 1");
    clock = static_cast<uint64_t>(parsed);
  }
  ORPHEUS_CHECK_INPUT(!a.out.empty(), "--out is empty: give the file to write the restored parameters to");
  checkOutputs({{"--out", a.out, OutputPath::Kind::kFile}},
               {{"--ckpt-dir", a.dir, /*directory=*/true}, {"--config", a.configFile}});
  // The replay computes as the job did: BLAS rounds a product differently with
  // another number of threads. (restore() names a directory without a job file.)
  std::error_code ec;
  ckpt::JobInfo job;
  if (std::filesystem::is_regular_file(ckpt::jobPath(a.dir), ec)) {
    job = ckpt::readJobInfo(a.dir);
    setBlasThreads(job.computation.empty() ? 1
                                           : recordedThreads(decodeRecord(job.computation,
                                                                          ckpt::jobPath(a.dir).string())));
  }
  const auto backend = ops::makeBackend(a.device);
  const auto r = restore(a.dir, a.replica, clock, *backend);
  // A --balance job: which rank trained on which rows at that clock (read before
  // anything is written: a damaged chunk log leaves no --out).
  const auto chunks = describeChunksAt(a.dir, r.clock);
  ckpt::ModelFileInfo info;
  info.modelSpec = job.modelSpec;
  if (!job.modelText.empty()) info.modelDigest = textDigest(job.modelText);
  info.clock = static_cast<int64_t>(r.clock);
  info.seed = job.seed;
  info.replica = r.replica;
  info.features = job.features;
  info.classes = job.classes;
  // The optimizer state (none for sgd) in its own group, /optimizer.
  ckpt::saveParams(resolveOutput(a.out),
                            withState(r.params, r.optimizerState), info);
  std::printf("restored replica %d at clock %llu%s (%s, %zu groups replayed) to %s\n", r.replica,
              static_cast<unsigned long long>(r.clock), clock == 0 ? ", the newest restorable clock" : "",
              r.fromSnapshot ? fmt::format("from the snapshot of clock {}", r.fromSnapshot).c_str() : "from W0",
              r.groupsReplayed, a.out.c_str());
  // The digest a --param-digests run writes in its metrics (param_crc32c).
  std::printf("parameters crc32c %u\n", paramDigest(r.params));
  if (chunks) {
    std::printf("data chunks at clock %llu: %s\n", static_cast<unsigned long long>(r.clock), chunks->c_str());
  }
  return 0;
}

}  // namespace orpheus::engine::cli
