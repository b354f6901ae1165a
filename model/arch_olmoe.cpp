// Architecture `olmoe`: the llama block with RMSNorm over the whole q and k rows (all heads at
// once, attn_q_norm / attn_k_norm) after the projections and before NEOX RoPE, and a mixture of
// experts for its feed-forward (softmax over all experts, the top expert_used_count weighted by
// their probabilities as they are).
#include "model/arch.hpp"

namespace sy {
namespace {

void read_config(ArchLoader& ld) {
  ld.read_common(/*experts=*/true);
  ModelConfig& c = ld.config();
  ld.read_rope_scaling(/*allow_llama3=*/false);
  c.rope_layout = RopeLayout::Neox;
  c.qk_norm_whole = true;
  if (c.n_experts == 0) ld.req_int("expert_count");
  ld.read_experts(/*norm=*/false);
}

void load_weights(ArchLoader& ld) {
  const ModelConfig& c = ld.config();
  ModelWeights& w = ld.weights();
  ld.load_embeddings_and_output();
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    ld.load_attention(L, l);
    const std::string b = block_prefix(l);
    L.q_norm = ld.vec(b + "attn_q_norm.weight", q_dim);
    L.k_norm = ld.vec(b + "attn_k_norm.weight", kv_dim);
    ld.load_moe_ffn(L, l);
  }
}

}  // namespace

const ArchSpec& arch_olmoe() {
  static const ArchSpec s{"olmoe", read_config, load_weights};
  return s;
}

}  // namespace sy
