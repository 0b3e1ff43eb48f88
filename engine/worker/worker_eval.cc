// The worker's evaluation: each rank's replica on its own test shard, in chunks.
#include "engine/worker/worker.h"

#include <algorithm>
#include <functional>

namespace orpheus::engine {
namespace {

// Test examples scored at a time.
constexpr int64_t kEvalChunk = 2000;

}  // namespace

ops::ExampleBatch view(const data::Batch& batch) {
  ops::ExampleBatch x;
  if (batch.sparse) {
    x.sparse = &batch.sparseX;
  } else {
    x.dense = &batch.dense;
  }
  x.labels = &batch.labels;
  x.indices = &batch.indices;
  return x;
}

// The sums of `score` over the test set, in chunks of kEvalChunk examples.
ops::EvalSums evaluateOn(const data::Dataset& test,
                         const std::function<ops::EvalSums(const ops::ExampleBatch&)>& score) {
  ops::EvalSums sums;
  for (int64_t begin = 0; begin < test.size(); begin += kEvalChunk) {
    const data::Batch chunk = data::slice(test, begin, std::min(test.size(), begin + kEvalChunk));
    const ops::EvalSums part = score(view(chunk));
    sums.lossSum += part.lossSum;
    sums.correct += part.correct;
    sums.count += part.count;
  }
  return sums;
}

ops::EvalSums evaluateOn(const ops::Model& model, const ParamSet& params, const data::Dataset& test) {
  return evaluateOn(test, [&](const ops::ExampleBatch& chunk) { return model.evaluate(params, chunk); });
}

ops::EvalSums Worker::evaluateLocal() {
  if (test_ == nullptr) return {};
  // A resident replica is scored where it lives (a pending SSP step is taken on the host, below).
  if (updater_.resident() && !updater_.pending()) {
    const std::span<const ops::Tensor> w = updater_.deviceParams(replica_);
    return evaluateOn(*test_, [&](const ops::ExampleBatch& chunk) {
      return model_.evaluateOnDevice(w, chunk, updater_.backend());
    });
  }
  updater_.toHost(replica_);
  // Under SSP a clock's step may wait for batches still to come: score the
  // replica as that step would leave it, without taking it.
  if (updater_.pending()) return evaluateOn(model_, updater_.peek(replica_), *test_);
  return evaluateOn(model_, replica_, *test_);
}

EvalResult Worker::evaluate() {
  const ops::EvalSums sums = evaluateLocal();
  double v[3] = {sums.lossSum, sums.correct, sums.count};
  transport_.control().sum(v);
  EvalResult r;
  r.examples = static_cast<int64_t>(v[2]);
  r.loss = v[2] > 0 ? v[0] / v[2] : 0.0;
  r.accuracy = v[2] > 0 ? v[1] / v[2] : 0.0;
  return r;
}

// On evaluation clocks each rank scores its own replica on its own test shard into
// `record`: no collective, unless the job stops at a target accuracy, which all
// ranks must agree on. Returns whether the target is reached.
bool Worker::evaluateAt(uint64_t clock, ClockRecord& record) {
  const auto every = static_cast<uint64_t>(config_.evalEvery);
  const bool evalClock = clock == static_cast<uint64_t>(config_.clocks) || (every > 0 && clock % every == 0);
  if (!evalClock || test_ == nullptr) return false;
  const ops::EvalSums sums = evaluateLocal();
  record[kHasEval] = 1.0;
  record[kEvalLoss] = sums.lossSum;
  record[kEvalCorrect] = sums.correct;
  record[kEvalCount] = sums.count;
  if (config_.targetAccuracy <= 0.0) return false;
  double v[2] = {sums.correct, sums.count};
  transport_.control().sum(v);
  return v[1] > 0 && v[0] / v[1] >= config_.targetAccuracy;
}

}  // namespace orpheus::engine
