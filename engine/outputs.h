// The files a job writes, checked together before its first clock, so that a bad
// output path costs a second, not a training run, and no user file is replaced by
// mistake.
//
// The rules (examples/README.md, "Which files Orpheus writes"):
//  - An output is a regular file or a path that does not exist yet. A device, a
//    pipe, a socket or a directory where a file is wanted is refused, never replaced
//    (a stream such as the metrics may go to a character device or a pipe).
//  - A symlink is followed: the file it points to is what gets written (atomically,
//    in that file's directory); the link itself stays.
//  - No output is an input of the same job (its data, model, config file and
//    trace; nor an input a directory output would write, inputsOf and
//    OutputPath::writes), or inside a directory the job reads
//    (restore's --ckpt-dir), and no two outputs are the same file (compared after
//    following symlinks, and by inode for hard links); no output lies inside an
//    output directory, whose files belong to the engine, nor inside any checkpoint
//    (a directory above it holds a job.h5), whose files belong to its job.
//  - Every output can be written: its directory exists and a file can be created
//    there (probed by creating and removing a temporary file), and an existing
//    output file is writable.
#pragma once

#include "engine/config.h"

#include <string>
#include <vector>

namespace orpheus::engine {

// The name every writability probe starts with: a file another rank may hold for
// an instant in any output directory (a checkpoint's too), never anything else.
inline constexpr const char* kProbePrefix = ".orpheus-probe-";

struct OutputPath {
  enum class Kind { kFile, kDirectory };
  std::string flag;  // how the user named it, e.g. "--save"
  std::string path;  // empty: not requested
  Kind kind = Kind::kFile;
  // Written as a stream (appended line by line, never renamed over): a character
  // device or a pipe is accepted too (`--metrics /dev/stdout`).
  bool stream = false;
  // kDirectory: the names the job writes there, as a glob ("replica-*.h5"); an
  // input so named inside the directory would be replaced.
  std::string writes = {};
};

struct InputPath {
  std::string flag;  // e.g. "--train"
  std::string path;  // empty: none
  bool directory = false;  // a directory read whole (a checkpoint): nothing is written inside it
};

// --save-replicas DIR: each rank writes DIR/replica-<id>.h5 there.
OutputPath replicasOutput(const std::string& dir);

// What a train or simulate job reads: --train, --test, --model, --config and,
// with --adapt, --adapt-trace.
std::vector<InputPath> inputsOf(const TrainConfig& config);

// Throws InputError naming the flag and path on the first output that breaks a
// rule above. Directories (--save-replicas, --ckpt-dir) must exist or be creatable;
// files inside them are the engine's own names.
void checkOutputs(const std::vector<OutputPath>& outputs, const std::vector<InputPath>& inputs);

// Where a write to `path` lands: `path` itself, or the file a symlink at it points
// to (through any chain of links). A dangling link yields its target's path.
std::string resolveOutput(const std::string& path);

}  // namespace orpheus::engine
