// The programming model of Algorithm 1: a model turns (parameters, examples)
// into sufficient vector groups (compute_svg) and SVGs into parameter updates
// (compute_update). One SVG per example; the SVGs of a minibatch are held
// columnar in an SvBatch so a clock runs as matrix operations.
#pragma once

#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/rebuild.h"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace orpheus::ops {

// A minibatch as the model sees it: examples as columns, not owned.
struct ExampleBatch {
  const Matrix* dense = nullptr;         // D x B, or null when sparse
  const SparseMatrix* sparse = nullptr;  // D x B, or null when dense
  const Eigen::VectorXi* labels = nullptr;
  // Index of each example in its rank's shard (keys data-dependent variables), or null.
  const std::vector<int64_t>* indices = nullptr;

  int64_t size() const { return labels->size(); }
  int64_t features() const { return dense ? dense->rows() : sparse->rows(); }
};

struct ParamSpec {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Sums over the examples of a batch, so ranks can add them up.
struct EvalSums {
  double lossSum = 0.0;
  double correct = 0.0;
  double count = 0.0;
};

class Model {
 public:
  virtual ~Model() = default;

  // A one-line description stored with saved parameters, e.g. "mlr features=784 classes=10".
  virtual std::string spec() const = 0;
  // The digest (textDigest, engine/base/crc32c.h) of the .loss text the model was
  // parsed from, stored with saved parameters; "" for built-in and C++-built models.
  virtual std::string textDigest() const { return {}; }
  virtual std::vector<ParamSpec> paramSpecs() const = 0;
  // W0 = h(G0): initial parameters generated from the job seed alone.
  virtual ParamSet initParams(uint64_t seed) const = 0;

  // compute_svg for every example of the batch: column i of each matrix's U and V
  // is example i's SVG. Coefficients are 1; the caller scales them (learning rate,
  // averaging). The SVs stand for the gradient of the summed per-example loss.
  // Returns the mean loss of the batch through `meanLoss`.
  virtual SvBatch computeSvg(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const = 0;

  // Which parameter (and bias) each matrix of computeSvg's batches updates, in
  // batch order: the same for every batch. Empty: the model does not say, and
  // its SVs are only had whole (the engine does not overlap their exchange).
  struct SvSiteInfo {
    uint32_t paramId = 0;
    int32_t biasId = -1;
  };
  virtual std::vector<SvSiteInfo> svSites() const { return {}; }
  // Told, on the calling thread, that matrix `index` of the batch being computed
  // is final (U, V; the batch's coefficients are ones): the reference stays valid
  // until computeSvgStreamed returns. *meanLoss is set before the first call.
  using SvReadyFn = std::function<void(size_t index, const SvMatrix& matrix)>;
  // computeSvg that hands each matrix to `ready` as soon as it exists, top layer
  // first, so its exchange can overlap the rest of the backward pass (wait-free
  // backpropagation, Poseidon). Returns the same batch as computeSvg, bit for bit.
  // The default computes the batch, then hands its matrices out last to first.
  virtual SvBatch computeSvgStreamed(const ParamSet& w, const ExampleBatch& x, double* meanLoss,
                                     const SvReadyFn& ready) const;

  // compute_update for a set of SV batches applied together: W += U diag(c) V^T,
  // on views of the batches (a received batch where it arrived). The default
  // rebuilds every matrix with one GEMM over all batches' columns on the job's
  // `backend`, in `buffers` (kept by the caller from clock to clock).
  virtual void computeUpdate(std::span<const SvBatchView* const> batches, ParamSet& w, Backend& backend,
                             RebuildBuffers& buffers) const;
  // The same on whole batches, on a CPU backend (tests and tools).
  void computeUpdate(std::span<const SvBatch* const> batches, ParamSet& w) const;

  // Dense gradient of the summed per-example loss (the baseline's message), shaped
  // like the parameters, its products on the job's `backend`. The default
  // rebuilds it from the batch's own SVGs.
  virtual ParamSet denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss, Backend& backend,
                                 RebuildBuffers& buffers) const;
  // The same on a CPU backend (tests and tools).
  ParamSet denseGradient(const ParamSet& w, const ExampleBatch& x, double* meanLoss) const;

  // Device residency: compute_svg with the parameters as tensors of a backend
  // (ops/backend.h), every value and gradient kept on its device.
  // "" when this model's computeSvgOnDevice runs on a backend, else why not.
  virtual std::string deviceRefusal() const;
  // computeSvg with the parameters `w` as tensors on `backend`'s device
  // (paramSpecs() order). The batch comes back in host memory (the wire and the
  // SV log need it). The default throws "model <spec> does not run on a device".
  virtual SvBatch computeSvgOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                     Backend& backend) const;
  // Told from inside a device pass, on the calling thread, that the batch's matrix
  // `index` is final on the device: its U (J x B) and, where its V is a value of
  // the pass, V (K x B); `v` is null where V is host data the batch holds itself
  // (the input, token one-hots). Both stay valid until the model's next device
  // pass or releaseDevice().
  using DeviceSvReadyFn = std::function<void(size_t index, const Tensor& u, const Tensor* v)>;
  // computeSvgOnDevice that leaves the device's arrays to the caller: each matrix
  // handed to `ready` (top layer first, as the backward pass makes it final, so its
  // copy to the host can overlap the rest of the pass) comes back with U, and V
  // where `ready` got one, sized but not filled; the caller copies them in. A
  // model whose batch is not its sites one to one (a sequence model's) fills the
  // whole batch itself and hands out nothing. The default does that.
  virtual SvBatch computeSvgOnDeviceStreamed(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                             Backend& backend, const DeviceSvReadyFn& ready) const;
  // The data queue: copies `next` to `backend`'s device now, on its copy queue,
  // while the device passes queued before compute, so that the next device pass on
  // exactly this batch (the same objects, alive and unchanged until then) finds it
  // there. False where the model copies nothing ahead (the default): the pass then
  // copies the batch in itself.
  virtual bool prefetchOnDevice(const ExampleBatch& next, Backend& backend) const {
    (void)next, (void)backend;
    return false;
  }
  // Seconds the device's compute waited for prefetched batches since the last call.
  virtual double takeDeviceDataWait() const { return 0.0; }
  // The dense gradient of the summed loss into `grad` (tensors on backend's device,
  // the parameters' shapes), with no host round trip: one GEMM U V^T per site, a
  // bias the column sum of its U. The default throws as computeSvgOnDevice's.
  virtual void denseGradientOnDevice(std::span<const Tensor> w, const ExampleBatch& x, double* meanLoss,
                                     Backend& backend, std::span<Tensor> grad) const;
  // After computeSvgOnDevice: each matrix of the batch it returned (in order) as it
  // still lies on the device, U unweighted and V where dense (ops/rebuild.h;
  // hostU left for the caller to set), valid until the model's next device pass
  // or releaseDevice(). Empty when the model keeps none (the default).
  virtual std::vector<DeviceSvs> lastDeviceSvs() const { return {}; }
  // Drops what the model keeps on a device between calls (the device executor's
  // tensors): called by the worker that used it, while its backend still lives.
  virtual void releaseDevice() const {}
  // evaluate() with the parameters as tensors on `backend` (paramSpecs order), for
  // a model whose deviceRefusal() is empty: the same sums, bitwise on cpu and strict.
  virtual EvalSums evaluateOnDevice(std::span<const Tensor> w, const ExampleBatch& x, Backend& backend) const;

  virtual EvalSums evaluate(const ParamSet& w, const ExampleBatch& x) const = 0;
  // False for models without a predicted class (e.g. topic models): no accuracy.
  virtual bool hasAccuracy() const { return true; }
  // The labels (or a token stream's words) the model takes, 0..labelCount()-1, and
  // the name of what fixes it; -1 where it takes any label the data has.
  virtual int64_t labelCount() const { return -1; }
  virtual std::string labelName() const { return {}; }
  // True for language models: evaluate() counts tokens, not examples, so
  // exp(lossSum / count) is the perplexity, reported with the loss.
  virtual bool reportsPerplexity() const { return false; }
  // True when computeSvg carries state from one minibatch to the next that the
  // parameters do not hold (a sequence model's recurrent states per stream).
  virtual bool carriesState() const { return false; }
  // True when computeSvg keeps variables per example across clocks (a topic model's
  // data-dependent variables), keyed by the example's row in the rank's shard.
  virtual bool keepsPerExample() const { return false; }
  // That state as named matrices, and back: a resumed job puts back what the
  // interrupted one carried after the clock it resumes from, so it continues
  // bitwise. Like computeSvg, these belong to the compute thread.
  virtual ParamSet carriedState() const { return {}; }
  virtual void restoreCarriedState(const ParamSet& state) const { (void)state; }
  // What one SVG (one column of computeSvg's batch, the unit selection picks) is
  // for a sequence model: an example with all its T steps (its matrices' sites are
  // T entries of B columns), or one (example, step) pair (each parameter's sites
  // are one entry of B * T columns, column t * B + j for step t of example j; the
  // update is the same sum). Models without steps have examples only.
  enum class SvgUnit { kExample, kStep };
  virtual void setSvgUnit(SvgUnit unit) { (void)unit; }

  // Shapes indexed by param id, for validating received SV batches.
  std::vector<std::pair<int64_t, int64_t>> paramShapes() const;
  // Parameters of the right shapes, all zero.
  ParamSet zeroParams() const;
};

}  // namespace orpheus::ops
