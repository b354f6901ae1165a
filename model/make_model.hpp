// make-model: writes a random-weight Llama GGUF of a standard shape (for tests and benchmarks)
// that both this runtime and llama.cpp load.
#pragma once

#include <cstdint>
#include <string>

namespace sy {

/// What to write: a shape (tiny, 15M, 110M, 1B, 8B), a weight dtype for the 2-D matrices
/// (f32, f16, bf16, q8_0, q4_0), an optional GGUF whose tokenizer.ggml.* metadata is copied,
/// the seed of the weights, an optional context length and the output path.
struct MakeModelOptions {
  std::string shape = "tiny";
  std::string dtype = "f32";
  std::string vocab_from;
  uint64_t seed = 0;
  int64_t ctx_len = 0;  ///< llama.context_length written; 0: the shape's
  std::string out;
};

/// Hyperparameters of one make-model shape.
struct ModelShape {
  std::string name;
  int dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int ffn_dim = 0;
  int n_vocab = 0;  ///< of the built-in vocabulary; --vocab-from overrides it
  int ctx_len = 2048;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool tied_output = false;  ///< no output.weight: the output projection is token_embd
};

/// The shape called `name` (case-insensitive); throws std::invalid_argument for unknown names.
ModelShape model_shape(const std::string& name);

/// Writes the model to opts.out; throws std::invalid_argument (bad options), gguf::Error (bad
/// --vocab-from file) or std::runtime_error (I/O).
void make_model(const MakeModelOptions& opts);

}  // namespace sy
