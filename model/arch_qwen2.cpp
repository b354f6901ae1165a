// Architecture `qwen2`: the llama block with Q/K/V biases and NEOX RoPE (pairs i, i + n_rot/2).
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
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    ld.load_attention(L, l);
    // The biases are part of the architecture: a file without them is broken.
    const std::string b = block_prefix(l);
    L.bq = ld.vec(b + "attn_q.bias", q_dim);
    L.bk = ld.vec(b + "attn_k.bias", kv_dim);
    L.bv = ld.vec(b + "attn_v.bias", kv_dim);
    ld.load_ffn(L, l);
  }
}

}  // namespace

const ArchSpec& arch_qwen2() {
  static const ArchSpec s{"qwen2", read_config, load_weights};
  return s;
}

}  // namespace sy
