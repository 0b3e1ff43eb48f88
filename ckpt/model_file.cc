#include "ckpt/model_file.h"

#include "engine/base/error.h"

#include <hdf5.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

namespace orpheus::ckpt {
namespace {

// Owns an HDF5 handle; closes it with the matching function.
class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() {
    if (id_ >= 0) close_(id_);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its own error stack by default; errors are reported as exceptions here.
void silenceHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void writeStringAttr(hid_t loc, const char* name, const std::string& value) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), value.c_str()) < 0) {
    throw IoError(fmt::format("cannot write attribute '{}'", name));
  }
}

void writeInt64Attr(hid_t loc, const char* name, int64_t value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(loc, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0) {
    throw IoError(fmt::format("cannot write attribute '{}'", name));
  }
}

bool readStringAttr(hid_t loc, const char* name, std::string* out) {
  if (H5Aexists(loc, name) <= 0) return false;
  H5Handle attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  const size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  H5Handle memType(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(memType.get(), size);
  if (H5Aread(attr.get(), memType.get(), value.data()) < 0) return false;
  value.resize(std::strlen(value.c_str()));
  *out = value;
  return true;
}

bool readInt64Attr(hid_t loc, const char* name, int64_t* out) {
  if (H5Aexists(loc, name) <= 0) return false;
  H5Handle attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  return H5Aread(attr.get(), H5T_NATIVE_INT64, out) >= 0;
}

void fsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void saveParams(const std::string& path, const ParamSet& params, const ModelFileInfo& info) {
  silenceHdf5();
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  try {
    {
      H5Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
      H5Pset_link_creation_order(fcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
      H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose);
      if (!file.valid()) {
        throw IoError(fmt::format("cannot create '{}': {}", path, std::strerror(errno ? errno : EACCES)));
      }
      for (const auto& p : params.params) {
        // Stored row-major as (rows, cols), the layout every HDF5 reader expects.
        const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rowMajor = p.value;
        const hsize_t dims[2] = {static_cast<hsize_t>(p.value.rows()), static_cast<hsize_t>(p.value.cols())};
        H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
        H5Handle set(H5Dcreate2(file.get(), p.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                H5P_DEFAULT),
                     H5Dclose);
        if (!set.valid() ||
            H5Dwrite(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, rowMajor.data()) < 0) {
          throw IoError(fmt::format("cannot write parameter '{}' to '{}'", p.name, path));
        }
      }
      writeStringAttr(file.get(), "model_spec", info.modelSpec);
      writeInt64Attr(file.get(), "clock", info.clock);
      writeInt64Attr(file.get(), "seed", static_cast<int64_t>(info.seed));
      writeInt64Attr(file.get(), "replica", info.replica);
      writeInt64Attr(file.get(), "features", info.features);
      writeInt64Attr(file.get(), "classes", info.classes);
      if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw IoError(fmt::format("cannot flush '{}'", path));
    }
    fsyncPath(tmp);
    std::error_code ec;
    fs::rename(tmp, target, ec);
    if (ec) throw IoError(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
    fsyncPath(dir.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

ParamSet loadParams(const std::string& path, ModelFileInfo* info) {
  silenceHdf5();
  ORPHEUS_CHECK_INPUT(std::filesystem::exists(path), "parameter file '{}' does not exist", path);
  ORPHEUS_CHECK_INPUT(H5Fis_hdf5(path.c_str()) > 0, "parameter file '{}' is not an HDF5 file", path);
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
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
  ORPHEUS_CHECK_INPUT(!names.empty(), "parameter file '{}' holds no datasets", path);

  ParamSet params;
  for (const auto& name : names) {
    H5Handle set(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    H5Handle space(H5Dget_space(set.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    ORPHEUS_CHECK_INPUT(rank == 1 || rank == 2, "dataset '{}' in '{}' has {} dimensions, expected 1 or 2", name, path,
                        rank);
    hsize_t dims[2] = {1, 1};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rowMajor(
        static_cast<Eigen::Index>(dims[0]), static_cast<Eigen::Index>(rank == 2 ? dims[1] : 1));
    ORPHEUS_CHECK_INPUT(H5Dread(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, rowMajor.data()) >= 0,
                        "cannot read dataset '{}' from '{}' as float", name, path);
    ORPHEUS_CHECK_INPUT(rowMajor.allFinite(), "dataset '{}' in '{}' holds non-finite values", name, path);
    params.params.push_back({name, rowMajor});
  }
  if (info) {
    readStringAttr(file.get(), "model_spec", &info->modelSpec);
    readInt64Attr(file.get(), "clock", &info->clock);
    int64_t seed = 0;
    if (readInt64Attr(file.get(), "seed", &seed)) info->seed = static_cast<uint64_t>(seed);
    readInt64Attr(file.get(), "replica", &info->replica);
    readInt64Attr(file.get(), "features", &info->features);
    readInt64Attr(file.get(), "classes", &info->classes);
  }
  return params;
}

}  // namespace orpheus::ckpt
