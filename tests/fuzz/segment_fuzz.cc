// Reading an SV log segment back (ckpt::loadSegment, and ckpt::inspect and
// ckpt::readLog on a checkpoint directory holding it), what `orpheus inspect`,
// `restore` and `--resume` do with a log on disk. A damaged segment must end in a
// problem string or an InputError; anything else is a finding.
//
// Input: four header bytes, then the segment.
//   flags    bit 0 clear: the rest is the segment file's bytes, as they are;
//            bit 0 set: the rest describes the segment's contents, and a valid
//            HDF5 file holding them is written (so that mutations reach the checks
//            behind HDF5 and the CRC): bit 1 repairs the CRC, bit 2 declares the
//            records dataset longer than what is written into it
//   first    the first clock in the file's name
//   span     last - first
//   replica  the replica directory, mod 4
// The contents: a row count (mod 17) and the rows (EntryRow, 16 bytes each), a
// size count (mod 17) and the sizes (u64 each), the CRC (u32), the extra length of
// the records dataset (u32, bit 2), then the records' bytes.
#include "ckpt/h5.h"
#include "ckpt/layout.h"
#include "ckpt/log_reader.h"
#include "ckpt/segment.h"
#include "engine/base/crc32c.h"
#include "engine/base/error.h"
#include "tests/fuzz/fuzz_file.h"

#include <hdf5.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

using namespace orpheus;
namespace fs = std::filesystem;
using ckpt::H5Handle;

namespace {

constexpr uint8_t kStructured = 1, kRepairCrc = 2, kLongRecords = 4;

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // The next sizeof(T) bytes (zeros past the end).
  template <typename T>
  T take() {
    T value{};
    const size_t n = std::min(sizeof(T), size_);
    std::memcpy(&value, data_, n);
    data_ += n;
    size_ -= n;
    return value;
  }
  std::vector<uint8_t> rest() { return {data_, data_ + size_}; }

 private:
  const uint8_t* data_;
  size_t size_;
};

void writeVector(hid_t file, const char* name, hid_t fileType, hid_t memType, const void* data, hsize_t count,
                 hsize_t extent) {
  H5Handle space(H5Screate_simple(1, &extent, nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (extent != count) {
    // Longer than written: chunked, so the unwritten part takes no space.
    const hsize_t chunk = std::min<hsize_t>(extent, 4096);  // no larger than the fixed extent
    H5Pset_chunk(dcpl.get(), 1, &chunk);
  }
  H5Handle set(H5Dcreate2(file, name, fileType, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!set.valid()) std::abort();
  if (count == 0) return;
  H5Handle memSpace(H5Screate_simple(1, &count, nullptr), H5Sclose);
  const hsize_t start = 0;
  H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  if (H5Dwrite(set.get(), memType, memSpace.get(), space.get(), H5P_DEFAULT, data) < 0) std::abort();
}

template <typename T>
void writeAttr(hid_t file, const char* name, hid_t fileType, hid_t memType, T value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(file, name, fileType, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), memType, &value) < 0) std::abort();
}

// A segment file holding the contents `in` describes, in the segment format.
void writeStructured(const std::string& path, uint8_t flags, uint64_t first, uint64_t last, int replica, Bytes in) {
  std::vector<ckpt::EntryRow> rows(in.take<uint8_t>() % 17);
  for (auto& r : rows) r = in.take<ckpt::EntryRow>();
  std::vector<uint64_t> sizes(in.take<uint8_t>() % 17);
  for (auto& s : sizes) s = in.take<uint64_t>();
  uint32_t crc = in.take<uint32_t>();
  const uint64_t extra = (flags & kLongRecords) ? in.take<uint32_t>() : 0;
  const std::vector<uint8_t> records = in.rest();
  if (flags & kRepairCrc) {
    crc = crc32c(0, records.data(), records.size());
    crc = crc32c(crc, rows.data(), rows.size() * sizeof(ckpt::EntryRow));
    crc = crc32c(crc, sizes.data(), sizes.size() * sizeof(uint64_t));
  }

  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) std::abort();
  writeVector(file.get(), "records", H5T_STD_U8LE, H5T_NATIVE_UINT8, records.data(), records.size(),
              records.size() + extra);
  H5Handle rowType(H5Tcreate(H5T_COMPOUND, sizeof(ckpt::EntryRow)), H5Tclose);
  H5Tinsert(rowType.get(), "clock", HOFFSET(ckpt::EntryRow, clock), H5T_NATIVE_UINT64);
  H5Tinsert(rowType.get(), "kind", HOFFSET(ckpt::EntryRow, kind), H5T_NATIVE_UINT32);
  H5Tinsert(rowType.get(), "records", HOFFSET(ckpt::EntryRow, records), H5T_NATIVE_UINT32);
  writeVector(file.get(), "entries", rowType.get(), rowType.get(), rows.data(), rows.size(), rows.size());
  writeVector(file.get(), "record_sizes", H5T_STD_U64LE, H5T_NATIVE_UINT64, sizes.data(), sizes.size(),
              sizes.size());
  writeAttr<int64_t>(file.get(), "version", H5T_STD_I64LE, H5T_NATIVE_INT64, ckpt::kSegmentVersion);
  writeAttr<uint64_t>(file.get(), "first_clock", H5T_STD_U64LE, H5T_NATIVE_UINT64, first);
  writeAttr<uint64_t>(file.get(), "last_clock", H5T_STD_U64LE, H5T_NATIVE_UINT64, last);
  writeAttr<int64_t>(file.get(), "replica", H5T_STD_I64LE, H5T_NATIVE_INT64, replica);
  writeAttr<uint32_t>(file.get(), "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, crc);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ckpt::silenceHdf5();
  spdlog::set_level(spdlog::level::off);  // the readers' warnings about the damage they skip
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t flags = data[0];
  const uint64_t first = data[1];
  const uint64_t last = first + data[2];
  const int replica = data[3] % 4;

  // A fresh checkpoint directory holding this one segment.
  const std::string dir = fuzz::scratch().file("ckpt");
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(ckpt::replicaDir(dir, replica));
  const std::string path = ckpt::segmentPath(dir, replica, first, last).string();
  if (flags & kStructured) {
    writeStructured(path, flags, first, last, replica, Bytes(data + 4, size - 4));
  } else {
    fuzz::writeBytes(path, data + 4, size - 4);
  }

  std::vector<ckpt::LogEntry> entries;
  std::vector<ckpt::ClockRange> lost;
  if (ckpt::loadSegment(path, replica, first, last, &entries, &lost).empty()) {
    // What a replay gets: every record of a group is an SV batch.
    for (const auto& e : entries) {
      for (const auto& r : e.records) {
        try {
          decode(r);
        } catch (const InputError&) {
        }
      }
    }
  }
  try {
    ckpt::inspect(dir);
  } catch (const InputError&) {
  }
  try {
    ckpt::readLog(dir, replica, 0, last);
  } catch (const InputError&) {
  }
  return 0;
}
