#include "ckpt/sv_log_writer.h"

#include "ckpt/h5.h"
#include "ckpt/segment.h"
#include "engine/base/error.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <pthread.h>
#include <sched.h>

namespace orpheus::ckpt {
namespace {

// flush() and a full staging area wait for the IO thread; a disk that does not
// answer within this long is reported rather than waited on forever.
constexpr auto kStallTimeout = std::chrono::minutes(10);
// The most a segment holds before it closes early (a group may pass it).
constexpr size_t kSegmentBytes = size_t{64} << 20;

IoError stalled(size_t staged, int replica, const std::string& dir) {
  return IoError(fmt::format("checkpoint writer stalled: {} bytes of replica {} not written to '{}' in {} s", staged,
                             replica, dir, std::chrono::seconds(kStallTimeout).count()));
}

double threadCpuSeconds() {
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0.0;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

struct SvLogWriter::Segment : BuiltSegment {};

SvLogWriter::SvLogWriter(std::string dir, int replica, size_t stagingBytes, int clocksPerSegment,
                         WriterOptions options)
    : dir_(std::move(dir)),
      clocksPerSegment_(clocksPerSegment),
      stagingLimit_(stagingBytes),
      segmentBytes_(std::min(stagingBytes / 2, kSegmentBytes)),
      replica_(replica),
      options_(options),
      building_(std::make_unique<Segment>()),
      writing_(std::make_unique<Segment>()) {
  ORPHEUS_CHECK_INPUT(clocksPerSegment >= 1, "a log segment must span at least one clock, not {}", clocksPerSegment);
  ORPHEUS_CHECK_INPUT(replica >= 0, "replica id {} is negative", replica);
  ORPHEUS_CHECK_INPUT(options.version == kSegmentVersion || options.version == kSegmentVersionCopies,
                      "checkpoint log format {} is not one this build writes ({} or {})", options.version,
                      kSegmentVersionCopies, kSegmentVersion);
  thread_ = std::thread([this] { run(); });
}

SvLogWriter::~SvLogWriter() {
  if (!abandoned_) {
    try {
      flush();
    } catch (const std::exception& e) {
      spdlog::error("checkpoint log of replica {} is incomplete: {}", replica_, e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int SvLogWriter::replica() const { return replica_; }

uint64_t SvLogWriter::bytesWritten() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytesWritten_;
}

double SvLogWriter::cpuSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cpuSeconds_;
}

void SvLogWriter::push(Command command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(command));
  }
  cv_.notify_all();
}

void SvLogWriter::startSegment(uint64_t clock) {
  if (openStarted_) return;
  openStarted_ = true;
  // Within one replica this writer's segments chain exactly; the first one starts
  // at the first clock it sees.
  openFirst_ = chainEnd_ ? *chainEnd_ + 1 : clock;
  openLast_ = openFirst_;
}

void SvLogWriter::closeIfDue(uint64_t clock) {
  // A segment due at clock c stays open until a later clock begins: entries that
  // arrive after endClock(c) but still belong to clock c (late SSP batches) then
  // land in the segment that holds c.
  if (closeDue_ && clock > lastEnded_) closeSegment();
}

void SvLogWriter::stage(Entry entry, size_t bytes) {
  ORPHEUS_ENFORCE(entry.clock >= lastEntry_ && entry.clock >= lastEnded_,
                  "checkpoint log: an entry of clock {} after clock {} (ended: {})", entry.clock, lastEntry_,
                  lastEnded_);
  ORPHEUS_ENFORCE(!chainEnd_ || entry.clock > *chainEnd_,
                  "checkpoint log: an entry of clock {} after its segment was closed", entry.clock);
  startSegment(entry.clock);
  lastEntry_ = entry.clock;
  openLast_ = std::max(openLast_, entry.clock);
  openBytes_ += bytes;
  Command c;
  c.type = Command::Type::kEntry;
  c.replica = replica_;
  c.entry = std::move(entry);
  c.bytes = bytes;
  push(std::move(c));
}

void SvLogWriter::waitForRoom(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  // Only closed segments drain; the open one is held until its clock boundary, so a
  // group larger than what the queue can free is staged over the limit.
  const auto full = [&] { return staged_ + bytes > stagingLimit_ && staged_ > openBytes_ && !error_; };
  if (full()) {
    const auto start = std::chrono::steady_clock::now();
    const bool drained = cv_.wait_for(lock, kStallTimeout, [&] { return !full(); });
    waitSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!drained) {
      throw stalled(staged_, replica_, dir_);
    }
  }
  staged_ += bytes;
}

void SvLogWriter::appendGroup(uint64_t clock, std::vector<SharedBytes> records) {
  std::vector<Record> converted;
  converted.reserve(records.size());
  for (auto& r : records) {
    ORPHEUS_ENFORCE(r != nullptr, "checkpoint log: a null record in the group of clock {}", clock);
    converted.push_back(Record::encoded(std::move(r)));
  }
  appendGroup(clock, std::move(converted));
}

void SvLogWriter::appendGroup(uint64_t clock, std::vector<Record> records) {
  size_t bytes = 0;
  for (const auto& r : records) {
    ORPHEUS_ENFORCE(!r.ref || options_.version >= kSegmentVersion,
                    "checkpoint log: a batch reference at clock {} in format {}", clock, options_.version);
    bytes += r.size();
  }
  closeIfDue(clock);
  waitForRoom(bytes);
  stage(Entry{clock, EventKind::kGroup, std::move(records)}, bytes);
}

void SvLogWriter::appendEvent(uint64_t clock, EventKind kind) {
  ORPHEUS_ENFORCE(kind != EventKind::kGroup && kind != EventKind::kReset && kind != EventKind::kKnobs &&
                      !isJobRecord(kind),
                  "checkpoint log: event kind {} staged without its contents at clock {}", static_cast<uint32_t>(kind),
                  clock);
  stageEvent(clock, kind, {});
}

void SvLogWriter::appendKnobs(uint64_t clock, std::span<const std::byte> record) {
  ORPHEUS_ENFORCE(record.size() == kKnobsRecordBytes || isFormat4Knobs(record.size()),
                  "checkpoint log: a knobs record of {} bytes at clock {}",
                  record.size(), clock);
  stageEvent(clock, EventKind::kKnobs,
             {Record::encoded(std::make_shared<std::vector<std::byte>>(record.begin(), record.end()))});
}

void SvLogWriter::appendJobRecord(uint64_t clock, EventKind kind, std::string_view line) {
  ORPHEUS_ENFORCE(isJobRecord(kind) && !line.empty() && line.size() <= kTextRecordMaxBytes,
                  "checkpoint log: a job record of kind {} and {} bytes at clock {}", static_cast<uint32_t>(kind),
                  line.size(), clock);
  const auto* begin = reinterpret_cast<const std::byte*>(line.data());
  stageEvent(clock, kind, {Record::encoded(std::make_shared<std::vector<std::byte>>(begin, begin + line.size()))});
}

void SvLogWriter::stageEvent(uint64_t clock, EventKind kind, std::vector<Record> records) {
  closeIfDue(clock);
  size_t bytes = 0;
  // A job record (a line of text) counts as no staged bytes: a segment of nothing
  // but events and it at a hand-over clock stays open, as one of events only does.
  for (const auto& r : records) bytes += isJobRecord(kind) ? 0 : r.size();
  if (bytes > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    staged_ += bytes;
  }
  stage(Entry{clock, kind, std::move(records)}, bytes);
}

void SvLogWriter::endClock(uint64_t clock) {
  ORPHEUS_ENFORCE(clock >= lastEntry_ && clock >= lastEnded_ && (!chainEnd_ || clock > *chainEnd_),
                  "checkpoint log: clock {} ended after clock {} (entries up to {})", clock, lastEnded_, lastEntry_);
  closeIfDue(clock);
  startSegment(clock);
  lastEnded_ = clock;
  openLast_ = std::max(openLast_, clock);
  // A segment closes every clocksPerSegment clocks, or earlier once it holds
  // segmentBytes_ (at most half the staging area), so the disk writes one segment
  // while the next one fills, and the buffers they are built in stay small.
  const bool longEnough = clock - openFirst_ + 1 >= static_cast<uint64_t>(clocksPerSegment_);
  const bool big = openBytes_ > 0 && openBytes_ >= segmentBytes_;
  closeDue_ = closeDue_ || longEnough || big;
}

void SvLogWriter::closeSegment() {
  closeDue_ = false;
  if (!openStarted_) return;
  // A segment of nothing but the hand-over clock would take the previous holder's
  // file name (see chaining in ckpt/segment.h); it stays open into the next clock.
  const bool handOverOnly = handOver_ && openFirst_ == *handOver_ && openLast_ == *handOver_;
  if (handOverOnly && openBytes_ == 0) return;
  chainEnd_ = openLast_;
  Command c;
  c.type = Command::Type::kClose;
  c.replica = replica_;
  c.firstClock = openFirst_;
  c.lastClock = openLast_;
  openStarted_ = false;
  openBytes_ = 0;
  push(std::move(c));
}

void SvLogWriter::switchReplica(int id) {
  ORPHEUS_CHECK_INPUT(id >= 0, "replica id {} is negative", id);
  const uint64_t seen = std::max(lastEnded_, lastEntry_);
  closeSegment();
  if (openStarted_) {
    // Still open: only the hand-over events of the previous arrival, which are not
    // written, as the previous holder's segment already ends that clock.
    Command c;
    c.type = Command::Type::kDrop;
    c.replica = replica_;
    push(std::move(c));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    replica_ = id;
    durable_ = seen;
  }
  openStarted_ = false;
  openBytes_ = 0;
  chainEnd_.reset();
  lastEnded_ = 0;
  lastEntry_ = 0;
  handOver_ = seen > 0 ? std::optional<uint64_t>(seen) : std::nullopt;
}

void SvLogWriter::resumeAt(int id, uint64_t clock) {
  switchReplica(id);
  std::lock_guard<std::mutex> lock(mu_);
  durable_ = clock;
  handOver_.reset();
  if (clock > 0) {
    chainEnd_ = clock;
    lastEnded_ = clock;
  }
}

uint64_t SvLogWriter::discardStaged() {
  openStarted_ = false;
  openBytes_ = 0;
  closeDue_ = false;
  uint64_t durable = 0;
  std::deque<Command> dropped;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // What the IO thread has not taken of this replica was only in memory; what it
    // took and has not written goes with a drop. A write in progress completes.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->replica == replica_) {
        if (it->type == Command::Type::kEntry) staged_ -= it->bytes;
        dropped.push_back(std::move(*it));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    Command c;
    c.type = Command::Type::kDrop;
    c.replica = replica_;
    pending_.push_back(std::move(c));
    cv_.notify_all();
    const bool done = cv_.wait_for(lock, kStallTimeout, [&] { return pending_.empty() && idle_; });
    if (!done) {
      throw stalled(staged_, replica_, dir_);
    }
    durable = durable_;
  }
  // Entries after the durable end would follow a hole: the log continues from there.
  chainEnd_ = durable;
  handOver_.reset();
  return durable;
}

void SvLogWriter::appendReset(uint64_t clock, uint64_t resetTo) {
  ORPHEUS_ENFORCE(chainEnd_ && resetTo >= *chainEnd_ && resetTo <= clock && *chainEnd_ < clock,
                  "checkpoint log: a reset to clock {} at clock {} (log on disk up to {})", resetTo, clock,
                  chainEnd_ ? *chainEnd_ : 0);
  stageEvent(clock, EventKind::kReset, {Record::encoded(resetRecord(resetTo, *chainEnd_))});
}

void SvLogWriter::abandon() {
  openStarted_ = false;
  openBytes_ = 0;
  std::deque<Command> dropped;
  {
    std::unique_lock<std::mutex> lock(mu_);
    abandoned_ = true;
    dropped.swap(pending_);
    cv_.wait_for(lock, kStallTimeout, [&] { return idle_; });
    staged_ = 0;
  }
}

void SvLogWriter::check() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void SvLogWriter::flush() {
  closeSegment();
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = cv_.wait_for(lock, kStallTimeout, [&] { return pending_.empty() && idle_; });
  if (!done) {
    throw stalled(staged_, replica_, dir_);
  }
  if (error_) std::rethrow_exception(error_);
}

void SvLogWriter::run() {
  silenceHdf5();
  if (options_.idle) {
    sched_param param{};
    const int rc = pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
    if (rc != 0) spdlog::warn("checkpoint writer of replica {}: cannot run under SCHED_IDLE (error {})", replica_, rc);
  }
  // This thread keeps up with the compute thread rather than yielding to it: a
  // group copied at once is released while it is in cache and its memory serves the
  // next clock's batches; a lagging writer would make the process fault in fresh
  // memory every clock and then catch up in a burst.
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) break;
    Command command = std::move(pending_.front());
    pending_.pop_front();
    idle_ = false;
    const bool skip = error_ != nullptr || abandoned_;
    lock.unlock();
    consume(command, skip);
    command = Command{};  // releases the records outside the lock
    const double cpu = threadCpuSeconds();
    lock.lock();
    cpuSeconds_ = cpu;
    idle_ = true;
    cv_.notify_all();
  }
}

void SvLogWriter::takeEntries() {
  // While a segment is being written, entries of the next one are copied in (so
  // they are released while still in cache); closes and drops wait their turn.
  for (;;) {
    Command command;
    bool skip = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() || pending_.front().type != Command::Type::kEntry) return;
      command = std::move(pending_.front());
      pending_.pop_front();
      skip = error_ != nullptr || abandoned_;
    }
    consume(command, skip);
  }
}

void SvLogWriter::consume(Command& command, bool skip) {
  Segment& seg = *building_;
  size_t freed = 0;  // record bytes no longer staged
  switch (command.type) {
    case Command::Type::kEntry:
      if (seg.replica != command.replica) {
        // Not expected (a segment ends with a close or a drop): what was built is not written.
        freed += seg.bytes;
        seg.reset(command.replica);
      }
      seg.bytes += command.bytes;
      // After a failure nothing is written: no need to copy.
      if (!skip) seg.append(command.entry.clock, command.entry.kind, command.entry.records, segmentBytes_ + segmentBytes_ / 8);
      break;
    case Command::Type::kDrop:
      if (seg.replica == command.replica) {
        freed += seg.bytes;
        seg.reset(-1);
      }
      break;
    case Command::Type::kClose: {
      if (seg.replica != command.replica) {
        freed += seg.bytes;
        seg.reset(command.replica);  // a segment with no entries
      }
      // The built segment is written while the next one is built in the other buffer.
      std::swap(building_, writing_);
      building_->reset(-1);
      Segment& out = *writing_;
      uint64_t written = 0;
      std::exception_ptr error;
      if (!skip) {
        try {
          written = writeSegment(dir_, command.replica, command.firstClock, command.lastClock, out,
                                 [this] { takeEntries(); }, options_.version);
        } catch (...) {
          error = std::current_exception();
        }
      }
      freed += out.bytes;
      out.reset(-1);
      std::lock_guard<std::mutex> lock(mu_);
      staged_ -= freed;
      bytesWritten_ += written;
      if (error && !error_) error_ = error;
      if (!skip && !error && command.replica == replica_) durable_ = std::max(durable_, command.lastClock);
      cv_.notify_all();
      return;
    }
  }
  if (freed > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    staged_ -= freed;
    cv_.notify_all();
  }
}

}  // namespace orpheus::ckpt
