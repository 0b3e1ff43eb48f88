// What point-to-point calls carry, on either plane.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace orpheus::comm {

struct Message {
  int peer = -1;  // the sender
  std::vector<std::byte> bytes;
};

// Sends take shared ownership: the transport keeps the bytes alive until the send
// completes, and one encoded record can go to several peers without a copy.
using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

}  // namespace orpheus::comm
