// The .loss parser and the model checks behind it (SV identification, the fusion
// plan) on arbitrary text. Bad input must end in InputError; anything else is a
// finding. Nothing is allocated for parameters: only sizes are checked.
#include "engine/base/error.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"

#include <string>

using namespace orpheus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    ops::Graph graph = ops::parseLoss(text, "fuzz.loss", ops::LossDims{4, 3});
    graph.fusionPlan();
    const ops::GraphModel model(std::move(graph), "fuzz", 1);
    model.paramSpecs();
  } catch (const InputError&) {
  }
  return 0;
}
