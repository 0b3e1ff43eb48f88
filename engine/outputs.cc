#include "engine/outputs.h"

#include "engine/base/error.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fnmatch.h>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>

namespace orpheus::engine {
namespace {

namespace fs = std::filesystem;

struct FileId {
  dev_t device;
  ino_t inode;
  bool operator==(const FileId&) const = default;
};

std::optional<FileId> fileId(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// Creates and removes a file in `dir`: the one reliable test that outputs can be
// written there (permissions, read-only mounts, /proc, full quotas on create).
void probeDirectory(const fs::path& dir, const OutputPath& out) {
  std::string name = (dir / (std::string(kProbePrefix) + "XXXXXX")).string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) {
    throw InputError(fmt::format("{} '{}': cannot write to directory '{}': {}", out.flag, out.path, dir.string(),
                                 std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(name.c_str());
}

// The nearest existing directory at or above `path`.
fs::path existingAncestor(fs::path path) {
  std::error_code ec;
  while (!path.empty() && !fs::exists(path, ec)) {
    if (path == path.parent_path()) break;
    path = path.parent_path();
  }
  return path.empty() ? fs::path(".") : path;
}

void checkFile(const OutputPath& out, const fs::path& target) {
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (fs::exists(st)) {
    if (fs::is_directory(st)) {
      throw InputError(fmt::format("{} '{}' is a directory; give a file path", out.flag, out.path));
    }
    const bool streamable = fs::is_character_file(st) || fs::is_fifo(st);
    if (!fs::is_regular_file(st) && !(out.stream && streamable)) {
      throw InputError(fmt::format("{} '{}' is not a regular file (a device, pipe or socket): outputs are written "
                                   "only as regular files",
                                   out.flag, out.path));
    }
    if (::access(target.c_str(), W_OK) != 0) {
      throw InputError(fmt::format("{} '{}': cannot write: {}", out.flag, out.path, std::strerror(errno)));
    }
    if (!fs::is_regular_file(st)) return;  // a stream: written through, never renamed over
  } else if (!fs::is_directory(dir, ec)) {
    throw InputError(fmt::format("{} '{}': directory '{}' does not exist", out.flag, out.path, dir.string()));
  }
  // Files are replaced by a rename in their directory: that must be writable too.
  probeDirectory(dir, out);
}

void checkDirectory(const OutputPath& out, const fs::path& target) {
  std::error_code ec;
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec)) {
      throw InputError(fmt::format("{} '{}' exists and is not a directory", out.flag, out.path));
    }
    probeDirectory(target, out);
    return;
  }
  // Created by the job: whatever exists above it must take new entries.
  const fs::path above = existingAncestor(target);
  if (!fs::is_directory(above, ec)) {
    throw InputError(fmt::format("{} '{}': '{}' is not a directory", out.flag, out.path, above.string()));
  }
  probeDirectory(above, out);
}

bool inside(const fs::path& file, const fs::path& dir) {
  const auto rel = file.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != ".." && rel != ".";
}

// The nearest directory above `path` that holds a checkpoint (its job.h5), or empty:
// its files belong to that job, whatever this one is given.
fs::path checkpointAbove(const fs::path& path) {
  std::error_code ec;
  for (fs::path dir = path.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::is_regular_file(dir / "job.h5", ec)) return dir;
    if (dir == dir.root_path()) break;
  }
  return {};
}

}  // namespace

OutputPath replicasOutput(const std::string& dir) {
  OutputPath replicas{"--save-replicas", dir, OutputPath::Kind::kDirectory};
  replicas.writes = "replica-*.h5";
  return replicas;
}

std::vector<InputPath> inputsOf(const TrainConfig& config) {
  return {{"--train", config.train},
          {"--test", config.test},
          {"--model", config.model},
          {"--config", config.configFile},
          {"--adapt-trace", config.adapt ? config.adaptTrace : std::string()}};
}

std::string resolveOutput(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  // Follow a chain of links by hand, so a dangling link still names where it points.
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  const fs::path canonical = fs::weakly_canonical(p, ec);
  return (ec ? p.lexically_normal() : canonical).string();
}

void checkOutputs(const std::vector<OutputPath>& outputs, const std::vector<InputPath>& inputs) {
  struct Resolved {
    const OutputPath* out;
    fs::path path;
    std::optional<FileId> id;
  };
  std::vector<Resolved> seen;
  for (const OutputPath& out : outputs) {
    if (out.path.empty()) continue;
    const fs::path target = resolveOutput(out.path);
    const auto id = fileId(target.string());
    for (const InputPath& in : inputs) {
      if (in.path.empty()) continue;
      const fs::path source = resolveOutput(in.path);
      const auto inId = fileId(source.string());
      if (source == target || (id && inId && *id == *inId)) {
        throw InputError(fmt::format("{} '{}' is the same file as {} '{}': an output never replaces an input", out.flag,
                                     out.path, in.flag, in.path));
      }
      if (in.directory && inside(target, source)) {
        throw InputError(fmt::format("{} '{}' is inside {} '{}', which this command reads: write it elsewhere",
                                     out.flag, out.path, in.flag, in.path));
      }
      if (!out.writes.empty() && source.parent_path() == target &&
          ::fnmatch(out.writes.c_str(), source.filename().c_str(), 0) == 0) {
        throw InputError(fmt::format("{} '{}' is a file {} '{}' writes ({}): an output never replaces an input",
                                     in.flag, in.path, out.flag, out.path, out.writes));
      }
    }
    for (const Resolved& other : seen) {
      if (other.path == target || (id && other.id && *id == *other.id)) {
        throw InputError(fmt::format("{} '{}' and {} '{}' are the same path: give each output its own", other.out->flag,
                                     other.out->path, out.flag, out.path));
      }
      const bool fileInDir = other.out->kind == OutputPath::Kind::kDirectory;
      const bool dirHoldsFile = out.kind == OutputPath::Kind::kDirectory;
      if ((fileInDir && inside(target, other.path)) || (dirHoldsFile && inside(other.path, target))) {
        const Resolved& file = fileInDir ? Resolved{&out, target, id} : other;
        const Resolved& dir = fileInDir ? other : Resolved{&out, target, id};
        throw InputError(fmt::format("{} '{}' is inside {} '{}', whose files belong to the engine", file.out->flag,
                                     file.out->path, dir.out->flag, dir.out->path));
      }
    }
    seen.push_back({&out, target, id});
  }
  // Then each on its own, once it is known not to clash with another.
  for (const Resolved& r : seen) {
    const fs::path checkpoint = checkpointAbove(r.path);
    if (!checkpoint.empty()) {
      throw InputError(fmt::format("{} '{}' is inside the checkpoint '{}' (it holds a job.h5), whose files belong to "
                                   "that job: write it elsewhere",
                                   r.out->flag, r.out->path, checkpoint.string()));
    }
    if (r.out->kind == OutputPath::Kind::kFile) {
      checkFile(*r.out, r.path);
    } else {
      checkDirectory(*r.out, r.path);
    }
  }
}

}  // namespace orpheus::engine
