// Engine::copy_blocks checked the same way on every backend: a block copied on write lets a
// forked sequence go on exactly as the one it was copied from. Header-only so each test keeps its
// own link set.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/engine.hpp"
#include "tests/support/seq_step.hpp"

namespace sy::test {

/// Largest absolute differences between last-row logits of the copy-on-write scenario.
struct KvCopyDiffs {
  float fork = 0;   ///< forked sequence (copied block) against the original, in one step
  float stale = 0;  ///< the same fork before the copy (the block held other KV) against it
  float fresh = 0;  ///< the original against the whole prompt fed in one step
  int32_t n_vocab = 0;
};

/// Sequence A feeds prompt[0, n1) (n1 = 1.5 blocks, so its second block is partly filled);
/// sequence Z writes other tokens into blocks of its own; fork B takes A's first block and Z's
/// second. B is stepped once on the stale block, then A's second block is copied over Z's and A
/// and B feed the same two tokens in one step. `prompt` needs n1 + 2 tokens.
inline KvCopyDiffs kv_copy_check(Engine& e, const std::vector<int32_t>& prompt) {
  const int32_t bs = e.block_size();
  const int32_t n1 = bs + std::max(1, bs / 2);
  std::vector<int32_t> head(prompt.begin(), prompt.begin() + n1);
  std::vector<int32_t> other(head.rbegin(), head.rend());
  std::vector<int32_t> next(prompt.begin() + n1, prompt.begin() + n1 + 2);
  std::vector<int32_t> whole(prompt.begin(), prompt.begin() + n1 + 2);
  auto take = [&](int k) {
    std::vector<int32_t> b;
    for (int i = 0; i < k; ++i) b.push_back(*e.pool().alloc());
    return b;
  };
  const std::vector<int32_t> a = take(2), z = take(2), c = take(3);
  const std::vector<int32_t> b_tab = {a[0], z[1]};
  StepOutput out;
  e.step({seq_step(head, 0, a), seq_step(other, 0, z)}, out);
  e.step({seq_step(next, n1, b_tab)}, out);
  const std::vector<float> stale(out.row(0), out.row(0) + out.n_vocab);
  e.copy_blocks({KvBlockCopy{a[1], z[1], false}});
  e.step({seq_step(next, n1, a), seq_step(next, n1, b_tab)}, out);
  const std::vector<float> la(out.row(0), out.row(0) + out.n_vocab);
  const std::vector<float> lb(out.row(1), out.row(1) + out.n_vocab);
  e.step({seq_step(whole, 0, c)}, out);
  const std::vector<float> lc(out.row(0), out.row(0) + out.n_vocab);
  KvCopyDiffs d;
  d.n_vocab = out.n_vocab;
  for (int32_t i = 0; i < out.n_vocab; ++i) {
    const auto k = static_cast<size_t>(i);
    d.fork = std::max(d.fork, std::abs(la[k] - lb[k]));
    d.stale = std::max(d.stale, std::abs(la[k] - stale[k]));
    d.fresh = std::max(d.fresh, std::abs(la[k] - lc[k]));
  }
  for (const auto* t : {&a, &z, &c})
    for (int32_t b : *t) e.pool().free(b);
  return d;
}

}  // namespace sy::test
