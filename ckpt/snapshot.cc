#include "ckpt/snapshot.h"

#include "ckpt/h5.h"
#include "ckpt/layout.h"
#include "engine/base/crc32c.h"
#include "engine/base/memory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

namespace orpheus::ckpt {
namespace {

namespace fs = std::filesystem;

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

int64_t blockBegin(int64_t rows, int rank, int ranks) { return rows * rank / ranks; }

struct PartBlock {
  std::string name;
  int64_t fullRows = 0;
  RowMajor rows;
};
struct Part {
  uint64_t clock = 0;
  int64_t rank = 0;
  int64_t ranks = 0;
  std::vector<PartBlock> blocks;  // in parameter order
};

// Reads and verifies one snapshot part; returns why it is unusable, or "".
std::string loadPart(const std::string& path, Part* part) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "missing";
  H5Handle file = openH5ForReading(path);
  if (!file.valid()) return "not a readable HDF5 file";
  int64_t version = 0;
  std::string names;
  if (!readI64Attr(file.get(), "version", &version) || !readU64Attr(file.get(), "clock", &part->clock) ||
      !readI64Attr(file.get(), "rank", &part->rank) || !readI64Attr(file.get(), "ranks", &part->ranks) ||
      !readStringAttr(file.get(), "parameters", &names)) {
    return "its attributes are missing or unreadable";
  }
  if (version < 1 || version > kFormatVersion) return fmt::format("unknown format version {}", version);
  if (part->ranks < 1 || part->rank < 0 || part->rank >= part->ranks) return "bad rank attributes";
  for (size_t begin = 0; begin < names.size();) {
    const size_t end = std::min(names.find('\n', begin), names.size());
    PartBlock block;
    block.name = names.substr(begin, end - begin);
    begin = end + 1;
    H5Handle set(H5Dopen2(file.get(), block.name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!set.valid()) return fmt::format("dataset '{}' is missing", block.name);
    H5Handle space(H5Dget_space(set.get()), H5Sclose);
    if (H5Sget_simple_extent_ndims(space.get()) != 2) return fmt::format("dataset '{}' is not 2-D", block.name);
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    uint32_t crc = 0;
    if (!readI64Attr(set.get(), "rows", &block.fullRows) || !readU32Attr(set.get(), "crc32c", &crc)) {
      return fmt::format("dataset '{}' lacks its attributes", block.name);
    }
    // The rows its block should hold and a size that fits, before anything is allocated.
    const int64_t expected =
        block.fullRows < 0 || block.fullRows > kMaxSize
            ? -1
            : blockBegin(block.fullRows, static_cast<int>(part->rank) + 1, static_cast<int>(part->ranks)) -
                  blockBegin(block.fullRows, static_cast<int>(part->rank), static_cast<int>(part->ranks));
    if (expected < 0) return fmt::format("dataset '{}' has {} full rows", block.name, block.fullRows);
    if (static_cast<int64_t>(dims[0]) != expected) {
      return fmt::format("dataset '{}' holds {} rows, its block has {}", block.name, dims[0], expected);
    }
    if (static_cast<double>(dims[0]) * static_cast<double>(dims[1]) * sizeof(float) > physicalMemoryBytes() &&
        physicalMemoryBytes() > 0) {
      return fmt::format("dataset '{}' declares {} x {} floats, more than this machine's memory", block.name, dims[0],
                         dims[1]);
    }
    block.rows.resize(static_cast<Eigen::Index>(dims[0]), static_cast<Eigen::Index>(dims[1]));
    if (block.rows.size() > 0 &&
        H5Dread(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, block.rows.data()) < 0) {
      return fmt::format("dataset '{}' is unreadable", block.name);
    }
    if (crc32c(0, block.rows.data(), static_cast<size_t>(block.rows.size()) * sizeof(float)) != crc) {
      return fmt::format("dataset '{}' fails its CRC32C", block.name);
    }
    part->blocks.push_back(std::move(block));
  }
  return "";
}

// Reads every part of a snapshot and checks that they agree (with `shapes` when
// given). Returns why the snapshot is unusable, or ""; assembles into `out` when given.
std::string assembleSnapshot(const std::string& dir, uint64_t clock, const ParamSet* shapes, ParamSet* out) {
  Part part;
  std::string problem = loadPart(snapshotPartPath(dir, clock, 0).string(), &part);
  if (!problem.empty()) return fmt::format("part 0 ('{}'): {}", snapshotPartPath(dir, clock, 0).string(), problem);
  const int ranks = static_cast<int>(part.ranks);
  // Part 0 sets what every part must hold: the parameter names, full rows, columns.
  struct Shape {
    std::string name;
    int64_t rows;
    int64_t cols;
  };
  std::vector<Shape> reference;
  for (const auto& b : part.blocks) reference.push_back({b.name, b.fullRows, b.rows.cols()});
  if (shapes) {
    if (reference.size() != shapes->size()) {
      return fmt::format("it holds {} parameters, the model has {}", reference.size(), shapes->size());
    }
    for (const Param& p : shapes->params) {
      const auto it =
          std::find_if(reference.begin(), reference.end(), [&](const Shape& s) { return s.name == p.name; });
      if (it == reference.end()) return fmt::format("it lacks parameter '{}'", p.name);
      if (it->rows != p.value.rows() || it->cols != p.value.cols()) {
        return fmt::format("parameter '{}' is {}x{}, the model's is {}x{}", p.name, it->rows, it->cols, p.value.rows(),
                           p.value.cols());
      }
    }
  }
  if (out) {
    // In the model's order when it is given, else in the stored order.
    out->params.clear();
    if (shapes) {
      for (const Param& p : shapes->params) out->params.push_back({p.name, Matrix(p.value.rows(), p.value.cols())});
    } else {
      for (const Shape& s : reference) out->params.push_back({s.name, Matrix(s.rows, s.cols)});
    }
  }
  for (int r = 0; r < ranks; ++r) {
    if (r > 0) {
      part = Part{};
      const std::string path = snapshotPartPath(dir, clock, r).string();
      problem = loadPart(path, &part);
      if (!problem.empty()) return fmt::format("part {} ('{}'): {}", r, path, problem);
    }
    if (part.clock != clock || part.ranks != ranks || part.rank != r) {
      return fmt::format("part {} claims clock {}, rank {} of {}", r, part.clock, part.rank, part.ranks);
    }
    if (part.blocks.size() != reference.size()) return fmt::format("part {} holds other parameters", r);
    for (size_t i = 0; i < part.blocks.size(); ++i) {
      const PartBlock& b = part.blocks[i];
      if (b.name != reference[i].name || b.fullRows != reference[i].rows || b.rows.cols() != reference[i].cols) {
        return fmt::format("part {} disagrees with part 0 on parameter '{}'", r, b.name);
      }
      if (out) {
        const int index = out->find(b.name);
        (*out)[static_cast<size_t>(index)].middleRows(blockBegin(b.fullRows, r, ranks), b.rows.rows()) = b.rows;
      }
    }
  }
  return "";
}

}  // namespace

void writeSnapshotPart(const std::string& dir, uint64_t clock, int rank, int ranks, const ParamSet& params) {
  silenceHdf5();
  ORPHEUS_CHECK_INPUT(ranks >= 1 && rank >= 0 && rank < ranks, "snapshot part {} of {} ranks", rank, ranks);
  const fs::path path = snapshotPartPath(dir, clock, rank);
  const std::string name = path.string();
  writeH5Durably(path, H5FileKind::kLog, [&](hid_t file) {
    std::string names;
    for (const Param& p : params.params) {
      ORPHEUS_ENFORCE(p.name.find('\n') == std::string::npos, "parameter name '{}' holds a newline", p.name);
      const int64_t rows = p.value.rows();
      const int64_t begin = blockBegin(rows, rank, ranks), end = blockBegin(rows, rank + 1, ranks);
      // Stored row-major as (rows, cols), like a parameter file.
      const RowMajor block = p.value.middleRows(begin, end - begin);
      H5Handle set = writeFloatMatrix(file, p.name, block.data(), block.rows(), block.cols(), /*groups=*/true, name);
      writeI64Attr(set.get(), "rows", rows, name);
      writeU32Attr(set.get(), "crc32c", crc32c(0, block.data(), static_cast<size_t>(block.size()) * sizeof(float)),
                   name);
      if (!names.empty()) names.push_back('\n');
      names += p.name;
    }
    writeI64Attr(file, "version", kFormatVersion, name);
    writeU64Attr(file, "clock", clock, name);
    writeI64Attr(file, "rank", rank, name);
    writeI64Attr(file, "ranks", ranks, name);
    writeStringAttr(file, "parameters", names, name);
  });
}

std::vector<uint64_t> snapshotClocks(const std::string& dir) {
  std::vector<uint64_t> out;
  for (const NumberedDir& d : listSnapshotDirs(dir)) out.push_back(d.number);
  return out;
}

std::optional<ParamSet> readSnapshot(const std::string& dir, uint64_t clock, const ParamSet& shapes) {
  silenceHdf5();
  ParamSet out;
  const std::string problem = assembleSnapshot(dir, clock, &shapes, &out);
  if (!problem.empty()) {
    spdlog::warn("snapshot of clock {} in '{}' is unusable: {}", clock, dir, problem);
    return std::nullopt;
  }
  return out;
}

std::string snapshotProblem(const std::string& dir, uint64_t clock, const ParamSet* shapes) {
  silenceHdf5();
  return assembleSnapshot(dir, clock, shapes, nullptr);
}

}  // namespace orpheus::ckpt
