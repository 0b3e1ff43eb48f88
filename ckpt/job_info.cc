#include "ckpt/job_info.h"

#include "ckpt/h5.h"
#include "ckpt/layout.h"
#include "engine/base/memory.h"

#include <cmath>
#include <filesystem>

namespace orpheus::ckpt {

namespace fs = std::filesystem;

void writeJobInfo(const std::string& dir, const JobInfo& info) {
  silenceHdf5();
  const fs::path path = jobPath(dir);
  const std::string name = path.string();
  writeH5Durably(path, H5FileKind::kLog, [&](hid_t file) {
    writeI64Attr(file, "version", kFormatVersion, name);
    writeStringAttr(file, "model_name", info.modelName, name);
    writeStringAttr(file, "model_text", info.modelText, name);
    writeStringAttr(file, "model_spec", info.modelSpec, name);
    writeI64Attr(file, "features", info.features, name);
    writeI64Attr(file, "classes", info.classes, name);
    writeU64Attr(file, "seed", info.seed, name);
    writeI64Attr(file, "ranks", info.ranks, name);
    writeI64Attr(file, "batch", info.batch, name);
    writeF64Attr(file, "lr", info.lr, name);
    writeStringAttr(file, "flags", info.flags, name);
    writeStringAttr(file, "computation", info.computation, name);
  });
}

JobInfo readJobInfo(const std::string& dir) {
  silenceHdf5();
  const std::string path = jobPath(dir).string();
  std::error_code ec;
  ORPHEUS_CHECK_INPUT(fs::exists(path, ec), "checkpoint '{}' has no job file '{}'", dir, path);
  H5Handle file = openH5ForReading(path);
  ORPHEUS_CHECK_INPUT(file.valid(), "job file '{}' is not a readable HDF5 file", path);
  JobInfo info;
  int64_t version = 0, ranks = 0;
  // Each attribute one value of the type the writer gave it.
  const auto require = [&](bool ok, const char* name, const char* type) {
    ORPHEUS_CHECK_INPUT(ok, "job file '{}' lacks a readable attribute '{}' ({})", path, name, type);
  };
  constexpr const char* kI64 = "a signed 64-bit integer";
  constexpr const char* kString = "a string";
  require(readI64Attr(file.get(), "version", &version), "version", kI64);
  ORPHEUS_CHECK_INPUT(version >= 1 && version <= kFormatVersion, "job file '{}' has unknown format version {}", path,
                      version);
  require(readStringAttr(file.get(), "model_name", &info.modelName), "model_name", kString);
  require(readStringAttr(file.get(), "model_text", &info.modelText), "model_text", kString);
  require(readStringAttr(file.get(), "model_spec", &info.modelSpec), "model_spec", kString);
  require(readI64Attr(file.get(), "features", &info.features), "features", kI64);
  require(readI64Attr(file.get(), "classes", &info.classes), "classes", kI64);
  require(readU64Attr(file.get(), "seed", &info.seed), "seed", "an unsigned 64-bit integer");
  require(readI64Attr(file.get(), "ranks", &ranks), "ranks", kI64);
  require(readI64Attr(file.get(), "batch", &info.batch), "batch", kI64);
  require(readF64Attr(file.get(), "lr", &info.lr), "lr", "a 64-bit float");
  require(readStringAttr(file.get(), "flags", &info.flags), "flags", kString);
  // Optional: older checkpoints did not record it.
  if (!readStringAttr(file.get(), "computation", &info.computation)) info.computation.clear();
  // Sizes as the loss parser bounds them; 0 where the writer did not know the value.
  const auto inRange = [&](int64_t v, int64_t most, const char* name) {
    ORPHEUS_CHECK_INPUT(v >= 0 && v <= most, "job file '{}': attribute '{}' is {}, outside 0..{} (a damaged file)",
                        path, name, v, most);
  };
  inRange(info.features, kMaxSize, "features");
  inRange(info.classes, kMaxSize, "classes");
  inRange(info.batch, kMaxSize, "batch");
  inRange(ranks, kMaxRanks, "ranks");
  ORPHEUS_CHECK_INPUT(std::isfinite(info.lr), "job file '{}': attribute 'lr' is {}, not a finite number", path,
                      info.lr);
  info.ranks = static_cast<int>(ranks);
  return info;
}

}  // namespace orpheus::ckpt
