// The coordinator (paper, section 3.4): barriers at which every rank stops after
// the same clock, periodic centralized synchronization (replicas averaged every R
// clocks) and parameter-replica rotation along the ring of ranks (every S clocks).
// Every call here is a collective: all ranks make it after the same clock.
#pragma once

#include "comm/transport.h"
#include "engine/adapt/knobs.h"
#include "engine/coordinator/outer_step.h"
#include "engine/base/params.h"
#include "engine/worker/optimizer.h"

#include <cstdint>

namespace orpheus::engine {

// What a barrier did.
struct Coordination {
  bool averaged = false;
  bool rotated = false;
  double divergenceMax = 0.0;   // max over replicas of ||W_r - mean|| / ||mean||, before averaging
  double divergenceMean = 0.0;
};

// What the coordinator reads of the job (engine/worker/part_options.h makes it from
// the flags). R is not here: it is a knob (--adapt changes it), read at each clock.
struct CoordinatorOptions {
  int64_t rotateEvery = 0;  // S: clocks between replica rotations; 0 = off
  OuterStepOptions outer;   // --outer-lr, --outer-momentum: DiLoCo's step at each averaging
};

class Coordinator {
 public:
  // The references must outlive the coordinator; R is read from `knobs` at each clock.
  Coordinator(const CoordinatorOptions& options, comm::Transport& transport, const adapt::Knobs& knobs)
      : options_(options), transport_(transport), knobs_(knobs), outer_(options.outer) {}

  // The parameters every replica starts from, the same on every rank (W0, or a new
  // membership epoch's average): the outer step's anchor, its momentum zero
  // (nothing to do without --outer-lr).
  void startFrom(const ParamSet& initial) { outer_.start(initial); }
  const OuterStep& outerStep() const { return outer_; }
  // Resume: the outer step's anchor and momentum from the checkpoint.
  void resumeOuterStep(ParamSet anchor, ParamSet momentum) { outer_.resume(std::move(anchor), std::move(momentum)); }

  // Whether the ranks average, or rotate, their replicas after `clock`. Never with
  // one rank: there is nothing to do.
  bool averagesAfter(uint64_t clock) const { return due(knobs_.averageEvery, clock); }
  bool rotatesAfter(uint64_t clock) const { return due(options_.rotateEvery, clock); }
  bool barrierAfter(uint64_t clock) const { return averagesAfter(clock) || rotatesAfter(clock); }

  // Every replica becomes the average, bitwise the same on every rank. The
  // optimizer state is averaged with it, elementwise (Adam's m and v, AdaGrad's
  // sums, momentum buffers); the step count becomes the largest of the replicas'
  // (they are equal unless a failure set one back). With --outer-lr the average
  // is then the outer step's W (engine/coordinator/outer_step.h); the optimizer
  // state is averaged as without.
  Coordination average(ParamSet& replica, Optimizer& optimizer, uint64_t clock);
  // This rank's replica goes to rank+1 and rank-1's comes here, its id and its
  // optimizer state with it.
  void rotate(ParamSet& replica, Optimizer& optimizer, int& replicaId, uint64_t clock);

 private:
  bool due(int64_t every, uint64_t clock) const {
    return every > 0 && transport_.size() > 1 && clock % static_cast<uint64_t>(every) == 0;
  }

  CoordinatorOptions options_;
  comm::Transport& transport_;
  const adapt::Knobs& knobs_;
  OuterStep outer_;
};

}  // namespace orpheus::engine
