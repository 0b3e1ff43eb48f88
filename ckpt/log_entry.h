// What a replica's log holds (ckpt/layout.h describes the log): the records the
// writer takes, and the entries a reader gets back.
#pragma once

#include "engine/base/sv_batch.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace orpheus::ckpt {

using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

// A group's record of a batch another replica computed and sent here: each SV batch
// is written once per job, by the replica that computed it (its whole local batch,
// in that replica's own group), and every replica that applied it logs this
// reference instead of a copy. What the receiver applied is a function of the
// referenced batch and these fields (engine/recovery/checkpoint.cc recomputes it); the log
// itself only reads `replica` and `clock`. Stored as 32 bytes, little-endian:
//   0 magic "ORSR"   4 version u16 (=1)   6 reserved u16   8 replica u32
//  12 sender u32    16 clock u64         24 select i32    28 method u32
struct BatchRef {
  uint32_t replica = 0;  // the replica that computed the batch (its log holds it)
  uint32_t sender = 0;   // the rank that held it then (seeds the selection)
  uint64_t clock = 0;    // the sender's clock
  int32_t select = 0;    // C of the selection applied before sending (0: none)
  uint32_t method = 0;   // the selection method, as the engine numbers it
};
inline constexpr uint32_t kBatchRefMagic = 0x5253524fu;  // "ORSR" read little-endian
inline constexpr size_t kBatchRefBytes = 32;
void encodeBatchRef(const BatchRef& ref, std::byte* out);
// The reference a record holds, or none when it is not one (an SV batch record).
std::optional<BatchRef> parseBatchRef(std::span<const std::byte> record);
// Where an SV batch record says it comes from (its header, unchecked); none when
// the record is too short or not an SV batch.
struct BatchOrigin {
  uint32_t replica = 0;
  uint64_t clock = 0;
};
std::optional<BatchOrigin> peekBatchOrigin(std::span<const std::byte> record);

// One record of a group as the writer takes it; nothing is copied. Either bytes
// already encoded (a batch as it travelled, kept alive by `owner`), an SV batch
// the IO thread encodes straight into the segment (the worker's own batch: the
// compute thread does no encoding for the log), or a reference to a batch another
// replica's log holds.
struct Record {
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
  std::shared_ptr<const SvBatch> batch;
  std::optional<BatchRef> ref;
  // `bytes` are an SV batch record whose header CRC is known to be right (it was
  // decoded or encoded here), so the segment's CRC needs no pass over them.
  bool checkedCrc = false;

  static Record encoded(SharedBytes bytes, bool checkedCrc = false);
  static Record part(std::shared_ptr<const void> owner, std::span<const std::byte> bytes, bool checkedCrc);
  static Record of(std::shared_ptr<const SvBatch> batch);
  static Record reference(const BatchRef& ref);
  size_t size() const { return ref ? kBatchRefBytes : batch ? encodedSize(*batch) : bytes.size(); }
};

// kKnobs (added after the first logs; older logs hold none): the coordinator set
// the communication knobs at this clock (--adapt); one record of
// kKnobsRecordBytes (or kKnobsRecordBytesWide or kKnobsRecordBytesRank, format 4), as engine/adapt/knobs.h encodes it. Replay applies nothing for
// it: the batches already carry what the knobs did.
//
// kMembership and kChunks (segment format 4; older directories keep them in the
// text files DIR/membership and DIR/chunks): the job's own records, which every
// rank writes into the log of the replica it holds, so any replica's log that
// survives holds them (ckpt/replay.h reads them from all, one of each). Each has
// one record, a line of text spelled as the old text files spell it:
//   kMembership  "epoch E clock C ranks P": membership epoch E starts after clock C
//   kChunks      "layout rows R shards n0 n1 ...": --balance's chunk layout, or
//                "clock K moves c:f>t ...": the chunk moves after clock K
// Replay applies nothing for them either.
enum class EventKind : uint32_t {
  kGroup = 0, kAveraged = 1, kRotatedOut = 2, kRotatedIn = 3, kReset = 4, kKnobs = 5, kMembership = 6, kChunks = 7
};
inline constexpr size_t kKnobsRecordBytes = 32;
// A knobs record that also sets the SV value width (bf16): segment format 4.
inline constexpr size_t kKnobsRecordBytesWide = 40;
// A knobs record that also sets the rank of --sv-rank's batches: segment format 4.
inline constexpr size_t kKnobsRecordBytesRank = 48;
// Whether a knobs record of `size` bytes needs segment format 4.
inline bool isFormat4Knobs(size_t size) { return size == kKnobsRecordBytesWide || size == kKnobsRecordBytesRank; }
// The longest membership or chunk record a log takes.
inline constexpr size_t kTextRecordMaxBytes = size_t{1} << 20;
// Whether `kind` is one of the job's own records (kMembership, kChunks).
inline bool isJobRecord(EventKind kind) { return kind == EventKind::kMembership || kind == EventKind::kChunks; }

// One entry of a replica's log, as read back.
struct LogEntry {
  uint64_t clock = 0;               // the replica's local clock when it happened
  EventKind kind = EventKind::kGroup;
  std::vector<std::vector<std::byte>> records;  // kGroup: encoded SV batches applied together; kKnobs, kMembership, kChunks: its record
  // kReset: the replica became its state at clock resetTo; the log before this entry
  // ends at clock logEnd (logEnd <= resetTo <= clock, logEnd < clock). resetTo past
  // logEnd is a snapshot.
  uint64_t resetTo = 0;
  uint64_t logEnd = 0;
};

// A group's reference, as the log reader indexes it: at local clock `at` the
// replica applied the batch `replica` computed at its clock `clock`.
struct BatchUse {
  uint64_t at = 0;
  uint32_t replica = 0;
  uint64_t clock = 0;
};

struct ClockRange {
  uint64_t first = 0;
  uint64_t last = 0;  // inclusive
};

}  // namespace orpheus::ckpt
