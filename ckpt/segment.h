// The log segment format (one replica's log for clocks first..last; the layout and
// failure semantics are in ckpt/layout.h). A segment is an HDF5 file with
//   records        u8[]      the entries' records, one after another
//   entries        {clock u64, kind u32, records u32}[]   in apply order
//   record_sizes   u64[]     the size of every record, in order
// and the attributes version, first_clock, last_clock, replica, and crc32c: the
// CRC32C over the records' bytes, then the entries' rows, then the sizes, in their
// little-endian form. A reset entry has one 16-byte record: the clock reset to and
// the end of the log before it (u64 each). A group's records are SV batch records
// (engine/base/sv_batch.h) or, from version 3 on, batch references (ckpt/log_entry.h,
// BatchRef): a replica's own batch of a clock is stored whole in its own log, once,
// and the batches it received are references into the logs of the replicas that
// computed them. Versions 1 and 2 hold every applied batch whole; they are read as
// they are.
//
// Chaining. A segment of replica R covers its local clocks first..last; the
// segments of R chain when each starts right after the previous one ends, or at the
// very clock the previous one ends: a rotation hands a replica over in the middle of
// a clock (the old holder logs the clock's batches and "rotated out", the new holder
// "rotated in"), so both holders' segments hold a part of that clock. A writer never
// closes a segment that holds nothing but the hand-over clock, so the two holders
// never write the same file name.
#pragma once

#include "ckpt/durable.h"
#include "ckpt/log_entry.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orpheus::ckpt {

// Version 2 added the reset event, version 3 batch references, version 4 the
// membership and chunk records (ckpt/log_entry.h), and knobs records that set the SV
// value width (bf16). A segment is written as version
// 4 only when it holds such a record; any other is written as before (3, or 2 when
// asked), byte for byte, so a build that predates version 4 still reads it.
inline constexpr int64_t kSegmentVersion = 3;
inline constexpr int64_t kSegmentVersionJobRecords = 4;
// The oldest version a writer may still be asked for (every received batch copied).
inline constexpr int64_t kSegmentVersionCopies = 2;

// Whether a segment starting at `first` continues a chain that has reached `reached`
// (`started` false: nothing yet, so the chain must start at the first clock).
bool continuesChain(uint64_t reached, bool started, uint64_t first);

// One row of a segment's "entries" dataset.
struct EntryRow {
  uint64_t clock;
  uint32_t kind;
  uint32_t records;
};
static_assert(sizeof(EntryRow) == 16, "EntryRow is stored without padding");

// A segment being built: its records copied, one after another, into one aligned
// buffer (SV batches encoded there), with their rows, sizes and CRC.
struct BuiltSegment {
  int replica = -1;  // -1: nothing being built
  AlignedBuffer data;
  size_t used = 0;
  std::vector<EntryRow> rows;
  std::vector<uint64_t> sizes;
  uint32_t recordsCrc = 0;  // CRC32C of all records' bytes, concatenated
  size_t bytes = 0;         // record bytes, as the writer counts them staged

  void reset(int id);
  // Copies one entry in: encoded records as they are, SV batches encoded; each
  // record's CRC is taken from its header when that is known to be right, else
  // computed on the copy while it is in cache. `expectedBytes`: what a segment
  // usually holds, so the buffer is allocated once.
  void append(uint64_t clock, EventKind kind, const std::vector<Record>& records, size_t expectedBytes);
};

// The record of a reset entry.
SharedBytes resetRecord(uint64_t resetTo, uint64_t logEnd);

// Writes replica `replica`'s segment of clocks first..last durably; `between` runs
// while the records are being written (between pieces). Returns the file's size.
// `version`: kSegmentVersion, or kSegmentVersionCopies when the segment holds no
// references (the format older readers know); kSegmentVersionJobRecords instead
// when the segment holds a membership or chunk record.
uint64_t writeSegment(const std::string& dir, int replica, uint64_t first, uint64_t last, const BuiltSegment& seg,
                      const std::function<void()>& between, int64_t version = kSegmentVersion);

// Reads and verifies a segment against its name and CRC. Returns why it is damaged,
// or "" with its entries in `out`, the clocks its resets lost in `lost`, its events
// (every entry but groups, without records but the one of a kKnobs, kMembership or kChunks entry) in `events`, the batch references of
// its groups in `uses`, and the clocks of the replica's own batches it holds (SV
// batch records of groups whose header names the replica) in `ownBatches`, in
// order (each when given).
std::string loadSegment(const std::string& path, int replica, uint64_t first, uint64_t last, std::vector<LogEntry>* out,
                        std::vector<ClockRange>* lost = nullptr, std::vector<LogEntry>* events = nullptr,
                        std::vector<BatchUse>* uses = nullptr, std::vector<uint64_t>* ownBatches = nullptr);

// Whether the segment at `path` holds a membership or chunk record, from its
// entries alone (nothing else is read or checked; an unreadable file holds none).
bool holdsJobRecords(const std::string& path);

}  // namespace orpheus::ckpt
