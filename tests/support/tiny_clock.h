// One clock of a tiny job for checkpoint tests: a 4 x 3 minibatch whose values and
// labels are a fixed function of the clock, its SV batch computed on `params` and
// applied to them. Returned for the log, its header's clock set.
#pragma once

#include "engine/base/sv_batch.h"
#include "ops/model.h"

#include <memory>

namespace orpheus::testing {

inline std::shared_ptr<SvBatch> tinyClock(const ops::Model& model, ParamSet& params, uint64_t c) {
  Matrix x(4, 3);
  Eigen::VectorXi labels(3);
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 4; ++i) x(i, j) = static_cast<float>(((c * 7 + i * 3 + j * 5) % 11)) / 11.0f - 0.4f;
    labels(j) = static_cast<int>((c + j) % 3);
  }
  ops::ExampleBatch batch{&x, nullptr, &labels, nullptr};
  double loss = 0.0;
  auto svb = std::make_shared<SvBatch>(model.computeSvg(params, batch, &loss));
  svb->header.clock = c;
  const SvBatch* ptrs[] = {svb.get()};
  model.computeUpdate(ptrs, params);
  return svb;
}

}  // namespace orpheus::testing
