#include "ckpt/model_file.h"
#include "engine/base/crc32c.h"
#include "engine/base/error.h"

#include <catch2/catch.hpp>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace orpheus;
namespace fs = std::filesystem;

namespace {

fs::path tempDir() {
  const auto dir = fs::temp_directory_path() / ("orpheus_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

ParamSet sample() {
  ParamSet p;
  Matrix w(3, 4);
  for (int i = 0; i < 12; ++i) w.data()[i] = 0.25f * static_cast<float>(i) - 1.0f;
  p.params.push_back({"W", w});
  p.params.push_back({"b", Matrix::Constant(3, 1, 0.5f)});
  p.params.push_back({"A", Matrix::Constant(2, 2, -3.0f)});  // names are not in alphabetical order
  return p;
}

}  // namespace

TEST_CASE("parameters round-trip through HDF5 with their attributes and order", "[ckpt]") {
  const auto dir = tempDir();
  const std::string path = (dir / "model.h5").string();
  ckpt::ModelFileInfo info;
  info.modelSpec = "mlr features=4 classes=3";
  info.clock = 77;
  info.seed = 12345;
  info.replica = 2;
  info.modelDigest = textDigest("param W[2, 3]\n");
  ckpt::saveParams(path, sample(), info);
  ckpt::ModelFileInfo back;
  const ParamSet loaded = ckpt::loadParams(path, &back);
  REQUIRE(loaded.size() == 3);
  CHECK(loaded.params[0].name == "W");
  CHECK(loaded.params[1].name == "b");
  CHECK(loaded.params[2].name == "A");
  CHECK(loaded[0] == sample()[0]);
  CHECK(loaded[1] == sample()[1]);
  CHECK(back.modelSpec == info.modelSpec);
  CHECK(back.clock == 77);
  CHECK(back.seed == 12345u);
  CHECK(back.replica == 2);
  CHECK(back.modelDigest == info.modelDigest);
  CHECK(back.modelDigest == "e:" + fmt::format("{:08x}", crc32c(0, "param W[2, 3]\n", 14)));
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
  fs::remove_all(dir);
}

TEST_CASE("a dataset whose declared shape exceeds memory is refused before it is allocated", "[ckpt]") {
  const auto dir = tempDir();
  const std::string path = (dir / "huge.h5").string();
  {
    // 2^40 x 4 floats declared, chunked: a few bytes on disk.
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[2] = {hsize_t{1} << 40, 4};
    const hsize_t chunk[2] = {1024, 4};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(plist, 2, chunk);
    const hid_t set = H5Dcreate2(file, "W", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, plist, H5P_DEFAULT);
    REQUIRE(set >= 0);
    H5Dclose(set);
    H5Pclose(plist);
    H5Sclose(space);
    H5Fclose(file);
  }
  CHECK_THROWS_AS(ckpt::loadParams(path), InputError);
  CHECK_THROWS_WITH(ckpt::loadParams(path), Catch::Contains("dataset 'W' in '" + path + "' (1099511627776 x 4 floats)") &&
                                                Catch::Contains("more than"));
  fs::remove_all(dir);
}

TEST_CASE("other writers' attributes: a variable-length model_spec is read, a crc32c of another type refused",
          "[ckpt]") {
  const auto dir = tempDir();
  const std::string path = (dir / "other.h5").string();
  const auto scalarAttr = [](hid_t loc, const char* name, hid_t type, const void* value) {
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(attr >= 0);
    H5Awrite(attr, type, value);
    H5Aclose(attr);
    H5Sclose(space);
  };
  const auto write = [&](bool badCrc, bool extras = false) {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (extras) {  // a text dataset beside the matrix, and a clock of floats
      const hid_t text = H5Tcopy(H5T_C_S1);
      H5Tset_size(text, 5);
      const hid_t one = H5Screate(H5S_SCALAR);
      const hid_t notes = H5Dcreate2(file, "notes", text, one, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(notes, text, H5S_ALL, H5S_ALL, H5P_DEFAULT, "hello");
      H5Dclose(notes);
      H5Sclose(one);
      H5Tclose(text);
      const double clock = 12.5;
      scalarAttr(file, "clock", H5T_NATIVE_DOUBLE, &clock);
    }
    const hsize_t dims[2] = {2, 2};
    const float values[4] = {1, 2, 3, 4};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t set = H5Dcreate2(file, "W", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    if (badCrc) {
      const int64_t crc = -5;
      scalarAttr(set, "crc32c", H5T_NATIVE_INT64, &crc);
    }
    H5Dclose(set);
    H5Sclose(space);
    const hid_t vlen = H5Tcopy(H5T_C_S1);
    H5Tset_size(vlen, H5T_VARIABLE);
    H5Tset_cset(vlen, H5T_CSET_UTF8);
    const char* spec = "graph examples/tm.loss features=4 classes=3";
    scalarAttr(file, "model_spec", vlen, &spec);
    H5Tclose(vlen);
    H5Fclose(file);
  };
  write(false);
  ckpt::ModelFileInfo info;
  REQUIRE(ckpt::loadParams(path, &info).size() == 1);
  CHECK(info.modelSpec == "graph examples/tm.loss features=4 classes=3");
  write(true);
  CHECK_THROWS_WITH(ckpt::loadParams(path),
                    Catch::Contains("dataset 'W' in '" + path + "' has a crc32c attribute that is not one unsigned"));
  // A text dataset is passed over, not a reason to refuse the file; a clock of another
  // type is unknown (-1), not clock 0.
  write(false, true);
  const ParamSet loaded = ckpt::loadParams(path, &info);
  REQUIRE(loaded.size() == 1);
  CHECK(loaded.params[0].name == "W");
  CHECK(info.clock == -1);
  fs::remove_all(dir);
}

TEST_CASE("a failed save leaves no file and keeps an existing one", "[ckpt]") {
  const auto dir = tempDir();
  CHECK_THROWS_AS(ckpt::saveParams((dir / "missing" / "m.h5").string(), sample(), {}), IoError);
  CHECK_FALSE(fs::exists(dir / "missing"));
  fs::remove_all(dir);
}

TEST_CASE("loading a missing or foreign file is an input error naming it", "[ckpt]") {
  const auto dir = tempDir();
  CHECK_THROWS_WITH(ckpt::loadParams((dir / "nope.h5").string()), Catch::Contains("nope.h5"));
  const auto text = dir / "text.h5";
  std::ofstream(text) << "not hdf5\n";
  CHECK_THROWS_AS(ckpt::loadParams(text.string()), InputError);
  CHECK_THROWS_WITH(ckpt::loadParams(text.string()), Catch::Contains("not an HDF5 file"));
  fs::remove_all(dir);
}

TEST_CASE("a save that fails midway names the call and keeps the existing file", "[ckpt]") {
  const auto dir = tempDir();
  const std::string path = (dir / "m.h5").string();
  ckpt::ModelFileInfo first, second;
  first.modelSpec = "first";
  first.clock = 1;
  second.modelSpec = "second";
  second.clock = 2;
  ckpt::saveParams(path, sample(), first);
  ParamSet bad = sample();
  bad.params.push_back({"", Matrix::Constant(1, 1, 1.0f)});  // HDF5 refuses an empty name
  CHECK_THROWS_AS(ckpt::saveParams(path, bad, second), IoError);
  CHECK_THROWS_WITH(ckpt::saveParams(path, bad, second),
                    Catch::Contains(path) && Catch::Contains("H5Dcreate2"));
  ckpt::ModelFileInfo info;
  CHECK(ckpt::loadParams(path, &info).size() == 3);
  CHECK(info.modelSpec == "first");
  CHECK(info.modelDigest.empty());  // a model without a .loss text records none
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
  fs::remove_all(dir);
}

TEST_CASE("a parameter file whose values changed on disk is refused, naming the dataset", "[ckpt]") {
  const auto dir = tempDir();
  const auto path = dir / "model.h5";
  ckpt::saveParams(path.string(), sample(), {});
  // W's values as written (row-major), found in the file and one bit flipped.
  const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> w = sample()[0];
  std::string bytes((std::istreambuf_iterator<char>(std::ifstream(path, std::ios::binary).rdbuf())), {});
  const std::string values(reinterpret_cast<const char*>(w.data()), static_cast<size_t>(w.size()) * sizeof(float));
  const size_t at = bytes.find(values);
  REQUIRE(at != std::string::npos);
  bytes[at + 5] = static_cast<char>(bytes[at + 5] ^ 0x10);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  CHECK_THROWS_AS(ckpt::loadParams(path.string()), InputError);
  CHECK_THROWS_WITH(ckpt::loadParams(path.string()),
                    Catch::Contains("dataset 'W'") && Catch::Contains("model.h5") && Catch::Contains("crc32c"));
  fs::remove_all(dir);
}
