// Run: the walk of a parsed program (docs/programs.md, "Chat turns", "Execution"): each sequence of
// steps (the top level, every branch of a running fork) advances until it needs an output from
// outside; those needs are the Actions, and complete() feeds their outputs back.
#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "programs/program.hpp"
#include "programs/template.hpp"

namespace sy::programs {
namespace {

// FNV-1a (64 bit) of a step's path: the salt of its seed. A pure function of the path, so the
// copies of a fork's `n` branches sample differently and a resumed program samples as before.
uint64_t path_salt(std::string_view path) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : path) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// A path's numbers ("2.1.0" -> {2, 1, 0}). Ordered as vectors they are the program's step order:
// a fork, then its branches' steps branch by branch, then its join.
std::vector<uint32_t> path_key(const std::string& path) {
  std::vector<uint32_t> key;
  uint32_t v = 0;
  for (char c : path) {
    if (c == '.') {
      key.push_back(v);
      v = 0;
    } else {
      v = v * 10 + static_cast<uint32_t>(c - '0');
    }
  }
  key.push_back(v);
  return key;
}

// A variable's value: one output, or a join's list.
struct Value {
  std::vector<std::string> values;
  bool list = false;
};

// What {{name}} inserts: the value, or a list's items joined by "\n".
std::string rendered(const Value& v) {
  std::string out;
  for (std::size_t i = 0; i < v.values.size(); ++i) {
    if (i) out += '\n';
    out += v.values[i];
  }
  return out;
}

}  // namespace

struct Run::Impl {
  // One sequence of steps being walked: the top level, or one branch of a fork that is running.
  struct Frame {
    enum State : uint8_t { running, waiting_action, waiting_prefill, waiting_branches, done };
    const Steps* steps = nullptr;
    const Frame* parent = nullptr;  // the frame whose fork this branch is of (waits meanwhile)
    std::string prefix;             // of its variables in vars(): "" top level, "F.i." branch i
    std::size_t next = 0;           // the step to walk next
    State state = running;
    // The context: one text (text mode) or the turns (chat mode); a branch starts from a copy of
    // its fork's, and `base_*` mark where the copy ended, so the join finds what it added.
    std::string text;
    std::vector<Turn> turns;
    std::size_t base_text = 0;
    std::size_t base_turns = 0;
    std::string extended;  // chat mode: text a branch added to the turn it inherited last
    std::map<std::string, Value> vars;             // defined by this frame's steps
    std::vector<std::unique_ptr<Frame>> branches;  // of the fork at `next`, while it runs

    const Value* find(const std::string& name) const {
      for (const Frame* f = this; f; f = f->parent) {
        const auto it = f->vars.find(name);
        if (it != f->vars.end()) return &it->second;
      }
      return nullptr;
    }
  };

  std::shared_ptr<const Program> program;
  Frame root;
  std::map<std::string, std::string> restored;         // path -> output, from the journal
  std::map<std::string, Frame*> pending;               // path -> the frame waiting on it
  std::map<std::vector<uint32_t>, VarValue> exported;  // by step order: what vars() lists
  std::vector<Action> queued;  // became ready inside complete(); ready() hands them out
  uint32_t done_steps = 0;
  std::string last;  // the output of the last top-level gen, select or tool step

  explicit Impl(std::shared_ptr<const Program> p) : program(std::move(p)) {
    root.steps = &program->steps;
    // Inputs are seen by {{name}} everywhere; vars() lists them from the program, not `exported`.
    for (const auto& [name, value] : program->inputs) root.vars[name] = Value{{value}, false};
  }

  bool chat() const { return program->chat; }

  std::string render(const std::string& t, const Frame& f) const {
    std::string out;
    detail::scan_template(
        t, [&](std::string_view lit) { out += lit; },
        [&](std::string_view name) {
          // parse() refused every name not defined before in scope, so this finds it
          if (const Value* v = f.find(std::string(name))) out += rendered(*v);
        });
    return out;
  }

  void define(Frame& f, const std::string& name, const std::string& path, Value v) {
    exported[path_key(path)] = VarValue{f.prefix + name, v.values, v.list};
    f.vars[name] = std::move(v);
  }

  // The step's sampling: the submit's fields, the step's own over them, and the seed salted by
  // the step's path.
  GenDefaults params(const Step& s) const {
    const GenDefaults& d = program->defaults;
    GenDefaults p = d;
    if (s.kind == Step::Kind::gen) {
      const GenParams& g = s.gen;
      if (g.max_tokens) p.max_tokens = *g.max_tokens;
      if (g.temperature) p.temperature = *g.temperature;
      if (g.top_k) p.top_k = *g.top_k;
      if (g.top_p) p.top_p = *g.top_p;
      if (g.stop) p.stop = *g.stop;
      if (g.controls) p.controls = *g.controls;
    }
    p.seed = (s.gen.seed ? *s.gen.seed : d.seed) + path_salt(s.path);
    return p;
  }

  Action action(Action::Kind kind, const Step& s, const Frame& f) const {
    Action a;
    a.kind = kind;
    a.path = s.path;
    a.name = s.name;
    a.step = &s;
    if (chat())
      a.turns = f.turns;
    else
      a.text = f.text;
    a.params = params(s);
    switch (kind) {
      case Action::Kind::gen:
        a.constraint = s.gen.constraint;
        break;
      case Action::Kind::select:
        a.choices = s.choices;
        break;
      case Action::Kind::tool:
        a.tool = s.tool;
        a.arguments = render(s.arguments, f);
        a.timeout_ms = s.timeout_ms;
        break;
      case Action::Kind::prefill:
        // One token whose output is discarded: the context's KV is what it is for.
        a.params.max_tokens = 1;
        break;
    }
    return a;
  }

  // A gen, select or tool step of `f` is done with `output`.
  void apply(Frame& f, const Step& s, const std::string& output) {
    define(f, s.name, s.path, Value{{output}, false});
    if (s.append) {
      if (!chat())
        f.text += output;
      else
        f.turns.push_back(Turn{s.kind == Step::Kind::tool ? s.role : "assistant", output});
    }
    ++done_steps;
    if (&f == &root) last = output;
    ++f.next;
    f.state = Frame::running;
  }

  void append_text(Frame& f, const Step& s) {
    std::string t = render(s.text, f);
    if (!chat()) {
      f.text += t;
    } else if (!s.role.empty()) {
      f.turns.push_back(Turn{s.role, std::move(t)});
    } else if (f.turns.empty()) {
      f.turns.push_back(Turn{"user", std::move(t)});  // text before any role: the user's
    } else {
      if (f.turns.size() == f.base_turns) f.extended += t;  // extends the fork's last turn
      f.turns.back().content += t;
    }
  }

  // Whether the journal holds the fork's prefill or any step inside the fork: then its context
  // was prefilled before the restart (the prefill is only a cache warm-up; not worth redoing).
  bool restored_within(const std::string& path) const {
    if (restored.count(path)) return true;
    const std::string inside = path + ".";
    const auto it = restored.lower_bound(inside);
    return it != restored.end() && it->first.compare(0, inside.size(), inside) == 0;
  }

  void start_fork(Frame& f, const Step& s, std::vector<Action>& out) {
    // Variables of branch i appear as "F.i.name": F the fork's name (within the frame's own
    // prefix, so copies of a named fork inside forked branches stay apart) or its path.
    const std::string label = s.name.empty() ? s.path : f.prefix + s.name;
    f.branches.clear();
    for (std::size_t i = 0; i < s.branches.size(); ++i) {
      auto b = std::make_unique<Frame>();
      b->steps = &s.branches[i];
      b->parent = &f;
      b->prefix = label + "." + std::to_string(i) + ".";
      b->text = f.text;
      b->turns = f.turns;
      b->base_text = f.text.size();
      b->base_turns = f.turns.size();
      f.branches.push_back(std::move(b));
    }
    if (s.branches.size() >= 2 && !restored_within(s.path)) {
      out.push_back(action(Action::Kind::prefill, s, f));
      pending[s.path] = &f;
      f.state = Frame::waiting_prefill;
    } else {
      f.state = Frame::waiting_branches;
    }
  }

  // Every branch of the fork at f.next is done: the join after it gathers them.
  void finish_fork(Frame& f) {
    const Steps& steps = *f.steps;
    const bool has_join = f.next + 1 < steps.size() && steps[f.next + 1].kind == Step::Kind::join;
    if (has_join && steps[f.next + 1].mode == Step::join_list) {
      const Step& j = steps[f.next + 1];
      Value list{{}, true};
      for (const auto& b : f.branches) {
        const auto it = b->vars.find(j.var);
        list.values.push_back(it == b->vars.end() ? std::string() : rendered(it->second));
      }
      define(f, j.name, j.path, std::move(list));
    } else if (has_join) {
      const std::string& sep = steps[f.next + 1].separator;
      if (!chat()) {
        for (std::size_t i = 0; i < f.branches.size(); ++i) {
          if (i) f.text += sep;
          f.text += f.branches[i]->text.substr(f.branches[i]->base_text);
        }
      } else {
        // Turns are messages of their own: no separator between them. What branches added to
        // the turn they inherited goes there first (branch order), then their new turns.
        for (const auto& b : f.branches) {
          if (b->extended.empty()) continue;
          if (f.turns.empty())
            f.turns.push_back(Turn{"user", b->extended});
          else
            f.turns.back().content += b->extended;
        }
        for (const auto& b : f.branches)
          f.turns.insert(f.turns.end(),
                         b->turns.begin() + static_cast<std::ptrdiff_t>(b->base_turns),
                         b->turns.end());
      }
    }
    f.branches.clear();
    f.next += has_join ? 2 : 1;
    f.state = Frame::running;
  }

  // Walks `f` (and its running branches) as far as outputs allow; new actions go to `out`.
  void advance(Frame& f, std::vector<Action>& out) {
    for (;;) {
      switch (f.state) {
        case Frame::waiting_action:
        case Frame::waiting_prefill:
        case Frame::done:
          return;
        case Frame::waiting_branches: {
          bool all_done = true;
          for (auto& b : f.branches) {
            advance(*b, out);
            all_done = all_done && b->state == Frame::done;
          }
          if (!all_done) return;
          finish_fork(f);
          break;
        }
        case Frame::running: {
          if (f.next >= f.steps->size()) {
            f.state = Frame::done;
            return;
          }
          const Step& s = (*f.steps)[f.next];
          switch (s.kind) {
            case Step::Kind::text:
              append_text(f, s);
              ++f.next;
              break;
            case Step::Kind::gen:
            case Step::Kind::select:
            case Step::Kind::tool: {
              if (const auto r = restored.find(s.path); r != restored.end()) {
                apply(f, s, r->second);
                break;
              }
              const Action::Kind k = s.kind == Step::Kind::gen      ? Action::Kind::gen
                                     : s.kind == Step::Kind::select ? Action::Kind::select
                                                                    : Action::Kind::tool;
              out.push_back(action(k, s, f));
              pending[s.path] = &f;
              f.state = Frame::waiting_action;
              return;
            }
            case Step::Kind::fork:
              start_fork(f, s, out);
              break;
            case Step::Kind::join:
              ++f.next;  // parse() puts every join right after its fork, which consumes it
              break;
          }
          break;
        }
      }
    }
  }
};

Run::Run(std::shared_ptr<const Program> program)
    : impl_(std::make_unique<Impl>(std::move(program))) {}
Run::~Run() = default;
Run::Run(Run&&) noexcept = default;
Run& Run::operator=(Run&&) noexcept = default;

void Run::restore(const std::string& path, const std::string& output) {
  // Past the first ready() an output for a step already handed out completes it; any other is
  // kept for when the walk gets there.
  if (impl_->pending.count(path)) {
    complete(path, output);
    return;
  }
  impl_->restored[path] = output;
}

std::vector<Action> Run::ready() {
  impl_->advance(impl_->root, impl_->queued);
  return std::exchange(impl_->queued, {});
}

bool Run::complete(const std::string& path, const std::string& output) {
  Impl& m = *impl_;
  const auto it = m.pending.find(path);
  if (it == m.pending.end()) return false;
  Impl::Frame& f = *it->second;
  m.pending.erase(it);
  // An action completed before ready() handed it out (its path known from a journal) is done:
  // it must not be handed out any more.
  std::erase_if(m.queued, [&](const Action& a) { return a.path == path; });
  if (f.state == Impl::Frame::waiting_prefill)
    f.state = Impl::Frame::waiting_branches;
  else
    m.apply(f, (*f.steps)[f.next], output);
  // Walk on now, so that finished() is true as soon as the last output is in; the actions this
  // frees wait for the next ready().
  m.advance(m.root, m.queued);
  return true;
}

bool Run::finished() const {
  return impl_->root.state == Impl::Frame::done;
}

std::vector<VarValue> Run::vars() const {
  std::vector<VarValue> out;
  for (const auto& [name, value] : impl_->program->inputs) out.push_back(VarValue{name, {value}});
  for (const auto& [key, v] : impl_->exported) out.push_back(v);
  return out;
}

std::string Run::last_output() const {
  return impl_->last;
}

uint32_t Run::steps_done() const {
  return impl_->done_steps;
}

std::vector<std::string> Run::pending() const {
  // The walk may have gone on inside complete(): what it queued is not handed out yet.
  std::vector<std::string> out;
  for (const auto& [path, frame] : impl_->pending) {
    const bool queued = std::any_of(impl_->queued.begin(), impl_->queued.end(),
                                    [&](const Action& a) { return a.path == path; });
    if (!queued) out.push_back(path);
  }
  return out;
}

}  // namespace sy::programs
