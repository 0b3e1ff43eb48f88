// How a job's replicas keep in step: the sync mode of a clock and the consistency
// model between clocks; and how a device's SVs come to the host for the wire. Read
// by the parts of the worker through their options structs; the flags' names for
// the values are in engine/config.h.
#pragma once

namespace orpheus::engine {

// --sync: SV batches (Algorithm 1), the dense gradient all-reduced, or PowerSGD's factors of it.
enum class SyncMode { kSv, kDense, kPowerSgd };
// --consistency: every batch of a clock before the next (BSP), or within s clocks (SSP).
enum class Consistency { kBsp, kSsp };
// --transfer: how a replica on a device brings its SV batches to host memory
// (engine/worker/sv_transfer.h): on the device's copy queue while the backward
// pass goes on, or with blocking copies after it.
enum class TransferMode { kStaged, kSync };

}  // namespace orpheus::engine
