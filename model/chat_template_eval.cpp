// The chat-template evaluator: runs the syntax tree against the render's variables, writing
// output whose every byte keeps its mark (template text or message data).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "model/chat_template_internal.hpp"

namespace sy::chat::detail {
namespace {

// Arguments of a call, filter or test node: kids from `first` on, names aligned with them.
Args eval_args(const Node& n, std::size_t first, Ctx& c) {
  Args a;
  for (std::size_t i = first; i < n.kids.size(); ++i) {
    const std::string& nm = n.names.size() > i - first ? n.names[i - first] : std::string();
    Value v = eval(*n.kids[i], c);
    if (nm.empty())
      a.pos.push_back(std::move(v));
    else
      a.kw.emplace_back(nm, std::move(v));
  }
  return a;
}

}  // namespace

// The items a for loop or filter walks: list elements, dict keys, string characters.
List iterate(const Value& v, int line) {
  switch (v.k) {
    case K::List:
      return *v.list;
    case K::Dict: {
      List l;
      for (const auto& kv : v.dict->items) l.push_back(Value::text(kv.first));
      return l;
    }
    case K::Str: {
      List l;
      const auto cps = code_points(v.str.s);
      for (std::size_t i = 0; i + 1 < cps.size(); ++i)
        l.push_back(Value::string(v.str.sub(cps[i], cps[i + 1] - cps[i])));
      return l;
    }
    case K::Undef:
      return {};
    default:
      fail(line, std::string("cannot iterate over a ") + kind_name(v));
  }
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.k == K::Dict) {
    if (key.k == K::Str) {
      const Value* v = obj.dict->find(key.str.s);
      return v ? *v : Value{};
    }
    if (key.is_num()) {
      const Value* v = obj.dict->find(to_str(key).s);
      return v ? *v : Value{};
    }
    return {};
  }
  if ((obj.k == K::List || obj.k == K::Str) && (key.k == K::Int || key.k == K::Bool)) {
    if (obj.k == K::List) {
      const int64_t n = static_cast<int64_t>(obj.list->size());
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return {};
      return (*obj.list)[static_cast<std::size_t>(i)];
    }
    const auto cps = code_points(obj.str.s);
    const int64_t n = static_cast<int64_t>(cps.size()) - 1;
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return {};
    return Value::string(
        obj.str.sub(cps[static_cast<std::size_t>(i)],
                    cps[static_cast<std::size_t>(i) + 1] - cps[static_cast<std::size_t>(i)]));
  }
  if (obj.k == K::Undef || obj.k == K::None) return {};
  (void)line;
  return {};
}

Value slice(const Value& obj, const Value* a, const Value* b, const Value* st, int line) {
  const int64_t step = st && st->k != K::None && st->k != K::Undef ? st->as_int() : 1;
  if (step == 0) fail(line, "slice step cannot be zero");
  std::vector<std::size_t> cps;
  int64_t n = 0;
  if (obj.k == K::List) {
    n = static_cast<int64_t>(obj.list->size());
  } else if (obj.k == K::Str) {
    cps = code_points(obj.str.s);
    n = static_cast<int64_t>(cps.size()) - 1;
  } else {
    fail(line, std::string("cannot slice a ") + kind_name(obj));
  }
  auto bound = [&](const Value* v, int64_t def) {
    if (!v || v->k == K::None || v->k == K::Undef) return def;
    int64_t i = v->as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t lo = bound(a, step > 0 ? 0 : n - 1);
  const int64_t hi = bound(b, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) idx.push_back(i);
  if (obj.k == K::List) {
    List l;
    for (int64_t i : idx) l.push_back((*obj.list)[static_cast<std::size_t>(i)]);
    return Value::of_list(std::move(l));
  }
  Str s;
  for (int64_t i : idx)
    s.append(obj.str.sub(cps[static_cast<std::size_t>(i)],
                         cps[static_cast<std::size_t>(i) + 1] - cps[static_cast<std::size_t>(i)]));
  return Value::string(std::move(s));
}

Value arith(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    Str s = to_str(a);
    s.append(to_str(b));
    return Value::string(std::move(s));
  }
  if (op == "+") {
    if (a.k == K::Str && b.k == K::Str) {
      Str s = a.str;
      s.append(b.str);
      return Value::string(std::move(s));
    }
    if (a.k == K::List && b.k == K::List) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::of_list(std::move(l));
    }
  }
  if (op == "*") {
    const Value* s = a.k == K::Str || a.k == K::List   ? &a
                     : b.k == K::Str || b.k == K::List ? &b
                                                       : nullptr;
    const Value* n = s == &a ? &b : &a;
    if (s && (n->k == K::Int || n->k == K::Bool)) {
      const int64_t times = std::max<int64_t>(0, n->as_int());
      const std::size_t unit = s->k == K::Str ? s->str.s.size() : s->list->size();
      if (unit > 0 && static_cast<std::size_t>(times) > ChatTemplate::kMaxOutputBytes / unit)
        fail(line, "repetition too large");
      if (s->k == K::Str) {
        Str r;
        for (int64_t i = 0; i < times; ++i) r.append(s->str);
        return Value::string(std::move(r));
      }
      List l;
      for (int64_t i = 0; i < times; ++i) l.insert(l.end(), s->list->begin(), s->list->end());
      return Value::of_list(std::move(l));
    }
  }
  if (!a.is_num() || !b.is_num())
    fail(line,
         "unsupported operand types for " + op + ": " + kind_name(a) + " and " + kind_name(b));
  const bool ints = a.k != K::Float && b.k != K::Float;
  if (op == "/") {
    if (b.num() == 0) fail(line, "division by zero");
    return Value::real(a.num() / b.num());
  }
  if (ints) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    const auto checked = [&](bool overflow) {
      if (overflow) fail(line, "integer overflow in " + op);
      return Value::integer(r);
    };
    if (op == "+") return checked(__builtin_add_overflow(x, y, &r));
    if (op == "-") return checked(__builtin_sub_overflow(x, y, &r));
    if (op == "*") return checked(__builtin_mul_overflow(x, y, &r));
    if (op == "//" || op == "%") {
      if (y == 0) fail(line, "division by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1)
        fail(line, "integer overflow in " + op);
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    if (op == "**") {
      if (y >= 0) {
        int64_t p = 1;
        for (int64_t i = 0; i < y; ++i) {
          if (__builtin_mul_overflow(p, x, &p)) fail(line, "integer overflow in **");
          if (p == 0 || p == 1) break;  // stays there
          if (p == -1 && i > 0) {
            p = (y % 2 == 0) ? 1 : -1;
            break;
          }
        }
        return Value::integer(p);
      }
      return Value::real(std::pow(double(x), double(y)));
    }
  } else {
    const double x = a.num(), y = b.num();
    if (op == "+") return Value::real(x + y);
    if (op == "-") return Value::real(x - y);
    if (op == "*") return Value::real(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) fail(line, "division by zero");
      const double q = std::floor(x / y);
      return Value::real(op == "//" ? q : x - q * y);
    }
    if (op == "**") return Value::real(std::pow(x, y));
  }
  fail(line, "unknown operator " + op);
}

bool contains(const Value& hay, const Value& needle, int line) {
  switch (hay.k) {
    case K::Str:
      if (needle.k != K::Str) fail(line, "'in <string>' needs a string on the left");
      return hay.str.s.find(needle.str.s) != std::string::npos;
    case K::List:
      for (const auto& v : *hay.list)
        if (equal(v, needle)) return true;
      return false;
    case K::Dict:
      return needle.k == K::Str && hay.dict->find(needle.str.s) != nullptr;
    case K::Undef:
      return false;
    default:
      fail(line, std::string("'in' needs a string, list or dict, got ") + kind_name(hay));
  }
}

Value eval(const Node& n, Ctx& c) {
  switch (n.kind) {
    case Node::Lit:
      return n.lit;
    case Node::Var: {
      if (const Value* v = c.lookup(n.name)) return *v;
      return {};
    }
    case Node::Attr: {
      const Value obj = eval(*n.kids[0], c);
      if (obj.k == K::Dict) {
        const Value* v = obj.dict->find(n.name);
        return v ? *v : Value{};
      }
      return {};
    }
    case Node::Index:
      return get_item(eval(*n.kids[0], c), eval(*n.kids[1], c), n.line);
    case Node::Slice: {
      const Value obj = eval(*n.kids[0], c);
      Value parts[3];
      const Value* p[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 3; ++k)
        if (n.kids[static_cast<std::size_t>(k) + 1]) {
          parts[k] = eval(*n.kids[static_cast<std::size_t>(k) + 1], c);
          p[k] = &parts[k];
        }
      return slice(obj, p[0], p[1], p[2], n.line);
    }
    case Node::Call: {
      const Node& callee = *n.kids[0];
      const Args a = eval_args(n, 1, c);
      if (callee.kind == Node::Attr) {
        const Value obj = eval(*callee.kids[0], c);
        if (obj.k == K::Dict) {
          if (const Value* f = obj.dict->find(callee.name); f && f->k == K::Func)
            return call_global(f->fn, a, n.line);
        }
        return call_method(obj, callee.name, a, n.line);
      }
      const Value f = eval(callee, c);
      if (f.k == K::Func) return call_global(f.fn, a, n.line);
      if (callee.kind == Node::Var)
        fail(n.line, "'" + callee.name + "' is " +
                         (f.k == K::Undef ? std::string("undefined") : "not callable"));
      fail(n.line, std::string("a ") + kind_name(f) + " is not callable");
    }
    case Node::Filter: {
      const Value v = eval(*n.kids[0], c);
      return run_filter(n.name, v, eval_args(n, 1, c), n.line);
    }
    case Node::Test: {
      const Value v = eval(*n.kids[0], c);
      const bool r = run_test(n.name, v, eval_args(n, 1, c), n.line);
      return Value::boolean(r != n.negate);
    }
    case Node::Unary: {
      const Value v = eval(*n.kids[0], c);
      if (n.name == "not") return Value::boolean(!truthy(v));
      if (!v.is_num()) fail(n.line, "unary " + n.name + " needs a number");
      if (n.name == "-") {
        if (v.k == K::Float) return Value::real(-v.f);
        if (v.as_int() == std::numeric_limits<int64_t>::min())
          fail(n.line, "integer overflow in unary -");
        return Value::integer(-v.as_int());
      }
      return v.k == K::Bool ? Value::integer(v.as_int()) : v;
    }
    case Node::Binary: {
      if (n.name == "and") {
        Value l = eval(*n.kids[0], c);
        return truthy(l) ? eval(*n.kids[1], c) : l;
      }
      if (n.name == "or") {
        Value l = eval(*n.kids[0], c);
        return truthy(l) ? l : eval(*n.kids[1], c);
      }
      const Value l = eval(*n.kids[0], c);
      const Value r = eval(*n.kids[1], c);
      return arith(n.name, l, r, n.line);
    }
    case Node::Compare: {
      Value l = eval(*n.kids[0], c);
      for (std::size_t i = 0; i < n.names.size(); ++i) {
        Value r = eval(*n.kids[i + 1], c);
        const std::string& op = n.names[i];
        bool ok;
        if (op == "==")
          ok = equal(l, r);
        else if (op == "!=")
          ok = !equal(l, r);
        else if (op == "in")
          ok = contains(r, l, n.line);
        else if (op == "not in")
          ok = !contains(r, l, n.line);
        else {
          const int cmp = compare(l, r, n.line);
          ok = op == "<" ? cmp < 0 : op == "<=" ? cmp <= 0 : op == ">" ? cmp > 0 : cmp >= 0;
        }
        if (!ok) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case Node::Cond:
      if (truthy(eval(*n.kids[1], c))) return eval(*n.kids[0], c);
      return n.kids[2] ? eval(*n.kids[2], c) : Value{};
    case Node::ListLit: {
      List l;
      for (const auto& k : n.kids) l.push_back(eval(*k, c));
      return Value::of_list(std::move(l));
    }
    case Node::DictLit: {
      Dict d;
      for (std::size_t i = 0; i + 1 < n.kids.size(); i += 2)
        d.set(to_str(eval(*n.kids[i], c)).s, eval(*n.kids[i + 1], c));
      return of_dict(std::move(d));
    }
  }
  return {};
}

namespace {

void emit(Ctx& c, const Str& s, int line) {
  if (c.out.s.size() + s.s.size() > ChatTemplate::kMaxOutputBytes)
    fail(line, "output exceeds " + std::to_string(ChatTemplate::kMaxOutputBytes) + " bytes");
  c.out.append(s);
}

void assign(Ctx& c, const Stmt& s, Value v) {
  auto& top = c.frames.back();
  if (s.targets.size() == 2 && !s.cond) {  // ns.attr
    const Value* ns = c.lookup(s.targets[0]);
    if (!ns || ns->k != K::Dict || !ns->dict->is_namespace)
      fail(s.line, "cannot set an attribute of '" + s.targets[0] + "' (not a namespace)");
    ns->dict->set(s.targets[1], std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    top[s.targets[0]] = std::move(v);
    return;
  }
  List items = iterate(v, s.line);
  if (items.size() != s.targets.size())
    fail(s.line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                     std::to_string(s.targets.size()) + " names");
  for (std::size_t i = 0; i < items.size(); ++i) top[s.targets[i]] = items[i];
}

Flow exec_for(const Stmt& s, Ctx& c) {
  List all = iterate(eval(*s.expr, c), s.line);
  List items;
  if (s.cond) {
    for (Value& x : all) {
      c.frames.emplace_back();
      if (s.targets.size() == 1) {
        c.frames.back()[s.targets[0]] = x;
      } else {
        List parts = iterate(x, s.line);
        for (std::size_t i = 0; i < s.targets.size() && i < parts.size(); ++i)
          c.frames.back()[s.targets[i]] = parts[i];
      }
      const bool keep = truthy(eval(*s.cond, c));
      c.frames.pop_back();
      if (keep) items.push_back(std::move(x));
    }
  } else {
    items = std::move(all);
  }
  // Jinja runs the `else` body unless some iteration ran to its end: an iteration left by break
  // or continue does not count.
  bool completed = false;
  Value loop;
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    c.step(s.line);
    c.frames.emplace_back();
    auto& f = c.frames.back();
    const Value& x = items[static_cast<std::size_t>(i)];
    if (s.targets.size() == 1) {
      f[s.targets[0]] = x;
    } else {
      List parts = iterate(x, s.line);
      if (parts.size() != s.targets.size())
        fail(s.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                         std::to_string(s.targets.size()) + " loop variables");
      for (std::size_t k = 0; k < parts.size(); ++k) f[s.targets[k]] = parts[k];
    }
    // One `loop` object per loop, its fields updated in place (cheaper than a new one per
    // iteration; a template that keeps `loop` past its iteration sees the later values).
    if (i == 0) {
      Dict d;
      for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                            "depth", "depth0", "previtem", "nextitem"})
        d.items.emplace_back(k, Value{});
      loop = of_dict(std::move(d));
    }
    auto& li = loop.dict->items;
    li[0].second = Value::integer(i + 1);
    li[1].second = Value::integer(i);
    li[2].second = Value::integer(n - i);
    li[3].second = Value::integer(n - i - 1);
    li[4].second = Value::boolean(i == 0);
    li[5].second = Value::boolean(i == n - 1);
    li[6].second = Value::integer(n);
    li[7].second = Value::integer(1);
    li[8].second = Value::integer(0);
    li[9].second = i > 0 ? items[static_cast<std::size_t>(i - 1)] : Value{};
    li[10].second = i + 1 < n ? items[static_cast<std::size_t>(i + 1)] : Value{};
    f["loop"] = loop;
    const Flow fl = exec(s.body, c);
    c.frames.pop_back();
    completed = completed || fl == Flow::Normal;
    if (fl == Flow::Break) break;
  }
  if (!completed) return exec(s.else_body, c);
  return Flow::Normal;
}

}  // namespace

Flow exec(const Body& body, Ctx& c) {
  for (const Stmt& s : body) {
    c.step(s.line);
    switch (s.kind) {
      case Stmt::Text:
        emit(c, Str::clean(s.text), s.line);
        break;
      case Stmt::Out:
        emit(c, to_str(eval(*s.expr, c)), s.line);
        break;
      case Stmt::If:
        for (const auto& br : s.branches) {
          if (!br.first || truthy(eval(*br.first, c))) {
            const Flow f = exec(br.second, c);
            if (f != Flow::Normal) return f;
            break;
          }
        }
        break;
      case Stmt::For:
        exec_for(s, c);
        break;
      case Stmt::Set:
        assign(c, s, eval(*s.expr, c));
        break;
      case Stmt::SetBlock: {
        Str saved = std::move(c.out);
        c.out = Str{};
        exec(s.body, c);
        Str captured = std::move(c.out);
        c.out = std::move(saved);
        c.frames.back()[s.targets[0]] = Value::string(std::move(captured));
        break;
      }
      case Stmt::Break:
        return Flow::Break;
      case Stmt::Continue:
        return Flow::Continue;
    }
  }
  return Flow::Normal;
}

}  // namespace sy::chat::detail
