// The trained test model (stories260K, loaded once per test process) and greedy token choice:
// shared by the engine tests on CPU and GPU. Header-only so each test keeps its own link set.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/engine.hpp"
#include "model/llama.hpp"
#include "tests/support/seq_step.hpp"

namespace sy::test {

/// stories260K from SY_MODELS_DIR, loaded on first use.
inline std::shared_ptr<LlamaModel> stories_model() {
  static std::shared_ptr<LlamaModel> m = LlamaModel::load(SY_MODELS_DIR "/stories260K.gguf");
  return m;
}

/// Greedy choice: the highest logit, ties to the lowest id.
inline int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

/// One sequence of a hand-driven greedy run: its prompt is fed `chunk` tokens per step, then one
/// sampled token per step, into blocks taken from the engine's pool.
struct FedSeq {
  std::vector<int32_t> cur;     // the tokens of the step being built
  std::vector<int32_t> blocks;  // block table
  int32_t n_past = 0;
  size_t fed = 0;  // prompt tokens fed so far

  /// Builds the next step of this sequence into `st`: the next prompt chunk, or `last` once the
  /// prompt is fed. False when the pool has no block left for it.
  bool next_step(Engine& e, const std::vector<int32_t>& prompt, int chunk, int32_t last,
                 SeqStep& st) {
    if (fed < prompt.size()) {
      const size_t k = std::min<size_t>(static_cast<size_t>(chunk), prompt.size() - fed);
      cur.assign(prompt.begin() + static_cast<long>(fed),
                 prompt.begin() + static_cast<long>(fed + k));
    } else {
      cur.assign(1, last);
    }
    const int32_t need = n_past + static_cast<int32_t>(cur.size());
    while (static_cast<int32_t>(blocks.size()) * e.block_size() < need) {
      auto b = e.pool().alloc();
      if (!b) return false;
      blocks.push_back(*b);
    }
    st = seq_step(cur, n_past, blocks);
    return true;
  }
  /// Records that the step built by next_step ran; true when its logits are a sampled token's
  /// (the prompt is fed completely).
  bool stepped(const std::vector<int32_t>& prompt) {
    n_past += static_cast<int32_t>(cur.size());
    if (fed < prompt.size()) fed += cur.size();
    return fed >= prompt.size();
  }
  /// Returns the blocks to the engine's pool (entries already given back are -1).
  void release(Engine& e) {
    for (int32_t b : blocks)
      if (b >= 0) e.pool().free(b);
    blocks.clear();
  }
};

/// Generation of every prompt in one engine, every unfinished sequence in every step: prompt i
/// fed `chunk` tokens per step, then its picked tokens, until it has lengths[i] of them.
/// `pick(batch, ids)` runs one step and fills one id per sequence of the batch (ids of steps that
/// end inside a prompt are dropped). Throws std::runtime_error when the pool runs out of blocks.
template <class Pick>
std::vector<std::vector<int32_t>> generate_all(Engine& e,
                                               const std::vector<std::vector<int32_t>>& prompts,
                                               const std::vector<size_t>& lengths, int chunk,
                                               Pick pick) {
  std::vector<FedSeq> seqs(prompts.size());
  std::vector<std::vector<int32_t>> gen(prompts.size());
  std::vector<int32_t> ids;
  for (;;) {
    std::vector<SeqStep> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (gen[i].size() >= lengths[i]) continue;
      SeqStep st;
      if (!seqs[i].next_step(e, prompts[i], chunk, gen[i].empty() ? 0 : gen[i].back(), st))
        throw std::runtime_error("generate_all: the KV pool has no block left");
      batch.push_back(st);
      who.push_back(i);
    }
    if (batch.empty()) break;
    ids.assign(batch.size(), -1);
    pick(batch, ids);
    for (size_t b = 0; b < who.size(); ++b) {
      if (seqs[who[b]].stepped(prompts[who[b]])) gen[who[b]].push_back(ids[b]);
    }
  }
  for (auto& s : seqs) s.release(e);
  return gen;
}

}  // namespace sy::test
