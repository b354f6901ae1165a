// Architecture `gemma2`: embeddings scaled by sqrt(dim), norms after attention and after the
// feed-forward as well as before, GELU(tanh)-gated FFN, attention and final logit soft-caps,
// a sliding window on the even layers, NEOX RoPE, output tied to the embedding.
#include <cmath>

#include "model/arch.hpp"

namespace sy {
namespace {

// Soft-caps of the released Gemma 2 models, used where a file omits the keys (llama.cpp's
// defaults as well).
constexpr double kDefaultAttnSoftcap = 50.0;
constexpr double kDefaultFinalSoftcap = 30.0;

void read_config(ArchLoader& ld) {
  ld.read_common();
  ld.read_rope_scaling(/*allow_llama3=*/false);
  ModelConfig& c = ld.config();
  c.rope_layout = RopeLayout::Neox;
  c.activation = Activation::GeluTanh;
  c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  // Queries are scaled by 1/sqrt(head_dim) (attention.key_length), as llama.cpp runs Gemma 2.
  c.query_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.attn_softcap =
      static_cast<float>(ld.opt_float("attn_logit_softcapping").value_or(kDefaultAttnSoftcap));
  c.final_softcap =
      static_cast<float>(ld.opt_float("final_logit_softcapping").value_or(kDefaultFinalSoftcap));
  if (!(c.attn_softcap >= 0.0f) || !(c.final_softcap >= 0.0f) || !std::isfinite(c.attn_softcap) ||
      !std::isfinite(c.final_softcap)) {
    throw gguf::Error(
        "gemma2 soft-caps (attn_logit_softcapping, final_logit_softcapping) must be "
        ">= 0");
  }
  // The window applies to even layers only (layer l with l % 2 == 0), the others see the whole
  // context, so it is not a model-wide window (sliding_window stays 0).
  const int win =
      ld.int_in("attention.sliding_window", ld.opt_int("attention.sliding_window").value_or(0), 0,
                int64_t{1} << 24);
  for (int l = 0; l < c.n_layers; ++l)
    c.layer_window[static_cast<size_t>(l)] = l % 2 == 0 ? win : 0;
}

void load_weights(ArchLoader& ld) {
  const ModelConfig& c = ld.config();
  ModelWeights& w = ld.weights();
  ld.load_embeddings_and_output();
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    const std::string b = block_prefix(l);
    ld.load_attention(L, l);
    L.post_attn_norm = ld.vec(b + "post_attention_norm.weight", c.dim);
    ld.load_ffn(L, l);
    L.post_ffn_norm = ld.vec(b + "post_ffw_norm.weight", c.dim);
  }
}

}  // namespace

const ArchSpec& arch_gemma2() {
  static const ArchSpec s{"gemma2", read_config, load_weights};
  return s;
}

}  // namespace sy
