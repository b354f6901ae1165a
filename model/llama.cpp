// Loading of llama-family GGUF files: hyperparameters from `llama.*` metadata, every weight
// checked against them and viewed in place in the mapped file.
#include "model/llama.hpp"

#include <cmath>
#include <string>
#include <utility>

namespace sy {
namespace {

// Upper bounds on hyperparameters: far above any released llama-family model, low enough that
// products of them (buffer sizes) cannot overflow 64-bit arithmetic on a hostile file.
constexpr int64_t kMaxDim = 1 << 17;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxCtx = int64_t{1} << 24;
constexpr int64_t kMaxVocab = int64_t{1} << 24;

[[noreturn]] void fail(const std::string& msg) {
  throw gguf::Error(msg);
}

// An integer key, or nullopt when absent; a present key of a non-integer type is an error (a
// silent default would hide a broken file).
std::optional<int64_t> opt_int(const gguf::File& f, const std::string& key) {
  const gguf::Value* v = f.find(key);
  if (!v) return std::nullopt;
  auto x = v->as_int();
  if (!x) fail("metadata key '" + key + "' is not an integer");
  return x;
}

std::optional<double> opt_float(const gguf::File& f, const std::string& key) {
  const gguf::Value* v = f.find(key);
  if (!v) return std::nullopt;
  auto x = v->as_float();
  if (!x) fail("metadata key '" + key + "' is not a number");
  return x;
}

int64_t req_int(const gguf::File& f, const std::string& key) {
  auto x = opt_int(f, key);
  if (!x) fail("missing metadata key '" + key + "'");
  return *x;
}

int checked(const std::string& key, int64_t x, int64_t lo, int64_t hi) {
  if (x < lo || x > hi) {
    fail("metadata key '" + key + "' = " + std::to_string(x) + " is out of range [" +
         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(x);
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
  return *t;
}

}  // namespace

LlamaConfig read_llama_config(const gguf::File& file) {
  const gguf::Value* arch_v = file.find("general.architecture");
  if (!arch_v) fail("missing metadata key 'general.architecture'");
  auto arch = arch_v->as_string();
  if (!arch) fail("metadata key 'general.architecture' is not a string");
  // Mistral-shaped files (GQA, a sliding window key) are converted with architecture "llama".
  if (*arch != "llama") fail("unsupported architecture '" + std::string(*arch) + "'");
  const std::string p = "llama.";

  LlamaConfig c;
  c.dim = checked(p + "embedding_length", req_int(file, p + "embedding_length"), 1, kMaxDim);
  c.n_layers = checked(p + "block_count", req_int(file, p + "block_count"), 1, kMaxLayers);
  c.ffn_dim =
      checked(p + "feed_forward_length", req_int(file, p + "feed_forward_length"), 1, kMaxDim * 8);
  c.n_heads =
      checked(p + "attention.head_count", req_int(file, p + "attention.head_count"), 1, kMaxHeads);
  c.n_kv_heads =
      checked(p + "attention.head_count_kv",
              opt_int(file, p + "attention.head_count_kv").value_or(c.n_heads), 1, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0) {
    fail("attention.head_count " + std::to_string(c.n_heads) +
         " is not a multiple of attention.head_count_kv " + std::to_string(c.n_kv_heads));
  }
  if (auto hd = opt_int(file, p + "attention.key_length")) {
    c.head_dim = checked(p + "attention.key_length", *hd, 1, kMaxDim);
  } else {
    if (c.dim % c.n_heads != 0) {
      fail("embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
           std::to_string(c.n_heads) + " and attention.key_length is absent");
    }
    c.head_dim = c.dim / c.n_heads;
  }
  if (auto vl = opt_int(file, p + "attention.value_length"); vl && *vl != c.head_dim) {
    fail("attention.value_length " + std::to_string(*vl) + " differs from key_length " +
         std::to_string(c.head_dim) + " (unsupported)");
  }
  c.rope_dim =
      checked(p + "rope.dimension_count",
              opt_int(file, p + "rope.dimension_count").value_or(c.head_dim), 2, c.head_dim);
  if (c.rope_dim % 2 != 0) fail("rope.dimension_count " + std::to_string(c.rope_dim) + " is odd");
  c.rope_theta = static_cast<float>(opt_float(file, p + "rope.freq_base").value_or(10000.0));
  if (!(c.rope_theta > 1.0f) || !std::isfinite(c.rope_theta)) fail("rope.freq_base must be > 1");
  c.norm_eps =
      static_cast<float>(opt_float(file, p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.norm_eps >= 0.0f) || !std::isfinite(c.norm_eps)) {
    fail("attention.layer_norm_rms_epsilon must be >= 0");
  }
  c.ctx_len = checked(p + "context_length", req_int(file, p + "context_length"), 1, kMaxCtx);
  c.sliding_window = checked(p + "attention.sliding_window",
                             opt_int(file, p + "attention.sliding_window").value_or(0), 0, kMaxCtx);
  if (opt_int(file, p + "expert_count").value_or(0) > 0) {
    fail("mixture-of-experts llama files (llama.expert_count) are unsupported");
  }
  if (const gguf::Value* st = file.find(p + "rope.scaling.type")) {
    auto s = st->as_string();
    if (!s || *s != "none") fail("rope scaling (llama.rope.scaling.type) is unsupported");
  }
  if (file.tensor("rope_freqs.weight")) fail("rope frequency factors (rope_freqs) are unsupported");

  // The vocabulary size is the embedding's row count; other declarations must agree with it.
  const gguf::TensorInfo* emb = file.tensor("token_embd.weight");
  if (!emb) fail("missing tensor 'token_embd.weight'");
  if (emb->dims.size() != 2 || emb->dims[0] != static_cast<uint64_t>(c.dim)) {
    fail("tensor 'token_embd.weight' has shape " + shape_str(emb->dims) + ", expected [" +
         std::to_string(c.dim) + ", n_vocab]");
  }
  if (emb->dims[1] < 1 || emb->dims[1] > static_cast<uint64_t>(kMaxVocab)) {
    fail("tensor 'token_embd.weight' has " + std::to_string(emb->dims[1]) + " rows (vocabulary)");
  }
  c.n_vocab = static_cast<int>(emb->dims[1]);
  if (auto vs = opt_int(file, p + "vocab_size"); vs && *vs != c.n_vocab) {
    fail("llama.vocab_size " + std::to_string(*vs) + " differs from token_embd rows " +
         std::to_string(c.n_vocab));
  }
  if (const gguf::Value* toks = file.find("tokenizer.ggml.tokens")) {
    const gguf::Array* a = toks->as_array();
    if (a && a->items.size() != static_cast<size_t>(c.n_vocab)) {
      fail("tokenizer.ggml.tokens has " + std::to_string(a->items.size()) +
           " tokens but token_embd has " + std::to_string(c.n_vocab) + " rows");
    }
  }
  return c;
}

std::shared_ptr<LlamaModel> LlamaModel::load(const std::string& path) {
  return from_gguf(gguf::File::open(path));
}

std::shared_ptr<LlamaModel> LlamaModel::from_gguf(gguf::File file) {
  std::shared_ptr<LlamaModel> m(new LlamaModel(std::move(file)));
  const gguf::File& f = m->file_;
  const LlamaConfig c = read_llama_config(f);
  m->config_ = c;

  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;

  // A matrix weight stored as GGUF dims {cols, rows}.
  const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    const gguf::TensorInfo& t = require_tensor(f, name, {u(cols), u(rows)});
    if (cols % gguf::block_elems(t.type) != 0) {
      fail("tensor '" + name + "' of type " + gguf::type_name(t.type) + " has " +
           std::to_string(cols) + " columns, not a multiple of its block size");
    }
    kernels::WeightView w;
    w.type = static_cast<kernels::DType>(t.type);
    w.data = f.data(t);
    w.rows = rows;
    w.cols = cols;
    return w;
  };
  // A norm weight (dim floats); other element types are converted once into owned memory.
  const auto norm = [&](const std::string& name) -> const float* {
    const gguf::TensorInfo& t = require_tensor(f, name, {u(c.dim)});
    if (t.type == gguf::TensorType::F32) return reinterpret_cast<const float*>(f.data(t));
    if (c.dim % gguf::block_elems(t.type) != 0) {
      fail("tensor '" + name + "' of type " + gguf::type_name(t.type) + " has a partial block");
    }
    m->owned_.emplace_back(static_cast<size_t>(c.dim));
    kernels::dequantize_row(static_cast<kernels::DType>(t.type), f.data(t), m->owned_.back().data(),
                            c.dim);
    return m->owned_.back().data();
  };

  LlamaWeights& w = m->weights_;
  w.tok_embd = matrix("token_embd.weight", c.n_vocab, c.dim);
  w.output_norm = norm("output_norm.weight");
  // Files without an output matrix tie it to the token embedding.
  w.output = f.tensor("output.weight") ? matrix("output.weight", c.n_vocab, c.dim) : w.tok_embd;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LlamaLayer& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = norm(b + "attn_norm.weight");
    L.wq = matrix(b + "attn_q.weight", q_dim, c.dim);
    L.wk = matrix(b + "attn_k.weight", kv_dim, c.dim);
    L.wv = matrix(b + "attn_v.weight", kv_dim, c.dim);
    L.wo = matrix(b + "attn_output.weight", c.dim, q_dim);
    L.ffn_norm = norm(b + "ffn_norm.weight");
    L.w_gate = matrix(b + "ffn_gate.weight", c.ffn_dim, c.dim);
    L.w_up = matrix(b + "ffn_up.weight", c.ffn_dim, c.dim);
    L.w_down = matrix(b + "ffn_down.weight", c.dim, c.ffn_dim);
  }
  m->tokenizer_ = Tokenizer::from_gguf(f);
  if (m->tokenizer_->n_vocab() != c.n_vocab) {
    fail("tokenizer has " + std::to_string(m->tokenizer_->n_vocab()) +
         " tokens but token_embd has " + std::to_string(c.n_vocab) + " rows");
  }
  return m;
}

}  // namespace sy
