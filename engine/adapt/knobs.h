// The knobs of the communication co-designs that may change while a job runs
// (--adapt): selection C, fanout Q, staleness s, the averaging period R, the
// width of the SV values on the wire (f32, or bf16: --sv-dtype, --adapt-bf16) and,
// under --sv-rank, the rank r each matrix's update is sent at (in place of C). The
// worker, the coordinator and the checkpoint log read them from one Knobs object
// owned by the worker, never from the flags they started from, so a change
// takes effect for all of them at the same clock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace orpheus::engine::adapt {

struct Knobs {
  int64_t select = 0;        // C: SVGs sent per clock; 0 = all B
  int64_t fanout = 0;        // Q: peers per clock (P-1 under broadcast)
  int64_t staleness = 0;     // s, under SSP
  int64_t averageEvery = 0;  // R: clocks between averagings; 0 = off
  bool bf16 = false;         // U and V sent as bf16 (half their bytes), else f32
  int64_t rank = 0;          // r under --sv-rank (then C stays 0), else 0

  bool operator==(const Knobs&) const = default;
};

// "C=25 Q=3 s=2 R=50", " bf16" when the values are sent as bf16, " r=2" under --sv-rank.
std::string toString(const Knobs& knobs);

// The knobs as the SV log keeps them (a kKnobs entry's one record): four
// little-endian i64 in the order above, ckpt::kKnobsRecordBytes in all; with bf16
// a fifth i64, 1 (ckpt::kKnobsRecordBytesWide: segment format 4); with a rank, a
// fifth i64 for the width (0 f32, 1 bf16) and a sixth, r (kKnobsRecordBytesRank,
// format 4). Logs written before the fifth knob hold only the short form, which
// decodes as f32.
inline constexpr size_t kKnobsRecordBytes = 4 * sizeof(int64_t);
inline constexpr size_t kKnobsRecordBytesWide = 5 * sizeof(int64_t);
inline constexpr size_t kKnobsRecordBytesRank = 6 * sizeof(int64_t);
std::vector<std::byte> encodeKnobs(const Knobs& knobs);
// CorruptRecordError when `bytes` is not one record of sane knobs.
Knobs decodeKnobs(std::span<const std::byte> bytes);

}  // namespace orpheus::engine::adapt
