// Loading of a GGUF model: the architecture table, the checks and readers every architecture
// shares (ArchLoader), and Model::from_gguf. Per-architecture choices live in model/arch_*.cpp.
#include "model/model.hpp"

#include <cmath>
#include <string>
#include <utility>

#include "model/arch.hpp"

namespace sy {
namespace {

// Upper bounds on hyperparameters: far above any released model, low enough that products of
// them (buffer sizes) cannot overflow 64-bit arithmetic on a hostile file.
constexpr int64_t kMaxDim = 1 << 17;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxCtx = int64_t{1} << 24;
constexpr int64_t kMaxVocab = int64_t{1} << 24;

[[noreturn]] void fail(const std::string& msg) {
  throw gguf::Error(msg);
}

// The table: adding an architecture is one model/arch_<name>.cpp and one line here.
const std::vector<const ArchSpec*>& arch_table() {
  static const std::vector<const ArchSpec*> t = {&arch_llama(),  &arch_qwen2(),   &arch_qwen3(),
                                                 &arch_gemma2(), &arch_phi3(),    &arch_qwen2moe(),
                                                 &arch_olmoe(),  &arch_qwen3moe()};
  return t;
}

// Architectures (llama.cpp's names) refused with what they need that this build lacks, rather
// than as unknown; nullptr: not one of them.
const char* missing_features(const std::string& a) {
  static const std::pair<const char*, const char*> kKnown[] = {
      {"mixtral", "a mixture-of-experts architecture this build does not implement"},
      {"dbrx", "a mixture-of-experts architecture this build does not implement"},
      {"grok", "a mixture-of-experts architecture this build does not implement"},
      {"deepseek2", "a mixture-of-experts architecture this build does not implement"},
      {"arctic", "a mixture-of-experts architecture this build does not implement"},
      {"deepseek", "a mixture-of-experts architecture this build does not implement"},
      // Granite scales each block's attention and FFN output before the residual add and
      // divides the logits; the model description has no such steps.
      {"granitemoe",
       "Granite's residual scale (granitemoe.residual_scale) and logit scale "
       "(granitemoe.logit_scale) are not implemented by the engines"},
      {"granite",
       "Granite's residual scale (granite.residual_scale) and logit scale (granite.logit_scale) "
       "are not implemented by the engines"}};
  for (const auto& [name, why] : kKnown)
    if (a == name) return why;
  return nullptr;
}

std::string shape_str(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

const gguf::TensorInfo& require_tensor(const gguf::File& f, const std::string& name,
                                       std::vector<uint64_t> expected) {
  const gguf::TensorInfo* t = f.tensor(name);
  if (!t) fail("missing tensor '" + name + "'");
  if (t->dims != expected) {
    fail("tensor '" + name + "' has shape " + shape_str(t->dims) + ", expected " +
         shape_str(expected));
  }
  const auto type = static_cast<uint32_t>(t->type);
  if (!kernels::dtype_known(type)) {
    fail("tensor '" + name + "' has type " + gguf::type_label(type) +
         ", which this build does not support");
  }
  return *t;
}

const ArchSpec& find_arch(const gguf::File& file) {
  const gguf::Value* arch_v = file.find("general.architecture");
  if (!arch_v) fail("missing metadata key 'general.architecture'");
  auto arch = arch_v->as_string();
  if (!arch) fail("metadata key 'general.architecture' is not a string");
  const std::string a(*arch);
  for (const ArchSpec* s : arch_table())
    if (a == s->name) return *s;
  if (const char* why = missing_features(a)) fail("unsupported architecture '" + a + "': " + why);
  std::string names;
  for (const std::string& n : supported_architectures()) names += (names.empty() ? "" : ", ") + n;
  fail("unsupported architecture '" + a + "' (supported: " + names + ")");
}

// The checks every description gets after its architecture filled it in.
void check_config(const gguf::File& file, const ModelConfig& c) {
  if (static_cast<int>(c.layer_window.size()) != c.n_layers) {
    fail("architecture '" + c.arch + "' gave " + std::to_string(c.layer_window.size()) +
         " layer windows for " + std::to_string(c.n_layers) + " layers");
  }
  if (!(c.query_scale > 0.0f) || !std::isfinite(c.query_scale)) {
    fail("architecture '" + c.arch + "': attention query scale must be > 0");
  }
  if (const gguf::Value* toks = file.find("tokenizer.ggml.tokens")) {
    const gguf::Array* a = toks->as_array();
    if (a && a->items.size() != static_cast<size_t>(c.n_vocab)) {
      fail("tokenizer.ggml.tokens has " + std::to_string(a->items.size()) +
           " tokens but token_embd has " + std::to_string(c.n_vocab) + " rows");
    }
  }
}

}  // namespace

const char* rope_layout_name(RopeLayout r) {
  return r == RopeLayout::Norm ? "norm" : "neox";
}

const char* activation_name(Activation a) {
  return a == Activation::SiLU ? "silu" : "gelu_tanh";
}

bool ModelConfig::has_layer_windows() const {
  for (int32_t w : layer_window)
    if (w > 0) return true;
  return false;
}

ModelLimits model_limits(const ModelConfig& c) {
  ModelLimits l;
  l.ctx_len = c.ctx_len;
  l.n_vocab = c.n_vocab;
  l.sliding_window = c.sliding_window;
  l.n_layers = c.n_layers;
  l.kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  l.layer_window = c.layer_window;
  return l;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const ArchSpec* s : arch_table()) out.emplace_back(s->name);
  return out;
}

std::string block_prefix(int layer) {
  return "blk." + std::to_string(layer) + ".";
}

// ---- ArchLoader ----

ArchLoader::ArchLoader(const gguf::File& file, ModelConfig& config, ModelWeights* weights,
                       std::vector<std::vector<float>>* owned)
    : file_(file), c_(config), w_(weights), owned_(owned), p_(config.arch + ".") {}

// A present key of the wrong type is an error (a silent default would hide a broken file).
std::optional<int64_t> ArchLoader::opt_int(const std::string& key) const {
  const gguf::Value* v = file_.find(p_ + key);
  if (!v) return std::nullopt;
  auto x = v->as_int();
  if (!x) fail("metadata key '" + p_ + key + "' is not an integer");
  return x;
}

std::optional<double> ArchLoader::opt_float(const std::string& key) const {
  const gguf::Value* v = file_.find(p_ + key);
  if (!v) return std::nullopt;
  auto x = v->as_float();
  if (!x) fail("metadata key '" + p_ + key + "' is not a number");
  return x;
}

std::optional<std::string> ArchLoader::opt_string(const std::string& key) const {
  const gguf::Value* v = file_.find(p_ + key);
  if (!v) return std::nullopt;
  auto x = v->as_string();
  if (!x) fail("metadata key '" + p_ + key + "' is not a string");
  return std::string(*x);
}

int64_t ArchLoader::req_int(const std::string& key) const {
  auto x = opt_int(key);
  if (!x) fail("missing metadata key '" + p_ + key + "'");
  return *x;
}

int ArchLoader::int_in(const std::string& key, int64_t x, int64_t lo, int64_t hi) const {
  if (x < lo || x > hi) {
    fail("metadata key '" + p_ + key + "' = " + std::to_string(x) + " is out of range [" +
         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(x);
}

void ArchLoader::read_common(bool experts) {
  ModelConfig& c = c_;
  const auto req = [&](const char* k, int64_t lo, int64_t hi) {
    return int_in(k, req_int(k), lo, hi);
  };
  c.dim = req("embedding_length", 1, kMaxDim);
  c.n_layers = req("block_count", 1, kMaxLayers);
  c.ffn_dim = req("feed_forward_length", 1, kMaxDim * 8);
  c.n_heads = req("attention.head_count", 1, kMaxHeads);
  c.n_kv_heads = int_in("attention.head_count_kv",
                        opt_int("attention.head_count_kv").value_or(c.n_heads), 1, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0) {
    fail("attention.head_count " + std::to_string(c.n_heads) +
         " is not a multiple of attention.head_count_kv " + std::to_string(c.n_kv_heads));
  }
  if (auto hd = opt_int("attention.key_length")) {
    c.head_dim = int_in("attention.key_length", *hd, 1, kMaxDim);
  } else {
    if (c.dim % c.n_heads != 0) {
      fail("embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
           std::to_string(c.n_heads) + " and attention.key_length is absent");
    }
    c.head_dim = c.dim / c.n_heads;
  }
  if (auto vl = opt_int("attention.value_length"); vl && *vl != c.head_dim) {
    fail("attention.value_length " + std::to_string(*vl) + " differs from key_length " +
         std::to_string(c.head_dim) + " (unsupported)");
  }
  c.rope_dim = int_in("rope.dimension_count", opt_int("rope.dimension_count").value_or(c.head_dim),
                      2, c.head_dim);
  if (c.rope_dim % 2 != 0) fail("rope.dimension_count " + std::to_string(c.rope_dim) + " is odd");
  c.rope_theta = static_cast<float>(opt_float("rope.freq_base").value_or(10000.0));
  if (!(c.rope_theta > 1.0f) || !std::isfinite(c.rope_theta)) fail("rope.freq_base must be > 1");
  c.norm_eps = static_cast<float>(opt_float("attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.norm_eps >= 0.0f) || !std::isfinite(c.norm_eps)) {
    fail("attention.layer_norm_rms_epsilon must be >= 0");
  }
  c.ctx_len = req("context_length", 1, kMaxCtx);
  if (const int64_t e = opt_int("expert_count").value_or(0); e > 0) {
    if (!experts)
      fail("mixture-of-experts files (" + p_ + "expert_count = " + std::to_string(e) +
           ") are unsupported for architecture '" + c.arch + "'");
    c.n_experts = int_in("expert_count", e, 1, 256);
  }
  c.rope_layout = RopeLayout::Norm;
  c.rope_freq_scale = 1.0f;
  c.activation = Activation::SiLU;
  c.embed_scale = 1.0f;
  c.query_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.attn_softcap = 0.0f;
  c.final_softcap = 0.0f;
  c.sliding_window = 0;
  c.layer_window.assign(static_cast<size_t>(c.n_layers), 0);

  // The vocabulary size is the embedding's row count; other declarations must agree with it.
  const gguf::TensorInfo* emb = file_.tensor("token_embd.weight");
  if (!emb) fail("missing tensor 'token_embd.weight'");
  if (emb->dims.size() != 2 || emb->dims[0] != static_cast<uint64_t>(c.dim)) {
    fail("tensor 'token_embd.weight' has shape " + shape_str(emb->dims) + ", expected [" +
         std::to_string(c.dim) + ", n_vocab]");
  }
  if (emb->dims[1] < 1 || emb->dims[1] > static_cast<uint64_t>(kMaxVocab)) {
    fail("tensor 'token_embd.weight' has " + std::to_string(emb->dims[1]) + " rows (vocabulary)");
  }
  c.n_vocab = static_cast<int>(emb->dims[1]);
  if (auto vs = opt_int("vocab_size"); vs && *vs != c.n_vocab) {
    fail(p_ + "vocab_size " + std::to_string(*vs) + " differs from token_embd rows " +
         std::to_string(c.n_vocab));
  }
}

void ArchLoader::read_rope_scaling(bool allow_llama3) {
  const std::string type = opt_string("rope.scaling.type").value_or("none");
  // Older converters wrote the linear factor as rope.scale_linear.
  auto factor = opt_float("rope.scaling.factor");
  if (!factor) factor = opt_float("rope.scale_linear");
  if (type == "none") {
    if (factor && *factor != 1.0 && !file_.find(p_ + "rope.scaling.type")) {
      // A bare rope.scale_linear means linear scaling.
      c_.rope_freq_scale = static_cast<float>(1.0 / *factor);
    }
  } else if (type == "linear") {
    if (factor && *factor != 0.0) {
      if (!(*factor > 0.0) || !std::isfinite(*factor)) fail(p_ + "rope.scaling.factor must be > 0");
      c_.rope_freq_scale = static_cast<float>(1.0 / *factor);
    }
  } else if (type == "llama3" && allow_llama3) {
    // Llama-3 scaling is carried by the file's rope_freqs.weight; without it the file is broken.
    if (!has_tensor("rope_freqs.weight")) {
      fail(p_ + "rope.scaling.type is 'llama3' but the file has no rope_freqs.weight");
    }
  } else {
    fail("rope scaling type '" + type + "' (" + p_ + "rope.scaling.type) is unsupported");
  }
  if (!(c_.rope_freq_scale > 0.0f) || !std::isfinite(c_.rope_freq_scale)) {
    fail(p_ + "rope scaling factor must be > 0");
  }
}

namespace {

// The tensor `name` of shape {cols, rows, n...} (the dims after the first two multiply `rows`) as
// one matrix of rows x cols, its rows whole blocks of its type.
kernels::WeightView matrix_view(const gguf::File& f, const std::string& name,
                                std::vector<uint64_t> dims) {
  const gguf::TensorInfo& t = require_tensor(f, name, dims);
  const auto cols = static_cast<int64_t>(dims[0]);
  if (cols % kernels::dtype_block_elems(t.type) != 0) {
    fail("tensor '" + name + "' of type " + gguf::type_label(static_cast<uint32_t>(t.type)) +
         " has " + std::to_string(cols) + " columns, not a multiple of its block size");
  }
  kernels::WeightView w;
  w.type = t.type;
  w.data = f.data(t);
  w.cols = cols;
  w.rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) w.rows *= static_cast<int64_t>(dims[i]);
  return w;
}

}  // namespace

kernels::WeightView ArchLoader::matrix(const std::string& name, int64_t rows, int64_t cols) const {
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  return matrix_view(file_, name, {u(cols), u(rows)});
}

const float* ArchLoader::vec(const std::string& name, int64_t n) {
  const gguf::TensorInfo& t = require_tensor(file_, name, {static_cast<uint64_t>(n)});
  if (t.type == kernels::DType::F32) return reinterpret_cast<const float*>(file_.data(t));
  if (n % kernels::dtype_block_elems(t.type) != 0) {
    fail("tensor '" + name + "' of type " + gguf::type_label(static_cast<uint32_t>(t.type)) +
         " has a partial block");
  }
  owned_->emplace_back(static_cast<size_t>(n));
  kernels::dequantize_row(t.type, file_.data(t), owned_->back().data(), n);
  return owned_->back().data();
}

const float* ArchLoader::opt_vec(const std::string& name, int64_t n) {
  return has_tensor(name) ? vec(name, n) : nullptr;
}

kernels::WeightView ArchLoader::rows_of(const kernels::WeightView& w, int64_t row0, int64_t n) {
  kernels::WeightView v = w;
  v.data = static_cast<const uint8_t*>(w.data) + row0 * kernels::row_bytes(w.type, w.cols);
  v.rows = n;
  return v;
}

void ArchLoader::load_embeddings_and_output() {
  const ModelConfig& c = c_;
  ModelWeights& w = *w_;
  w.tok_embd = matrix("token_embd.weight", c.n_vocab, c.dim);
  w.output_norm = vec("output_norm.weight", c.dim);
  // Files without an output matrix tie it to the token embedding.
  w.output = has_tensor("output.weight") ? matrix("output.weight", c.n_vocab, c.dim) : w.tok_embd;
  w.output_bias = opt_vec("output.bias", c.n_vocab);
  w.layers.assign(static_cast<size_t>(c.n_layers), LayerWeights{});
}

void ArchLoader::load_attention(LayerWeights& L, int layer) {
  const ModelConfig& c = c_;
  const std::string b = block_prefix(layer);
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  L.attn_norm = vec(b + "attn_norm.weight", c.dim);
  L.wq = matrix(b + "attn_q.weight", q_dim, c.dim);
  L.wk = matrix(b + "attn_k.weight", kv_dim, c.dim);
  L.wv = matrix(b + "attn_v.weight", kv_dim, c.dim);
  L.bq = opt_vec(b + "attn_q.bias", q_dim);
  L.bk = opt_vec(b + "attn_k.bias", kv_dim);
  L.bv = opt_vec(b + "attn_v.bias", kv_dim);
  L.wo = matrix(b + "attn_output.weight", c.dim, q_dim);
  L.bo = opt_vec(b + "attn_output.bias", c.dim);
}

void ArchLoader::load_qkv_biases(LayerWeights& L, int layer) {
  const ModelConfig& c = c_;
  const std::string b = block_prefix(layer);
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  L.bq = vec(b + "attn_q.bias", q_dim);
  L.bk = vec(b + "attn_k.bias", kv_dim);
  L.bv = vec(b + "attn_v.bias", kv_dim);
}

void ArchLoader::load_ffn(LayerWeights& L, int layer) {
  const ModelConfig& c = c_;
  const std::string b = block_prefix(layer);
  L.ffn_norm = vec(b + "ffn_norm.weight", c.dim);
  L.w_gate = matrix(b + "ffn_gate.weight", c.ffn_dim, c.dim);
  L.w_up = matrix(b + "ffn_up.weight", c.ffn_dim, c.dim);
  L.w_down = matrix(b + "ffn_down.weight", c.dim, c.ffn_dim);
}

void ArchLoader::read_experts(bool norm, bool width_per_used) {
  ModelConfig& c = c_;
  if (c.n_experts == 0) return;
  const int64_t used = req_int("expert_used_count");
  if (used > c.n_experts) {
    fail("metadata key '" + p_ + "expert_used_count' = " + std::to_string(used) + " exceeds '" +
         p_ + "expert_count' = " + std::to_string(c.n_experts));
  }
  c.n_experts_used = int_in("expert_used_count", used, 1, c.n_experts);
  if (auto f = opt_int("expert_feed_forward_length")) {
    c.expert_ffn_dim = int_in("expert_feed_forward_length", *f, 1, int64_t{1} << 20);
    expert_width_key_ = p_ + "expert_feed_forward_length";
  } else if (width_per_used) {
    expert_width_key_ = p_ + "feed_forward_length / " + p_ + "expert_used_count";
    c.expert_ffn_dim = c.ffn_dim / c.n_experts_used;
    if (c.expert_ffn_dim < 1) {
      fail(expert_width_key_ + " = " + std::to_string(c.ffn_dim) + " / " +
           std::to_string(c.n_experts_used) + " leaves no expert width and " + p_ +
           "expert_feed_forward_length is absent");
    }
  } else {
    c.expert_ffn_dim = c.ffn_dim;
    expert_width_key_ = p_ + "feed_forward_length";
  }
  if (const gguf::Value* v = file_.find(p_ + "expert_weights_norm")) {
    const auto* b = std::get_if<bool>(&v->v);
    if (!b) fail("metadata key '" + p_ + "expert_weights_norm' is not a bool");
    norm = *b;
  }
  c.expert_weights_norm = norm;
  c.expert_weights_scale = static_cast<float>(opt_float("expert_weights_scale").value_or(1.0));
  if (!(c.expert_weights_scale > 0.0f) || !std::isfinite(c.expert_weights_scale))
    fail("metadata key '" + p_ + "expert_weights_scale' must be > 0");
  // llama.cpp: 1 softmax, 2 sigmoid (DeepSeek-V3 style); absent: softmax. The engines route by
  // softmax only.
  if (const int64_t g = opt_int("expert_gating_func").value_or(1); g != 1)
    fail("metadata key '" + p_ + "expert_gating_func' = " + std::to_string(g) +
         (g == 2 ? " (sigmoid gating)" : "") +
         " is not supported: only 1, a softmax over the experts' router logits");
}

std::vector<kernels::WeightView> ArchLoader::experts(const std::string& name, int64_t n,
                                                     int64_t rows, int64_t cols) const {
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  const kernels::WeightView all = matrix_view(file_, name, {u(cols), u(rows), u(n)});
  std::vector<kernels::WeightView> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) out.push_back(rows_of(all, e * rows, rows));
  return out;
}

void ArchLoader::load_moe_ffn(LayerWeights& L, int layer) {
  const ModelConfig& c = c_;
  const std::string b = block_prefix(layer);
  // The router and the stacks against the keys first, so that a disagreement names the keys.
  const std::string dim = p_ + "embedding_length", n = p_ + "expert_count";
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  const auto check = [&](const std::string& name, std::vector<uint64_t> want,
                         const std::string& keys) {
    const gguf::TensorInfo* t = file_.tensor(b + name);
    if (t && t->dims != want) {
      fail("tensor '" + b + name + "' has shape " + shape_str(t->dims) + ", expected " +
           shape_str(want) + " = [" + keys + "]");
    }
  };
  check("ffn_gate_inp.weight", {u(c.dim), u(c.n_experts)}, dim + ", " + n);
  const std::string in_keys = dim + ", " + expert_width_key_ + ", " + n;
  check("ffn_gate_exps.weight", {u(c.dim), u(c.expert_ffn_dim), u(c.n_experts)}, in_keys);
  check("ffn_up_exps.weight", {u(c.dim), u(c.expert_ffn_dim), u(c.n_experts)}, in_keys);
  check("ffn_down_exps.weight", {u(c.expert_ffn_dim), u(c.dim), u(c.n_experts)},
        expert_width_key_ + ", " + dim + ", " + n);
  L.ffn_norm = vec(b + "ffn_norm.weight", c.dim);
  L.router = matrix(b + "ffn_gate_inp.weight", c.n_experts, c.dim);
  L.exp_gate = experts(b + "ffn_gate_exps.weight", c.n_experts, c.expert_ffn_dim, c.dim);
  L.exp_up = experts(b + "ffn_up_exps.weight", c.n_experts, c.expert_ffn_dim, c.dim);
  L.exp_down = experts(b + "ffn_down_exps.weight", c.n_experts, c.dim, c.expert_ffn_dim);
  if (c.shared_expert_ffn_dim > 0) {
    L.shexp_gate_inp = vec(b + "ffn_gate_inp_shexp.weight", c.dim);
    L.shexp_gate = matrix(b + "ffn_gate_shexp.weight", c.shared_expert_ffn_dim, c.dim);
    L.shexp_up = matrix(b + "ffn_up_shexp.weight", c.shared_expert_ffn_dim, c.dim);
    L.shexp_down = matrix(b + "ffn_down_shexp.weight", c.dim, c.shared_expert_ffn_dim);
  }
}

// ---- Model ----

std::string draft_vocabulary_mismatch(const Model& target, const Model& draft) {
  const Tokenizer& a = target.tokenizer();
  const Tokenizer& b = draft.tokenizer();
  if (a.n_vocab() != b.n_vocab())
    return "tokenizer.ggml.tokens: the draft model's vocabulary has " +
           std::to_string(b.n_vocab()) + " tokens, the target's " + std::to_string(a.n_vocab());
  if (a.kind() != b.kind() || a.pre_split() != b.pre_split())
    return "tokenizer.ggml.model / tokenizer.ggml.pre: the draft model's tokenizer is of another "
           "kind than the target's";
  for (int32_t t = 0; t < a.n_vocab(); ++t)
    if (a.token_text(t) != b.token_text(t) || a.token_type(t) != b.token_type(t))
      return "tokenizer.ggml.tokens: token " + std::to_string(t) + " is '" + b.token_text(t) +
             "' in the draft model and '" + a.token_text(t) + "' in the target";
  if (a.bos() != b.bos() || a.eos() != b.eos())
    return "tokenizer.ggml.bos_token_id / eos_token_id: the draft model's (" +
           std::to_string(b.bos()) + ", " + std::to_string(b.eos()) + ") are not the target's (" +
           std::to_string(a.bos()) + ", " + std::to_string(a.eos()) + ")";
  if (target.config().n_vocab != draft.config().n_vocab)
    return "output.weight: the draft model scores " + std::to_string(draft.config().n_vocab) +
           " tokens, the target " + std::to_string(target.config().n_vocab);
  return {};
}

ModelConfig read_model_config(const gguf::File& file) {
  const ArchSpec& spec = find_arch(file);
  ModelConfig c;
  c.arch = spec.name;
  ArchLoader ld(file, c, nullptr, nullptr);
  spec.read_config(ld);
  check_config(file, c);
  return c;
}

std::shared_ptr<Model> Model::load(const std::string& path) {
  return from_gguf(gguf::File::open(path));
}

std::shared_ptr<Model> Model::from_gguf(gguf::File file) {
  std::shared_ptr<Model> m(new Model(std::move(file)));
  const gguf::File& f = m->file_;
  const ArchSpec& spec = find_arch(f);
  m->config_.arch = spec.name;
  ArchLoader ld(f, m->config_, &m->weights_, &m->owned_);
  spec.read_config(ld);
  check_config(f, m->config_);
  spec.load_weights(ld);
  m->limits_ = model_limits(m->config_);
  m->tokenizer_ = Tokenizer::from_gguf(f);
  if (m->tokenizer_->n_vocab() != m->config_.n_vocab) {
    fail("tokenizer has " + std::to_string(m->tokenizer_->n_vocab()) +
         " tokens but token_embd has " + std::to_string(m->config_.n_vocab) + " rows");
  }
  return m;
}

}  // namespace sy
