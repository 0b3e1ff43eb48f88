// How a segment of a token stream is laid out as one example (a dense column),
// shared by the token-stream reader (engine/data) and the executor of unrolled
// sequence models:
//   row 0        the stream the segment belongs to (0 <= stream < streams)
//   row 1        the segment's index within its stream (0, 1, 2, ...)
//   rows 2..T+2  its T + 1 token ids: step t reads token t and predicts token t + 1
// A segment continues its stream's previous one when its index is that one's + 1:
// then the carried states start from where the previous segment ended.
#pragma once

#include <cstdint>

namespace orpheus::ops {

inline constexpr int64_t kSegmentStreamRow = 0;
inline constexpr int64_t kSegmentIndexRow = 1;
inline constexpr int64_t kSegmentTokenRow = 2;

// Rows of a segment of T steps.
constexpr int64_t segmentRows(int64_t steps) { return kSegmentTokenRow + steps + 1; }

}  // namespace orpheus::ops
