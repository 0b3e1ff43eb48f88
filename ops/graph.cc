#include "ops/graph.h"

#include "engine/base/error.h"

#include <algorithm>
#include <optional>

namespace orpheus::ops {
namespace {

std::string describe(const Node& n) {
  if (n.kind == NodeKind::kParam) return fmt::format("'{}' is {}x{}", n.name, n.rows, n.cols);
  if (n.rows == 1) return fmt::format("'{}' is a scalar per example", n.name);
  return fmt::format("'{}' has {} rows per example", n.name, n.rows);
}

}  // namespace

int Graph::add(Node n) {
  if (n.kind != NodeKind::kOp) {
    const int first = find(n.name);
    ORPHEUS_CHECK_INPUT(first < 0, "{}'{}' is declared twice{}", where(n.loc), n.name,
                        node(first).loc.line > 0 ? fmt::format(" (first at line {})", node(first).loc.line) : "");
    ORPHEUS_CHECK_INPUT(n.rows > 0 && n.cols > 0, "'{}' needs a positive shape, got {}x{}", n.name, n.rows, n.cols);
  }
  n.id = static_cast<int>(nodes_.size());
  nodes_.push_back(std::move(n));
  return nodes_.back().id;
}

int Graph::param(const std::string& name, int64_t rows, int64_t cols, Init init, SourceLoc loc) {
  Node n;
  n.kind = NodeKind::kParam;
  n.name = name;
  n.rows = rows;
  n.cols = cols;
  n.init = init;
  n.loc = loc;
  const int id = add(std::move(n));
  params_.push_back(id);
  return id;
}

int Graph::input(const std::string& name, int64_t rows, SourceLoc loc) {
  ORPHEUS_CHECK_INPUT(sequence_ < 0, "{}only one input may be declared ('{}' after the sequence '{}')", where(-1), name,
                      sequence_ >= 0 ? node(sequence_).name : "");
  ORPHEUS_CHECK_INPUT(input_ < 0, "{}only one input may be declared ('{}' after '{}')", where(-1), name,
                      input_ >= 0 ? node(input_).name : "");
  Node n;
  n.kind = NodeKind::kInput;
  n.name = name;
  n.rows = rows;
  n.perExample = true;
  n.loc = loc;
  return input_ = add(std::move(n));
}

int Graph::label(const std::string& name, int64_t rows, SourceLoc loc) {
  ORPHEUS_CHECK_INPUT(label_ < 0, "only one label may be declared ('{}')", name);
  Node n;
  n.kind = NodeKind::kLabel;
  n.name = name;
  n.rows = rows;
  n.perExample = true;
  n.loc = loc;
  return label_ = add(std::move(n));
}

int Graph::local(const std::string& name, int64_t rows, Init init, int innerSteps, double innerLr, SourceLoc loc) {
  ORPHEUS_CHECK_INPUT(innerSteps >= 0 && innerLr >= 0, "'{}': inner steps and rate must be non-negative", name);
  ORPHEUS_CHECK_INPUT(innerSteps <= kMaxInnerSteps, "'{}': {} inner steps per clock; at most {} are allowed", name,
                      innerSteps, kMaxInnerSteps);
  Node n;
  n.kind = NodeKind::kLocal;
  n.name = name;
  n.rows = rows;
  n.perExample = true;
  n.init = init;
  n.innerSteps = innerSteps;
  n.innerLr = innerLr;
  n.loc = loc;
  const int id = add(std::move(n));
  locals_.push_back(id);
  return id;
}

int Graph::sequence(const std::string& name, int64_t rows, SourceLoc loc) {
  const std::string at = loc.line > 0 ? fmt::format("{}:{}:{}: ", source_, loc.line, loc.column) : "";
  ORPHEUS_CHECK_INPUT(sequence_ < 0 && input_ < 0, "{}only one input may be declared ('{}' after '{}')", at, name,
                      sequence_ >= 0 ? node(sequence_).name : (input_ >= 0 ? node(input_).name : ""));
  return sequence_ = token(name, rows, 0, 0, loc);
}

int Graph::token(const std::string& name, int64_t rows, int step, int offset, SourceLoc loc) {
  Node n;
  n.kind = NodeKind::kToken;
  n.name = name;
  n.rows = rows;
  n.perExample = true;
  n.step = step;
  n.tokenOffset = offset;
  n.loc = loc;
  return add(std::move(n));
}

int Graph::state(const std::string& name, int64_t rows, SourceLoc loc) {
  Node n;
  n.kind = NodeKind::kState;
  n.name = name;
  n.rows = rows;
  n.perExample = true;
  n.loc = loc;
  const int id = add(std::move(n));
  states_.push_back(id);
  next_.push_back(-1);
  return id;
}

void Graph::setNext(int state, int value, SourceLoc loc) {
  const std::string at = loc.line > 0 ? fmt::format("{}:{}:{}: ", source_, loc.line, loc.column) : "";
  const auto it = std::find(states_.begin(), states_.end(), state);
  ORPHEUS_CHECK_INPUT(it != states_.end(), "{}'next' names '{}', which is not a state (declare it with 'state')", at,
                      node(state).name);
  int& next = next_[static_cast<size_t>(it - states_.begin())];
  ORPHEUS_CHECK_INPUT(next < 0, "{}second 'next' for state '{}'", at, node(state).name);
  const Node& v = node(value);
  ORPHEUS_CHECK_INPUT(v.perExample, "{}the next value of state '{}' must be per example, not parameter '{}'", at,
                      node(state).name, v.name);
  ORPHEUS_CHECK_INPUT(v.rows == node(state).rows, "{}shape mismatch: state '{}' has {} rows but its next value '{}' has {}",
                      at, node(state).name, node(state).rows, v.name, v.rows);
  next = value;
}

int Graph::slice(int input, int64_t first, int64_t rows, const std::string& text, SourceLoc loc) {
  const std::string at = loc.line > 0 ? fmt::format("{}:{}:{}: ", source_, loc.line, loc.column) : "";
  const Node& a = node(input);
  ORPHEUS_CHECK_INPUT(a.perExample, "{}'{}' slices parameter '{}'; only per-example vectors can be sliced", at, text,
                      a.name);
  ORPHEUS_CHECK_INPUT(first >= 0 && rows > 0 && first + rows <= a.rows,
                      "{}shape mismatch in '{}': rows [{}, {}) of {}", at, text, first, first + rows, describe(a));
  Node n;
  n.kind = NodeKind::kOp;
  n.op = OpKind::kSlice;
  n.name = text;
  n.inputs = {input};
  n.attr = static_cast<double>(first);
  n.rows = rows;
  n.perExample = true;
  n.loc = loc;
  return add(std::move(n));
}

Graph Graph::unroll(int steps) const {
  ORPHEUS_CHECK_INPUT(isCell(), "{}the model has no sequence input to unroll", where(-1));
  ORPHEUS_CHECK_INPUT(steps >= 1, "{}a sequence model needs at least one step per segment, got {}", where(-1), steps);
  ORPHEUS_CHECK_INPUT(loss_ >= 0, "{}the model declares no loss", where(-1));
  for (size_t s = 0; s < states_.size(); ++s) {
    ORPHEUS_CHECK_INPUT(next_[s] >= 0, "{}state '{}' has no next value (add a line 'next {} = EXPR')",
                        where(states_[s]), node(states_[s]).name, node(states_[s]).name);
  }
  Graph out;
  out.source_ = source_;
  out.steps_ = steps;
  std::vector<int> shared(nodes_.size(), -1);
  for (int p : params_) {
    const Node& n = node(p);
    shared[static_cast<size_t>(p)] = out.param(n.name, n.rows, n.cols, n.init, n.loc);
  }
  for (int s : states_) {
    const Node& n = node(s);
    shared[static_cast<size_t>(s)] = out.state(n.name, n.rows, n.loc);
  }
  out.next_.clear();
  std::vector<int> prev;
  int total = -1;
  for (int t = 0; t < steps; ++t) {
    std::vector<int> cur(nodes_.size(), -1);
    for (const Node& n : nodes_) {
      const size_t i = static_cast<size_t>(n.id);
      switch (n.kind) {
        case NodeKind::kParam:
          cur[i] = shared[i];
          break;
        case NodeKind::kToken:
        case NodeKind::kLabel:
          cur[i] = out.token(fmt::format("{}@{}", n.name, t), n.rows, t, n.kind == NodeKind::kLabel ? 1 : 0, n.loc);
          break;
        case NodeKind::kState: {
          const size_t k = static_cast<size_t>(std::find(states_.begin(), states_.end(), n.id) - states_.begin());
          cur[i] = t == 0 ? shared[i] : prev[static_cast<size_t>(next_[k])];
          break;
        }
        case NodeKind::kOp: {
          std::vector<int> inputs;
          for (int in : n.inputs) inputs.push_back(cur[static_cast<size_t>(in)]);
          cur[i] = n.op == OpKind::kSlice ? out.slice(inputs[0], static_cast<int64_t>(n.attr), n.rows, n.name, n.loc)
                                          : out.apply(n.op, std::move(inputs), n.name, n.attr, n.loc);
          break;
        }
        case NodeKind::kInput:
        case NodeKind::kLocal:
          throw InputError(fmt::format("{}'{}' cannot be part of a sequence model", where(n.id), n.name));
      }
    }
    const int loss = cur[static_cast<size_t>(loss_)];
    total = t == 0 ? loss : out.apply(OpKind::kAdd, {total, loss}, "sum of the steps' losses", 1.0, node(loss_).loc);
    if (prediction_ >= 0) out.stepPredictions_.push_back(cur[static_cast<size_t>(prediction_)]);
    prev = std::move(cur);
  }
  for (size_t s = 0; s < states_.size(); ++s) out.finalStates_.push_back(prev[static_cast<size_t>(next_[s])]);
  out.setLoss(total);
  return out;
}

namespace {

// The rows of `op`'s result on `inputs`, once the operands' shapes are checked;
// `at` and `text` place the expression in messages.
int64_t resultRows(const Graph& graph, OpKind op, const std::vector<int>& inputs, const std::string& text,
                   const std::string& at) {
  const Node& a = graph.node(inputs[0]);
  const auto mismatch = [&](const std::string& why) {
    if (inputs.size() == 1) {
      return InputError(fmt::format("{}shape mismatch in '{}': {}; {}", at, text, why, describe(a)));
    }
    return InputError(fmt::format("{}shape mismatch in '{}': {}; {} and {}", at, text, why, describe(a),
                                  describe(graph.node(inputs[1]))));
  };
  const auto requirePerExample = [&](const Node& x) {
    if (!x.perExample) {
      throw InputError(fmt::format("{}'{}' uses parameter '{}' directly in {}, which takes per-example vectors", at,
                                   text, x.name, opName(op)));
    }
  };
  switch (operatorType(op)) {
    case 1:
      requirePerExample(a);
      return 1;
    case 2:
      requirePerExample(a);
      return a.rows;
    case 3: {
      const Node& b = graph.node(inputs[1]);
      requirePerExample(a);
      requirePerExample(b);
      if (a.rows != b.rows) throw mismatch(fmt::format("{} needs operands of equal length", opName(op)));
      return 1;
    }
    case 4: {
      const Node& b = graph.node(inputs[1]);
      if (!a.perExample && !b.perExample) {
        throw InputError(fmt::format("{}'{}' combines two parameters; one operand must be per-example", at, text));
      }
      const Node& param = a.perExample ? b : a;
      if (!param.perExample && param.cols != 1) {
        throw mismatch(fmt::format("{} broadcasts only a vector parameter (n x 1)", opName(op)));
      }
      if (a.rows != b.rows) throw mismatch(fmt::format("{} needs operands of equal length", opName(op)));
      return a.rows;
    }
    case 6: {  // kConcat
      const Node& b = graph.node(inputs[1]);
      requirePerExample(a);
      requirePerExample(b);
      return a.rows + b.rows;
    }
    case 5: {
      const Node& v = graph.node(inputs[1]);
      if (a.kind != NodeKind::kParam) {
        throw InputError(
            fmt::format("{}'{}': the left operand of a matrix-vector product must be a parameter matrix, got '{}'", at,
                        text, a.name));
      }
      requirePerExample(v);
      if (a.cols != v.rows) throw mismatch(fmt::format("{} columns must equal the vector's length", a.name));
      return a.rows;
    }
    default:
      ORPHEUS_ENFORCE(false, "unknown operator type");
  }
  return 0;
}

}  // namespace

int Graph::apply(OpKind op, std::vector<int> inputs, const std::string& text, double attr, SourceLoc loc) {
  ORPHEUS_ENFORCE(op != OpKind::kSlice, "slices are built with Graph::slice");
  ORPHEUS_ENFORCE(static_cast<int>(inputs.size()) == arity(op), "{} takes {} operands, got {}", opName(op), arity(op),
                  inputs.size());
  for (int in : inputs) ORPHEUS_ENFORCE(in >= 0 && in < static_cast<int>(nodes_.size()), "bad operand {}", in);
  Node n;
  n.kind = NodeKind::kOp;
  n.op = op;
  n.name = text;
  n.inputs = inputs;
  n.attr = attr;
  n.perExample = true;
  n.loc = loc;
  const std::string at = loc.line > 0 ? fmt::format("{}:{}:{}: ", source_, loc.line, loc.column) : "";
  n.rows = resultRows(*this, op, inputs, text, at);
  return add(std::move(n));
}

void Graph::setLoss(int id) {
  const Node& n = node(id);
  ORPHEUS_CHECK_INPUT(n.perExample && n.rows == 1, "{}the loss '{}' must be a scalar per example, but it has {} rows",
                      where(id), n.name, n.rows);
  loss_ = id;
}

void Graph::setPrediction(int id) {
  const Node& n = node(id);
  ORPHEUS_CHECK_INPUT(n.perExample, "{}the prediction '{}' must be a per-example vector", where(id), n.name);
  ORPHEUS_CHECK_INPUT(label_ < 0 || n.rows == node(label_).rows,
                      "{}the prediction '{}' has {} rows but the label '{}' has {}", where(id), n.name, n.rows,
                      node(label_).name, node(label_).rows);
  prediction_ = id;
}

int Graph::paramIndex(int id) const {
  const auto it = std::find(params_.begin(), params_.end(), id);
  return it == params_.end() ? -1 : static_cast<int>(it - params_.begin());
}

int Graph::find(const std::string& name) const {
  for (const Node& n : nodes_) {
    if (n.kind != NodeKind::kOp && n.name == name) return n.id;
  }
  return -1;
}

std::vector<int> Graph::consumers(int id) const {
  std::vector<int> out;
  for (const Node& n : nodes_) {
    if (std::find(n.inputs.begin(), n.inputs.end(), id) != n.inputs.end()) out.push_back(n.id);
  }
  return out;
}

std::string Graph::where(int id) const { return where(id < 0 ? SourceLoc{} : node(id).loc); }

std::string Graph::where(SourceLoc loc) const {
  if (loc.line == 0) return source_.empty() ? "" : source_ + ": ";
  return fmt::format("{}:{}:{}: ", source_, loc.line, loc.column);
}

std::vector<SvSite> Graph::identifySvs() const {
  ORPHEUS_CHECK_INPUT(loss_ >= 0, "{}the model declares no loss", where(-1));
  ORPHEUS_CHECK_INPUT(!params_.empty(),
                      "{}the model declares no parameters, so training has nothing to learn (declare one with "
                      "'param NAME[ROWS, COLS]')",
                      where(-1));
  // Nodes the loss depends on.
  std::vector<bool> feedsLoss(nodes_.size(), false);
  feedsLoss[static_cast<size_t>(loss_)] = true;
  for (int id = loss_; id >= 0; --id) {
    if (!feedsLoss[static_cast<size_t>(id)]) continue;
    for (int in : node(id).inputs) feedsLoss[static_cast<size_t>(in)] = true;
  }

  std::vector<SvSite> sites;
  for (int p : params_) {
    const Node& param = node(p);
    const std::vector<int> users = consumers(p);
    const bool usedAsMatrix = std::any_of(users.begin(), users.end(), [&](int u) {
      return node(u).op == OpKind::kMatVec && node(u).inputs[0] == p;
    });
    if (users.empty() || !feedsLoss[static_cast<size_t>(p)]) {
      throw InputError(fmt::format("{}parameter '{}' has no SV form: it does not influence the loss", where(p),
                                   param.name));
    }
    if (usedAsMatrix || param.cols > 1) {
      for (int u : users) {
        const Node& user = node(u);
        if (user.op != OpKind::kMatVec || user.inputs[0] != p) {
          throw InputError(fmt::format(
              "{}parameter '{}' has no SV form: it is used by '{}' ({}), but a matrix parameter may only multiply a "
              "vector (W * v)",
              where(u), param.name, user.name, opName(user.op)));
        }
      }
      continue;
    }
    // A vector parameter: must be a bias added to matrix-vector products that feed only that addition.
    for (int u : users) {
      const Node& user = node(u);
      const int other = user.inputs.size() == 2 ? (user.inputs[0] == p ? user.inputs[1] : user.inputs[0]) : -1;
      const bool biasOfProduct = user.op == OpKind::kAdd && other >= 0 && node(other).kind == NodeKind::kOp &&
                                 node(other).op == OpKind::kMatVec && consumers(other).size() == 1;
      if (!biasOfProduct) {
        throw InputError(fmt::format(
            "{}parameter '{}' has no SV form: it is used by '{}' ({}), but a vector parameter must be a bias added to a "
            "matrix-vector product used nowhere else (W * v + b)",
            where(u), param.name, user.name, opName(user.op)));
      }
    }
  }

  for (const Node& n : nodes_) {
    if (n.kind != NodeKind::kOp || n.op != OpKind::kMatVec || !feedsLoss[static_cast<size_t>(n.id)]) continue;
    SvSite site;
    site.param = paramIndex(n.inputs[0]);
    site.matvecNode = n.id;
    site.vectorNode = n.inputs[1];
    for (int u : consumers(n.id)) {
      const Node& user = node(u);
      if (user.op != OpKind::kAdd) continue;
      const int other = user.inputs[0] == n.id ? user.inputs[1] : user.inputs[0];
      if (node(other).kind == NodeKind::kParam) site.bias = paramIndex(other);
    }
    sites.push_back(site);
  }
  return sites;
}

namespace {

// The roles of the nodes of an LSTM cell whose hidden state is `hidden`, and its
// products m1 = f * cPrev and m2 = i * g; false when they do not form one.
bool matchLstmRoles(const Graph& graph, int hidden, LstmCellRoles& r, int& m1, int& m2) {
  const auto isOp = [&](int id, OpKind op) {
    return graph.node(id).kind == NodeKind::kOp && graph.node(id).op == op;
  };
  // The operands of a binary node, either order, such that `first(a)` holds.
  const auto split = [&](int id, const auto& first, int* a, int* b) {
    const Node& n = graph.node(id);
    if (first(n.inputs[0])) {
      *a = n.inputs[0];
      *b = n.inputs[1];
      return true;
    }
    if (first(n.inputs[1])) {
      *a = n.inputs[1];
      *b = n.inputs[0];
      return true;
    }
    return false;
  };
  r.hidden = hidden;
  if (!isOp(hidden, OpKind::kMultiply)) return false;
  // A gate: act(chunk(gates, k, 4)) with `gates` the same for all four.
  const auto gate = [&](int id, OpKind act, int which) {
    if (!isOp(id, act)) return false;
    const int slice = graph.node(id).inputs[0];
    if (!isOp(slice, OpKind::kSlice)) return false;
    const Node& sl = graph.node(slice);
    const int gates = sl.inputs[0];
    if (graph.node(gates).rows != 4 * sl.rows || (r.gates >= 0 && r.gates != gates)) return false;
    r.gates = gates;
    r.act[which] = id;
    r.offset[which] = static_cast<int64_t>(sl.attr);
    return true;
  };
  int tanhCell = -1;
  int out = -1;
  if (!split(hidden, [&](int id) { return isOp(id, OpKind::kTanh) && isOp(graph.node(id).inputs[0], OpKind::kAdd); },
             &tanhCell, &out)) {
    return false;
  }
  r.tanhCell = tanhCell;
  r.cell = graph.node(tanhCell).inputs[0];
  if (!gate(out, OpKind::kSigmoid, LstmCellRoles::kOutput)) return false;
  // cell = (f * cPrev) + (i * g), the sum in either order.
  const auto holdsCandidate = [&](int id) {
    if (!isOp(id, OpKind::kMultiply)) return false;
    const Node& n = graph.node(id);
    return isOp(n.inputs[0], OpKind::kTanh) || isOp(n.inputs[1], OpKind::kTanh);
  };
  if (!split(r.cell, holdsCandidate, &m2, &m1) || !isOp(m1, OpKind::kMultiply)) return false;
  int i = -1;
  int g = -1;
  if (!split(m2, [&](int id) { return isOp(id, OpKind::kTanh); }, &g, &i)) return false;
  if (!gate(g, OpKind::kTanh, LstmCellRoles::kCandidate) || !gate(i, OpKind::kSigmoid, LstmCellRoles::kInput)) {
    return false;
  }
  int f = -1;
  const auto isForget = [&](int id) {
    return isOp(id, OpKind::kSigmoid) && isOp(graph.node(id).inputs[0], OpKind::kSlice);
  };
  return split(m1, isForget, &f, &r.cPrev) && gate(f, OpKind::kSigmoid, LstmCellRoles::kForget);
}

// The cell's nodes, sorted, when its gates are the four chunks of one per-example
// `gates` and it can run as one step where `hidden` stands; false otherwise.
bool lstmCellGroup(const Graph& graph, const LstmCellRoles& r, int m1, int m2, std::vector<int>& group) {
  const int hidden = r.hidden;
  const int64_t h = graph.node(hidden).rows;
  std::vector<bool> seen(4, false);
  for (int64_t offset : r.offset) {
    if (offset % h != 0 || offset / h < 0 || offset / h > 3 || seen[static_cast<size_t>(offset / h)]) return false;
    seen[static_cast<size_t>(offset / h)] = true;
  }
  // Both operands hold one column per example (no broadcast parameter).
  if (graph.node(r.cPrev).rows != h || r.cPrev == r.gates || !graph.node(r.cPrev).perExample ||
      !graph.node(r.gates).perExample) {
    return false;
  }
  group = {m1, m2, r.cell, r.tanhCell, r.hidden};
  for (int k = 0; k < 4; ++k) {
    group.push_back(r.act[k]);
    group.push_back(graph.node(r.act[k]).inputs[0]);
  }
  std::sort(group.begin(), group.end());
  if (std::adjacent_find(group.begin(), group.end()) != group.end()) return false;
  // The step runs where `hidden` stands: every outside use of its nodes comes later,
  // and only the cell and hidden states have any.
  for (int id : group) {
    if (id == r.gates || id == r.cPrev) return false;
    for (int user : graph.consumers(id)) {
      if (std::binary_search(group.begin(), group.end(), user)) continue;
      if ((id != r.cell && id != r.hidden) || user < hidden) return false;
    }
  }
  return group.back() == hidden;
}

}  // namespace

bool Graph::matchLstmCell(int hidden, FusedStep* step) const {
  LstmCellRoles r;
  int m1 = -1;
  int m2 = -1;
  if (!matchLstmRoles(*this, hidden, r, m1, m2)) return false;
  std::vector<int> group;
  if (!lstmCellGroup(*this, r, m1, m2, group)) return false;
  step->kind = FusedStep::Kind::kLstmCell;
  step->nodes = std::move(group);
  step->lstm = r;
  return true;
}

std::vector<FusedStep> Graph::fusionPlan(bool lstmCells, ChainLimits limits) const {
  std::vector<FusedStep> steps;
  std::vector<bool> taken(nodes_.size(), false);
  for (const Node& n : nodes_) {
    FusedStep cell;
    if (n.kind == NodeKind::kOp && matchLstmCell(n.id, &cell)) {
      for (int id : cell.nodes) taken[static_cast<size_t>(id)] = true;
      if (lstmCells) steps.push_back(std::move(cell));
    }
  }
  std::vector<int> chainOf(nodes_.size(), -1);  // index into `chains` of the chain a node ends
  std::vector<std::vector<int>> chains;
  std::vector<std::vector<int>> chainInputs;  // each chain's distinct operands from outside it
  // The chain's inputs once node n joins it, or nothing when that would pass the limits.
  const auto joinedInputs = [&](int c, const Node& n) -> std::optional<std::vector<int>> {
    std::vector<int> in = chainInputs[static_cast<size_t>(c)];
    for (int x : n.inputs) {
      if (chainOf[static_cast<size_t>(x)] != c && std::find(in.begin(), in.end(), x) == in.end()) in.push_back(x);
    }
    if (static_cast<int64_t>(chains[static_cast<size_t>(c)].size()) + 1 > limits.steps ||
        static_cast<int64_t>(in.size()) > limits.inputs) {
      return std::nullopt;
    }
    return in;
  };
  for (const Node& n : nodes_) {
    if (n.kind != NodeKind::kOp || taken[static_cast<size_t>(n.id)]) continue;
    // softmax -> cross_entropy: the pair's gradient is p * sum(t) - t.
    if (n.op == OpKind::kCrossEntropy) {
      const Node& p = node(n.inputs[0]);
      if (p.kind == NodeKind::kOp && p.op == OpKind::kSoftmax && consumers(p.id).size() == 1 &&
          n.inputs[1] != p.id) {
        steps.push_back({FusedStep::Kind::kSoftmaxCrossEntropy, {p.id, n.id}, {}});
      }
      continue;
    }
    if (!isElementwise(n.op)) continue;
    int joined = -1;
    std::optional<std::vector<int>> inputs;
    for (int in : n.inputs) {
      const int c = chainOf[static_cast<size_t>(in)];
      if (c >= 0 && consumers(in).size() == 1 && joined < 0 && (inputs = joinedInputs(c, n))) joined = c;
    }
    if (joined >= 0) {
      chains[static_cast<size_t>(joined)].push_back(n.id);
      chainInputs[static_cast<size_t>(joined)] = std::move(*inputs);
    } else {
      // A new chain (also where joining would pass the backend's limits).
      joined = static_cast<int>(chains.size());
      chains.push_back({n.id});
      std::vector<int> in;
      for (int x : n.inputs) {
        if (std::find(in.begin(), in.end(), x) == in.end()) in.push_back(x);
      }
      chainInputs.push_back(std::move(in));
    }
    chainOf[static_cast<size_t>(n.id)] = joined;
  }
  for (auto& c : chains) {
    if (c.size() >= 2) steps.push_back({FusedStep::Kind::kElementwise, std::move(c), {}});
  }
  std::sort(steps.begin(), steps.end(), [](const FusedStep& a, const FusedStep& b) { return a.nodes[0] < b.nodes[0]; });
  return steps;
}

}  // namespace orpheus::ops
