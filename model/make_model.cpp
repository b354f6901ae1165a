// make-model: random-weight Llama GGUF files of standard shapes. Weights are a pure function of
// (seed, tensor name, row), generated and encoded row by row on all cores while the file is
// written, so even the 8B shape never sits in memory whole.
#include "model/make_model.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "model/gguf.hpp"

namespace sy {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Vocabulary sizes: Llama 2's SentencePiece vocabulary for the small shapes, Llama 3's for the
// big ones, so the output projection costs what it does in the real models.
constexpr int kSmallVocab = 32000;
constexpr int kLlama3Vocab = 128256;

struct DTypeInfo {
  const char* name;
  gguf::TensorType type;
  uint32_t file_type;  // llama.cpp's llama_ftype for a file whose matrices are all this type
};
constexpr DTypeInfo kDTypes[] = {
    {"f32", gguf::TensorType::F32, 0},    {"f16", gguf::TensorType::F16, 1},
    {"bf16", gguf::TensorType::BF16, 32}, {"q8_0", gguf::TensorType::Q8_0, 7},
    {"q4_0", gguf::TensorType::Q4_0, 2},
};

DTypeInfo dtype_info(const std::string& name) {
  const std::string n = lower(name);
  for (const DTypeInfo& d : kDTypes)
    if (n == d.name) return d;
  throw std::invalid_argument("make-model: unknown dtype '" + name +
                              "' (expected f32, f16, bf16, q8_0 or q4_0)");
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Threads for weight generation: all cores, but a small tensor is not worth splitting finely.
int worker_count(int64_t rows) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  // 64 rows per thread at least: below that, starting a thread costs more than the work.
  return static_cast<int>(std::clamp<int64_t>(rows / 64, 1, hw));
}

// Fill callback for a (rows x cols) matrix of uniform values with standard deviation `stddev`,
// encoded as `type`. Row r depends only on (seed, name, r): the thread count changes nothing.
std::function<void(uint8_t*, size_t)> random_matrix(const std::string& name, gguf::TensorType type,
                                                    int64_t rows, int64_t cols, float stddev,
                                                    uint64_t seed) {
  const uint64_t tensor_key = fnv1a(name) ^ (seed * 0x2545f4914f6cdd1dull);
  return [=](uint8_t* dst, size_t n_bytes) {
    const auto rb = static_cast<size_t>(gguf::row_bytes(type, cols));
    if (rb * static_cast<size_t>(rows) != n_bytes)
      throw std::logic_error("make-model: tensor size mismatch for " + name);
    // Uniform on [-a, a) has standard deviation a / sqrt(3).
    const float a = stddev * std::sqrt(3.0f);
    auto work = [&](int64_t r0, int64_t r1) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = r0; r < r1; ++r) {
        uint64_t state = tensor_key ^ (static_cast<uint64_t>(r) * 0x9e3779b97f4a7c15ull);
        splitmix64(state);  // decorrelate neighbouring rows' starting states
        for (float& x : row) {
          // top 24 bits: exactly representable in a float, uniform on [0, 1)
          const float u = static_cast<float>(splitmix64(state) >> 40) * (1.0f / 16777216.0f);
          x = (2.0f * u - 1.0f) * a;
        }
        kernels::quantize_row(static_cast<kernels::DType>(type), row.data(), dst + r * rb, cols);
      }
    };
    const int nt = worker_count(rows);
    if (nt == 1) {
      work(0, rows);
      return;
    }
    std::vector<std::thread> threads;
    std::exception_ptr error;
    std::mutex error_mu;
    for (int t = 0; t < nt; ++t) {
      const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
      threads.emplace_back([&, r0, r1] {
        try {
          work(r0, r1);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!error) error = std::current_exception();
        }
      });
    }
    for (auto& th : threads) th.join();
    if (error) std::rethrow_exception(error);
  };
}

std::vector<uint8_t> ones_f32(int64_t n) {
  std::vector<uint8_t> b(static_cast<size_t>(n) * 4);
  const float one = 1.0f;
  for (int64_t i = 0; i < n; ++i) std::memcpy(b.data() + i * 4, &one, 4);
  return b;
}

// SentencePiece token types as llama.cpp numbers them.
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUnused = 5, kByte = 6 };

// Our own SentencePiece-style vocabulary: specials, the 256 byte-fallback tokens, then "▁",
// single characters and the prefix chains of common words (a piece is only reachable by merges
// when its prefixes exist), so ordinary English is not encoded byte by byte; then made-up
// words up to n_vocab.
void add_builtin_vocab(gguf::Writer& w, int n_vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {kUnknown, kControl, kControl};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.emplace_back(buf);
    scores.push_back(0);
    types.push_back(kByte);
  }
  const std::string sp = "\xe2\x96\x81";  // U+2581, SentencePiece's word-start marker
  std::vector<std::string> pieces = {sp};
  for (char c = 'a'; c <= 'z'; ++c) pieces.emplace_back(1, c);
  for (const char* p : {",", ".", "!", "?", "'", "\""}) pieces.emplace_back(p);
  const char* words[] = {
      "the",  "and",   "a",     "to",     "was",  "he",   "she",  "it",   "in",     "of",   "on",
      "that", "with",  "for",   "is",     "his",  "her",  "they", "you",  "day",    "one",  "time",
      "once", "upon",  "there", "little", "girl", "boy",  "big",  "play", "said",   "mom",  "cat",
      "dog",  "happy", "saw",   "went",   "had",  "ball", "park", "fun",  "friend", "tree", "bird",
      "sun",  "The",   "Once",  "One",    "She",  "He",   "They", "Lily", "Tom"};
  std::set<std::string> seen(pieces.begin(), pieces.end());
  for (const char* word : words) {
    const std::string wd = word;
    for (size_t k = 1; k <= wd.size(); ++k) {
      std::string p = sp + wd.substr(0, k);
      if (seen.insert(p).second) pieces.push_back(p);
    }
  }
  // Earlier pieces merge first, as in trained vocabularies where the score is -merge rank.
  for (size_t i = 0; i < pieces.size(); ++i) {
    tokens.push_back(pieces[i]);
    scores.push_back(-static_cast<float>(i));
    types.push_back(kNormal);
  }
  if (static_cast<int>(tokens.size()) > n_vocab)
    throw std::logic_error("make-model: built-in vocabulary larger than the shape's");
  // The rest of the shape's vocabulary (32000 or 128256 rows, so the output matmul costs what
  // it does in a real model) are made-up words of one to three syllables, so the random demo
  // model prints visible pseudo-words rather than empty pieces. Merges never reach them.
  static const char kConsonants[] = "bdfgklmnprstvz";
  static const char kVowels[] = "aeiou";
  std::vector<std::string> syllables;
  for (char c : std::string_view(kConsonants))
    for (char v : std::string_view(kVowels)) syllables.push_back(std::string{c, v});
  const size_t n_syl = syllables.size();
  for (size_t i = 0; static_cast<int>(tokens.size()) < n_vocab; ++i) {
    // Enumerate 1-, then 2-, then 3-syllable words in a fixed order.
    size_t k = i;
    std::string word;
    if (k < n_syl) {
      word = syllables[k];
    } else if ((k -= n_syl) < n_syl * n_syl) {
      word = syllables[k / n_syl] + syllables[k % n_syl];
    } else {
      k -= n_syl * n_syl;
      if (k >= n_syl * n_syl * n_syl) throw std::logic_error("make-model: vocabulary too large");
      word = syllables[k / (n_syl * n_syl)] + syllables[(k / n_syl) % n_syl] + syllables[k % n_syl];
    }
    std::string piece = sp + word;
    if (!seen.insert(piece).second) continue;
    tokens.push_back(piece);
    scores.push_back(-1e6f - static_cast<float>(i));
    types.push_back(kNormal);
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string("tokenizer.ggml.pre", "default");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
}

// Copies every tokenizer.ggml.* key of `path`; returns its token count.
int copy_vocab(gguf::Writer& w, const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  const gguf::Value* tokens = f.find("tokenizer.ggml.tokens");
  const gguf::Array* arr = tokens ? tokens->as_array() : nullptr;
  if (!arr || arr->elem_type != gguf::ValueType::STRING || arr->items.empty())
    throw gguf::Error("make-model: '" + path + "' has no tokenizer.ggml.tokens string array");
  // Token ids are int32 in llama.cpp.
  if (arr->items.size() > 0x7fffffffu)
    throw gguf::Error("make-model: '" + path + "' has too many tokens");
  for (const auto& [k, v] : f.metadata())
    if (k.rfind("tokenizer.ggml.", 0) == 0) w.add(k, v);
  return static_cast<int>(arr->items.size());
}

}  // namespace

namespace {
ModelShape shape_of(const char* name, int dim, int n_layers, int n_heads, int n_kv_heads,
                    int ffn_dim, int n_vocab) {
  ModelShape s;
  s.name = name;
  s.dim = dim;
  s.n_layers = n_layers;
  s.n_heads = n_heads;
  s.n_kv_heads = n_kv_heads;
  s.ffn_dim = ffn_dim;
  s.n_vocab = n_vocab;
  return s;
}
}  // namespace

ModelShape model_shape(const std::string& name) {
  const std::string n = lower(name);
  ModelShape s;
  if (n == "tiny") {
    s = shape_of("tiny", 64, 2, 4, 2, 192, kSmallVocab);
    s.tied_output = true;  // exercises the tied-embedding path
  } else if (n == "15m") {
    s = shape_of("15M", 288, 6, 6, 6, 768, kSmallVocab);
  } else if (n == "110m") {
    s = shape_of("110M", 768, 12, 12, 12, 2048, kSmallVocab);
  } else if (n == "1b") {
    s = shape_of("1B", 2048, 16, 32, 8, 8192, kLlama3Vocab);
    s.rope_theta = 500000.0f;
  } else if (n == "8b") {
    s = shape_of("8B", 4096, 32, 32, 8, 14336, kLlama3Vocab);
    s.rope_theta = 500000.0f;
  } else {
    throw std::invalid_argument("make-model: unknown shape '" + name +
                                "' (expected tiny, 15M, 110M, 1B or 8B)");
  }
  return s;
}

void make_model(const MakeModelOptions& opts) {
  const ModelShape s = model_shape(opts.shape);
  const DTypeInfo dt = dtype_info(opts.dtype);
  if (opts.out.empty()) throw std::invalid_argument("make-model: no output path given");
  // The GGUF key is a u32; positions beyond INT32_MAX would overflow the engine's slot arithmetic.
  if (opts.ctx_len < 0 || opts.ctx_len > INT32_MAX) {
    throw std::invalid_argument("make-model: --ctx must be in [0, " + std::to_string(INT32_MAX) +
                                "] (0: the shape's)");
  }
  const int64_t ctx_len = opts.ctx_len > 0 ? opts.ctx_len : s.ctx_len;

  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "switchyard-random-" + s.name + "-" + dt.name);
  w.add_u32("general.file_type", dt.file_type);
  // ggml's quantization format version of Q4_0/Q8_0 blocks (2 is the current layout).
  if (gguf::block_elems(dt.type) > 1) w.add_u32("general.quantization_version", 2);

  const int n_vocab = opts.vocab_from.empty() ? s.n_vocab : copy_vocab(w, opts.vocab_from);
  if (opts.vocab_from.empty()) add_builtin_vocab(w, n_vocab);

  const int head_dim = s.dim / s.n_heads;
  const int kv_dim = head_dim * s.n_kv_heads;
  w.add_u32("llama.context_length", static_cast<uint32_t>(ctx_len));
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(s.dim));
  w.add_u32("llama.block_count", static_cast<uint32_t>(s.n_layers));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(s.ffn_dim));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(s.n_heads));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(s.n_kv_heads));
  w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.add_f32("llama.rope.freq_base", s.rope_theta);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", s.norm_eps);
  w.add_u32("llama.vocab_size", static_cast<uint32_t>(n_vocab));

  // Matrices get standard deviation 1/sqrt(fan_in): each projection then keeps the activation
  // scale, and logits over an RMS-normed state come out with standard deviation about 1.
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float stddev = 1.0f / std::sqrt(static_cast<float>(cols));
    w.add_tensor(name, dt.type, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)},
                 random_matrix(name, dt.type, rows, cols, stddev, opts.seed));
  };
  // Norm vectors stay f32 whatever the dtype: llama.cpp requires that.
  auto norm = [&](const std::string& name) {
    w.add_tensor(name, gguf::TensorType::F32, {static_cast<uint64_t>(s.dim)}, ones_f32(s.dim));
  };

  matrix("token_embd.weight", n_vocab, s.dim);
  norm("output_norm.weight");
  if (!s.tied_output) matrix("output.weight", n_vocab, s.dim);
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", s.dim, s.dim);
    matrix(p + "attn_k.weight", kv_dim, s.dim);
    matrix(p + "attn_v.weight", kv_dim, s.dim);
    matrix(p + "attn_output.weight", s.dim, s.dim);
    norm(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", s.ffn_dim, s.dim);
    matrix(p + "ffn_up.weight", s.ffn_dim, s.dim);
    matrix(p + "ffn_down.weight", s.dim, s.ffn_dim);
  }
  w.write(opts.out);
}

}  // namespace sy
