// The architecture table's interface: what a model/arch_*.cpp file gets to read metadata and
// tensors with, and the entry it registers. Internal to model/ (the engines see model.hpp only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace sy {

/// Reads one file into a ModelConfig (and, when loading weights, a ModelWeights), with checks
/// that name the key or tensor at fault. Metadata keys are given without the "<arch>." prefix.
class ArchLoader {
 public:
  /// weights == nullptr: the description only (read_model_config).
  ArchLoader(const gguf::File& file, ModelConfig& config, ModelWeights* weights,
             std::vector<std::vector<float>>* owned);

  const gguf::File& file() const { return file_; }
  ModelConfig& config() { return c_; }
  ModelWeights& weights() { return *w_; }
  /// "<arch>." for the architecture being read.
  const std::string& prefix() const { return p_; }

  std::optional<int64_t> opt_int(const std::string& key) const;
  std::optional<double> opt_float(const std::string& key) const;
  std::optional<std::string> opt_string(const std::string& key) const;
  int64_t req_int(const std::string& key) const;
  /// opt_int/req_int checked against [lo, hi].
  int int_in(const std::string& key, int64_t x, int64_t lo, int64_t hi) const;

  /// The sizes every architecture declares the same way (embedding_length, block_count,
  /// feed_forward_length, head counts, key_length, rope.dimension_count, rope.freq_base,
  /// layer_norm_rms_epsilon, context_length), the vocabulary from token_embd, and defaults for
  /// the rest: NORM RoPE, SiLU, query scale 1/sqrt(head_dim), no windows, no soft-caps.
  /// Refuses mixture-of-experts files (<arch>.expert_count > 0) unless `experts`.
  void read_common(bool experts = false);
  /// The mixture-of-experts keys (expert_count > 0): expert_used_count, the expert width
  /// (expert_feed_forward_length; absent: feed_forward_length, or feed_forward_length /
  /// expert_used_count when `width_per_used`, as llama.cpp sizes qwen3moe's experts),
  /// expert_weights_norm (default `norm`), expert_weights_scale, expert_gating_func (1, softmax,
  /// only: sigmoid gating is refused naming the key).
  void read_experts(bool norm, bool width_per_used = false);
  /// rope.scaling.type none or linear (rope.scaling.factor); `allow_llama3`: also "llama3",
  /// whose frequency factors the file carries as rope_freqs.weight.
  void read_rope_scaling(bool allow_llama3);

  bool has_tensor(const std::string& name) const { return file_.tensor(name) != nullptr; }
  /// A matrix weight of `rows` output features by `cols` inputs (GGUF dims {cols, rows}).
  kernels::WeightView matrix(const std::string& name, int64_t rows, int64_t cols) const;
  /// A vector weight of n floats (f32 in place, other float types converted once).
  const float* vec(const std::string& name, int64_t n);
  /// vec(), or nullptr when the file has no such tensor.
  const float* opt_vec(const std::string& name, int64_t n);
  /// Rows [row0, row0 + n) of w, a view into the same tensor.
  static kernels::WeightView rows_of(const kernels::WeightView& w, int64_t row0, int64_t n);

  /// token_embd, output_norm, output (tied to token_embd when absent) and its optional bias.
  void load_embeddings_and_output();
  /// attn_norm, attn_q/k/v (with optional biases), attn_output (with optional bias).
  void load_attention(LayerWeights& L, int layer);
  /// attn_q/k/v.bias, required (qwen2, qwen2moe: a file without them is broken).
  void load_qkv_biases(LayerWeights& L, int layer);
  /// ffn_norm, ffn_gate, ffn_up, ffn_down.
  void load_ffn(LayerWeights& L, int layer);
  /// ffn_norm, the router ffn_gate_inp and the 3-D ffn_{gate,up,down}_exps (ne[2] the expert),
  /// plus the shared expert where config().shared_expert_ffn_dim > 0. A router or expert stack
  /// whose shape disagrees with the keys is refused naming the tensor, both shapes and the keys
  /// that give the expected one.
  void load_moe_ffn(LayerWeights& L, int layer);
  /// The n matrices of `rows` by `cols` of a 3-D tensor (GGUF dims {cols, rows, n}).
  std::vector<kernels::WeightView> experts(const std::string& name, int64_t n, int64_t rows,
                                           int64_t cols) const;

 private:
  const gguf::File& file_;
  ModelConfig& c_;
  ModelWeights* w_;
  std::vector<std::vector<float>>* owned_;
  std::string p_;
  std::string expert_width_key_;  // the key(s) read_experts took the expert width from
};

/// One architecture: the description it reads (no weights) and the tensors it loads.
struct ArchSpec {
  const char* name;  // general.architecture
  void (*read_config)(ArchLoader& ld);
  void (*load_weights)(ArchLoader& ld);  // after read_config; config() is complete
};

/// "blk.<layer>." — the prefix of a block's tensor names.
std::string block_prefix(int layer);

// One per model/arch_*.cpp, listed in model/model.cpp's table.
const ArchSpec& arch_llama();
const ArchSpec& arch_qwen2();
const ArchSpec& arch_qwen3();
const ArchSpec& arch_gemma2();
const ArchSpec& arch_phi3();
const ArchSpec& arch_qwen2moe();
const ArchSpec& arch_olmoe();
const ArchSpec& arch_qwen3moe();

}  // namespace sy
