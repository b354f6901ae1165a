// The compiled form of a grammar, internal to constraints/: one DFA over bytes per rule, with
// calls between rules (a recursive transition network), and the stack stepping shared by
// grammar_accepts and the token matcher.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "constraints/error.hpp"

namespace sy::constraints {

/// "No state": a missing byte transition, or a call whose return needs no frame.
inline constexpr uint32_t kNoState = UINT32_MAX;

/// A call out of a DFA state: enter the callee's start state with `ret` pushed below it.
struct DfaCall {
  uint32_t callee = 0;      // start state of the called rule
  uint32_t ret = kNoState;  // where the caller resumes; kNoState when it could only end there
};

/// A compiled grammar. A parse is a stack of DFA states, bottom to top: the top is where the
/// innermost rule is, the others are where each caller resumes once its callee ends.
class Grammar {
 public:
  uint32_t start = 0;  // root's start state
  uint32_t n_states = 0;
  uint32_t n_classes = 0;  // bytes fall into classes that every edge respects
  std::array<uint8_t, 256> byte_class{};
  std::vector<uint32_t> next;        // n_states × n_classes, kNoState where the byte fails
  std::vector<uint32_t> call_begin;  // n_states + 1 offsets into calls
  std::vector<DfaCall> calls;
  std::vector<uint8_t> final;  // the state's rule may end here
  std::vector<std::string> rule_names;
  std::size_t nfa_states = 0;  // elements of the source, after repetition and inlining
  std::size_t max_stacks = Limits{}.max_stacks;

  uint32_t step(uint32_t s, uint8_t b) const {
    return next[static_cast<std::size_t>(s) * n_classes + byte_class[b]];
  }
};

/// Stack sets are flat: each stack is its length followed by its states, bottom first.
using StackWords = std::vector<uint32_t>;

/// Whether every frame of the stack at `p` (length first) may end: the stack can pop to nothing
/// without reading more, so the text so far completes its bottom rule.
inline bool all_final(const Grammar& g, const uint32_t* p) {
  for (uint32_t i = 1; i <= p[0]; ++i)
    if (!g.final[p[i]]) return false;
  return true;
}

/// Whether some stack of the set in [p, p + n) can end (see all_final).
inline bool any_all_final(const Grammar& g, const uint32_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; i += p[i] + 1)
    if (all_final(g, p + i)) return true;
  return false;
}

/// Advances stacks by one byte. Holds a scratch stack, so one Stepper per thread of use.
class Stepper {
 public:
  explicit Stepper(const Grammar& g) : g_(&g) {}

  /// Appends to `out` every stack that the stack set in `in[begin, end)` becomes after byte b,
  /// without duplicates. Throws ConstraintError past the grammar's max_stacks. A stack whose
  /// bottom frame would have to end to take the byte has no successor: the caller of that frame
  /// is unknown or absent (see any_all_final for the callers that care).
  void step(const StackWords& in, std::size_t begin, std::size_t end, uint8_t b, StackWords& out) {
    const std::size_t out_begin = out.size();
    for (std::size_t i = begin; i < end;) {
      const uint32_t n = in[i];
      if (buf_.size() < n + 8) buf_.resize(n + 64);
      std::copy(in.begin() + static_cast<std::ptrdiff_t>(i + 1),
                in.begin() + static_cast<std::ptrdiff_t>(i + 1 + n), buf_.begin());
      i += n + 1;
      if (n > 0) expand(n, false, b, out);
    }
    dedup(out, out_begin);
  }

 private:
  // The frames are buf_[0, n). A fresh top frame has read nothing since it was entered: it must
  // not end here, because the caller's own state already holds the "callee read nothing" path
  // (a nullable call is also an epsilon edge when compiled), and ending it would only repeat it.
  void expand(uint32_t n, bool fresh, uint8_t b, StackWords& out) {
    for (;;) {
      const uint32_t d = buf_[n - 1];
      const uint32_t t = g_->step(d, b);
      if (t != kNoState) {
        out.push_back(n);
        out.insert(out.end(), buf_.begin(), buf_.begin() + (n - 1));
        out.push_back(t);
      }
      for (uint32_t c = g_->call_begin[d]; c < g_->call_begin[d + 1]; ++c) {
        const DfaCall call = g_->calls[c];
        if (call.ret == kNoState) {
          buf_[n - 1] = call.callee;
          expand(n, true, b, out);
        } else {
          if (buf_.size() < n + 8) buf_.resize(n + 64);
          buf_[n - 1] = call.ret;
          buf_[n] = call.callee;
          expand(n + 1, true, b, out);
        }
        buf_[n - 1] = d;
      }
      if (fresh || n == 1 || !g_->final[d]) return;
      --n;  // the top rule ends: the caller resumes and takes the byte
    }
  }

  void dedup(StackWords& out, std::size_t begin) {
    std::size_t count = 0;
    for (std::size_t i = begin; i < out.size(); i += out[i] + 1) ++count;
    if (count > g_->max_stacks)
      throw ConstraintError("the grammar is too ambiguous here: more than " +
                            std::to_string(g_->max_stacks) + " parse stacks (max_stacks)");
    if (count < 2) return;
    // Few stacks in practice: compare each with the ones kept before it.
    std::size_t w = begin;
    for (std::size_t i = begin; i < out.size();) {
      const uint32_t len = out[i] + 1;
      bool dup = false;
      for (std::size_t j = begin; j < w; j += out[j] + 1) {
        if (out[j] + 1 == len && std::equal(out.begin() + static_cast<std::ptrdiff_t>(i),
                                            out.begin() + static_cast<std::ptrdiff_t>(i + len),
                                            out.begin() + static_cast<std::ptrdiff_t>(j))) {
          dup = true;
          break;
        }
      }
      if (!dup) {
        if (w != i)
          std::copy(out.begin() + static_cast<std::ptrdiff_t>(i),
                    out.begin() + static_cast<std::ptrdiff_t>(i + len),
                    out.begin() + static_cast<std::ptrdiff_t>(w));
        w += len;
      }
      i += len;
    }
    out.resize(w);
  }

  const Grammar* g_;
  std::vector<uint32_t> buf_ = std::vector<uint32_t>(64);
};

}  // namespace sy::constraints
