// orpheus_bench_zero_copy: one clock's SV batch path on one rank of a broadcast
// group, for instruction counts (valgrind --tool=callgrind, see zero_copy.sh), no
// network. Each part runs once to warm up (buffers kept across clocks are made
// then), then once more with callgrind's collection on (run it with
// --collect-atstart=no; outside valgrind the toggles do nothing):
//   exchange  what one rank does with one clock's batches: encode its own batch
//             for sending, decode the P-1 records it received (the same wire
//             bytes in both paths) and rebuild W from all P batches
//     --path copy   the record encoded into one buffer, each received record
//                   decoded into an SvBatch of its own, the rebuild on SvBatches
//     --path views  the record as pieces (header + the batch's arrays) with its
//                   CRC, each received record decoded as views into the receive
//                   buffer, the rebuild on views with buffers kept across clocks
//   svg       the model's computeSvg (forward, backward, SVs) on one minibatch
// Built with -DORPHEUS_BENCH_BASELINE (zero_copy.sh does, against an older tree)
// only the copy path exists, so the same file measures the code before views.
//
// Usage: orpheus_bench_zero_copy [--loss FILE] [--features D] [--classes C]
//          [--batch B] [--ranks P] [--path copy|views] [--parts exchange,svg]
#include "engine/base/log.h"
#include "engine/base/params.h"
#include "engine/base/sv_batch.h"
#include "ops/graph_model.h"
#include "ops/rebuild.h"

#include <fmt/format.h>
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT  // no valgrind headers: nothing to tell
#endif

#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace orpheus {
namespace {

struct Options {
  std::string loss = "examples/mlp_wide.loss";
  int64_t features = 784;
  int64_t classes = 10;
  int64_t batch = 100;
  int ranks = 4;
  std::string path = "views";
  std::vector<std::string> parts{"exchange", "svg"};
};

[[noreturn]] void usage(const char* argv0) {
  fmt::print(stderr,
             "usage: {} [--loss FILE] [--features D] [--classes C] [--batch B] [--ranks P] [--path copy|views] "
             "[--parts exchange,svg]\n",
             argv0);
  std::exit(2);
}

Options parseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(argv[0]);
    const char* value = argv[++i];
    if (arg == "--loss") {
      o.loss = value;
    } else if (arg == "--features") {
      o.features = std::atoll(value);
    } else if (arg == "--classes") {
      o.classes = std::atoll(value);
    } else if (arg == "--batch") {
      o.batch = std::atoll(value);
    } else if (arg == "--ranks") {
      o.ranks = std::atoi(value);
    } else if (arg == "--path") {
      o.path = value;
    } else if (arg == "--parts") {
      o.parts.clear();
      std::stringstream list(value);
      for (std::string p; std::getline(list, p, ',');) {
        if (p != "exchange" && p != "svg") usage(argv[0]);
        o.parts.push_back(p);
      }
    } else {
      usage(argv[0]);
    }
  }
#if defined(ORPHEUS_BENCH_BASELINE)
  if (o.path != "copy") usage(argv[0]);
#else
  if (o.path != "copy" && o.path != "views") usage(argv[0]);
#endif
  if (o.features < 1 || o.classes < 1 || o.batch < 1 || o.ranks < 2 || o.parts.empty()) usage(argv[0]);
  return o;
}

// One clock's batches as this rank sees them: its own, and the others' records
// as they arrive in the allgather's buffer.
struct ClockBatches {
  SvBatch own;
  std::vector<std::byte> gathered;
  std::vector<size_t> offsets;  // ranks + 1, this rank (0) first
  SvBatchExpectation expect;
};

std::span<const std::byte> part(const ClockBatches& c, size_t r) {
  return {c.gathered.data() + c.offsets[r], c.offsets[r + 1] - c.offsets[r]};
}

// The copy path: one encoded buffer, decoded copies, the rebuild on SvBatches.
__attribute__((noinline)) size_t exchangeCopy(const ClockBatches& c, ParamSet& w, std::vector<std::byte>& encoded) {
  encoded.clear();
  encode(c.own, encoded);
  std::vector<SvBatch> remote;
  remote.reserve(c.offsets.size() - 2);
  SvBatchExpectation expect = c.expect;
  for (size_t r = 1; r + 1 < c.offsets.size(); ++r) {
    expect.sender = static_cast<int64_t>(r);
    remote.push_back(decode(part(c, r), expect));
  }
  std::vector<const SvBatch*> group{&c.own};
  for (const SvBatch& b : remote) group.push_back(&b);
  ops::applySvBatches(group, w);
  return encoded.size();
}

#if !defined(ORPHEUS_BENCH_BASELINE)
// The views path: the record as pieces, views into the receive buffer, the
// rebuild on views with its buffers kept.
__attribute__((noinline)) size_t exchangeViews(const ClockBatches& c, ParamSet& w, ops::RebuildBuffers& buffers) {
  SvBatchPieces record = encodePieces(c.own, /*scanValues=*/true);
  record.seal();
  std::vector<SvBatchView> views;
  views.reserve(c.offsets.size() - 1);
  views.push_back(viewOf(c.own));
  SvBatchExpectation expect = c.expect;
  for (size_t r = 1; r + 1 < c.offsets.size(); ++r) {
    expect.sender = static_cast<int64_t>(r);
    views.push_back(decodeView(nullptr, part(c, r), expect));
  }
  std::vector<const SvBatchView*> group;
  for (const SvBatchView& v : views) group.push_back(&v);
  ops::applySvBatches(group, w, buffers);
  return record.size;
}
#endif

__attribute__((noinline)) double computeSvgOnce(const ops::Model& model, const ParamSet& w,
                                                const ops::ExampleBatch& x, SvBatch& out) {
  double loss = 0.0;
  out = model.computeSvg(w, x, &loss);
  return loss;
}

}  // namespace
}  // namespace orpheus

int main(int argc, char** argv) {
  using namespace orpheus;
  const Options o = parseOptions(argc, argv);
  setBlasThreads(1);
  const auto model = ops::GraphModel::fromFile(o.loss, {o.features, o.classes}, 7);
  ParamSet w = model->initParams(7);
  std::mt19937_64 gen(20240611);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, static_cast<int>(o.classes) - 1);
  Matrix data(o.features, o.batch);
  for (int64_t i = 0; i < data.size(); ++i) data.data()[i] = unit(gen);
  Eigen::VectorXi labels(o.batch);
  for (int64_t j = 0; j < o.batch; ++j) labels(j) = label(gen);
  ops::ExampleBatch x;
  x.dense = &data;
  x.labels = &labels;
  // A small step, so the parameters stay finite.
  const float scale = -1e-4f / static_cast<float>(o.batch * o.ranks);

  for (const std::string& p : o.parts) {
    if (p == "svg") {
      SvBatch out;
      computeSvgOnce(*model, w, x, out);  // warm-up: the executor's buffers
      CALLGRIND_TOGGLE_COLLECT;
      const double loss = computeSvgOnce(*model, w, x, out);
      CALLGRIND_TOGGLE_COLLECT;
      fmt::print("{{\"part\": \"svg\", \"path\": \"{}\", \"batch\": {}, \"loss\": {:.6f}}}\n", o.path, o.batch,
                 loss);
      continue;
    }
    // Every rank's batch: this rank's SVs, with other coefficients per rank so the
    // records differ; the peers' records concatenated as the allgather leaves them.
    ClockBatches c;
    double loss = 0.0;
    c.own = model->computeSvg(w, x, &loss);
    c.own.header.clock = 1;
    ops::scaleCoefficients(c.own, scale);
    c.expect.clock = 1;
    c.expect.paramShapes = model->paramShapes();
    c.offsets.push_back(0);
    for (int r = 0; r < o.ranks; ++r) {
      SvBatch b = c.own;
      b.header.sender = static_cast<uint32_t>(r);
      b.header.replica = static_cast<uint32_t>(r);
      ops::scaleCoefficients(b, 1.0f + 0.01f * static_cast<float>(r));
      if (r == 0) c.own = b;
      encode(b, c.gathered);
      c.offsets.push_back(c.gathered.size());
    }
    size_t bytes = 0;
    if (o.path == "copy") {
      std::vector<std::byte> encoded;
      exchangeCopy(c, w, encoded);
      CALLGRIND_TOGGLE_COLLECT;
      bytes = exchangeCopy(c, w, encoded);
      CALLGRIND_TOGGLE_COLLECT;
    } else {
#if !defined(ORPHEUS_BENCH_BASELINE)
      ops::RebuildBuffers buffers;
      exchangeViews(c, w, buffers);
      CALLGRIND_TOGGLE_COLLECT;
      bytes = exchangeViews(c, w, buffers);
      CALLGRIND_TOGGLE_COLLECT;
#endif
    }
    fmt::print("{{\"part\": \"exchange\", \"path\": \"{}\", \"batch\": {}, \"ranks\": {}, \"record_bytes\": {}, "
               "\"w0_sum\": {:.6f}}}\n",
               o.path, o.batch, o.ranks, bytes, w[0].sum());
  }
  return 0;
}
