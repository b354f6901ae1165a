// Architecture `phi3`: fused attn_qkv (q rows, then k, then v) and fused ffn_up (gate rows, then
// up), NEOX RoPE, and the file's sliding window on every layer.
#include "model/arch.hpp"

namespace sy {
namespace {

void read_config(ArchLoader& ld) {
  ld.read_common();
  ld.read_rope_scaling(/*allow_llama3=*/false);
  ModelConfig& c = ld.config();
  c.rope_layout = RopeLayout::Neox;
  // Phi-3 was trained with its window on every layer; the batcher's default KV policy takes it
  // too, so blocks behind it are released.
  c.sliding_window =
      ld.int_in("attention.sliding_window", ld.opt_int("attention.sliding_window").value_or(0), 0,
                int64_t{1} << 24);
  c.layer_window.assign(static_cast<size_t>(c.n_layers), c.sliding_window);
  // LongRoPE files (128k context) carry two factor sets chosen by context length.
  if (ld.has_tensor("rope_factors_long.weight") || ld.has_tensor("rope_factors_short.weight")) {
    throw gguf::Error("phi3 LongRoPE frequency factors (rope_factors_long/short) are unsupported");
  }
}

void load_weights(ArchLoader& ld) {
  const ModelConfig& c = ld.config();
  ModelWeights& w = ld.weights();
  ld.load_embeddings_and_output();
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    const std::string b = block_prefix(l);
    if (ld.has_tensor(b + "attn_qkv.weight")) {
      const kernels::WeightView qkv = ld.matrix(b + "attn_qkv.weight", q_dim + 2 * kv_dim, c.dim);
      L.attn_norm = ld.vec(b + "attn_norm.weight", c.dim);
      L.wq = ArchLoader::rows_of(qkv, 0, q_dim);
      L.wk = ArchLoader::rows_of(qkv, q_dim, kv_dim);
      L.wv = ArchLoader::rows_of(qkv, q_dim + kv_dim, kv_dim);
      L.wo = ld.matrix(b + "attn_output.weight", c.dim, q_dim);
    } else {
      ld.load_attention(L, l);  // converted with separate q/k/v
    }
    L.ffn_norm = ld.vec(b + "ffn_norm.weight", c.dim);
    const kernels::WeightView gu = ld.matrix(b + "ffn_up.weight", 2 * int64_t{c.ffn_dim}, c.dim);
    L.w_gate = ArchLoader::rows_of(gu, 0, c.ffn_dim);
    L.w_up = ArchLoader::rows_of(gu, c.ffn_dim, c.ffn_dim);
    L.w_down = ld.matrix(b + "ffn_down.weight", c.dim, c.ffn_dim);
  }
}

}  // namespace

const ArchSpec& arch_phi3() {
  static const ArchSpec s{"phi3", read_config, load_weights};
  return s;
}

}  // namespace sy
