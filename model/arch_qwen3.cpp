// Architecture `qwen3`: the llama block with per-head RMSNorm of queries and keys
// (attn_q_norm / attn_k_norm, head_dim weights) before NEOX RoPE, and no biases.
#include "model/arch.hpp"

namespace sy {
namespace {

void read_config(ArchLoader& ld) {
  ld.read_common();
  ld.read_rope_scaling(/*allow_llama3=*/false);
  ld.config().rope_layout = RopeLayout::Neox;
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
    ld.load_ffn(L, l);
  }
}

}  // namespace

const ArchSpec& arch_qwen3() {
  static const ArchSpec s{"qwen3", read_config, load_weights};
  return s;
}

}  // namespace sy
