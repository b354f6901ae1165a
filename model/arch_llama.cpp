// Architecture `llama`: Llama 1/2/3/3.1/3.2, Mistral, TinyLlama. NORM RoPE with optional frequency
// factors (rope_freqs.weight, Llama 3.1) and linear or llama3 rope scaling; optional biases;
// Mixtral's mixture of experts (expert_count > 0).
#include "model/arch.hpp"

namespace sy {
namespace {

void read_config(ArchLoader& ld) {
  // Mixtral-shaped files: experts whose chosen probabilities are renormalised to sum 1.
  ld.read_common(/*experts=*/true);
  ModelConfig& c = ld.config();
  ld.read_experts(/*norm=*/true);
  ld.read_rope_scaling(/*allow_llama3=*/true);
  // Mistral-shaped files carry a sliding window key. Like llama.cpp, the forward pass does not
  // window the layers of a `llama` file; the batcher takes the key as its default KV policy.
  c.sliding_window =
      ld.int_in("attention.sliding_window", ld.opt_int("attention.sliding_window").value_or(0), 0,
                int64_t{1} << 24);
}

void load_weights(ArchLoader& ld) {
  const ModelConfig& c = ld.config();
  ModelWeights& w = ld.weights();
  ld.load_embeddings_and_output();
  // Llama 3.1 frequency factors: the angle of dim pair i is divided by factor i.
  w.rope_freqs = ld.opt_vec("rope_freqs.weight", c.rope_dim / 2);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    ld.load_attention(L, l);
    if (c.n_experts > 0)
      ld.load_moe_ffn(L, l);
    else
      ld.load_ffn(L, l);
  }
}

}  // namespace

const ArchSpec& arch_llama() {
  static const ArchSpec s{"llama", read_config, load_weights};
  return s;
}

}  // namespace sy
