// One sequence's entry of an engine step built from vectors the caller keeps alive: shared by the
// tests that drive an Engine by hand. Header-only so each test keeps its own link set.
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/engine.hpp"

namespace sy::test {

/// `toks` at slots [n_past, n_past + toks.size()) of block table `tab` (no window, last logits).
inline SeqStep seq_step(const std::vector<int32_t>& toks, int32_t n_past,
                        const std::vector<int32_t>& tab) {
  SeqStep s;
  s.tokens = toks.data();
  s.n_tokens = static_cast<int32_t>(toks.size());
  s.n_past = n_past;
  s.block_table = tab.data();
  s.n_blocks = static_cast<int32_t>(tab.size());
  return s;
}

}  // namespace sy::test
