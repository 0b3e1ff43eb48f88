#include "ckpt/clock_log.h"

#include "ckpt/layout.h"
#include "ckpt/model_file.h"
#include "ckpt/snapshot.h"
#include "ckpt/sv_log_writer.h"
#include "engine/base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <malloc.h>
#include <optional>
#include <utility>

namespace orpheus::ckpt {
namespace {

// Clocks between the ranks' agreements on the checkpoint writers' health.
constexpr uint64_t kLogCheckEvery = 50;

class NullClockLog final : public ClockLog {
 public:
  bool keepsRecords() const override { return false; }
  void appendGroup(uint64_t, std::vector<Record>) override {}
  Record received(const SvBatchHeader&, Record copy) const override { return copy; }
  void endClock(uint64_t) override {}
  void knobs(uint64_t, std::span<const std::byte>) override {}
  void jobRecord(uint64_t, EventKind, std::string_view) override {}
  void averaged(uint64_t, const ParamSet&) override {}
  void handOff(uint64_t) override {}
  void takeOver(uint64_t, int) override {}
  void flush() override {}
  void resumeAt(int, uint64_t) override {}
  void rejoin(uint64_t, const ParamSet*) override {}
  void abandon() override {}
  uint64_t loseStaged() override { return 0; }
  void recordReset(uint64_t, uint64_t) override {}
  double waitSeconds() const override { return 0.0; }
  double writerCpuSeconds() const override { return 0.0; }
};

WriterOptions writerOptions(const ClockLogOptions& o) {
  WriterOptions w;
  w.version = o.references ? kSegmentVersion : std::min<int64_t>(o.format, kSegmentVersion);
  w.idle = o.writerIdle;
  return w;
}

class SvClockLog final : public ClockLog {
 public:
  SvClockLog(const ClockLogOptions& options, ClockLogHooks hooks)
      : options_(options),
        hooks_(std::move(hooks)),
        writer_(options.dir, options.replica, options.stagingBytes, options.clocksPerSegment, writerOptions(options)) {
    if (!hooks_.collectively) hooks_.collectively = [](const std::function<void()>& step) { step(); };
  }

  bool keepsRecords() const override { return !options_.references; }
  void appendGroup(uint64_t clock, std::vector<Record> records) override {
    writer_.appendGroup(clock, std::move(records));
  }
  Record received(const SvBatchHeader& header, Record copy) const override {
    if (!options_.references) return copy;
    BatchRef ref;
    ref.replica = header.replica;
    ref.sender = header.sender;
    ref.clock = header.clock;
    ref.select = hooks_.select ? hooks_.select() : 0;
    ref.method = options_.selectMethod;
    return Record::reference(ref);
  }
  void endClock(uint64_t clock) override {
    writer_.endClock(clock);
    // A membership record is durable at the end of its epoch's first clock
    // (orpheus ctl reads the job's ranks from it); a segment of the change clock
    // alone would take the name of the previous holder's last one.
    if (membershipAt_ && clock >= *membershipAt_) {
      if (clock > *membershipAt_) writer_.closeSoon();
      if (writer_.segmentEndsAtLastClock()) membershipAt_.reset();
    }
    lastEnded_ = clock;
    if (writer_.segmentEndsAtLastClock()) writeCarriedState(clock);
    if (clock % kLogCheckEvery == 0) hooks_.collectively([&] { writer_.check(); });
  }
  void knobs(uint64_t clock, std::span<const std::byte> record) override { writer_.appendKnobs(clock, record); }
  void jobRecord(uint64_t clock, EventKind kind, std::string_view line) override {
    writer_.appendJobRecord(clock, kind, line);
    if (kind == EventKind::kMembership) membershipAt_ = clock;
  }
  void averaged(uint64_t clock, const ParamSet& replica) override {
    ++averagings_;
    writer_.appendEvent(clock, EventKind::kAveraged);
    if (averagings_ % std::max<int64_t>(options_.snapshotEvery, 1) != 0) return;
    // Every part is on disk once all ranks pass here: the snapshot is complete.
    hooks_.collectively([&] { writeSnapshotPart(options_.dir, clock, options_.rank, options_.ranks, replica); });
    lastSnapshot_ = clock;
  }
  void handOff(uint64_t clock) override {
    writeCarriedState(clock);
    writer_.appendEvent(clock, EventKind::kRotatedOut);
    const auto start = std::chrono::steady_clock::now();
    hooks_.collectively([&] { writer_.flush(); });
    handOffSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void takeOver(uint64_t clock, int id) override {
    writer_.switchReplica(id);
    writer_.appendEvent(clock, EventKind::kRotatedIn);
  }
  void flush() override {
    if (lastEnded_ > 0) writeCarriedState(lastEnded_);
    hooks_.collectively([&] { writer_.flush(); });
  }
  void resumeAt(int id, uint64_t clock) override {
    writer_.resumeAt(id, clock);
    lastEnded_ = clock;
    statesWritten_ = clock;  // the resumed job read them
  }
  void rejoin(uint64_t clock, const ParamSet* snapshot) override {
    // As a rotation's new holder does: a segment that starts at the change clock.
    writer_.switchReplica(writer_.replica());
    writer_.appendEvent(clock, EventKind::kAveraged);
    hooks_.collectively([&] {
      if (snapshot != nullptr) writeSnapshotPart(options_.dir, clock, options_.rank, options_.ranks, *snapshot);
    });
    lastSnapshot_ = clock;
  }
  void abandon() override { writer_.abandon(); }
  uint64_t loseStaged() override {
    logEnd_ = writer_.discardStaged();
    return std::max(logEnd_, lastSnapshot_);
  }
  void recordReset(uint64_t clock, uint64_t to) override {
    // Unless the log on disk reaches this very clock, its entries since its end
    // are gone: the reset says where the replica stands.
    if (logEnd_ < clock) writer_.appendReset(clock, to);
  }
  double waitSeconds() const override { return writer_.waitSeconds() + handOffSeconds_; }
  double writerCpuSeconds() const override { return writer_.cpuSeconds(); }

 private:
  // Before the segment that ends at `clock` can be durable (it closes when a later
  // clock begins, or in handOff or flush after this), so a resumable clock has its
  // states on disk unless the write failed, which stops the job.
  void writeCarriedState(uint64_t clock) {
    if (!hooks_.carriedState || clock == statesWritten_) return;
    const std::string path = statesPath(options_.dir, clock, options_.rank).string();
    std::error_code ec;
    std::filesystem::create_directories(statesDir(options_.dir, clock), ec);
    if (ec) {
      throw IoError(fmt::format("cannot create '{}': {}", statesDir(options_.dir, clock).string(), ec.message()));
    }
    ModelFileInfo info;
    info.modelSpec = options_.modelSpec;
    info.clock = static_cast<int64_t>(clock);
    info.replica = options_.rank;
    saveParams(path, hooks_.carriedState(), info);
    statesWritten_ = clock;
  }

  ClockLogOptions options_;
  ClockLogHooks hooks_;
  SvLogWriter writer_;
  int64_t averagings_ = 0;
  uint64_t lastSnapshot_ = 0;  // the newest snapshot known complete on disk
  uint64_t logEnd_ = 0;        // where the log on disk ended at the last failure
  double handOffSeconds_ = 0.0;
  uint64_t lastEnded_ = 0;      // the clock endClock was last given
  uint64_t statesWritten_ = 0;  // the newest clock whose carried state is on disk
  std::optional<uint64_t> membershipAt_;  // a membership record of this clock is not yet durable
};

}  // namespace

std::unique_ptr<ClockLog> makeClockLog(const ClockLogOptions& options, ClockLogHooks hooks) {
  if (!options.enabled) return std::make_unique<NullClockLog>();
  // The log's IO thread frees each clock's batches once it has copied them, a
  // little after the clock. Keep freed memory in the heap for the next clock's
  // batches rather than handing it back to the system and faulting it in again.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return std::make_unique<SvClockLog>(options, std::move(hooks));
}

}  // namespace orpheus::ckpt
