#include "ckpt/segment.h"

#include "ckpt/h5.h"
#include "ckpt/layout.h"
#include "engine/base/crc32c.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>

namespace orpheus::ckpt {
namespace {

namespace fs = std::filesystem;

// Every CRC here is defined over the little-endian encoding of the stored values,
// which on the supported hosts is their in-memory representation.
static_assert(std::endian::native == std::endian::little, "checkpoint CRCs assume a little-endian host");

// A compound type for EntryRow: `file` true gives the stored little-endian layout.
H5Handle entryType(bool file) {
  H5Handle type(H5Tcreate(H5T_COMPOUND, sizeof(EntryRow)), H5Tclose);
  H5Tinsert(type.get(), "clock", HOFFSET(EntryRow, clock), file ? H5T_STD_U64LE : H5T_NATIVE_UINT64);
  H5Tinsert(type.get(), "kind", HOFFSET(EntryRow, kind), file ? H5T_STD_U32LE : H5T_NATIVE_UINT32);
  H5Tinsert(type.get(), "records", HOFFSET(EntryRow, records), file ? H5T_STD_U32LE : H5T_NATIVE_UINT32);
  return type;
}

// The segment's CRC: over all records' bytes, then the rows, then the sizes.
uint32_t segmentCrc(uint32_t recordsCrc, const std::vector<EntryRow>& rows, const std::vector<uint64_t>& sizes) {
  uint32_t crc = crc32c(recordsCrc, rows.data(), rows.size() * sizeof(EntryRow));
  return crc32c(crc, sizes.data(), sizes.size() * sizeof(uint64_t));
}

uint32_t segmentCrc(const std::vector<uint8_t>& records, const std::vector<EntryRow>& rows,
                    const std::vector<uint64_t>& sizes) {
  return segmentCrc(crc32c(0, records.data(), records.size()), rows, sizes);
}

}  // namespace

bool continuesChain(uint64_t reached, bool started, uint64_t first) {
  if (!started) return first <= 1;
  return first == reached + 1 || first == reached;
}

Record Record::encoded(SharedBytes bytes, bool checkedCrc) {
  ORPHEUS_ENFORCE(bytes != nullptr, "checkpoint log: a null record");
  Record r;
  r.bytes = std::span<const std::byte>(*bytes);
  r.owner = std::move(bytes);
  r.checkedCrc = checkedCrc;
  return r;
}

Record Record::part(std::shared_ptr<const void> owner, std::span<const std::byte> bytes, bool checkedCrc) {
  ORPHEUS_ENFORCE(owner != nullptr, "checkpoint log: a record without its owner");
  Record r;
  r.owner = std::move(owner);
  r.bytes = bytes;
  r.checkedCrc = checkedCrc;
  return r;
}

Record Record::reference(const BatchRef& ref) {
  Record r;
  r.ref = ref;
  return r;
}

void encodeBatchRef(const BatchRef& ref, std::byte* out) {
  std::memset(out, 0, kBatchRefBytes);
  const uint16_t version = 1;
  std::memcpy(out + 0, &kBatchRefMagic, 4);
  std::memcpy(out + 4, &version, 2);
  std::memcpy(out + 8, &ref.replica, 4);
  std::memcpy(out + 12, &ref.sender, 4);
  std::memcpy(out + 16, &ref.clock, 8);
  std::memcpy(out + 24, &ref.select, 4);
  std::memcpy(out + 28, &ref.method, 4);
}

std::optional<BatchRef> parseBatchRef(std::span<const std::byte> record) {
  uint32_t magic = 0;
  uint16_t version = 0;
  if (record.size() != kBatchRefBytes) return std::nullopt;
  std::memcpy(&magic, record.data(), 4);
  std::memcpy(&version, record.data() + 4, 2);
  if (magic != kBatchRefMagic || version != 1) return std::nullopt;
  BatchRef ref;
  std::memcpy(&ref.replica, record.data() + 8, 4);
  std::memcpy(&ref.sender, record.data() + 12, 4);
  std::memcpy(&ref.clock, record.data() + 16, 8);
  std::memcpy(&ref.select, record.data() + 24, 4);
  std::memcpy(&ref.method, record.data() + 28, 4);
  return ref;
}

std::optional<BatchOrigin> peekBatchOrigin(std::span<const std::byte> record) {
  uint32_t magic = 0;
  if (record.size() < kSvBatchHeaderBytes) return std::nullopt;
  std::memcpy(&magic, record.data(), 4);
  if (magic != kSvBatchMagic) return std::nullopt;
  BatchOrigin o;
  std::memcpy(&o.replica, record.data() + 20, 4);
  std::memcpy(&o.clock, record.data() + 24, 8);
  return o;
}

Record Record::of(std::shared_ptr<const SvBatch> batch) {
  ORPHEUS_ENFORCE(batch != nullptr, "checkpoint log: a null batch");
  Record r;
  r.batch = std::move(batch);
  return r;
}

void BuiltSegment::reset(int id) {
  replica = id;
  used = 0;
  rows.clear();
  sizes.clear();
  recordsCrc = 0;
  bytes = 0;
}

void BuiltSegment::append(uint64_t clock, EventKind kind, const std::vector<Record>& records, size_t expectedBytes) {
  rows.push_back({clock, static_cast<uint32_t>(kind), static_cast<uint32_t>(records.size())});
  for (const Record& r : records) {
    const size_t size = r.size();
    data.reserve(used + size, used, expectedBytes);
    std::byte* out = data.data() + used;
    uint32_t crc = 0;
    if (r.ref) {
      encodeBatchRef(*r.ref, out);
      crc = crc32c(0, out, size);
    } else if (r.batch) {
      crc = wholeRecordCrc(encodeInto(*r.batch, out), size);
    } else if (r.checkedCrc) {
      streamCopy(out, r.bytes.data(), size);
      crc = wholeRecordCrc(storedCrc(r.bytes), size);
    } else {
      crc = copyWithCrc(r.bytes.data(), size, out);
    }
    used += size;
    sizes.push_back(size);
    recordsCrc = crc32cCombine(recordsCrc, crc, size);
  }
}

namespace {

// Whether the segment holds what only format 4 reads: a job record, or a knobs
// record that sets the SV value width or the rank.
bool needsFormat4(const BuiltSegment& seg) {
  size_t record = 0;
  for (const EntryRow& r : seg.rows) {
    const auto kind = static_cast<EventKind>(r.kind);
    if (isJobRecord(kind)) return true;
    if (kind == EventKind::kKnobs && isFormat4Knobs(seg.sizes[record])) return true;
    record += r.records;
  }
  return false;
}

}  // namespace

SharedBytes resetRecord(uint64_t resetTo, uint64_t logEnd) {
  auto record = std::make_shared<std::vector<std::byte>>(2 * sizeof(uint64_t));
  const uint64_t values[2] = {resetTo, logEnd};
  std::memcpy(record->data(), values, sizeof(values));
  return record;
}

uint64_t writeSegment(const std::string& dir, int replica, uint64_t first, uint64_t last, const BuiltSegment& seg,
                      const std::function<void()>& between, int64_t version) {
  const fs::path path = segmentPath(dir, replica, first, last);
  const std::string name = path.string();
  const uint64_t total = seg.used;
  haddr_t recordsAt = HADDR_UNDEF;  // where the records go once HDF5 has closed the file
  const auto fill = [&](hid_t file) {
    {
      // The records dataset is allocated now, contiguous, block aligned and never
      // filled; its bytes are written after HDF5 closes the file, straight from the
      // segment's buffer.
      const hsize_t count = total;
      H5Handle space(H5Screate_simple(1, &count, nullptr), H5Sclose);
      H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
      H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
      H5Handle set(ORPHEUS_H5_CHECK(H5Dcreate2(file, "records", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(),
                                               H5P_DEFAULT),
                                    name, "create dataset 'records' in"),
                   H5Dclose);
      if (total > 0) recordsAt = H5Dget_offset(set.get());
      if (total > 0 && recordsAt == HADDR_UNDEF) writeAll(set.get(), H5T_NATIVE_UINT8, seg.data.data(), "records", name);
    }
    {
      H5Handle fileType = entryType(true);
      H5Handle memType = entryType(false);
      H5Handle set = createVector(file, "entries", fileType.get(), seg.rows.size(), name);
      if (!seg.rows.empty()) writeAll(set.get(), memType.get(), seg.rows.data(), "entries", name);
    }
    {
      H5Handle set = createVector(file, "record_sizes", H5T_STD_U64LE, seg.sizes.size(), name);
      if (!seg.sizes.empty()) writeAll(set.get(), H5T_NATIVE_UINT64, seg.sizes.data(), "record_sizes", name);
    }
    writeI64Attr(file, "version", needsFormat4(seg) ? kSegmentVersionJobRecords : version, name);
    writeU64Attr(file, "first_clock", first, name);
    writeU64Attr(file, "last_clock", last, name);
    writeI64Attr(file, "replica", replica, name);
    writeU32Attr(file, "crc32c", segmentCrc(seg.recordsCrc, seg.rows, seg.sizes), name);
  };
  const auto raw = [&](const fs::path& tmp) {
    if (recordsAt != HADDR_UNDEF) writeDirect(tmp, name, recordsAt, seg.data.data(), total, between);
  };
  return writeH5Durably(path, H5FileKind::kLog, fill, raw);
}

namespace {

// A segment's datasets as read back.
struct SegmentData {
  std::vector<uint8_t> records;
  std::vector<EntryRow> rows;
  std::vector<uint64_t> sizes;
};

// What a segment's entries yield besides the entries themselves; each may be null.
struct SegmentScan {
  std::vector<ClockRange>* lost;
  std::vector<LogEntry>* events;
  std::vector<BatchUse>* uses;
  std::vector<uint64_t>* ownBatches;
};

// The attributes, against the segment's name; "" when they agree.
std::string checkAttributes(hid_t file, int replica, uint64_t first, uint64_t last, int64_t* version,
                            uint32_t* storedCrc) {
  int64_t storedReplica = 0;
  uint64_t storedFirst = 0, storedLast = 0;
  if (!readI64Attr(file, "version", version) || !readU64Attr(file, "first_clock", &storedFirst) ||
      !readU64Attr(file, "last_clock", &storedLast) || !readI64Attr(file, "replica", &storedReplica) ||
      !readU32Attr(file, "crc32c", storedCrc)) {
    return "its attributes are missing or unreadable";
  }
  if (*version < 1 || *version > kSegmentVersionJobRecords) {
    return fmt::format("unknown format version {}", *version);
  }
  if (storedFirst != first || storedLast != last || first > last) {
    return fmt::format("it holds clocks {}..{}, its name says {}..{}", storedFirst, storedLast, first, last);
  }
  if (storedReplica != replica) return fmt::format("it belongs to replica {}", storedReplica);
  return "";
}

// The datasets, checked against the stored CRC and against each other.
std::string readData(hid_t file, uint32_t storedCrc, SegmentData& data) {
  H5Handle memType = entryType(false);
  if (!readVector(file, "records", H5T_NATIVE_UINT8, &data.records)) return "dataset 'records' is unreadable";
  if (!readVector(file, "entries", memType.get(), &data.rows)) return "dataset 'entries' is unreadable";
  if (!readVector(file, "record_sizes", H5T_NATIVE_UINT64, &data.sizes)) {
    return "dataset 'record_sizes' is unreadable";
  }
  if (segmentCrc(data.records, data.rows, data.sizes) != storedCrc) return "CRC32C mismatch";

  // The CRC matched, so what follows only fails for a file written by something else.
  uint64_t recordCount = 0, byteCount = 0;
  for (const EntryRow& r : data.rows) recordCount += r.records;
  for (uint64_t s : data.sizes) {
    // Checked before adding, so sizes that wrap around cannot pass as the total.
    if (s > data.records.size() - byteCount) return "entries, sizes and records disagree";
    byteCount += s;
  }
  if (recordCount != data.sizes.size() || byteCount != data.records.size()) {
    return "entries, sizes and records disagree";
  }
  return "";
}

// A reset event (one record: the clock reset to and the end of the log before it)
// at `offset` of the records.
std::string scanReset(const SegmentData& data, const EntryRow& r, size_t record, size_t offset, bool firstRow,
                      uint64_t previous, uint64_t first, const SegmentScan& scan) {
  if (r.records != 1 || data.sizes[record] != 2 * sizeof(uint64_t)) return "a reset event is malformed";
  uint64_t values[2];
  std::memcpy(values, data.records.data() + offset, sizeof(values));
  const uint64_t resetTo = values[0], logEnd = values[1];
  if (logEnd > resetTo || resetTo > r.clock || logEnd >= r.clock || logEnd + 1 < first) {
    return fmt::format("a reset at clock {} to clock {} after a log ending at clock {}", r.clock, resetTo, logEnd);
  }
  if (previous > logEnd && !firstRow) {
    return fmt::format("the reset at clock {} follows entries past clock {}", r.clock, logEnd);
  }
  if (scan.lost) {
    // The states of the clocks between the log's end and the reset are gone,
    // except a snapshot's the replica was reset to.
    const uint64_t cut = resetTo > logEnd && resetTo < r.clock ? resetTo : r.clock;
    if (logEnd + 1 < cut) scan.lost->push_back({logEnd + 1, cut - 1});
    if (cut + 1 < r.clock) scan.lost->push_back({cut + 1, r.clock - 1});
  }
  if (scan.events) {
    LogEntry e;
    e.clock = r.clock;
    e.kind = EventKind::kReset;
    e.resetTo = resetTo;
    e.logEnd = logEnd;
    scan.events->push_back(std::move(e));
  }
  return "";
}

// A group's records: the batch references it uses and the batches of `replica` it holds.
std::string scanGroup(const SegmentData& data, const EntryRow& r, size_t record, size_t offset, int64_t version,
                      int replica, const SegmentScan& scan) {
  size_t at = offset;
  for (uint32_t i = 0; i < r.records; ++i) {
    const auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.records.data()) + at,
                                                  data.sizes[record + i]);
    at += data.sizes[record + i];
    if (const auto ref = parseBatchRef(bytes)) {
      if (version < 3) return fmt::format("a batch reference at clock {} in a version {} segment", r.clock, version);
      if (scan.uses) scan.uses->push_back({r.clock, ref->replica, ref->clock});
    } else if (const auto origin = peekBatchOrigin(bytes)) {
      if (scan.ownBatches && origin->replica == static_cast<uint32_t>(replica)) {
        scan.ownBatches->push_back(origin->clock);
      }
    }
  }
  return "";
}

// Checks every entry's clock and kind, and gathers what `scan` asks for.
std::string scanEntries(const SegmentData& data, int64_t version, int replica, uint64_t first, uint64_t last,
                        const SegmentScan& scan) {
  uint64_t previous = first;
  size_t record = 0, offset = 0;
  for (const EntryRow& r : data.rows) {
    if (r.clock < previous || r.clock > last) return fmt::format("entry of clock {} out of order", r.clock);
    const auto kind = static_cast<EventKind>(r.kind);
    const auto known = static_cast<uint32_t>(version >= kSegmentVersionJobRecords ? EventKind::kChunks
                                                                                   : EventKind::kKnobs);
    if (r.kind > known) return fmt::format("unknown entry kind {}", r.kind);
    std::string error;
    if (kind == EventKind::kReset) {
      error = scanReset(data, r, record, offset, &r == &data.rows.front(), previous, first, scan);
    } else if (kind == EventKind::kKnobs || isJobRecord(kind)) {
      // The record count first: a row without records has no size to read.
      const bool knobsSize = r.records == 1 && (data.sizes[record] == kKnobsRecordBytes ||
                                                (version >= kSegmentVersionJobRecords &&
                                                 isFormat4Knobs(data.sizes[record])));
      if (r.records != 1 || (kind == EventKind::kKnobs && !knobsSize)) {
        return fmt::format("a {} event is malformed", kind == EventKind::kKnobs ? "knobs" : "job record");
      }
      if (scan.events) {
        LogEntry e;
        e.clock = r.clock;
        e.kind = kind;
        const auto* begin = reinterpret_cast<const std::byte*>(data.records.data()) + offset;
        e.records.emplace_back(begin, begin + data.sizes[record]);
        scan.events->push_back(std::move(e));
      }
    } else if (kind == EventKind::kGroup) {
      error = scanGroup(data, r, record, offset, version, replica, scan);
    } else {
      if (r.records != 0) return "an event carries records";
      if (scan.events) {
        LogEntry e;
        e.clock = r.clock;
        e.kind = kind;
        scan.events->push_back(std::move(e));
      }
    }
    if (!error.empty()) return error;
    for (uint32_t i = 0; i < r.records; ++i, ++record) offset += data.sizes[record];
    previous = r.clock;
  }
  return "";
}

// Every entry with its records (a reset: its two clocks).
void collectEntries(const SegmentData& data, std::vector<LogEntry>& out) {
  size_t record = 0, offset = 0;
  for (const EntryRow& r : data.rows) {
    LogEntry e;
    e.clock = r.clock;
    e.kind = static_cast<EventKind>(r.kind);
    if (e.kind == EventKind::kReset) {
      uint64_t values[2];
      std::memcpy(values, data.records.data() + offset, sizeof(values));
      e.resetTo = values[0];
      e.logEnd = values[1];
      offset += data.sizes[record++];
      out.push_back(std::move(e));
      continue;
    }
    e.records.reserve(r.records);
    for (uint32_t i = 0; i < r.records; ++i, ++record) {
      const auto* begin = reinterpret_cast<const std::byte*>(data.records.data()) + offset;
      e.records.emplace_back(begin, begin + data.sizes[record]);
      offset += data.sizes[record];
    }
    out.push_back(std::move(e));
  }
}

}  // namespace

std::string loadSegment(const std::string& path, int replica, uint64_t first, uint64_t last, std::vector<LogEntry>* out,
                        std::vector<ClockRange>* lost, std::vector<LogEntry>* events, std::vector<BatchUse>* uses,
                        std::vector<uint64_t>* ownBatches) {
  H5Handle file = openH5ForReading(path);
  if (!file.valid()) return "not a readable HDF5 file (truncated or overwritten)";
  int64_t version = 0;
  uint32_t storedCrc = 0;
  std::string error = checkAttributes(file.get(), replica, first, last, &version, &storedCrc);
  if (!error.empty()) return error;
  SegmentData data;
  error = readData(file.get(), storedCrc, data);
  if (!error.empty()) return error;
  error = scanEntries(data, version, replica, first, last, SegmentScan{lost, events, uses, ownBatches});
  if (!error.empty()) return error;
  if (out) collectEntries(data, *out);
  return "";
}

bool holdsJobRecords(const std::string& path) {
  H5Handle file = openH5ForReading(path);
  if (!file.valid()) return false;
  H5Handle memType = entryType(false);
  std::vector<EntryRow> rows;
  if (!readVector(file.get(), "entries", memType.get(), &rows)) return false;
  return std::any_of(rows.begin(), rows.end(), [](const EntryRow& r) {
    return isJobRecord(static_cast<EventKind>(r.kind));
  });
}

}  // namespace orpheus::ckpt
