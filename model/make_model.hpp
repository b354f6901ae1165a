// make-model: writes a random-weight GGUF of a standard shape and architecture (for tests and
// benchmarks) that both this runtime and llama.cpp load.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/ggml_type.hpp"
#include "model/gguf.hpp"

namespace sy {

/// What to write: a shape (tiny, mini, 15M, 110M, 1B, 8B), an architecture (llama, qwen2, qwen3,
/// gemma2, phi3, and the mixtures of experts mixtral, qwen2moe, olmoe, qwen3moe: llama.cpp's GGUF
/// keys and tensor names; mixtral is written as general.architecture `llama` with experts), a
/// weight dtype for the matrices and expert stacks (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
/// iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, and the mixes q4_k_m, q5_k_m), an optional GGUF
/// whose tokenizer.ggml.* metadata is copied, the seed of the weights, an optional context
/// length, the experts of the MoE architectures and the output path.
struct MakeModelOptions {
  std::string shape = "tiny";
  std::string arch = "llama";
  std::string dtype = "f32";
  std::string vocab_from;
  uint64_t seed = 0;
  int64_t ctx_len = 0;  ///< <arch>.context_length written; 0: the shape's
  /// MoE architectures only (elsewhere each must stay 0): experts per layer (0: 8), experts per
  /// token (0: 2) and the FFN width of one expert (0: the shape's ffn_dim, as Mixtral's experts
  /// are as wide as Mistral's dense FFN).
  int n_experts = 0;
  int n_experts_used = 0;
  int expert_ffn = 0;
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

/// Writes the model to opts.out; throws std::invalid_argument (bad options, or a dtype whose
/// quantizer this build lacks), gguf::Error (bad --vocab-from file) or std::runtime_error (I/O).
void make_model(const MakeModelOptions& opts);

/// The type make-model stores the matrix or expert stack `name` in (layer `layer` of `n_layers`,
/// -1 outside the layers; `cols` its row length; `n_experts` the model's expert count, 0 for a
/// dense model) for `dtype`: F32 for the router ffn_gate_inp whatever the dtype (llama-quantize
/// never quantizes it); else the dtype's type, with llama-quantize's Q4_K_M / Q5_K_M rule for
/// the mixes (Q6_K for output.weight, and for the tied token_embd.weight when `tied`, and for
/// attn_v and every ffn_down* (ffn_down_exps, ffn_down_shexp) of the layers llama.cpp gives more
/// bits; fused attn_qkv Q5_K / Q6_K; with exactly 8 experts attn_k and attn_v Q8_0 and, in
/// Q4_K_M, attn_output Q5_K), and llama.cpp's fallback where cols is not a multiple of the
/// type's block size (Q2_K, Q3_K, IQ4_XS -> IQ4_NL; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0;
/// F16 where not even 32 divides it). Throws std::invalid_argument for an unknown dtype.
kernels::DType make_model_tensor_type(const std::string& dtype, const std::string& name, int layer,
                                      int n_layers, int64_t cols, bool tied = false,
                                      int n_experts = 0);

/// Writes to `out` the GGUF `from` cut to its first `n_layers` transformer blocks (tensors
/// blk.N.* from n_layers on left out, <arch>.block_count set; every other key and tensor as it
/// is): a draft model of the file's own vocabulary for speculative decoding. Throws
/// std::invalid_argument for n_layers outside [1, the file's block count], gguf::Error for a bad
/// file, std::runtime_error on I/O failure.
void make_model_keep_layers(const std::string& from, int n_layers, const std::string& out);

/// The dtype names make-model accepts, comma-separated (for usage and error texts).
const char* make_model_dtypes();

}  // namespace sy
