#include "ckpt/h5.h"

#include "ckpt/durable.h"

#include <cstring>
#include <string_view>

namespace orpheus::ckpt {
namespace {

namespace fs = std::filesystem;

// Large raw data starts on a file system block (kDirectAlign) from this size on.
constexpr hsize_t kAlignThreshold = 64 * 1024;

void writeAttr(hid_t loc, const char* name, hid_t fileType, hid_t memType, const void* value, const std::string& path) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(ORPHEUS_H5_CHECK(H5Acreate2(loc, name, fileType, space.get(), H5P_DEFAULT, H5P_DEFAULT), path,
                                 "write attribute '{}' of", name),
                H5Aclose);
  ORPHEUS_H5_CHECK(H5Awrite(attr.get(), memType, value), path, "write attribute '{}' of", name);
}

// One value of the kind `memType` is: a number of another class or sign, a wider
// integer (HDF5 would clip it: -5 read as 0), or more than one value is not read.
bool readAttr(hid_t loc, const char* name, hid_t memType, void* out) {
  if (H5Aexists(loc, name) <= 0) return false;
  H5Handle attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  H5Handle space(H5Aget_space(attr.get()), H5Sclose);
  if (!type.valid() || !space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  const H5T_class_t kind = H5Tget_class(type.get());
  if (kind != H5Tget_class(memType)) return false;
  if (kind == H5T_INTEGER &&
      (H5Tget_sign(type.get()) != H5Tget_sign(memType) || H5Tget_size(type.get()) > H5Tget_size(memType))) {
    return false;
  }
  return H5Aread(attr.get(), memType, out) >= 0;
}

// The file creation and access properties of a kind of file.
struct FileProperties {
  H5Handle fcpl{H5Pcreate(H5P_FILE_CREATE), H5Pclose};
  H5Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};

  explicit FileProperties(H5FileKind kind) {
    H5Pset_link_creation_order(fcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    if (kind == H5FileKind::kLog) {
      H5Pset_attr_phase_change(fcpl.get(), 0, 0);
      H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);
      H5Pset_alignment(fapl.get(), kAlignThreshold, kDirectAlign);
    }
#if H5_VERSION_GE(1, 10, 7)
    // The file is private until renamed; locks only fail on shared file systems.
    H5Pset_file_locking(fapl.get(), false, true);
#endif
  }
};

}  // namespace

void silenceHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string h5ErrorString(int err) { return err != 0 ? std::strerror(err) : "HDF5 error"; }

namespace detail {
void throwH5(const char* call, const std::string& path, const std::string& what, int err) {
  // The call's function name, without its arguments.
  const std::string_view text(call);
  const std::string_view function = text.substr(0, text.find('('));
  throw IoError(fmt::format("cannot {} '{}': {} ({})", what, path, h5ErrorString(err), function));
}
}  // namespace detail

void writeI64Attr(hid_t loc, const char* name, int64_t value, const std::string& path) {
  writeAttr(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, path);
}
void writeU64Attr(hid_t loc, const char* name, uint64_t value, const std::string& path) {
  writeAttr(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, path);
}
void writeU32Attr(hid_t loc, const char* name, uint32_t value, const std::string& path) {
  writeAttr(loc, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value, path);
}
void writeF64Attr(hid_t loc, const char* name, double value, const std::string& path) {
  writeAttr(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, path);
}

bool readI64Attr(hid_t loc, const char* name, int64_t* out) { return readAttr(loc, name, H5T_NATIVE_INT64, out); }
bool readU64Attr(hid_t loc, const char* name, uint64_t* out) { return readAttr(loc, name, H5T_NATIVE_UINT64, out); }
bool readU32Attr(hid_t loc, const char* name, uint32_t* out) { return readAttr(loc, name, H5T_NATIVE_UINT32, out); }
bool readF64Attr(hid_t loc, const char* name, double* out) { return readAttr(loc, name, H5T_NATIVE_DOUBLE, out); }

void writeStringAttr(hid_t loc, const char* name, const std::string& value, const std::string& path,
                     StringAttr kind) {
  std::string buffer = value;
  if (buffer.empty()) buffer.push_back('\0');
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), buffer.size());
  if (kind == StringAttr::kUtf8) {
    H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
  }
  writeAttr(loc, name, type.get(), type.get(), buffer.data(), path);
}

bool readStringAttr(hid_t loc, const char* name, std::string* out) {
  if (H5Aexists(loc, name) <= 0) return false;
  H5Handle attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) return false;
  if (H5Tis_variable_str(type.get()) > 0) {
    // A variable-length string (what h5py writes for a Python str): one of them.
    H5Handle space(H5Aget_space(attr.get()), H5Sclose);
    if (!space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1) return false;
    H5Handle memType(H5Tcopy(H5T_C_S1), H5Tclose);
    if (H5Tset_size(memType.get(), H5T_VARIABLE) < 0 || H5Tset_cset(memType.get(), H5Tget_cset(type.get())) < 0) {
      return false;
    }
    char* text = nullptr;
    if (H5Aread(attr.get(), memType.get(), &text) < 0) return false;
    *out = text != nullptr ? std::string(text) : std::string();
    H5free_memory(text);
    return true;
  }
  const size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  // Read as stored: HDF5 does not convert between character sets.
  H5Handle memType(H5Tget_native_type(type.get(), H5T_DIR_DEFAULT), H5Tclose);
  if (H5Aread(attr.get(), memType.get(), value.data()) < 0) return false;
  while (!value.empty() && value.back() == '\0') value.pop_back();
  *out = std::move(value);
  return true;
}

uint64_t writeH5Durably(const fs::path& path, H5FileKind kind, const std::function<void(hid_t file)>& fill,
                        const std::function<void(const fs::path& tmp)>& afterClose, bool createDirectory) {
  const std::string target = path.string();
  return writeDurably(
      path,
      [&](const fs::path& tmp) {
        const FileProperties props(kind);
        H5Handle file(ORPHEUS_H5_CHECK(H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, props.fcpl.get(), props.fapl.get()),
                                       target, "create"),
                      H5Fclose);
        fill(file.get());
        ORPHEUS_H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), target, "write");
        ORPHEUS_H5_CHECK(H5Fclose(file.release()), target, "write");
        if (afterClose) afterClose(tmp);
      },
      createDirectory);
}

H5Handle openH5ForReading(const std::string& path) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl.get(), false, true);
#endif
  if (H5Fis_hdf5(path.c_str()) <= 0) return H5Handle(-1, H5Fclose);
  return H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
}

H5Handle createVector(hid_t file, const char* name, hid_t type, hsize_t count, const std::string& path) {
  H5Handle space(H5Screate_simple(1, &count, nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  return H5Handle(ORPHEUS_H5_CHECK(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                                   path, "create dataset '{}' in", name),
                  H5Dclose);
}

void writeAll(hid_t set, hid_t memType, const void* data, const char* name, const std::string& path) {
  ORPHEUS_H5_CHECK(H5Dwrite(set, memType, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path, "write dataset '{}' of", name);
}

H5Handle writeFloatMatrix(hid_t file, const std::string& name, const float* data, int64_t rows, int64_t cols,
                          bool groups, const std::string& path) {
  const hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)};
  H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), groups ? 1 : 0);
  H5Handle set(ORPHEUS_H5_CHECK(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), H5P_DEFAULT,
                                           H5P_DEFAULT),
                                path, "write parameter '{}' to", name),
               H5Dclose);
  if (rows * cols > 0) {
    ORPHEUS_H5_CHECK(H5Dwrite(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path,
                     "write parameter '{}' to", name);
  }
  return set;
}

}  // namespace orpheus::ckpt
