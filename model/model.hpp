// One description of a decoder-only transformer read from a GGUF file: its hyperparameters, the
// per-layer choices of its architecture (norms, biases, RoPE layout, activation, soft-caps,
// attention windows) and weight views into the mapped file. The engines run a step from this
// description alone; model/arch_*.cpp fill it in, one file per `general.architecture`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

namespace sy {

/// Which dims of a head RoPE rotates together.
enum class RopeLayout {
  Norm,  ///< adjacent pairs (2i, 2i + 1): llama
  Neox,  ///< pairs (i, i + rope_dim / 2): qwen2, qwen3, gemma2, phi3
};

/// The gated feed-forward's activation: down(act(gate x) * up x).
enum class Activation {
  SiLU,      ///< SwiGLU: llama, qwen2, qwen3, phi3
  GeluTanh,  ///< GeGLU with GELU's tanh approximation: gemma2
};

const char* rope_layout_name(RopeLayout r);
const char* activation_name(Activation a);

/// Hyperparameters and architecture choices of a model. The fields up to sliding_window are the
/// sizes every backend needs; the rest say how a step is computed.
struct ModelConfig {
  std::string arch;  // general.architecture
  int n_vocab = 0;
  int dim = 0;  // embedding length
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;  // < n_heads for grouped-query attention
  int head_dim = 0;    // dim / n_heads unless the file says otherwise (attention.key_length)
  int ffn_dim = 0;
  int ctx_len = 0;   // trained context length (<arch>.context_length)
  int rope_dim = 0;  // rotated dims per head (<arch>.rope.dimension_count, default head_dim)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  int sliding_window = 0;  // a window every layer uses (0: none): the batcher's default KV policy
                           // (Mistral-shaped llama files, phi3); gemma2's alternate-layer window
                           // is in layer_window only

  RopeLayout rope_layout = RopeLayout::Norm;
  /// Multiplies every RoPE angle: 1 / rope.scaling.factor for linear scaling, else 1.
  float rope_freq_scale = 1.0f;
  Activation activation = Activation::SiLU;
  float embed_scale = 1.0f;    // token embeddings are multiplied by this (gemma2: sqrt(dim))
  float query_scale = 0.0f;    // attention scores are (q . k) * query_scale (1 / sqrt(head_dim))
  float attn_softcap = 0.0f;   // > 0: scores become c * tanh(scores / c) before the softmax
  float final_softcap = 0.0f;  // > 0: the same on the output logits
  /// Attention window of each layer (n_layers entries; 0: the whole context).
  std::vector<int32_t> layer_window;
  /// q_norm / k_norm normalise the whole q and k rows, all heads at once (olmoe), not each head.
  bool qk_norm_whole = false;

  // Mixture of experts (n_experts 0: a dense FFN). A token's router logits (ffn_gate_inp . x) go
  // through a softmax over all experts; the n_experts_used most probable ones run, each weighted
  // by its probability (divided by the chosen ones' sum when expert_weights_norm), times
  // expert_weights_scale, and their outputs are summed.
  int n_experts = 0;
  int n_experts_used = 0;
  int expert_ffn_dim = 0;  // hidden width of one expert
  bool expert_weights_norm = false;
  float expert_weights_scale = 1.0f;
  /// qwen2moe: hidden width of the shared expert that every token also runs, gated by
  /// sigmoid(ffn_gate_inp_shexp . x); 0: none.
  int shared_expert_ffn_dim = 0;

  /// Whether any layer attends through a window of its own.
  bool has_layer_windows() const;
};

/// Weight views of one transformer block. Norm and bias weights are f32 (converted once where the
/// file stores them otherwise); a nullptr is a step the architecture does not have.
struct LayerWeights {
  const float* attn_norm = nullptr;       // (dim) before attention
  const float* post_attn_norm = nullptr;  // (dim) on the attention output (gemma2), or nullptr
  kernels::WeightView wq;                 // (n_heads * head_dim, dim)
  kernels::WeightView wk;                 // (n_kv_heads * head_dim, dim)
  kernels::WeightView wv;                 // (n_kv_heads * head_dim, dim)
  const float* bq = nullptr;              // (n_heads * head_dim) bias, or nullptr (qwen2)
  const float* bk = nullptr;              // (n_kv_heads * head_dim)
  const float* bv = nullptr;              // (n_kv_heads * head_dim)
  const float* q_norm = nullptr;          // (head_dim) per-head RMSNorm before RoPE (qwen3)
  const float* k_norm = nullptr;          // (head_dim)
  kernels::WeightView wo;                 // (dim, n_heads * head_dim)
  const float* bo = nullptr;              // (dim) attention output bias, or nullptr
  const float* ffn_norm = nullptr;        // (dim) before the feed-forward
  const float* post_ffn_norm = nullptr;   // (dim) on the feed-forward output (gemma2)
  kernels::WeightView w_gate;             // (ffn_dim, dim)
  kernels::WeightView w_up;               // (ffn_dim, dim)
  kernels::WeightView w_down;             // (dim, ffn_dim)
  // Mixture of experts (ModelConfig::n_experts > 0; w_gate/w_up/w_down are then empty).
  kernels::WeightView router;                 // (n_experts, dim) ffn_gate_inp
  std::vector<kernels::WeightView> exp_gate;  // n_experts of (expert_ffn_dim, dim)
  std::vector<kernels::WeightView> exp_up;    // n_experts of (expert_ffn_dim, dim)
  std::vector<kernels::WeightView> exp_down;  // n_experts of (dim, expert_ffn_dim)
  const float* shexp_gate_inp = nullptr;      // (dim) the shared expert's gate, or nullptr
  kernels::WeightView shexp_gate;             // (shared_expert_ffn_dim, dim)
  kernels::WeightView shexp_up;               // (shared_expert_ffn_dim, dim)
  kernels::WeightView shexp_down;             // (dim, shared_expert_ffn_dim)
};

/// The model's weights. A fused tensor (phi3's attn_qkv, its gate|up ffn_up) is seen through
/// row ranges: wq/wk/wv and w_gate/w_up then point into one tensor of the file.
struct ModelWeights {
  kernels::WeightView tok_embd;        // (n_vocab, dim): row t is token t's embedding
  const float* output_norm = nullptr;  // (dim)
  kernels::WeightView output;          // (n_vocab, dim); token_embd when the file ties them
  const float* output_bias = nullptr;  // (n_vocab), or nullptr
  const float* rope_freqs = nullptr;   // (rope_dim / 2) RoPE frequency divisors, or nullptr
  std::vector<LayerWeights> layers;
};

/// What serving (admission, the batcher, KV sizing) needs of a model: sizes and windows, not its
/// architecture.
struct ModelLimits {
  int32_t ctx_len = 0;
  int32_t n_vocab = 0;
  int32_t sliding_window = 0;  // ModelConfig::sliding_window: the default KV policy's window
  int32_t n_layers = 0;
  int64_t kv_dim = 0;  // n_kv_heads * head_dim: values of one cached K (or V) row per layer
  /// Bytes one token's KV entry takes in the CPU engine's cache: K and V of every layer, each a
  /// row of kv_dim values in `t` (F32 4 bytes a value, F16 2, Q8_0 34 per 32).
  int64_t kv_bytes_per_token(kernels::DType t = kernels::DType::F16) const {
    return 2 * int64_t{n_layers} * kv_row_bytes(t);
  }
  /// Bytes of one cached K (or V) row of one layer in `t` (kernels::row_bytes; a partial last
  /// block counts whole).
  int64_t kv_row_bytes(kernels::DType t = kernels::DType::F16) const {
    const int64_t be = kernels::dtype_block_elems(t);
    return static_cast<int64_t>(kernels::row_bytes(t, (kv_dim + be - 1) / be * be));
  }
  std::vector<int32_t> layer_window;  // ModelConfig::layer_window

  /// The window W of the KV window group: > 0 when the model has layers of two kinds, some with
  /// full attention and the others all with the same window W of their own (gemma2's even
  /// layers); 0 when every layer is of one kind (llama, phi3) or the windows differ. Such a model
  /// can keep the windowed layers' K/V in blocks of their own (EngineOptions::n_window_blocks).
  int32_t split_window() const {
    int32_t w = 0;
    int n_windowed = 0;
    for (int32_t lw : layer_window) {
      if (lw <= 0) continue;
      if (w > 0 && lw != w) return 0;
      w = lw;
      ++n_windowed;
    }
    return n_windowed > 0 && n_windowed < static_cast<int>(layer_window.size()) ? w : 0;
  }
  /// Layers of the window group (split_window() > 0): those with a window of their own.
  int32_t n_window_layers() const {
    if (split_window() == 0) return 0;
    int32_t n = 0;
    for (int32_t lw : layer_window) n += lw > 0 ? 1 : 0;
    return n;
  }
  /// Bytes one token takes in a block of the full-attention group (the full layers' K and V)
  /// and in a block of the window group (the windowed layers'), when the model splits; with one
  /// group the first is kv_bytes_per_token and the second 0.
  int64_t kv_bytes_per_token_full(kernels::DType t = kernels::DType::F16) const {
    return 2 * int64_t{n_layers - n_window_layers()} * kv_row_bytes(t);
  }
  int64_t kv_bytes_per_token_window(kernels::DType t = kernels::DType::F16) const {
    return 2 * int64_t{n_window_layers()} * kv_row_bytes(t);
  }
};
ModelLimits model_limits(const ModelConfig& c);

/// A loaded model: the mapped file, its description, weight views and tokenizer.
class Model {
 public:
  /// Loads a GGUF file; throws gguf::Error naming what is wrong (unsupported architecture,
  /// missing tensor, shape that does not match the hyperparameters, unsupported type).
  static std::shared_ptr<Model> load(const std::string& path);
  /// Same, from an already parsed file (takes ownership).
  static std::shared_ptr<Model> from_gguf(gguf::File file);

  const ModelConfig& config() const { return config_; }
  const ModelLimits& limits() const { return limits_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::File& file() const { return file_; }

 private:
  friend class ArchLoader;
  explicit Model(gguf::File file) : file_(std::move(file)) {}
  gguf::File file_;
  ModelConfig config_;
  ModelLimits limits_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::vector<float>> owned_;  // f32 copies of non-f32 norm and bias weights
};

/// Why `draft` cannot draft tokens for `target` (speculative decoding): its vocabulary differs
/// (size, a token's text or type, BOS/EOS) or its output width does; the message names the
/// key and the first difference. Empty when they share the vocabulary.
std::string draft_vocabulary_mismatch(const Model& target, const Model& draft);

/// Reads and checks the description of a file (no weights): what an engine sizes itself by.
ModelConfig read_model_config(const gguf::File& file);

/// The architectures this build loads (general.architecture values), in table order.
std::vector<std::string> supported_architectures();

// The names the rest of the tree used while only `llama` was supported.
using LlamaConfig = ModelConfig;
using LlamaLayer = LayerWeights;
using LlamaWeights = ModelWeights;
using LlamaModel = Model;
inline LlamaConfig read_llama_config(const gguf::File& file) {
  return read_model_config(file);
}

}  // namespace sy
