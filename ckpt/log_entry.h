// What a replica's log holds (ckpt/layout.h describes the log): the records the
// writer takes, and the entries a reader gets back.
#pragma once

#include "engine/base/sv_batch.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace orpheus::ckpt {

using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

// One record of a group as the writer takes it; nothing is copied. Either bytes
// already encoded (a batch as it travelled, kept alive by `owner`), or an SV batch
// the IO thread encodes straight into the segment (the worker's own batch: the
// compute thread does no encoding for the log).
struct Record {
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
  std::shared_ptr<const SvBatch> batch;
  // `bytes` are an SV batch record whose header CRC is known to be right (it was
  // decoded or encoded here), so the segment's CRC needs no pass over them.
  bool checkedCrc = false;

  static Record encoded(SharedBytes bytes, bool checkedCrc = false);
  static Record part(std::shared_ptr<const void> owner, std::span<const std::byte> bytes, bool checkedCrc);
  static Record of(std::shared_ptr<const SvBatch> batch);
  size_t size() const { return batch ? encodedSize(*batch) : bytes.size(); }
};

enum class EventKind : uint32_t { kGroup = 0, kAveraged = 1, kRotatedOut = 2, kRotatedIn = 3, kReset = 4 };

// One entry of a replica's log, as read back.
struct LogEntry {
  uint64_t clock = 0;               // the replica's local clock when it happened
  EventKind kind = EventKind::kGroup;
  std::vector<std::vector<std::byte>> records;  // kGroup: encoded SV batches applied together
  // kReset: the replica became its state at clock resetTo; the log before this entry
  // ends at clock logEnd (logEnd <= resetTo <= clock, logEnd < clock). resetTo past
  // logEnd is a snapshot.
  uint64_t resetTo = 0;
  uint64_t logEnd = 0;
};

struct ClockRange {
  uint64_t first = 0;
  uint64_t last = 0;  // inclusive
};

}  // namespace orpheus::ckpt
