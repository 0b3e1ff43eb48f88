#include "ops/model.h"

#include "ops/cpu/cpu_backend.h"
#include "ops/rebuild.h"

namespace orpheus::ops {

void Model::computeUpdate(std::span<const SvBatchView* const> batches, ParamSet& w, Backend& backend,
                          RebuildBuffers& buffers) const {
  applySvBatches(batches, w, backend, buffers);
}

void Model::computeUpdate(std::span<const SvBatch* const> batches, ParamSet& w) const {
  std::vector<SvBatchView> views;
  views.reserve(batches.size());
  std::vector<const SvBatchView*> pointers;
  for (const SvBatch* b : batches) views.push_back(viewOf(*b));
  for (const SvBatchView& v : views) pointers.push_back(&v);
  RebuildBuffers buffers;
  cpu::CpuBackend backend;
  computeUpdate(pointers, w, backend, buffers);
}

SvBatch Model::computeSvgStreamed(const ParamSet& w, const ExampleBatch& x, double* meanLoss,
                                  const SvReadyFn& ready) const {
  SvBatch batch = computeSvg(w, x, meanLoss);
  for (size_t i = batch.matrices.size(); i-- > 0;) ready(i, batch.matrices[i]);
  return batch;
}

ParamSet Model::denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                              RebuildBuffers& buffers) const {
  const SvBatch svg = computeSvg(w, x, meanLoss);
  ParamSet grad = zeroParams();
  const SvBatchView view = viewOf(svg);
  const SvBatchView* one[] = {&view};
  applySvBatches(one, grad, backend, buffers);
  return grad;
}

ParamSet Model::denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const {
  cpu::CpuBackend backend;
  RebuildBuffers buffers;
  return denseGradient(w, x, meanLoss, backend, buffers);
}

std::string Model::deviceRefusal() const { return "this model has no device form"; }

SvBatch Model::computeSvgOnDevice(std::span<const Tensor>, const ExampleBatch&, double*, Backend&) const {
  throw Error(fmt::format("model {} does not run on a device: {}", spec(), deviceRefusal()));
}

SvBatch Model::computeSvgOnDeviceStreamed(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                          Backend& backend, const DeviceSvReadyFn&) const {
  return computeSvgOnDevice(w, x, meanLoss, backend);
}

void Model::denseGradientOnDevice(std::span<const Tensor>, const ExampleBatch&, double*, Backend&,
                                  std::span<Tensor>) const {
  throw Error(fmt::format("model {} does not run on a device: {}", spec(), deviceRefusal()));
}

EvalSums Model::evaluateOnDevice(std::span<const Tensor>, const ExampleBatch&, Backend&) const {
  throw Error(fmt::format("model {} does not run on a device: {}", spec(), deviceRefusal()));
}

std::vector<std::pair<int64_t, int64_t>> Model::paramShapes() const {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const auto& s : paramSpecs()) shapes.emplace_back(s.rows, s.cols);
  return shapes;
}

ParamSet Model::zeroParams() const {
  ParamSet p;
  for (const auto& s : paramSpecs()) p.params.push_back({s.name, Matrix::Zero(s.rows, s.cols)});
  return p;
}

}  // namespace orpheus::ops
