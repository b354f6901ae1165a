// Architecture `qwen2moe`: the qwen2 block (Q/K/V biases, NEOX RoPE) with a mixture of experts
// for its feed-forward: softmax over all experts, the top expert_used_count weighted by their
// probabilities as they are (not renormalised), plus a shared expert on every token gated by
// sigmoid(ffn_gate_inp_shexp . x).
#include "model/arch.hpp"

namespace sy {
namespace {

void read_config(ArchLoader& ld) {
  ld.read_common(/*experts=*/true);
  ModelConfig& c = ld.config();
  ld.read_rope_scaling(/*allow_llama3=*/false);
  c.rope_layout = RopeLayout::Neox;
  if (c.n_experts == 0) ld.req_int("expert_count");  // names the key when it is 0
  ld.read_experts(/*norm=*/false, /*width_per_used=*/true);
  c.shared_expert_ffn_dim =
      ld.int_in("expert_shared_feed_forward_length",
                ld.opt_int("expert_shared_feed_forward_length").value_or(0), 0, int64_t{1} << 20);
}

void load_weights(ArchLoader& ld) {
  const ModelConfig& c = ld.config();
  ModelWeights& w = ld.weights();
  ld.load_embeddings_and_output();
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    ld.load_attention(L, l);
    ld.load_qkv_biases(L, l);
    ld.load_moe_ffn(L, l);
  }
}

}  // namespace

const ArchSpec& arch_qwen2moe() {
  static const ArchSpec s{"qwen2moe", read_config, load_weights};
  return s;
}

}  // namespace sy
