// What point-to-point calls carry, on either plane.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace orpheus::comm {

struct Message {
  int peer = -1;  // the sender
  std::vector<std::byte> bytes;
};

// Sends take shared ownership: the transport keeps the bytes alive until the send
// completes, and one encoded record can go to several peers without a copy.
using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

// One message given as pieces that go on the wire back to back, each sent from
// where it lies (scatter/gather): a record's header and the arrays it describes
// need no copy into one buffer first. `owner` keeps every piece alive and
// unchanged until the send completes.
struct Pieces {
  std::vector<std::span<const std::byte>> pieces;
  std::shared_ptr<const void> owner;

  size_t size() const {
    size_t n = 0;
    for (const auto& p : pieces) n += p.size();
    return n;
  }
  // The pieces concatenated: for a backend that cannot send them as they are.
  std::vector<std::byte> joined() const {
    std::vector<std::byte> out;
    out.reserve(size());
    for (const auto& p : pieces) out.insert(out.end(), p.begin(), p.end());
    return out;
  }
};
using SharedPieces = std::shared_ptr<const Pieces>;

}  // namespace orpheus::comm
