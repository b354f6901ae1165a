// Architecture `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (per-head RMSNorm
// of queries and keys before NEOX RoPE, no biases) with a mixture of experts for its
// feed-forward: softmax over all experts, the top expert_used_count renormalised to sum 1, no
// shared expert.
#include "model/arch.hpp"

namespace sy {
namespace {

void read_config(ArchLoader& ld) {
  ld.read_common(/*experts=*/true);
  ModelConfig& c = ld.config();
  ld.read_rope_scaling(/*allow_llama3=*/false);
  c.rope_layout = RopeLayout::Neox;
  // Every layer is a mixture of experts: a file without expert_count (or with 0) is broken.
  if (c.n_experts == 0) c.n_experts = ld.int_in("expert_count", ld.req_int("expert_count"), 1, 256);
  // As llama.cpp: renormalised unless the file says otherwise; without
  // expert_feed_forward_length an expert is feed_forward_length / expert_used_count wide.
  ld.read_experts(/*norm=*/true, /*width_per_used=*/true);
}

void load_weights(ArchLoader& ld) {
  const ModelConfig& c = ld.config();
  ModelWeights& w = ld.weights();
  ld.load_embeddings_and_output();
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    ld.load_attention(L, l);
    const std::string b = block_prefix(l);
    L.q_norm = ld.vec(b + "attn_q_norm.weight", c.head_dim);
    L.k_norm = ld.vec(b + "attn_k_norm.weight", c.head_dim);
    ld.load_moe_ffn(L, l);
  }
}

}  // namespace

const ArchSpec& arch_qwen3moe() {
  static const ArchSpec s{"qwen3moe", read_config, load_weights};
  return s;
}

}  // namespace sy
