#include "ckpt/model_file.h"

#include "ckpt/h5.h"
#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "engine/base/memory.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>

namespace orpheus::ckpt {

void saveParams(const std::string& path, const ParamSet& params, const ModelFileInfo& info) {
  silenceHdf5();
  const auto fill = [&](hid_t file) {
    for (const auto& p : params.params) {
      const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rowMajor = p.value;
      // A name with a '/' lives in its groups (the optimizer state: optimizer/<param>/<buffer>).
      const H5Handle set = writeFloatMatrix(file, p.name, rowMajor.data(), rowMajor.rows(), rowMajor.cols(),
                                            /*groups=*/p.name.find('/') != std::string::npos, path);
      writeU32Attr(set.get(), "crc32c", crc32c(0, rowMajor.data(), static_cast<size_t>(rowMajor.size()) * sizeof(float)),
                   path);
    }
    writeStringAttr(file, "model_spec", info.modelSpec, path, StringAttr::kAscii);
    writeI64Attr(file, "clock", info.clock, path);
    writeI64Attr(file, "seed", static_cast<int64_t>(info.seed), path);
    writeI64Attr(file, "replica", info.replica, path);
    writeI64Attr(file, "features", info.features, path);
    writeI64Attr(file, "classes", info.classes, path);
    if (!info.modelDigest.empty()) writeStringAttr(file, "model_digest", info.modelDigest, path, StringAttr::kAscii);
  };
  // The directory must exist: a parameter file goes where the user said.
  writeH5Durably(path, H5FileKind::kParams, fill, nullptr, /*createDirectory=*/false);
}

ParamSet loadParams(const std::string& path, ModelFileInfo* info) {
  silenceHdf5();
  ORPHEUS_CHECK_INPUT(std::filesystem::exists(path), "parameter file '{}' does not exist", path);
  ORPHEUS_CHECK_INPUT(H5Fis_hdf5(path.c_str()) > 0, "parameter file '{}' is not an HDF5 file", path);
  H5Handle file = openH5ForReading(path);
  ORPHEUS_CHECK_INPUT(file.valid(), "cannot open parameter file '{}'", path);

  // Files written here track creation order, so parameters come back in model
  // order; files from other writers fall back to name order.
  std::vector<std::string> names;
  auto collect = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    H5O_info_t oinfo;
    if (H5Oget_info_by_name2(group, name, &oinfo, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 &&
        oinfo.type == H5O_TYPE_DATASET) {
      static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    }
    return 0;
  };
  if (H5Literate(file.get(), H5_INDEX_CRT_ORDER, H5_ITER_INC, nullptr, collect, &names) < 0) {
    names.clear();
    H5Literate(file.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names);
  }
  if (names.empty()) {
    // A checkpoint's job record (job.h5) holds the job's settings, no parameters.
    ORPHEUS_CHECK_INPUT(H5Aexists(file.get(), "computation") <= 0,
                        "'{}' is a checkpoint's job record, not a parameter file: write a clock's parameters with "
                        "'orpheus restore --ckpt-dir {} --clock latest --out FILE'",
                        path, std::filesystem::path(path).parent_path().string());
    throw InputError(fmt::format("parameter file '{}' holds no datasets", path));
  }

  ParamSet params;
  std::vector<std::string> skipped;
  for (const auto& name : names) {
    H5Handle set(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    // Another writer's file may hold text or records beside its matrices: they are no
    // parameters, and are passed over (said once below), not a reason to refuse the file.
    {
      const H5Handle type(H5Dget_type(set.get()), H5Tclose);
      const H5T_class_t kind = H5Tget_class(type.get());
      if (kind != H5T_FLOAT && kind != H5T_INTEGER) {
        skipped.push_back(name);
        continue;
      }
    }
    H5Handle space(H5Dget_space(set.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    ORPHEUS_CHECK_INPUT(rank == 1 || rank == 2, "dataset '{}' in '{}' has {} dimensions, expected 1 or 2", name, path,
                        rank);
    hsize_t dims[2] = {1, 1};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    // A declared shape costs nothing on disk: it is checked before anything is allocated
    // (the float matrix and its column-major copy).
    checkFitsInMemory(2.0 * static_cast<double>(dims[0]) * static_cast<double>(dims[1]) * sizeof(float),
                      fmt::format("dataset '{}' in '{}' ({} x {} floats)", name, path, dims[0], dims[1]));
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rowMajor(
        static_cast<Eigen::Index>(dims[0]), static_cast<Eigen::Index>(rank == 2 ? dims[1] : 1));
    ORPHEUS_CHECK_INPUT(H5Dread(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, rowMajor.data()) >= 0,
                        "cannot read dataset '{}' from '{}' as float", name, path);
    // What saveParams wrote carries each dataset's CRC32C: a damaged file is named, not
    // loaded (a file from another writer has none and is taken as it is).
    uint32_t crc = 0;
    const bool hasCrc = H5Aexists(set.get(), "crc32c") > 0;
    // One there that is not an unsigned 32-bit value checks nothing: named, not skipped.
    ORPHEUS_CHECK_INPUT(!hasCrc || readU32Attr(set.get(), "crc32c", &crc),
                        "dataset '{}' in '{}' has a crc32c attribute that is not one unsigned 32-bit integer", name,
                        path);
    ORPHEUS_CHECK_INPUT(!hasCrc ||
                            crc32c(0, rowMajor.data(), static_cast<size_t>(rowMajor.size()) * sizeof(float)) == crc,
                        "dataset '{}' in '{}' does not match its crc32c: the file is damaged, or was changed by "
                        "another program (which should then remove the attribute)",
                        name, path);
    ORPHEUS_CHECK_INPUT(rowMajor.allFinite(),
                        "dataset '{}' in '{}' holds values that are not finite float32 (nan, inf, or beyond 3.4e38)",
                        name, path);
    params.params.push_back({name, rowMajor});
  }
  ORPHEUS_CHECK_INPUT(!params.params.empty(), "parameter file '{}' holds no numeric datasets (only {})", path,
                      fmt::join(skipped, ", "));
  if (!skipped.empty()) {
    spdlog::warn("parameter file '{}': dataset{} {} {} not numeric, passed over", path, skipped.size() == 1 ? "" : "s",
                 fmt::join(skipped, ", "), skipped.size() == 1 ? "is" : "are");
  }
  if (info) {
    readStringAttr(file.get(), "model_spec", &info->modelSpec);
    // A clock of another type (a float from another writer) is not passed off as clock 0.
    if (H5Aexists(file.get(), "clock") > 0 && !readI64Attr(file.get(), "clock", &info->clock)) {
      info->clock = -1;
      spdlog::warn("parameter file '{}': its clock attribute is not one 64-bit integer: the clock is unknown", path);
    }
    int64_t seed = 0;
    if (readI64Attr(file.get(), "seed", &seed)) info->seed = static_cast<uint64_t>(seed);
    readI64Attr(file.get(), "replica", &info->replica);
    readI64Attr(file.get(), "features", &info->features);
    readI64Attr(file.get(), "classes", &info->classes);
    if (!readStringAttr(file.get(), "model_digest", &info->modelDigest)) info->modelDigest.clear();
  }
  return params;
}

}  // namespace orpheus::ckpt
