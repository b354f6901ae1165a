// From the parsed rules to the matcher's automaton: the checks that keep matching finite (no
// left recursion, every rule can end), inlining of small rules, one minimal DFA per remaining
// rule; and the whole-text checks of grammar.hpp.
#include "constraints/automaton.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "constraints/grammar.hpp"
#include "constraints/nfa.hpp"

namespace sy::constraints {
namespace {

// A rule that is not recursive is copied into its callers when it is small or used once:
// whitespace, enums, numbers and strings then live inside the caller, so the per-state token
// tables of the matcher see what follows them instead of stopping at the rule's end. A rule whose
// copies would add up past kInlineBudget states stays a call, so its states (and their tables,
// each a walk of the vocabulary at compile time) are shared by every caller.
constexpr std::size_t kInlineMaxStates = 2048;
constexpr std::size_t kInlineBudget = 4096;
// A rule takes no more inlined copies past this size, which keeps its determinization quick.
constexpr std::size_t kInlineRuleCap = 32 * 1024;

// State sets and signatures as hash keys while compiling.
struct WordsHash {
  std::size_t operator()(const std::vector<uint32_t>& v) const {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
    for (uint32_t x : v) {
      h ^= x;
      h *= 0xFF51AFD7ED558CCDull;
      h ^= h >> 32;
    }
    return static_cast<std::size_t>(h);
  }
};
using WordsMap = std::unordered_map<std::vector<uint32_t>, uint32_t, WordsHash>;

// A partition of 0..n-1 into sets that can be split by marking elements (Valmari and
// Lehtinen's refinable partition): mark some elements, then split() cuts each touched set into
// its marked and unmarked parts, the smaller part getting the new set number.
struct Refinable {
  explicit Refinable(uint32_t n)
      : elems(n), where(n), set_of(n, 0), first(n + 1, 0), past(n + 1, 0), marked(n + 1, 0) {
    for (uint32_t i = 0; i < n; ++i) elems[i] = where[i] = i;
    sets = n > 0 ? 1 : 0;
    past[0] = n;
  }

  // Regroups elements into consecutive sets: `order` lists them, `cut(a, b)` is true between
  // neighbours that belong to different sets. Only on a fresh partition.
  template <class Cut>
  void group(const std::vector<uint32_t>& order, Cut cut) {
    sets = 0;
    for (uint32_t i = 0; i < order.size(); ++i) {
      if (i == 0 || cut(order[i - 1], order[i])) {
        if (i > 0) past[sets - 1] = i;
        first[sets++] = i;
      }
      elems[i] = order[i];
      where[order[i]] = i;
      set_of[order[i]] = sets - 1;
    }
    if (sets > 0) past[sets - 1] = static_cast<uint32_t>(order.size());
  }

  void mark(uint32_t e) {
    const uint32_t s = set_of[e], i = where[e], j = first[s] + marked[s];
    elems[i] = elems[j];
    where[elems[i]] = i;
    elems[j] = e;
    where[e] = j;
    if (marked[s]++ == 0) touched.push_back(s);
  }

  void split() {
    while (!touched.empty()) {
      const uint32_t s = touched.back();
      touched.pop_back();
      const uint32_t j = first[s] + marked[s];
      if (j == past[s]) {
        marked[s] = 0;
        continue;
      }
      if (marked[s] <= past[s] - j) {
        first[sets] = first[s];
        past[sets] = first[s] = j;
      } else {
        past[sets] = past[s];
        first[sets] = past[s] = j;
      }
      for (uint32_t i = first[sets]; i < past[sets]; ++i) set_of[elems[i]] = sets;
      marked[s] = marked[sets] = 0;
      ++sets;
    }
  }

  uint32_t sets = 0;
  std::vector<uint32_t> elems, where, set_of, first, past, marked, touched;
};

class Builder {
 public:
  Builder(Nfa nfa, const Limits& lim) : nfa_(std::move(nfa)), lim_(lim) {}

  std::shared_ptr<const Grammar> run() {
    const std::size_t n = nfa_.rules.size();
    reachable_ = reach();
    check_productive();
    nullable_ = compute_nullable();
    // A call to a rule that can read nothing may also be skipped: the matcher relies on this
    // (it never ends a callee that has read nothing; the caller's own state has that path).
    for (uint32_t r = 0; r < n; ++r)
      for (NfaState& s : nfa_.rules[r].states)
        for (const NfaCall& c : s.calls)
          if (nullable_[c.rule]) s.eps.push_back(c.to);
    check_left_recursion();
    recursive_ = compute_recursive();
    inline_state_.assign(n, 0);
    total_states_ = 0;
    sites_.assign(n, 0);
    for (uint32_t r = 0; r < n; ++r) {
      if (!reachable_[r]) continue;
      total_states_ += nfa_.rules[r].states.size();
      for (const NfaState& s : nfa_.rules[r].states)
        for (const NfaCall& c : s.calls) ++sites_[c.rule];
    }
    for (uint32_t r = 0; r < n; ++r)
      if (reachable_[r]) inline_rule(r);
    reachable_ = reach();
    return determinize();
  }

 private:
  std::vector<char> reach() const {
    std::vector<char> seen(nfa_.rules.size(), 0);
    std::vector<uint32_t> todo{nfa_.root};
    seen[nfa_.root] = 1;
    while (!todo.empty()) {
      const uint32_t r = todo.back();
      todo.pop_back();
      for (const NfaState& s : nfa_.rules[r].states)
        for (const NfaCall& c : s.calls)
          if (!seen[c.rule]) {
            seen[c.rule] = 1;
            todo.push_back(c.rule);
          }
    }
    return seen;
  }

  // Whether the rule's accept state is reachable from its start, following epsilons, calls to
  // rules `ok` marks and, with `bytes`, byte edges.
  bool reaches_accept(uint32_t r, const std::vector<char>& ok, bool bytes) const {
    const NfaRule& rule = nfa_.rules[r];
    std::vector<char> seen(rule.states.size(), 0);
    std::vector<uint32_t> todo{rule.start};
    seen[rule.start] = 1;
    while (!todo.empty()) {
      const uint32_t s = todo.back();
      todo.pop_back();
      if (s == rule.accept) return true;
      auto visit = [&](uint32_t t) {
        if (!seen[t]) {
          seen[t] = 1;
          todo.push_back(t);
        }
      };
      for (uint32_t t : rule.states[s].eps) visit(t);
      for (const NfaCall& c : rule.states[s].calls)
        if (ok[c.rule]) visit(c.to);
      if (bytes)
        for (const NfaEdge& e : rule.states[s].bytes) visit(e.to);
    }
    return false;
  }

  std::vector<char> fixpoint(bool bytes) const {
    std::vector<char> ok(nfa_.rules.size(), 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < nfa_.rules.size(); ++r) {
        if (ok[r] || !reachable_[r]) continue;
        if (reaches_accept(r, ok, bytes)) {
          ok[r] = 1;
          changed = true;
        }
      }
    }
    return ok;
  }

  // A rule that cannot end would leave stacks that never finish: refuse it by name.
  void check_productive() const {
    const std::vector<char> ok = fixpoint(true);
    // Name a rule that calls itself if one cannot end: that is where the way out is missing.
    uint32_t bad = kNoState;
    for (uint32_t r = 0; r < nfa_.rules.size(); ++r) {
      if (!reachable_[r] || ok[r]) continue;
      if (bad == kNoState || (!self_call(bad) && self_call(r))) bad = r;
    }
    if (bad != kNoState)
      throw ConstraintError("rule '" + nfa_.rules[bad].name +
                            "' can never end: every alternative needs a rule that cannot end "
                            "(itself, directly or through others)");
  }

  bool self_call(uint32_t r) const {
    for (const NfaState& s : nfa_.rules[r].states)
      for (const NfaCall& c : s.calls)
        if (c.rule == r) return true;
    return false;
  }

  std::vector<char> compute_nullable() const { return fixpoint(false); }

  // The rules a rule can call before reading any byte.
  std::vector<uint32_t> left_calls(uint32_t r) const {
    const NfaRule& rule = nfa_.rules[r];
    std::vector<char> seen(rule.states.size(), 0);
    std::vector<uint32_t> todo{rule.start}, out;
    seen[rule.start] = 1;
    while (!todo.empty()) {
      const uint32_t s = todo.back();
      todo.pop_back();
      for (const NfaCall& c : rule.states[s].calls) out.push_back(c.rule);
      for (uint32_t t : rule.states[s].eps)
        if (!seen[t]) {
          seen[t] = 1;
          todo.push_back(t);
        }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // Left recursion would make the matcher call rules forever without reading: refuse it, naming
  // the cycle.
  void check_left_recursion() const {
    const std::size_t n = nfa_.rules.size();
    std::vector<std::vector<uint32_t>> edges(n);
    for (uint32_t r = 0; r < n; ++r)
      if (reachable_[r]) edges[r] = left_calls(r);
    std::vector<char> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<uint32_t> path;
    std::vector<std::pair<uint32_t, std::size_t>> frames;  // iterative DFS: rule, next edge
    for (uint32_t r0 = 0; r0 < n; ++r0) {
      if (!reachable_[r0] || color[r0]) continue;
      frames.push_back({r0, 0});
      color[r0] = 1;
      path.push_back(r0);
      while (!frames.empty()) {
        auto& [r, i] = frames.back();
        if (i == edges[r].size()) {
          color[r] = 2;
          path.pop_back();
          frames.pop_back();
          continue;
        }
        const uint32_t s = edges[r][i++];
        if (color[s] == 1) {
          std::string cycle;
          const auto at = std::find(path.begin(), path.end(), s);
          for (auto it = at; it != path.end(); ++it) cycle += nfa_.rules[*it].name + " -> ";
          cycle += nfa_.rules[s].name;
          throw ConstraintError("rule '" + nfa_.rules[s].name + "' is left-recursive (" + cycle +
                                "): it can reach itself before reading any text; write the "
                                "repetition with *, + or {m,n} instead");
        }
        if (color[s] == 0) {
          color[s] = 1;
          path.push_back(s);
          frames.push_back({s, 0});
        }
      }
    }
  }

  // Rules on a cycle of calls (Tarjan's strongly connected components, iteratively).
  std::vector<char> compute_recursive() const {
    const std::size_t n = nfa_.rules.size();
    std::vector<std::vector<uint32_t>> edges(n);
    std::vector<char> rec(n, 0);
    for (uint32_t r = 0; r < n; ++r) {
      if (!reachable_[r]) continue;
      for (const NfaState& s : nfa_.rules[r].states)
        for (const NfaCall& c : s.calls) {
          edges[r].push_back(c.rule);
          if (c.rule == r) rec[r] = 1;
        }
    }
    constexpr uint32_t kUnset = UINT32_MAX;
    std::vector<uint32_t> index(n, kUnset), low(n, 0);
    std::vector<char> on(n, 0);
    std::vector<uint32_t> stack;
    std::vector<std::pair<uint32_t, std::size_t>> frames;
    uint32_t counter = 0;
    for (uint32_t r0 = 0; r0 < n; ++r0) {
      if (!reachable_[r0] || index[r0] != kUnset) continue;
      frames.push_back({r0, 0});
      index[r0] = low[r0] = counter++;
      stack.push_back(r0);
      on[r0] = 1;
      while (!frames.empty()) {
        const uint32_t r = frames.back().first;
        std::size_t& i = frames.back().second;
        if (i < edges[r].size()) {
          const uint32_t s = edges[r][i++];
          if (index[s] == kUnset) {
            index[s] = low[s] = counter++;
            stack.push_back(s);
            on[s] = 1;
            frames.push_back({s, 0});
          } else if (on[s]) {
            low[r] = std::min(low[r], index[s]);
          }
          continue;
        }
        if (low[r] == index[r]) {
          std::vector<uint32_t> scc;
          uint32_t x;
          do {
            x = stack.back();
            stack.pop_back();
            on[x] = 0;
            scc.push_back(x);
          } while (x != r);
          if (scc.size() > 1)
            for (uint32_t y : scc) rec[y] = 1;
        }
        frames.pop_back();
        if (!frames.empty()) {
          const uint32_t parent = frames.back().first;
          low[parent] = std::min(low[parent], low[r]);
        }
      }
    }
    return rec;
  }

  // Replaces calls to small rules that are not recursive by copies of them (callees first).
  void inline_rule(uint32_t r) {
    if (inline_state_[r] == 2) return;
    inline_state_[r] = 1;
    const std::size_t original = nfa_.rules[r].states.size();
    for (std::size_t s = 0; s < original; ++s) {
      // Index anew on every access: copies append to this rule's states.
      for (std::size_t k = 0; k < nfa_.rules[r].states[s].calls.size();) {
        const NfaCall call = nfa_.rules[r].states[s].calls[k];
        const uint32_t callee = call.rule;
        if (recursive_[callee] || callee == r) {
          ++k;
          continue;
        }
        inline_rule(callee);
        const NfaRule& src = nfa_.rules[callee];
        NfaRule& dst = nfa_.rules[r];
        const std::size_t add = src.states.size();
        if (add > kInlineMaxStates ||
            (sites_[callee] > 1 && add * sites_[callee] > kInlineBudget) ||
            dst.states.size() + add > kInlineRuleCap || total_states_ + add > lim_.max_elements) {
          ++k;
          continue;
        }
        const auto off = static_cast<uint32_t>(dst.states.size());
        for (const NfaState& st : src.states) {
          NfaState copy = st;
          for (NfaEdge& e : copy.bytes) e.to += off;
          for (NfaCall& c : copy.calls) c.to += off;
          for (uint32_t& t : copy.eps) t += off;
          dst.states.push_back(std::move(copy));
        }
        total_states_ += add;
        NfaState& from = dst.states[s];
        from.calls.erase(from.calls.begin() + static_cast<std::ptrdiff_t>(k));
        from.eps.push_back(off + src.start);
        dst.states[off + src.accept].eps.push_back(call.to);
      }
    }
    inline_state_[r] = 2;
  }

  std::shared_ptr<const Grammar> determinize() {
    auto g = std::make_shared<Grammar>();
    const std::size_t n = nfa_.rules.size();
    g->max_stacks = lim_.max_stacks;
    for (const NfaRule& r : nfa_.rules) g->rule_names.push_back(r.name);

    // Byte classes: cut 0..255 wherever some edge of a used rule starts or stops.
    std::vector<char> cut(257, 0);
    cut[0] = 1;
    for (uint32_t r = 0; r < n; ++r) {
      if (!reachable_[r]) continue;
      g->nfa_states += nfa_.rules[r].states.size();
      for (const NfaState& s : nfa_.rules[r].states)
        for (const NfaEdge& e : s.bytes) {
          cut[e.lo] = 1;
          cut[static_cast<std::size_t>(e.hi) + 1] = 1;
        }
    }
    uint32_t cls = 0;
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && cut[static_cast<std::size_t>(b)]) ++cls;
      g->byte_class[static_cast<std::size_t>(b)] = static_cast<uint8_t>(cls);
    }
    g->n_classes = cls + 1;
    const uint32_t nc = g->n_classes;

    struct Pending {
      uint32_t rule;
      std::vector<uint32_t> set;
    };
    std::vector<Pending> states;
    std::vector<WordsMap> ids(n);
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> calls;  // per state: rule, ret
    auto intern = [&](uint32_t rule, std::vector<uint32_t> set) -> uint32_t {
      auto [it, fresh] = ids[rule].emplace(set, static_cast<uint32_t>(states.size()));
      if (fresh) {
        if (states.size() >= lim_.max_elements)
          throw ConstraintError("grammar needs more than " + std::to_string(lim_.max_elements) +
                                " automaton states (max_elements)");
        states.push_back({rule, std::move(set)});
        g->next.resize(g->next.size() + nc, kNoState);
        g->final.push_back(0);
        calls.emplace_back();
      }
      return it->second;
    };

    std::vector<uint32_t> mark;
    uint32_t epoch = 0;
    auto closure = [&](uint32_t rule, std::vector<uint32_t> seeds) {
      const NfaRule& R = nfa_.rules[rule];
      if (mark.size() < R.states.size()) mark.resize(R.states.size(), 0);
      ++epoch;
      std::vector<uint32_t> out;
      for (uint32_t s : seeds)
        if (mark[s] != epoch) {
          mark[s] = epoch;
          out.push_back(s);
        }
      for (std::size_t i = 0; i < out.size(); ++i)
        for (uint32_t t : R.states[out[i]].eps)
          if (mark[t] != epoch) {
            mark[t] = epoch;
            out.push_back(t);
          }
      // Keep only the states that read, call or accept: two closures that differ in states with
      // nothing but epsilons behave alike and must be one DFA state (as in RE2).
      std::size_t w = 0;
      for (uint32_t x : out) {
        const NfaState& st = R.states[x];
        if (!st.bytes.empty() || !st.calls.empty() || x == R.accept) out[w++] = x;
      }
      out.resize(w);
      std::sort(out.begin(), out.end());
      return out;
    };

    std::vector<uint32_t> start_of(n, kNoState);
    for (uint32_t r = 0; r < n; ++r)
      if (reachable_[r]) start_of[r] = intern(r, closure(r, {nfa_.rules[r].start}));

    std::vector<std::vector<uint32_t>> bucket(nc);
    for (std::size_t d = 0; d < states.size(); ++d) {
      const uint32_t rule = states[d].rule;
      const std::vector<uint32_t> set = states[d].set;  // states may grow below
      const NfaRule& R = nfa_.rules[rule];
      for (auto& b : bucket) b.clear();
      std::map<uint32_t, std::vector<uint32_t>> by_callee;
      for (uint32_t s : set) {
        if (s == R.accept) g->final[d] = 1;
        for (const NfaEdge& e : R.states[s].bytes)
          for (uint32_t c = g->byte_class[e.lo]; c <= g->byte_class[e.hi]; ++c)
            bucket[c].push_back(e.to);
        for (const NfaCall& c : R.states[s].calls) by_callee[c.rule].push_back(c.to);
      }
      WordsMap memo;  // classes often share their targets
      for (uint32_t c = 0; c < nc; ++c) {
        if (bucket[c].empty()) continue;
        std::sort(bucket[c].begin(), bucket[c].end());
        auto it = memo.find(bucket[c]);
        uint32_t t;
        if (it != memo.end()) {
          t = it->second;
        } else {
          t = intern(rule, closure(rule, bucket[c]));
          memo.emplace(bucket[c], t);
        }
        g->next[d * nc + c] = t;
      }
      for (auto& [callee, tos] : by_callee) {
        const uint32_t ret = intern(rule, closure(rule, std::move(tos)));  // may grow `calls`
        calls[d].push_back({callee, ret});
      }
    }

    g->n_states = static_cast<uint32_t>(states.size());
    for (auto& cs : calls)
      for (auto& [callee, ret] : cs) callee = start_of[callee];  // from rule to state
    g->start = start_of[nfa_.root];
    minimize(*g, calls);
    auto trivial = [&](uint32_t s) {
      if (!g->final[s] || !calls[s].empty()) return false;
      for (uint32_t c = 0; c < nc; ++c)
        if (g->next[static_cast<std::size_t>(s) * nc + c] != kNoState) return false;
      return true;
    };
    g->call_begin.push_back(0);
    for (uint32_t s = 0; s < g->n_states; ++s) {
      for (const auto& [callee, ret] : calls[s])
        g->calls.push_back({callee, trivial(ret) ? kNoState : ret});
      g->call_begin.push_back(static_cast<uint32_t>(g->calls.size()));
    }
    return g;
  }

  // Merges states that behave alike: the copies of a rule inlined at two places with the same
  // continuation (the first item of a list and the repeated ones), and the like; every state kept
  // is a token table built at compile time. Valmari and Lehtinen's partition refinement, which
  // takes partial transition functions in O(m log n); a call is a transition to the return state
  // labelled by the callee's start state.
  static void minimize(Grammar& g, std::vector<std::vector<std::pair<uint32_t, uint32_t>>>& calls) {
    const uint32_t n = g.n_states, nc = g.n_classes;
    std::vector<uint32_t> tail, label, head;
    for (uint32_t s = 0; s < n; ++s) {
      for (uint32_t c = 0; c < nc; ++c) {
        const uint32_t t = g.next[static_cast<std::size_t>(s) * nc + c];
        if (t == kNoState) continue;
        tail.push_back(s);
        label.push_back(c);
        head.push_back(t);
      }
      for (const auto& [callee, ret] : calls[s]) {
        tail.push_back(s);
        label.push_back(nc + callee);
        head.push_back(ret);
      }
    }
    const auto m = static_cast<uint32_t>(tail.size());
    Refinable blocks(n), cords(m);
    for (uint32_t s = 0; s < n; ++s)
      if (g.final[s]) blocks.mark(s);
    blocks.split();
    // Cords: the transitions grouped by label.
    std::vector<uint32_t> by_label(m);
    for (uint32_t t = 0; t < m; ++t) by_label[t] = t;
    std::sort(by_label.begin(), by_label.end(),
              [&](uint32_t a, uint32_t b) { return label[a] < label[b]; });
    cords.group(by_label, [&](uint32_t a, uint32_t b) { return label[a] != label[b]; });
    // The transitions into each state.
    std::vector<uint32_t> in_off(n + 1, 0), in(m);
    for (uint32_t t = 0; t < m; ++t) ++in_off[head[t] + 1];
    for (uint32_t s = 0; s < n; ++s) in_off[s + 1] += in_off[s];
    {
      std::vector<uint32_t> fill(in_off.begin(), in_off.end() - 1);
      for (uint32_t t = 0; t < m; ++t) in[fill[head[t]]++] = t;
    }
    for (uint32_t b = 1, c = 0; c < cords.sets;) {
      for (uint32_t i = cords.first[c]; i < cords.past[c]; ++i) blocks.mark(tail[cords.elems[i]]);
      blocks.split();
      ++c;
      while (b < blocks.sets) {
        for (uint32_t i = blocks.first[b]; i < blocks.past[b]; ++i) {
          const uint32_t s = blocks.elems[i];
          for (uint32_t j = in_off[s]; j < in_off[s + 1]; ++j) cords.mark(in[j]);
        }
        cords.split();
        ++b;
      }
    }
    std::vector<uint32_t> cls(blocks.set_of.begin(), blocks.set_of.end());
    const std::size_t count = blocks.sets;
    if (count == n) return;
    // Number the classes in order of their first state, so the start keeps a small id.
    std::vector<uint32_t> id(count, kNoState), rep;
    for (uint32_t s = 0; s < n; ++s)
      if (id[cls[s]] == kNoState) {
        id[cls[s]] = static_cast<uint32_t>(rep.size());
        rep.push_back(s);
      }
    auto map = [&](uint32_t s) { return s == kNoState ? kNoState : id[cls[s]]; };
    std::vector<uint32_t> next(count * nc);
    std::vector<uint8_t> final(count);
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> new_calls(count);
    for (uint32_t k = 0; k < count; ++k) {
      const uint32_t s = rep[k];
      final[k] = g.final[s];
      for (uint32_t c = 0; c < nc; ++c)
        next[static_cast<std::size_t>(k) * nc + c] =
            map(g.next[static_cast<std::size_t>(s) * nc + c]);
      for (const auto& [callee, ret] : calls[s]) new_calls[k].push_back({map(callee), map(ret)});
      std::sort(new_calls[k].begin(), new_calls[k].end());
      new_calls[k].erase(std::unique(new_calls[k].begin(), new_calls[k].end()), new_calls[k].end());
    }
    g.start = map(g.start);
    g.next.swap(next);
    g.final.swap(final);
    calls.swap(new_calls);
    g.n_states = static_cast<uint32_t>(count);
  }

  Nfa nfa_;
  const Limits& lim_;
  std::vector<char> reachable_, nullable_, recursive_, inline_state_;
  std::vector<std::size_t> sites_;  // call edges to each rule in the source
  std::size_t total_states_ = 0;
};

// Feeds `text` to the grammar from its start; the stack set after it (empty when refused).
StackWords run(const Grammar& g, std::string_view text) {
  Stepper st(g);
  StackWords cur{1, g.start}, next;
  for (const char c : text) {
    next.clear();
    st.step(cur, 0, cur.size(), static_cast<uint8_t>(c), next);
    if (next.empty()) return {};
    cur.swap(next);
  }
  return cur;
}

}  // namespace

std::shared_ptr<const Grammar> build_grammar(Nfa nfa, const Limits& lim) {
  return Builder(std::move(nfa), lim).run();
}

bool grammar_accepts(const Grammar& g, std::string_view text) {
  const StackWords s = run(g, text);
  return !s.empty() && any_all_final(g, s.data(), s.size());
}

bool grammar_accepts_prefix(const Grammar& g, std::string_view text) {
  return !run(g, text).empty();
}

GrammarInfo grammar_info(const Grammar& g) {
  GrammarInfo info;
  info.rules = g.rule_names.size();
  info.elements = g.nfa_states;
  info.states = g.n_states;
  info.byte_classes = g.n_classes;
  return info;
}

}  // namespace sy::constraints
