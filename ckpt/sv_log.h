// The incremental SV checkpoint (paper section 3.3), for code that uses all of it:
// the layout of a checkpoint directory and its failure semantics are described in
// ckpt/layout.h; the parts are
//   ckpt/job_info.h        DIR/job.h5: what the job was
//   ckpt/sv_log_writer.h   SvLogWriter: a replica's log, written by an IO thread
//   ckpt/snapshot.h        snapshot parts: write, list, reassemble
//   ckpt/log_reader.h      inspect() and readLog()
//   ckpt/restorable.h      which clocks of each replica can be restored, and why not
//   ckpt/replay.h          the event stream replayed: membership, chunk ownership,
//                          knobs at a clock, and a replica's entries for restore
//   ckpt/clock_log.h       ClockLog: the log as the clock loop writes it
// and underneath them ckpt/segment.h (the segment format), ckpt/durable.h (how every
// file is written) and ckpt/h5.h (HDF5).
#pragma once

#include "ckpt/job_info.h"
#include "ckpt/log_entry.h"
#include "ckpt/log_reader.h"
#include "ckpt/restorable.h"
#include "ckpt/snapshot.h"
#include "ckpt/sv_log_writer.h"
