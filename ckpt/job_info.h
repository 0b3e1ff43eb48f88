// DIR/job.h5 (ckpt/layout.h): what a job was, so its log can be replayed by a
// later process.
#pragma once

#include <cstdint>
#include <string>

namespace orpheus::ckpt {

// The most ranks a job records (a job.h5 or membership record beyond it is damaged).
constexpr int kMaxRanks = 1 << 16;

struct JobInfo {
  std::string modelName;   // "mlr" or the .loss path as given
  std::string modelText;   // the .loss file's text ("" for built-ins)
  std::string modelSpec;
  int64_t features = 0;
  int64_t classes = 0;
  uint64_t seed = 0;
  int ranks = 0;
  int64_t batch = 0;
  double lr = 0.0;
  std::string flags;       // the training command line, for humans
  // The settings that decide what the job computes, one "flag=value" per line
  // (engine/recovery/job_record.h); "" in checkpoints written before it was recorded.
  std::string computation;
};

// Writes DIR/job.h5 durably; reading it back gives the same JobInfo. IoError naming
// the file when it cannot be written; InputError naming it when it is missing,
// unreadable, lacks an attribute or holds one out of range (negative sizes, more
// than kMaxRanks ranks, a non-finite lr).
void writeJobInfo(const std::string& dir, const JobInfo& info);
JobInfo readJobInfo(const std::string& dir);

}  // namespace orpheus::ckpt
