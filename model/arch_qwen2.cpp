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
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    ld.load_attention(L, l);
    ld.load_qkv_biases(L, l);  // part of the architecture: a file without them is broken
    ld.load_ffn(L, l);
  }
}

}  // namespace

const ArchSpec& arch_qwen2() {
  static const ArchSpec s{"qwen2", read_config, load_weights};
  return s;
}

}  // namespace sy
