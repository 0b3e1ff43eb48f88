// The on-disk layout of a checkpoint directory: every path and name the checkpoint
// writes or reads is built and parsed here, and nowhere else.
//
// The incremental SV checkpoint (paper section 3.3): every SV batch applied to a
// replica is logged, so the replica can be rebuilt at any past clock by replaying
// the log from the last snapshot (or from W0, which the job seed determines).
//
// Layout of a checkpoint directory:
//   DIR/job.h5                     what the job was (model, seed, data shape, flags)
//   DIR/replica-<id>/seg-<first>-<last>.h5
//                                  the batches applied to replica <id> during its
//                                  local clocks first..last (inclusive), in order
//   DIR/snapshot-<clock>/part-<r>.h5
//                                  row block r of every parameter of the averaged
//                                  model after the averaging barrier of <clock>
//   DIR/membership                 directories before segment format 4 only: the
//                                  membership epochs after the first, one line each
//   DIR/chunks                     directories before segment format 4 only:
//                                  --balance's chunk layout, then every change of
//                                  chunk ownership, one line each; a job now writes
//                                  both as records of the replicas' logs (ckpt/replay.h)
//   DIR/states-<clock>/rank-<r>.h5 what rank r's model carried from one clock to the
//                                  next beyond the parameters (a sequence model's
//                                  recurrent states per stream) after <clock>, written
//                                  where a segment of the log it writes ends, before
//                                  that segment is durable: what --resume at <clock>
//                                  puts back; ranks, not replicas, own it (the data)
//   DIR/matrix-<clock>/            parameter files a job writes at <clock> (recovery
//                                  by matrix checkpoints, the baseline)
//   <any of the above>.discarded   set aside by a resume: past the clock it resumed
//                                  from, or damaged; never read again
// Clocks in names are zero-padded to 12 digits. Logs follow replicas, not ranks:
// after a rotation the new holder of replica <id> continues its directory.
//
// A segment holds, in apply order, "groups": the batches applied together in one
// compute_update at a local clock, and events (averaged, rotated in/out, reset). A
// group holds the replica's own batch as its encoded SV batch record and each batch
// received from another replica as a reference into that replica's log (format 3,
// ckpt/segment.h), so each batch is on disk once; restoring one replica reads the
// batches it references from the other replicas' logs in the same directory. Every file is written under a temporary
// name, flushed (fsync) and renamed (ckpt/durable.h), and a segment carries a CRC32C
// of its contents, so a crash leaves only whole segments; a segment that fails its
// CRC is damage. A damaged segment and a missing one are the same gap in the log; a
// later snapshot bridges it (ckpt/restorable.h).
//
// A failure loses what the log had only staged in memory. The holder then restores
// the replica from what is durable (the end of its log on disk, or a later snapshot)
// and logs a "reset" event: at clock T the replica went back to its state at clock
// R (E <= R <= T, R > E only for a snapshot). The log continues right after its
// durable end E (the next segment starts at E + 1, its first entry being the
// reset), so the clocks E+1..T-1 have no entries: their states are lost, and
// reading the log up to one of them is an error that says so.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace orpheus::ckpt {

// The format version of the job file and of snapshot parts (segments have their own,
// ckpt/segment.h).
inline constexpr int64_t kFormatVersion = 1;

// A clock as it appears in names: 12 digits, zero-padded.
std::string clockName(uint64_t clock);

std::filesystem::path jobPath(const std::string& dir);
// For a message about `dir` that holds no job file: where `dir` is itself one (a
// checkpoint's job.h5), "; it is a checkpoint's job file: give its directory 'D'", else "".
std::string jobFileHint(const std::string& dir);
std::filesystem::path membershipPath(const std::string& dir);
std::filesystem::path chunksPath(const std::string& dir);
std::filesystem::path replicaDir(const std::string& dir, int replica);
std::filesystem::path segmentPath(const std::string& dir, int replica, uint64_t first, uint64_t last);
std::filesystem::path snapshotDir(const std::string& dir, uint64_t clock);
std::filesystem::path snapshotPartPath(const std::string& dir, uint64_t clock, int rank);
std::filesystem::path matrixDir(const std::string& dir, uint64_t clock);
std::filesystem::path statesDir(const std::string& dir, uint64_t clock);
std::filesystem::path statesPath(const std::string& dir, uint64_t clock, int rank);
// Where a resume sets `path` aside.
std::filesystem::path discardedPath(const std::filesystem::path& path);

// Parse a file or directory name (not a path): the number(s) in it, any run of
// decimal digits. Temporary files (".seg-…") and set-aside ones ("….discarded")
// do not match.
struct SegmentName {
  uint64_t first = 0;
  uint64_t last = 0;
};
std::optional<SegmentName> parseSegmentName(std::string_view name);
std::optional<uint64_t> parseReplicaDirName(std::string_view name);
std::optional<uint64_t> parseSnapshotDirName(std::string_view name);
std::optional<uint64_t> parseMatrixDirName(std::string_view name);
std::optional<uint64_t> parseStatesDirName(std::string_view name);

// What a checkpoint directory holds, by name only (nothing is opened); a missing
// directory holds nothing.
struct SegmentFile {
  std::string path;
  uint64_t first = 0;
  uint64_t last = 0;
};
// The segment files in a replica directory, by first (then last) clock.
std::vector<SegmentFile> listSegments(const std::filesystem::path& replicaDir);
// The replica directories (number: the replica) or snapshot directories (number:
// the clock) of `dir`, by number.
struct NumberedDir {
  uint64_t number = 0;
  std::filesystem::path path;
};
std::vector<NumberedDir> listReplicaDirs(const std::string& dir);
std::vector<NumberedDir> listSnapshotDirs(const std::string& dir);
std::vector<NumberedDir> listStatesDirs(const std::string& dir);

}  // namespace orpheus::ckpt
