// The chat-template parser: builds the syntax tree from the pieces and tokens of the lexer
// (expressions by precedence, statements with their nested blocks).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "model/chat_template_internal.hpp"

namespace sy::chat::detail {
namespace {

// Nesting of expressions and blocks the parser accepts: real templates nest under 20; the bound
// keeps a hostile template from overflowing the stack.
constexpr int kMaxDepth = 200;

class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

  const Token& peek(std::size_t ahead = 0) const {
    return t_[std::min(pos_ + ahead, t_.size() - 1)];
  }
  bool at_end() const { return peek().kind == Tk::End; }
  bool is_op(std::string_view op, std::size_t ahead = 0) const {
    return peek(ahead).kind == Tk::Op && peek(ahead).text == op;
  }
  bool is_name(std::string_view n, std::size_t ahead = 0) const {
    return peek(ahead).kind == Tk::Name && peek(ahead).text == n;
  }
  Token next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail(line_, "expected '" + std::string(op) + "', got " + describe(peek()));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().kind != Tk::Name) fail(line_, "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected " + describe(peek()));
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tk::End:
        return "end of tag";
      case Tk::String:
        return "string literal";
      case Tk::Int:
      case Tk::Float:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }

  NodeP expression() {  // conditional expression
    Guard g(*this);
    NodeP e = or_expr();
    if (is_name("if")) {
      ++pos_;
      auto n = make(Node::Cond);
      NodeP cond = or_expr();
      NodeP other;
      if (is_name("else")) {
        ++pos_;
        other = expression();
      }
      n->kids.push_back(std::move(e));
      n->kids.push_back(std::move(cond));
      n->kids.push_back(std::move(other));
      return n;
    }
    return e;
  }

  // A comma list without brackets (for tuples in `for a, b in` iterables and `set`).
  NodeP tuple_or_expression() {
    NodeP first = expression();
    if (!is_op(",")) return first;
    auto n = make(Node::ListLit);
    n->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (at_end()) break;
      n->kids.push_back(expression());
    }
    return n;
  }

  NodeP or_expr() {
    NodeP l = and_expr();
    while (is_name("or")) {
      ++pos_;
      l = binary("or", std::move(l), and_expr());
    }
    return l;
  }
  NodeP and_expr() {
    NodeP l = not_expr();
    while (is_name("and")) {
      ++pos_;
      l = binary("and", std::move(l), not_expr());
    }
    return l;
  }
  NodeP not_expr() {
    Guard g(*this);
    if (is_name("not")) {
      ++pos_;
      auto n = make(Node::Unary);
      n->name = "not";
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }
  NodeP compare() {
    NodeP first = math1();
    NodeP chain;
    for (;;) {
      std::string op;
      if (peek().kind == Tk::Op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++pos_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!chain) {
        chain = make(Node::Compare);
        chain->kids.push_back(std::move(first));
      }
      chain->names.push_back(op);
      chain->kids.push_back(math1());
    }
    return chain ? std::move(chain) : std::move(first);
  }
  NodeP math1() {
    NodeP l = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      l = binary(op, std::move(l), concat());
    }
    return l;
  }
  NodeP concat() {
    NodeP l = math2();
    while (is_op("~")) {
      ++pos_;
      l = binary("~", std::move(l), math2());
    }
    return l;
  }
  NodeP math2() {
    NodeP l = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      l = binary(op, std::move(l), power());
    }
    return l;
  }
  NodeP power() {
    NodeP l = unary(true);
    while (is_op("**")) {
      ++pos_;
      l = binary("**", std::move(l), unary(true));
    }
    return l;
  }
  NodeP unary(bool with_filter) {
    Guard g(*this);
    NodeP n;
    if (is_op("-") || is_op("+")) {
      n = make(Node::Unary);
      n->name = next().text;
      n->kids.push_back(unary(false));
    } else {
      n = postfix(primary());
    }
    if (with_filter) n = filters(std::move(n));
    return n;
  }

  NodeP primary() {
    Guard g(*this);
    const Token t = next();
    switch (t.kind) {
      case Tk::Name: {
        if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return lit(Value::none());
        auto n = make(Node::Var);
        n->name = t.text;
        return n;
      }
      case Tk::String: {
        std::string s = t.text;
        while (peek().kind == Tk::String) s += next().text;  // adjacent literals join
        return lit(Value::text(std::move(s)));
      }
      case Tk::Int:
        return lit(Value::integer(t.i));
      case Tk::Float:
        return lit(Value::real(t.f));
      case Tk::Op:
        if (t.text == "(") {
          if (is_op(")")) {
            ++pos_;
            return make(Node::ListLit);
          }
          NodeP e = expression();
          if (is_op(",")) {
            auto n = make(Node::ListLit);
            n->kids.push_back(std::move(e));
            while (is_op(",")) {
              ++pos_;
              if (is_op(")")) break;
              n->kids.push_back(expression());
            }
            e = std::move(n);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto n = make(Node::ListLit);
          while (!is_op("]")) {
            n->kids.push_back(expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("]");
          return n;
        }
        if (t.text == "{") {
          auto n = make(Node::DictLit);
          while (!is_op("}")) {
            n->kids.push_back(expression());
            expect_op(":");
            n->kids.push_back(expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("}");
          return n;
        }
        break;
      default:
        break;
    }
    fail(line_, "unexpected " + describe(t) + " in an expression");
  }

  NodeP postfix(NodeP n) {
    for (;;) {
      if (is_op(".")) {
        ++pos_;
        auto a = make(Node::Attr);
        if (peek().kind == Tk::Int) {  // foo.0 is foo[0]
          a->kind = Node::Index;
          a->kids.push_back(std::move(n));
          a->kids.push_back(lit(Value::integer(next().i)));
        } else {
          a->name = expect_name();
          a->kids.push_back(std::move(n));
        }
        n = std::move(a);
      } else if (is_op("[")) {
        ++pos_;
        NodeP parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = expression();
          if (k < 2 && is_op(":")) {
            ++pos_;
            slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        auto s = make(slice ? Node::Slice : Node::Index);
        s->kids.push_back(std::move(n));
        if (slice) {
          for (auto& p : parts) s->kids.push_back(std::move(p));
        } else {
          if (!parts[0]) fail(line_, "empty subscript");
          s->kids.push_back(std::move(parts[0]));
        }
        n = std::move(s);
      } else if (is_op("(")) {
        auto c = make(Node::Call);
        c->kids.push_back(std::move(n));
        arguments(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  // (a, b, key=value) after the opening parenthesis has been seen (it is consumed here).
  void arguments(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tk::Name && is_op("=", 1)) {
        n.names.push_back(next().text);
        ++pos_;
      } else {
        n.names.emplace_back();
      }
      n.kids.push_back(expression());
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }

  NodeP filters(NodeP n) {
    for (;;) {
      if (is_op("|")) {
        ++pos_;
        auto f = make(Node::Filter);
        f->name = expect_name();
        check_filter(f->name);
        f->kids.push_back(std::move(n));
        if (is_op("("))
          arguments(*f);
        else
          f->names.clear();
        n = std::move(f);
      } else if (is_name("is")) {
        ++pos_;
        auto t = make(Node::Test);
        if (is_name("not")) {
          ++pos_;
          t->negate = true;
        }
        if (peek().kind == Tk::Name) {
          t->name = next().text;
        } else if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") ||
                   is_op(">=")) {
          t->name = next().text;
        } else {
          fail(line_, "expected a test name after 'is'");
        }
        if (t->name == "none" || t->name == "None") t->name = "none";
        if (t->name == "true" || t->name == "True") t->name = "true";
        if (t->name == "false" || t->name == "False") t->name = "false";
        check_test(t->name);
        t->kids.push_back(std::move(n));
        if (is_op("(")) {
          arguments(*t);
        } else if (!at_end() && (peek().kind == Tk::String || peek().kind == Tk::Int ||
                                 peek().kind == Tk::Float ||
                                 (peek().kind == Tk::Name && !is_name("and") && !is_name("or") &&
                                  !is_name("if") && !is_name("else") && !is_name("is") &&
                                  !is_name("in") && !is_name("not")))) {
          // `x is divisibleby 3`: a test takes one argument without parentheses
          t->names.emplace_back();
          t->kids.push_back(postfix(primary()));
        }
        n = std::move(t);
      } else {
        return n;
      }
    }
  }

  void check_filter(const std::string& name) const { check_filter_name(name, line_); }
  void check_test(const std::string& name) const { check_test_name(name, line_); }

 private:
  struct Guard {
    explicit Guard(ExprParser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth)
        fail(p_.line_, "expression nested deeper than " + std::to_string(kMaxDepth));
    }
    ~Guard() { --p_.depth_; }
    ExprParser& p_;
  };
  NodeP make(Node::Kind k) const {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line_;
    return n;
  }
  NodeP lit(Value v) const {
    auto n = make(Node::Lit);
    n->lit = std::move(v);
    return n;
  }
  NodeP binary(const std::string& op, NodeP l, NodeP r) const {
    auto n = make(Node::Binary);
    n->name = op;
    n->kids.push_back(std::move(l));
    n->kids.push_back(std::move(r));
    return n;
  }

  std::vector<Token> t_;
  std::size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

class StmtParser {
 public:
  explicit StmtParser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  Body parse_all() {
    std::string end;
    Body b = body({}, end);
    return b;
  }

 private:
  // Statements until one of `ends` (a block keyword) or the end; `found` gets the keyword met.
  Body body(const std::vector<std::string>& ends, std::string& found) {
    if (++depth_ > kMaxDepth) fail(line_, "blocks nested deeper than " + std::to_string(kMaxDepth));
    Body out;
    found.clear();
    while (k_ < p_.size()) {
      Piece& pc = p_[k_];
      line_ = pc.line;
      if (pc.kind == Piece::Text) {
        ++k_;
        if (pc.text.empty()) continue;
        Stmt s;
        s.kind = Stmt::Text;
        s.line = pc.line;
        s.text = pc.text;
        out.push_back(std::move(s));
        continue;
      }
      if (pc.kind == Piece::Comment) {
        ++k_;
        continue;
      }
      ExprParser ep(lex_expr(pc.text, pc.line), pc.line);
      if (pc.kind == Piece::Var) {
        ++k_;
        Stmt s;
        s.kind = Stmt::Out;
        s.line = pc.line;
        s.expr = ep.expression();
        ep.expect_end();
        out.push_back(std::move(s));
        continue;
      }
      if (ep.peek().kind != Tk::Name) fail(pc.line, "a block tag must start with a keyword");
      const std::string kw = ep.peek().text;
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        found = kw;
        cur_ = std::make_unique<ExprParser>(std::move(ep));
        ++k_;
        --depth_;
        return out;
      }
      ep.next();
      ++k_;
      const int line = pc.line;
      if (kw == "if") {
        out.push_back(parse_if(ep, line));
      } else if (kw == "for") {
        out.push_back(parse_for(ep, line));
      } else if (kw == "set") {
        out.push_back(parse_set(ep, line));
      } else if (kw == "break" || kw == "continue") {
        ep.expect_end();
        if (loops_ == 0) fail(line, "'" + kw + "' outside a loop");
        Stmt s;
        s.kind = kw == "break" ? Stmt::Break : Stmt::Continue;
        s.line = line;
        out.push_back(std::move(s));
      } else if (kw == "raw") {
        // the text piece that follows is literal; its endraw closes it
        std::string f;
        Body inner = body({"endraw"}, f);
        if (f.empty()) fail(line, "'raw' block not closed");
        for (auto& s : inner) out.push_back(std::move(s));
      } else if (kw == "generation") {
        // Hugging Face's marker of assistant text for training masks: renders its body
        std::string f;
        Body inner = body({"endgeneration"}, f);
        if (f.empty()) fail(line, "'generation' block not closed");
        for (auto& s : inner) out.push_back(std::move(s));
      } else if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0) {
        fail(line, "unexpected '" + kw + "'");
      } else {
        fail(line, "unsupported tag '" + kw + "'");
      }
    }
    if (!ends.empty())
      fail(line_, "missing '" + ends.back() + "' (end of template reached inside a block)");
    --depth_;
    return out;
  }

  Stmt parse_if(ExprParser& ep, int line) {
    Stmt s;
    s.kind = Stmt::If;
    s.line = line;
    NodeP cond = ep.expression();
    ep.expect_end();
    for (;;) {
      std::string f;
      Body b = body({"elif", "else", "endif"}, f);
      if (f.empty()) fail(line, "'if' block not closed (missing 'endif')");
      s.branches.emplace_back(std::move(cond), std::move(b));
      ExprParser& e = *cur_;
      e.next();
      if (f == "endif") {
        e.expect_end();
        break;
      }
      if (f == "elif") {
        cond = e.expression();
        e.expect_end();
      } else {
        e.expect_end();
        Body eb = body({"endif"}, f);
        if (f.empty()) fail(line, "'if' block not closed (missing 'endif')");
        cur_->next();
        cur_->expect_end();
        s.branches.emplace_back(nullptr, std::move(eb));
        break;
      }
    }
    return s;
  }

  Stmt parse_for(ExprParser& ep, int line) {
    Stmt s;
    s.kind = Stmt::For;
    s.line = line;
    s.targets.push_back(ep.expect_name());
    while (ep.is_op(",")) {
      ep.next();
      s.targets.push_back(ep.expect_name());
    }
    if (!ep.is_name("in")) fail(line, "expected 'in' in a 'for' tag");
    ep.next();
    // The iterable stops before a trailing `if` filter (no inline conditional here).
    s.expr = ep.or_expr();
    if (ep.is_name("if")) {
      ep.next();
      s.cond = ep.expression();
    }
    if (ep.is_name("recursive")) fail(line, "recursive loops are not supported");
    ep.expect_end();
    ++loops_;
    std::string f;
    s.body = body({"else", "endfor"}, f);
    --loops_;
    if (f.empty()) fail(line, "'for' block not closed (missing 'endfor')");
    cur_->next();
    cur_->expect_end();
    if (f == "else") {
      s.else_body = body({"endfor"}, f);
      if (f.empty()) fail(line, "'for' block not closed (missing 'endfor')");
      cur_->next();
      cur_->expect_end();
    }
    return s;
  }

  Stmt parse_set(ExprParser& ep, int line) {
    Stmt s;
    s.line = line;
    s.targets.push_back(ep.expect_name());
    if (ep.is_op(".")) {
      ep.next();
      s.targets.push_back(ep.expect_name());
    } else {
      while (ep.is_op(",")) {  // set a, b = ...
        ep.next();
        s.targets.push_back(ep.expect_name());
        s.cond = std::make_unique<Node>();  // marks a tuple target
      }
    }
    if (ep.at_end()) {
      if (s.targets.size() != 1) fail(line, "a block 'set' takes one name");
      s.kind = Stmt::SetBlock;
      std::string f;
      s.body = body({"endset"}, f);
      if (f.empty()) fail(line, "'set' block not closed (missing 'endset')");
      cur_->next();
      cur_->expect_end();
      return s;
    }
    if (ep.is_op("|")) fail(line, "filtered block 'set' is not supported");
    ep.expect_op("=");
    s.kind = Stmt::Set;
    s.expr = ep.tuple_or_expression();
    ep.expect_end();
    return s;
  }

  std::vector<Piece> p_;
  std::size_t k_ = 0;
  int line_ = 1;
  int depth_ = 0;
  int loops_ = 0;
  std::unique_ptr<ExprParser> cur_;  // the tag that ended the last body, positioned at its keyword
};

}  // namespace

Body parse_template(std::string_view source) {
  StmtParser p(split_source(std::string(source)));
  return p.parse_all();
}

}  // namespace sy::chat::detail
