// Parameters in HDF5: one float dataset per parameter at the file's root, named as
// in the model (a name with '/' goes into its groups: loadParams reads the root only),
// each with its CRC32C (attribute crc32c, checked on loading where present), and the
// attributes model_spec (string), clock, seed, replica, features and classes on the
// root group, and model_digest (string: the .loss text's textDigest) where the model
// was parsed from one. Files are written durably (ckpt/durable.h), so a reader never sees a
// partial file and an existing file survives a failed write.
#pragma once

#include "engine/base/params.h"

#include <cstdint>
#include <string>

namespace orpheus::ckpt {

struct ModelFileInfo {
  std::string modelSpec;
  int64_t clock = 0;     // -1: the file has a clock attribute that is not one integer
  uint64_t seed = 0;
  int64_t replica = 0;
  int64_t features = 0;  // the data width the model was built for (0: unknown)
  int64_t classes = 0;
  std::string modelDigest;  // "" for built-in models and files that predate it
};

// Throws IoError naming the path when the file cannot be written.
void saveParams(const std::string& path, const ParamSet& params, const ModelFileInfo& info);

// Throws InputError naming the path when the file is missing, not HDF5, holds no
// numeric datasets, or a dataset does not match its crc32c; other datasets (text,
// records) are passed over with a warning. Datasets are returned in the order of their names' creation
// (the order saveParams wrote them).
ParamSet loadParams(const std::string& path, ModelFileInfo* info = nullptr);

}  // namespace orpheus::ckpt
