// The .loss parser against hostile input: every case ends in one InputError that
// names file:line:col, never a crash, an exhausted stack or std::bad_alloc.
#include "engine/base/error.h"
#include "ops/graph_model.h"
#include "ops/loss_parser.h"
#include "ops/mlr.h"

#include <catch2/catch.hpp>

#include <string>

using namespace orpheus;
using namespace orpheus::ops;
using Catch::Contains;

namespace {

const LossDims kDims{4, 3};
const std::string kHeader = "param W[classes, features]\ninput x[features]\nlabel y[classes]\n";

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

TEST_CASE("deeply nested .loss expressions are refused, not recursed into", "[ops][parser]") {
  const size_t depth = 20000;
  SECTION("parentheses") {
    const std::string text = kHeader + "loss sq_l2(" + repeat("(", depth) + "W * x" + repeat(")", depth) + ")\n";
    CHECK_THROWS_WITH(parseLoss(text, "deep.loss", kDims),
                      Contains("deep.loss:4:") && Contains("nested more than 256 levels deep"));
  }
  SECTION("operator calls") {
    // Shallower, to stay within the line length limit.
    const std::string text = kHeader + "loss sq_l2(" + repeat("relu(", depth / 2) + "W * x" + repeat(")", depth / 2) + ")\n";
    CHECK_THROWS_WITH(parseLoss(text, "deep.loss", kDims),
                      Contains("deep.loss:4:") && Contains("nested more than 256 levels deep"));
  }
  SECTION("unary minus") {
    const std::string text = kHeader + "loss sq_l2(" + repeat("-", depth) + "W * x)\n";
    CHECK_THROWS_WITH(parseLoss(text, "deep.loss", kDims),
                      Contains("deep.loss:4:") && Contains("nested more than 256 levels deep"));
  }
  SECTION("nesting within the limit still parses") {
    const std::string text = kHeader + "loss sq_l2(" + repeat("(", 200) + "W * x" + repeat(")", 200) + ")\n";
    CHECK_NOTHROW(parseLoss(text, "ok.loss", kDims));
  }
}

TEST_CASE("an overlong .loss line is refused before it is parsed", "[ops][parser]") {
  // 3 MB of 'x + x + ...': each operator node kept the text of its expression, a
  // quadratic amount of memory.
  const std::string text = kHeader + "a = x" + repeat(" + x", 750000) + "\nloss sq_l2(W * a)\n";
  CHECK_THROWS_WITH(parseLoss(text, "long.loss", kDims),
                    Contains("long.loss:4:") && Contains("line is 3000005 bytes long") && Contains("65536"));
}

TEST_CASE("a long but legal expression keeps short node names", "[ops][parser]") {
  const std::string text = kHeader + "a = x" + repeat(" + x", 5000) + "\nloss sq_l2(W * a)\n";
  const Graph g = parseLoss(text, "wide.loss", kDims);
  for (const Node& n : g.nodes()) CHECK(n.name.size() <= 200);
}

TEST_CASE("sizes that cannot fit in memory are refused while parsing", "[ops][parser]") {
  const std::string text = "dim h = 1000000000\nparam W1[h, features]\ninput x[features]\nloss sq_l2(W1 * x)\n";
  CHECK_THROWS_WITH(parseLoss(text, "huge.loss", {784, 10}),
                    Contains("huge.loss:2:7") && Contains("'W1'") && Contains("1000000000x784") &&
                        Contains("needs 2.9 TiB") && Contains("memory"));
  // Dimensions whose product overflows 64 bits.
  const std::string overflow =
      "dim h = 9000000000000000000\nparam W1[h, h]\ninput x[features]\nloss sq_l2(W1 * x)\n";
  CHECK_THROWS_WITH(parseLoss(overflow, "overflow.loss", {784, 10}), Contains("overflow.loss:2:7") && Contains("'W1'"));
  // Many parameters that fit one by one but not together.
  std::string many = "dim h = 20000\n";
  for (int i = 0; i < 2000; ++i) many += "param W" + std::to_string(i) + "[h, h]\n";
  CHECK_THROWS_WITH(parseLoss(many, "many.loss", {784, 10}), Contains("many.loss:") && Contains("parameters"));
  // A per-example variable of a billion billion rows.
  const std::string local = "dim h = 1000000000000000000\ninput x[features]\nlocal z[h]\nloss sq_l2(z)\n";
  CHECK_THROWS_WITH(parseLoss(local, "local.loss", {784, 10}), Contains("local.loss:3:7") && Contains("'z'"));
}

TEST_CASE("a second loss or predict statement is an error naming the first", "[ops][parser]") {
  const std::string loss = kHeader + "loss cross_entropy(softmax(W * x), y)\nloss sq_l2(W * x)\n";
  CHECK_THROWS_WITH(parseLoss(loss, "two.loss", kDims),
                    Contains("two.loss:5:1") && Contains("second 'loss' statement; the first is at line 4"));
  const std::string predict =
      kHeader + "predict W * x\nloss cross_entropy(softmax(W * x), y)\npredict softmax(W * x)\n";
  CHECK_THROWS_WITH(parseLoss(predict, "two.loss", kDims),
                    Contains("two.loss:6:1") && Contains("second 'predict' statement; the first is at line 4"));
}

TEST_CASE("a name declared twice is an error at the second, naming the first", "[ops][parser]") {
  const std::string twice = kHeader + "param W[classes, features]\nloss cross_entropy(softmax(W * x), y)\n";
  CHECK_THROWS_WITH(parseLoss(twice, "twice.loss", kDims),
                    Contains("twice.loss:4:7: 'W' is declared twice (first at line 1)"));
}

TEST_CASE("a model without parameters is refused", "[ops][graph]") {
  const std::string text = "input x[features]\nloss sq_l2(x)\n";
  CHECK_THROWS_WITH(GraphModel(parseLoss(text, "none.loss", kDims), "none", 1),
                    Contains("none.loss") && Contains("no parameters"));
}

TEST_CASE("the inner step count of a data-dependent variable is bounded", "[ops][parser]") {
  const std::string base = "param B[features, 3]\ninput x[features]\nlocal s[3] init constant(0.3) ";
  const std::string tail = "\nloss sq_dist(B * s, x)\n";
  CHECK_THROWS_WITH(parseLoss(base + "steps 1000000000" + tail, "steps.loss", kDims),
                    Contains("steps.loss:3:") && Contains("1000000000") && Contains("at most 10000"));
  // Beyond int: no silent wrap to a small or negative count.
  CHECK_THROWS_WITH(parseLoss(base + "steps 4294967301" + tail, "steps.loss", kDims),
                    Contains("steps.loss:3:") && Contains("at most 10000"));
  CHECK_NOTHROW(parseLoss(base + "steps 10000" + tail, "steps.loss", kDims));
  // The C++ builder checks it too.
  Graph g;
  CHECK_THROWS_WITH(g.local("s", 3, Init{}, 1000000000, 0.1), Contains("at most 10000"));
}

TEST_CASE("a built-in MLR wider than memory is refused before allocating", "[ops]") {
  // A LIBSVM file with a feature index of 2^31-1 and a million classes.
  CHECK_THROWS_WITH(MultinomialLogisticRegression(2147483647, 1000000),
                    Contains("1000000x2147483647") && Contains("needs") && Contains("memory"));
  CHECK_NOTHROW(MultinomialLogisticRegression(784, 10));
}
