#include "ops/loss_parser.h"

#include "engine/base/error.h"
#include "engine/base/memory.h"
#include "ops/loss_syntax.h"
#include "ops/sequence_layout.h"

#include <cctype>
#include <charconv>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace orpheus::ops {
namespace {

using namespace loss_syntax;

class LineParser {
 public:
  LineParser(Graph& graph, FileState& state, const std::string& source, const std::string& line, int lineNo)
      : graph_(graph), state_(state), dims_(state.dims), names_(state.names), source_(source), line_(line),
        lineNo_(lineNo) {
    tokenize();
  }

  void statement() {
    if (peek().kind == Token::Kind::kEnd) return;
    const Token first = next();
    if (first.kind != Token::Kind::kIdent) fail(first, "a declaration or an assignment");
    // The keywords added with recurrence stay usable as names: 'next = ...' assigns.
    const bool assignment = peek().kind == Token::Kind::kPunct && peek().text == "=";
    if (first.text == "dim") {
      const Token name = expectIdent("a dimension name");
      expectPunct("=");
      dims_[name.text] = dimension();
    } else if (!assignment && (first.text == "sequence" || first.text == "state")) {
      declareSequenceOrState(first);
    } else if (!assignment && first.text == "next") {
      nextOfState();
    } else if (first.text == "param") {
      declareParam();
    } else if (first.text == "input" || first.text == "label") {
      declareInputOrLabel(first);
    } else if (first.text == "local") {
      declareLocal();
    } else if (first.text == "loss") {
      once(first, state_.lossLine);
      acceptPunct("=");
      const Value v = expression();
      requireNode(v, first, "the loss");
      graph_.setLoss(v.node);
    } else if (first.text == "predict") {
      once(first, state_.predictLine);
      const Value v = expression();
      requireNode(v, first, "the prediction");
      graph_.setPrediction(v.node);
    } else {
      assign(first);
    }
    if (peek().kind != Token::Kind::kEnd) fail(peek(), "end of line");
  }

 private:
  // 'sequence NAME[ROWS]' or 'state NAME[ROWS]', after the keyword `first`.
  void declareSequenceOrState(const Token& first) {
    const Token name = expectIdent("a name");
    expectPunct("[");
    const int64_t rows = dimension();
    expectPunct("]");
    if (first.text == "sequence") {
      try {
        declare(name, graph_.sequence(name.text, rows, loc(name)));
      } catch (const InputError& e) {
        if (std::string(e.what()).rfind(source_, 0) == 0) throw;
        throw InputError(at(name) + e.what());
      }
    } else {
      declare(name, graph_.state(name.text, rows, loc(name)));
    }
  }

  // 'next STATE = EXPR', after 'next'.
  void nextOfState() {
    const Token name = expectIdent("the name of a state");
    const auto it = names_.find(name.text);
    if (it == names_.end() || graph_.node(it->second).kind != NodeKind::kState) {
      throw InputError(fmt::format("{}'next' names '{}', which is not a state (declare it with 'state {}[SIZE]')",
                                   at(name), name.text, name.text));
    }
    expectPunct("=");
    const Value v = expression();
    requireNode(v, name, "the next value of '" + name.text + "'");
    graph_.setNext(it->second, v.node, loc(name));
  }

  // 'param NAME[ROWS(, COLS)] (init ...)', after 'param'.
  void declareParam() {
    const Token name = expectIdent("a parameter name");
    expectPunct("[");
    const int64_t rows = dimension();
    int64_t cols = 1;
    if (acceptPunct(",")) cols = dimension();
    expectPunct("]");
    Init init;
    if (acceptWord("init")) init = initSpec();
    checkParamFits(name, rows, cols);
    declare(name, graph_.param(name.text, rows, cols, init, loc(name)));
  }

  // 'input NAME[ROWS]' or 'label NAME[ROWS]', after the keyword `first`.
  void declareInputOrLabel(const Token& first) {
    const Token name = expectIdent("a name");
    expectPunct("[");
    const int64_t rows = dimension();
    expectPunct("]");
    if (first.text == "input" && graph_.isCell()) {
      throw InputError(fmt::format("{}a sequence model takes its data from the sequence; 'input' cannot be added",
                                   at(first)));
    }
    declare(name, first.text == "input" ? graph_.input(name.text, rows, loc(name))
                                        : graph_.label(name.text, rows, loc(name)));
  }

  // 'local NAME[ROWS] (init ...) (steps N) (lr X)', after 'local'.
  void declareLocal() {
    const Token name = expectIdent("a name");
    expectPunct("[");
    const int64_t rows = dimension();
    expectPunct("]");
    // One example's variable, at least: the batch's are allocated per clock.
    checkFits(name, static_cast<double>(rows) * sizeof(float),
              fmt::format("'{}' of {} floats per example", name.text, rows), 1.0);
    Init init;
    int steps = 5;
    double lr = 0.1;
    for (;;) {
      if (acceptWord("init")) {
        init = initSpec();
      } else if (acceptWord("steps")) {
        const Token count = expect(Token::Kind::kNumber, "a number of steps");
        const int64_t n = integer(count);
        if (n > Graph::kMaxInnerSteps) {
          throw InputError(fmt::format("{}'{}' asks for {} inner steps per clock; at most {} are allowed", at(count),
                                       name.text, n, Graph::kMaxInnerSteps));
        }
        steps = static_cast<int>(n);
      } else if (acceptWord("lr")) {
        lr = number(expect(Token::Kind::kNumber, "a learning rate"));
      } else {
        break;
      }
    }
    declare(name, graph_.local(name.text, rows, init, steps, lr, loc(name)));
  }

  // 'NAME = EXPR', after the name `first`.
  void assign(const Token& first) {
    expectPunct("=");
    const Value v = expression();
    requireNode(v, first, "'" + first.text + "'");
    if (names_.count(first.text) || dims_.count(first.text)) {
      throw InputError(fmt::format("{}'{}' is already defined", at(first), first.text));
    }
    names_[first.text] = v.node;
  }

  void tokenize() {
    size_t i = 0;
    while (i < line_.size()) {
      const char c = line_[i];
      if (c == '#') break;
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
        continue;
      }
      Token t;
      t.begin = i;
      t.column = static_cast<int>(i) + 1;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (i < line_.size() && (std::isalnum(static_cast<unsigned char>(line_[i])) || line_[i] == '_')) ++i;
        t.kind = Token::Kind::kIdent;
      } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
        while (i < line_.size() && (std::isalnum(static_cast<unsigned char>(line_[i])) || line_[i] == '.' ||
                                    ((line_[i] == '-' || line_[i] == '+') && (line_[i - 1] == 'e' || line_[i - 1] == 'E')))) {
          ++i;
        }
        t.kind = Token::Kind::kNumber;
      } else if (std::string_view("()[],=+-*").find(c) != std::string_view::npos) {
        ++i;
        t.kind = Token::Kind::kPunct;
      } else {
        throw InputError(fmt::format("{}:{}:{}: unexpected character '{}'", source_, lineNo_, i + 1, c));
      }
      t.end = i;
      t.text = line_.substr(t.begin, t.end - t.begin);
      tokens_.push_back(t);
    }
    Token end;
    end.begin = end.end = line_.size();
    end.column = static_cast<int>(line_.size()) + 1;
    tokens_.push_back(end);
  }

  // Refuses a statement that may appear once; `line` holds where it appeared first.
  void once(const Token& keyword, int& line) const {
    if (line > 0) {
      throw InputError(fmt::format("{}second '{}' statement; the first is at line {}", at(keyword), keyword.text, line));
    }
    line = lineNo_;
  }

  void checkFits(const Token& name, double bytes, const std::string& what, double share) const {
    try {
      checkFitsInMemory(bytes, what, share);
    } catch (const InputError& e) {
      throw InputError(at(name) + e.what());
    }
  }

  // A parameter matrix, and all parameters so far together, must fit in memory.
  void checkParamFits(const Token& name, int64_t rows, int64_t cols) {
    const double floats = static_cast<double>(rows) * static_cast<double>(cols);
    checkFits(name, floats * sizeof(float), fmt::format("parameter '{}' of {}x{} floats", name.text, rows, cols),
              kParamMemoryShare);
    state_.paramFloats += floats;
    checkFits(name, state_.paramFloats * sizeof(float),
              fmt::format("the model's parameters up to '{}' ({:.0f} floats)", name.text, state_.paramFloats),
              kParamMemoryShare);
  }

  // Bounds the recursion of the expression rules; one per nesting level.
  class Nesting {
   public:
    Nesting(LineParser& parser, const Token& at) : parser_(parser) {
      if (++parser_.depth_ > kMaxNestingDepth) {
        throw InputError(
            fmt::format("{}expression nested more than {} levels deep", parser_.at(at), kMaxNestingDepth));
      }
    }
    ~Nesting() { --parser_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    LineParser& parser_;
  };

  const Token& peek() const { return tokens_[pos_]; }
  Token next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  std::string at(const Token& t) const { return fmt::format("{}:{}:{}: ", source_, lineNo_, t.column); }
  SourceLoc loc(const Token& t) const { return {lineNo_, t.column}; }

  [[noreturn]] void fail(const Token& t, const std::string& expected) const {
    throw InputError(fmt::format("{}expected {}, found {}", at(t), expected, describe(t)));
  }
  Token expect(Token::Kind kind, const std::string& what) {
    if (peek().kind != kind) fail(peek(), what);
    return next();
  }
  Token expectIdent(const std::string& what) { return expect(Token::Kind::kIdent, what); }
  void expectPunct(const char* p) {
    if (!acceptPunct(p)) fail(peek(), fmt::format("'{}'", p));
  }
  bool acceptPunct(const char* p) {
    if (peek().kind == Token::Kind::kPunct && peek().text == p) {
      next();
      return true;
    }
    return false;
  }
  bool acceptWord(const char* w) {
    if (peek().kind == Token::Kind::kIdent && peek().text == w) {
      next();
      return true;
    }
    return false;
  }
  int64_t integer(const Token& t) const {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (ec != std::errc() || end != t.text.data() + t.text.size() || v <= 0) fail(t, "a positive integer");
    return v;
  }
  double number(const Token& t) const {
    double v = 0;
    const auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (ec != std::errc() || end != t.text.data() + t.text.size()) fail(t, "a number");
    return v;
  }
  // A size: a sum of products of integers and dimension names; a sum or product is at most kMaxSize.
  int64_t dimension() {
    int64_t total = dimensionTerm();
    while (acceptPunct("+")) {
      const int64_t term = dimensionTerm();
      // Both at most kMaxSize, so the sum cannot overflow.
      total = checkedSize(checkedSize(total) + checkedSize(term));
    }
    return total;
  }
  int64_t dimensionTerm() {
    int64_t product = dimensionFactor();
    while (acceptPunct("*")) {
      const Token at = peek();
      const int64_t f = dimensionFactor();
      if (product > kMaxSize / f) throw InputError(fmt::format("{}size too large", this->at(at)));
      product *= f;
    }
    return product;
  }
  int64_t checkedSize(int64_t v) const {
    if (v > kMaxSize) throw InputError(fmt::format("{}size too large", at(peek())));
    return v;
  }
  int64_t dimensionFactor() {
    const Token t = next();
    if (t.kind == Token::Kind::kNumber) return integer(t);
    if (t.kind != Token::Kind::kIdent) fail(t, "a size (an integer or a dimension name)");
    const auto it = dims_.find(t.text);
    if (it == dims_.end()) {
      throw InputError(fmt::format("{}unknown dimension '{}' (known: features, classes and names declared with dim)",
                                   at(t), t.text));
    }
    return it->second;
  }
  Init initSpec() {
    const Token t = expectIdent("an initialisation (zeros, constant, normal, uniform, glorot, he)");
    Init init;
    // A float's value; a scale (normal's deviation, uniform's bound) is not negative either.
    const auto arg = [&](bool scale = false) {
      expectPunct("(");
      const Token n = peek();
      const bool negative = acceptPunct("-");
      const double v = number(expect(Token::Kind::kNumber, "a number"));
      expectPunct(")");
      if (!(v <= std::numeric_limits<float>::max())) {
        throw InputError(fmt::format("{}{}(): {}{} is beyond the range of a float", at(n), t.text, negative ? "-" : "", v));
      }
      if (scale && negative && v != 0) {
        throw InputError(fmt::format("{}{}(): the scale -{} must not be negative", at(n), t.text, v));
      }
      return negative ? -v : v;
    };
    if (t.text == "zeros") {
      init.kind = Init::Kind::kZeros;
    } else if (t.text == "constant") {
      init.kind = Init::Kind::kConstant;
      init.value = arg();
    } else if (t.text == "normal") {
      init.kind = Init::Kind::kNormal;
      init.value = arg(true);
    } else if (t.text == "uniform") {
      init.kind = Init::Kind::kUniform;
      init.value = arg(true);
    } else if (t.text == "glorot") {
      init.kind = Init::Kind::kGlorot;
    } else if (t.text == "he") {
      init.kind = Init::Kind::kHe;
    } else {
      fail(t, "an initialisation (zeros, constant, normal, uniform, glorot, he)");
    }
    return init;
  }
  void declare(const Token& name, int node) {
    if (names_.count(name.text)) throw InputError(fmt::format("{}'{}' is already defined", at(name), name.text));
    names_[name.text] = node;
  }
  void requireNode(const Value& v, const Token& t, const std::string& what) const {
    if (v.isNumber()) throw InputError(fmt::format("{}{} must be an expression of the model, not a number", at(t), what));
  }

  std::string textFrom(size_t begin) const {
    const size_t end = tokens_[pos_ > 0 ? pos_ - 1 : 0].end;
    const size_t length = end > begin ? end - begin : 0;
    if (length <= kMaxNodeTextBytes) return line_.substr(begin, length);
    return line_.substr(begin, kMaxNodeTextBytes - 3) + "...";
  }

  Value apply(OpKind op, std::vector<int> inputs, size_t begin, const Token& where, double attr = 1.0) {
    Value v;
    v.node = graph_.apply(op, std::move(inputs), textFrom(begin), attr, loc(where));
    return v;
  }

  Value expression() {
    const Nesting nesting(*this, peek());
    const size_t begin = peek().begin;
    const Token startTok = peek();
    Value left = term();
    while (peek().kind == Token::Kind::kPunct && (peek().text == "+" || peek().text == "-")) {
      const Token op = next();
      const Value right = term();
      if (left.isNumber() && right.isNumber()) {
        left.number = op.text == "+" ? left.number + right.number : left.number - right.number;
        continue;
      }
      if (left.isNumber() || right.isNumber()) {
        throw InputError(fmt::format("{}a number can only scale an expression ('{}' adds one)", at(op),
                                     textFrom(begin)));
      }
      left = apply(op.text == "+" ? OpKind::kAdd : OpKind::kSubtract, {left.node, right.node}, begin, startTok);
    }
    return left;
  }

  Value term() {
    const size_t begin = peek().begin;
    const Token startTok = peek();
    Value left = unary();
    while (peek().kind == Token::Kind::kPunct && peek().text == "*") {
      next();
      const Value right = unary();
      if (left.isNumber() && right.isNumber()) {
        left.number *= right.number;
      } else if (left.isNumber() || right.isNumber()) {
        const double factor = left.isNumber() ? left.number : right.number;
        const int node = left.isNumber() ? right.node : left.node;
        left = apply(OpKind::kScale, {node}, begin, startTok, factor);
      } else if (const Node& l = graph_.node(left.node);
                 l.kind == NodeKind::kParam && !(l.cols == 1 && graph_.node(right.node).rows == l.rows)) {
        // A parameter matrix times a vector; a vector parameter times an equally long
        // vector is elementwise.
        left = apply(OpKind::kMatVec, {left.node, right.node}, begin, startTok);
      } else {
        left = apply(OpKind::kMultiply, {left.node, right.node}, begin, startTok);
      }
    }
    return left;
  }

  Value unary() {
    if (peek().kind == Token::Kind::kPunct && peek().text == "-") {
      const Nesting nesting(*this, peek());
      const Token minus = next();
      const size_t begin = minus.begin;
      Value v = unary();
      if (v.isNumber()) {
        v.number = -v.number;
        return v;
      }
      return apply(OpKind::kScale, {v.node}, begin, minus, -1.0);
    }
    return primary();
  }

  Value primary() {
    const Token t = next();
    if (t.kind == Token::Kind::kNumber) {
      Value v;
      v.number = number(t);
      return v;
    }
    if (t.kind == Token::Kind::kPunct && t.text == "(") {
      const Value v = expression();
      expectPunct(")");
      return v;
    }
    if (t.kind != Token::Kind::kIdent) fail(t, "an expression");
    if (peek().kind == Token::Kind::kPunct && peek().text == "(" && t.text == "chunk") return chunk(t);
    if (peek().kind == Token::Kind::kPunct && peek().text == "(") {
      next();
      const auto op = opFromName(t.text);
      if (op == OpKind::kSlice) {
        throw InputError(fmt::format("{}rows are taken with chunk(x, k, n): the k-th of n equal row blocks", at(t)));
      }
      if (!op) throw InputError(fmt::format("{}unknown operator '{}'", at(t), t.text));
      std::vector<Value> args;
      if (!(peek().kind == Token::Kind::kPunct && peek().text == ")")) {
        args.push_back(expression());
        while (acceptPunct(",")) args.push_back(expression());
      }
      expectPunct(")");
      const size_t wanted = *op == OpKind::kScale ? 2 : static_cast<size_t>(arity(*op));
      if (args.size() != wanted) {
        throw InputError(fmt::format("{}{} takes {} argument{}, got {}", at(t), t.text, wanted, wanted == 1 ? "" : "s",
                                     args.size()));
      }
      if (*op == OpKind::kScale) {
        if (args[0].isNumber() || !args[1].isNumber()) {
          throw InputError(fmt::format("{}scale takes an expression and a number: scale(x, 0.5)", at(t)));
        }
        return apply(OpKind::kScale, {args[0].node}, t.begin, t, args[1].number);
      }
      std::vector<int> inputs;
      for (const Value& a : args) {
        if (a.isNumber()) throw InputError(fmt::format("{}{} takes expressions, not numbers", at(t), t.text));
        inputs.push_back(a.node);
      }
      return apply(*op, std::move(inputs), t.begin, t);
    }
    const auto it = names_.find(t.text);
    if (it == names_.end()) {
      if (dims_.count(t.text)) {
        throw InputError(fmt::format("{}'{}' is a dimension; it can only give a size in [...]", at(t), t.text));
      }
      throw InputError(fmt::format("{}unknown name '{}'", at(t), t.text));
    }
    Value v;
    v.node = it->second;
    return v;
  }

  // chunk(x, k, n): rows [k r/n, (k+1) r/n) of x (r rows, a multiple of n).
  Value chunk(const Token& t) {
    next();  // '('
    const Value x = expression();
    expectPunct(",");
    const Token kTok = expect(Token::Kind::kNumber, "the block's index k (0 <= k < n)");
    expectPunct(",");
    const Token nTok = expect(Token::Kind::kNumber, "the number of blocks n");
    expectPunct(")");
    requireNode(x, t, "chunk's operand");
    int64_t k = 0;
    const auto [end, ec] = std::from_chars(kTok.text.data(), kTok.text.data() + kTok.text.size(), k);
    if (ec != std::errc() || end != kTok.text.data() + kTok.text.size()) fail(kTok, "an integer k");
    const int64_t n = integer(nTok);
    const int64_t rows = graph_.node(x.node).rows;
    if (k >= n) throw InputError(fmt::format("{}chunk {} of {}: k must be below n", at(kTok), k, n));
    if (rows % n != 0) {
      throw InputError(fmt::format("{}shape mismatch in '{}': '{}' has {} rows, not a multiple of {}", at(t),
                                   textFrom(t.begin), graph_.node(x.node).name, rows, n));
    }
    Value v;
    v.node = graph_.slice(x.node, k * (rows / n), rows / n, textFrom(t.begin), loc(t));
    return v;
  }

  Graph& graph_;
  FileState& state_;
  std::map<std::string, int64_t>& dims_;
  std::map<std::string, int>& names_;
  const std::string& source_;
  std::string line_;
  int lineNo_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Graph parseLoss(const std::string& text, const std::string& source, const LossDims& dims) {
  ORPHEUS_CHECK_INPUT(text.size() <= kMaxFileBytes, "{}: the model file is {} bytes; at most {} are allowed", source,
                      text.size(), kMaxFileBytes);
  Graph graph;
  graph.setSourceName(source);
  FileState state;
  if (dims.features > 0) state.dims["features"] = dims.features;
  if (dims.classes > 0) state.dims["classes"] = dims.classes;
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    ORPHEUS_CHECK_INPUT(line.size() <= kMaxLineBytes, "{}:{}:1: line is {} bytes long; a line may be at most {}",
                        source, lineNo, line.size(), kMaxLineBytes);
    LineParser parser(graph, state, source, line, lineNo);
    parser.statement();
    ORPHEUS_CHECK_INPUT(graph.nodes().size() <= kMaxNodes, "{}:{}:1: the model has more than {} expression nodes",
                        source, lineNo, kMaxNodes);
  }
  ORPHEUS_CHECK_INPUT(graph.loss() >= 0, "{}: no loss declared (add a line 'loss EXPR')", source);
  if (!graph.isCell()) return graph;
  const int64_t steps = dims.steps > 0 ? dims.steps : dims.features - segmentRows(0);
  ORPHEUS_CHECK_INPUT(steps > 0,
                      "{}: a sequence model needs token-stream data, whose segment length gives its time steps", source);
  ORPHEUS_CHECK_INPUT(static_cast<size_t>(steps) * graph.nodes().size() <= kMaxNodes,
                      "{}: unrolled over {} steps the model would have more than {} expression nodes", source, steps,
                      kMaxNodes);
  return graph.unroll(static_cast<int>(steps));
}

std::string readLossFile(const std::string& path) {
  std::ifstream in(path);
  ORPHEUS_CHECK_INPUT(in.good(), "cannot read model file '{}'", path);
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(in.tellg());
  ORPHEUS_CHECK_INPUT(size >= 0 && static_cast<size_t>(size) <= kMaxFileBytes,
                      "{}: the model file is {} bytes; at most {} are allowed", path, size, kMaxFileBytes);
  in.seekg(0, std::ios::beg);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Graph parseLossFile(const std::string& path, const LossDims& dims) { return parseLoss(readLossFile(path), path, dims); }

}  // namespace orpheus::ops
