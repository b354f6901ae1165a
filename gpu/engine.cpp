// Engine-side helpers shared by every backend (step output access, what a model asks of one).
#include "gpu/engine.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

namespace sy {

const float* StepOutput::row(size_t seq, int32_t k) const {
  if (seq >= offset.size()) throw std::out_of_range("StepOutput::row: no such sequence");
  const int32_t n = count[seq];
  if (k < 0) k = n - 1;
  if (k < 0 || k >= n) throw std::out_of_range("StepOutput::row: no such row");
  return logits.data() +
         (static_cast<size_t>(offset[seq]) + static_cast<size_t>(k)) * static_cast<size_t>(n_vocab);
}

void validate_copies(const std::vector<KvBlockCopy>& copies, int32_t n_blocks,
                     int32_t n_window_blocks) {
  for (size_t i = 0; i < copies.size(); ++i) {
    const KvBlockCopy& c = copies[i];
    const int32_t n = c.window ? n_window_blocks : n_blocks;
    const std::string what = "KV block copy " + std::to_string(i) + " (" + std::to_string(c.src) +
                             " -> " + std::to_string(c.dst) + (c.window ? ", window group" : "") +
                             ")";
    if (c.window && n_window_blocks <= 0)
      throw std::invalid_argument(what + ": this engine has no window group");
    if (c.src < 0 || c.src >= n || c.dst < 0 || c.dst >= n)
      throw std::invalid_argument(what + ": block id outside [0, " + std::to_string(n) + ")");
    if (c.src == c.dst) throw std::invalid_argument(what + ": a block copied onto itself");
  }
}

int64_t validate_batch(const std::vector<SeqStep>& batch, const BatchLimits& lim) {
  const auto bad = [](size_t i, const std::string& what) {
    throw BadSequence(i, "step: sequence " + std::to_string(i) + ": " + what);
  };
  const int64_t bs = lim.block_size;
  int64_t total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    if (s.n_tokens < 1) bad(i, "n_tokens must be >= 1");
    if (!s.tokens) bad(i, "tokens is null");
    if (s.n_past < 0) bad(i, "n_past must be >= 0");
    if (s.window < 0) bad(i, "window must be >= 0");
    if (s.sinks < 0) bad(i, "sinks must be >= 0");
    total += s.n_tokens;
    if (total > lim.max_tokens) {
      throw std::invalid_argument("step: more than " + std::to_string(lim.max_tokens) +
                                  " new tokens in one batch");
    }
    const int64_t end = int64_t{s.n_past} + s.n_tokens;
    if (end > INT32_MAX) bad(i, "n_past + n_tokens overflows");
    const int64_t need = (end + bs - 1) / bs;
    // One block table (`what` names it in messages) whose rows see window w (0: all) with
    // `sinks` leading slots, ids in [0, n_ids).
    const auto check_table = [&](const int32_t* table, int32_t n, int64_t w, int64_t sinks,
                                 int32_t n_ids, const std::string& what) {
      if (n < need || !table) {
        bad(i, what + " has " + std::to_string(n) + " blocks, " + std::to_string(need) +
                   " needed for " + std::to_string(end) + " slots");
      }
      // Slots some new token reads or writes: [0, sink_end) and [win_lo, end). Tokens' windows
      // only move forward, so the first token has the lowest window start and the last the most
      // sinks in sight.
      const int64_t win_lo = w > 0 ? std::max<int64_t>(0, int64_t{s.n_past} + 1 - w) : 0;
      const int64_t sink_end = w > 0 ? std::min<int64_t>(sinks, std::max<int64_t>(0, end - w)) : 0;
      for (int64_t b = 0; b < need; ++b) {
        const int32_t id = table[b];
        if (id == -1) {
          const int64_t b0 = b * bs, b1 = std::min<int64_t>(b0 + bs, end);
          if (b0 < sink_end || b1 > win_lo) {
            bad(i, what + " entry " + std::to_string(b) + " is -1 (released) but slots [" +
                       std::to_string(b0) + ", " + std::to_string(b1) +
                       ") are attended to or written by this step");
          }
        } else if (id < 0 || id >= n_ids) {
          bad(i, (what == "block table" ? "block id " : what + " block id ") + std::to_string(id) +
                     " out of range");
        }
      }
    };
    // The window the rows see: the step's, narrowed by the backend's own; sinks only with the
    // step's window.
    int64_t w = s.window;
    if (lim.model_window > 0) w = w > 0 ? std::min<int64_t>(w, lim.model_window) : lim.model_window;
    check_table(s.block_table, s.n_blocks, w, s.window > 0 && w > 0 ? s.sinks : 0, lim.n_blocks,
                "block table");
    if (lim.n_window_blocks > 0) {
      // The window group's layers see their own window without sinks where it is the narrower,
      // else the step's window with its sinks (the engines' rule).
      const int64_t gw = lim.group_window;
      const bool own = gw > 0 && (s.window == 0 || gw < s.window);
      check_table(s.window_table, s.n_window_blocks, own ? gw : s.window, own ? 0 : s.sinks,
                  lim.n_window_blocks, "window block table");
    }
    for (int32_t t = 0; t < s.n_tokens; ++t) {
      if (s.tokens[t] < 0 || s.tokens[t] >= lim.n_vocab) {
        bad(i, "token id " + std::to_string(s.tokens[t]) + " out of range [0, " +
                   std::to_string(lim.n_vocab) + ")");
      }
      if (s.positions && s.positions[t] < 0) bad(i, "negative position");
    }
  }
  return total;
}

std::string features_beyond_llama(const Model& m) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  std::string out;
  const auto add = [&](bool present, const char* what) {
    if (present) out += (out.empty() ? "" : ", ") + std::string(what);
  };
  bool bias = w.output_bias != nullptr, qk_norm = false, post_norm = false;
  for (const LayerWeights& L : w.layers) {
    bias = bias || L.bq || L.bk || L.bv || L.bo;
    qk_norm = qk_norm || L.q_norm || L.k_norm;
    post_norm = post_norm || L.post_attn_norm || L.post_ffn_norm;
  }
  add(c.rope_layout != RopeLayout::Norm, "NEOX RoPE");
  add(w.rope_freqs != nullptr, "RoPE frequency factors (rope_freqs)");
  add(c.rope_freq_scale != 1.0f, "linear RoPE scaling");
  add(bias, "biases");
  add(qk_norm, "per-head q/k norms");
  add(post_norm, "post-attention/post-FFN norms");
  add(c.activation != Activation::SiLU, "GELU-gated FFN");
  add(c.attn_softcap > 0.0f || c.final_softcap > 0.0f, "logit soft-caps");
  add(c.embed_scale != 1.0f, "embedding scale");
  add(c.query_scale != 1.0f / std::sqrt(static_cast<float>(c.head_dim)), "query scale");
  add(c.has_layer_windows(), "per-layer attention windows");
  add(c.n_experts > 0, "mixture of experts");
  add(c.qk_norm_whole, "whole-row q/k norms");
  return out;
}

}  // namespace sy
