// The `llama` architecture family (Llama 1/2/3, Mistral- and TinyLlama-shaped GGUF files):
// hyperparameters from metadata and weight views into the memory-mapped file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

namespace sy {

/// Hyperparameters of a llama-family model.
struct LlamaConfig {
  int n_vocab = 0;
  int dim = 0;  // embedding length
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;  // < n_heads for grouped-query attention
  int head_dim = 0;    // dim / n_heads unless the file says otherwise
  int ffn_dim = 0;
  int ctx_len = 0;   // trained context length (llama.context_length)
  int rope_dim = 0;  // rotated dims per head (llama.rope.dimension_count, default head_dim)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  int sliding_window = 0;  // 0: none declared by the file. Recorded only: like llama.cpp for
                           // architecture "llama", attention spans the whole context.
};

/// Weight views of one transformer block. Norm weights are always f32 (n floats).
struct LlamaLayer {
  const float* attn_norm = nullptr;  // (dim)
  kernels::WeightView wq;            // (n_heads * head_dim, dim)
  kernels::WeightView wk;            // (n_kv_heads * head_dim, dim)
  kernels::WeightView wv;            // (n_kv_heads * head_dim, dim)
  kernels::WeightView wo;            // (dim, n_heads * head_dim)
  const float* ffn_norm = nullptr;   // (dim)
  kernels::WeightView w_gate;        // (ffn_dim, dim)
  kernels::WeightView w_up;          // (ffn_dim, dim)
  kernels::WeightView w_down;        // (dim, ffn_dim)
};

struct LlamaWeights {
  kernels::WeightView tok_embd;        // (n_vocab, dim): row t is token t's embedding
  const float* output_norm = nullptr;  // (dim)
  kernels::WeightView output;          // (n_vocab, dim); token_embd when the file ties them
  std::vector<LlamaLayer> layers;
};

/// A loaded model: the mapped file, its config, weight views and tokenizer.
/// Norm weights stored as f16/bf16 are converted once into owned f32 buffers.
class LlamaModel {
 public:
  /// Loads a GGUF file; throws gguf::Error naming what is wrong (unsupported architecture,
  /// missing tensor, shape that does not match the hyperparameters, unsupported type).
  static std::shared_ptr<LlamaModel> load(const std::string& path);
  /// Same, from an already parsed file (takes ownership).
  static std::shared_ptr<LlamaModel> from_gguf(gguf::File file);

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::File& file() const { return file_; }

 private:
  explicit LlamaModel(gguf::File file) : file_(std::move(file)) {}
  gguf::File file_;
  LlamaConfig config_;
  LlamaWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::vector<float>> owned_;  // f32 copies of non-f32 norm weights
};

/// Reads and checks the hyperparameters of a llama-family file (no weights).
LlamaConfig read_llama_config(const gguf::File& file);

}  // namespace sy
