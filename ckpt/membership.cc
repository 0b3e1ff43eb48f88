#include "ckpt/membership.h"

#include "ckpt/durable.h"
#include "ckpt/job_info.h"
#include "ckpt/layout.h"
#include "engine/base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orpheus::ckpt {

namespace fs = std::filesystem;

std::vector<Epoch> readMembership(const std::string& dir) {
  std::vector<Epoch> epochs;
  Epoch first;
  first.ranks = std::max(readJobInfo(dir).ranks, 1);
  epochs.push_back(first);
  const fs::path path = membershipPath(dir);
  forEachTextLine(path, [&](int lineNo, const std::string& line) {
    std::istringstream words(line);
    std::string e, c, r;
    Epoch next;
    words >> e >> next.epoch >> c >> next.clock >> r >> next.ranks;
    ORPHEUS_CHECK_INPUT(words && e == "epoch" && c == "clock" && r == "ranks" && next.ranks >= 1 &&
                            next.epoch == epochs.back().epoch + 1 && next.clock >= epochs.back().clock,
                        "'{}' line {}: expected 'epoch {} clock C ranks P' (C >= {}), got '{}'", path.string(), lineNo,
                        epochs.back().epoch + 1, epochs.back().clock, line);
    epochs.push_back(next);
  });
  return epochs;
}

void appendEpoch(const std::string& dir, const Epoch& epoch) {
  const fs::path path = membershipPath(dir);
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream old;
    old << in.rdbuf();
    text = old.str();
  }
  text += fmt::format("epoch {} clock {} ranks {}\n", epoch.epoch, epoch.clock, epoch.ranks);
  writeTextDurably(path, text);
}

const Epoch& epochAfter(const std::vector<Epoch>& epochs, uint64_t clock) {
  const Epoch* found = &epochs.front();
  for (const Epoch& e : epochs) {
    if (e.clock <= clock) found = &e;
  }
  return *found;
}

int replicaCount(const std::vector<Epoch>& epochs) {
  int n = 1;
  for (const Epoch& e : epochs) n = std::max(n, e.ranks);
  return n;
}

int replicaHeldAt(int rank, const std::vector<Epoch>& epochs, uint64_t clock, int64_t rotateEvery) {
  const Epoch& e = epochAfter(epochs, clock);
  if (rotateEvery <= 0 || e.ranks <= 1) return rank;
  // Rotations at the epoch's own clock happened before the change; replica r starts at rank r.
  const auto every = static_cast<uint64_t>(rotateEvery);
  const auto rotations = static_cast<int64_t>(clock / every - e.clock / every);
  return static_cast<int>(((rank - rotations) % e.ranks + e.ranks) % e.ranks);
}

}  // namespace orpheus::ckpt
