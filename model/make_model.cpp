// make-model: random-weight GGUF files of standard shapes, dense or mixtures of experts. Weights
// are a pure function of (seed, tensor name, row), generated and encoded row by row on all cores
// while the file is written, so even the 8B shape never sits in memory whole.
#include "model/make_model.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/quants.hpp"
#include "model/gguf.hpp"

namespace sy {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Mixture-of-experts defaults: Mixtral-8x7B's 8 experts, 2 of them per token.
constexpr int kDefaultExperts = 8;
constexpr int kDefaultExpertsUsed = 2;

// Vocabulary sizes: Llama 2's SentencePiece vocabulary for the small shapes, Llama 3's for the
// big ones, so the output projection costs what it does in the real models.
constexpr int kSmallVocab = 32000;
constexpr int kLlama3Vocab = 128256;

// How a dtype picks each matrix's type: one type for all (as llama-quantize --pure), or
// llama.cpp's Q4_K_M / Q5_K_M mix.
enum class Mix { kPure, kQ4KM, kQ5KM };

struct DTypeInfo {
  const char* name;
  kernels::DType type;
  uint32_t file_type;  // llama.cpp's llama_ftype for a file of this dtype
  Mix mix;
};
constexpr DTypeInfo kDTypes[] = {
    {"f32", kernels::DType::F32, 0, Mix::kPure},
    {"f16", kernels::DType::F16, 1, Mix::kPure},
    {"bf16", kernels::DType::BF16, 32, Mix::kPure},
    {"q8_0", kernels::DType::Q8_0, 7, Mix::kPure},
    {"q4_0", kernels::DType::Q4_0, 2, Mix::kPure},
    {"q4_1", kernels::DType::Q4_1, 3, Mix::kPure},
    {"q5_0", kernels::DType::Q5_0, 8, Mix::kPure},
    {"q5_1", kernels::DType::Q5_1, 9, Mix::kPure},
    {"iq4_nl", kernels::DType::IQ4_NL, 25, Mix::kPure},
    {"q2_k", kernels::DType::Q2_K, 10, Mix::kPure},
    {"q3_k", kernels::DType::Q3_K, 11, Mix::kPure},  // llama_ftype Q3_K_S
    {"q4_k", kernels::DType::Q4_K, 14, Mix::kPure},  // Q4_K_S
    {"q5_k", kernels::DType::Q5_K, 16, Mix::kPure},  // Q5_K_S
    {"q6_k", kernels::DType::Q6_K, 18, Mix::kPure},
    {"iq4_xs", kernels::DType::IQ4_XS, 30, Mix::kPure},
    {"q4_k_m", kernels::DType::Q4_K, 15, Mix::kQ4KM},
    {"q5_k_m", kernels::DType::Q5_K, 17, Mix::kQ5KM},
};
constexpr const char* kDTypeList =
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, "
    "q4_k_m, q5_k_m";

DTypeInfo dtype_info(const std::string& name) {
  const std::string n = lower(name);
  for (const DTypeInfo& d : kDTypes)
    if (n == d.name) return d;
  throw std::invalid_argument("make-model: unknown dtype '" + name + "' (expected one of " +
                              kDTypeList + ")");
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between
// them get the larger type in the _M mixes.
bool use_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

// The type llama.cpp falls back to for a row length that is not whole 256-element blocks.
kernels::DType fallback(kernels::DType t, int64_t cols) {
  using T = kernels::DType;
  if (cols % kernels::dtype_block_elems(t) == 0) return t;
  switch (t) {
    case T::Q2_K:
    case T::Q3_K:
    case T::IQ4_XS:
      t = T::IQ4_NL;
      break;
    case T::Q4_K:
      t = T::Q5_0;
      break;
    case T::Q5_K:
      t = T::Q5_1;
      break;
    case T::Q6_K:
      t = T::Q8_0;
      break;
    default:
      break;
  }
  return cols % kernels::dtype_block_elems(t) == 0 ? t : T::F16;
}

// How an architecture normalises queries and keys after their projections.
enum class QkNorm {
  kNone,
  kPerHead,  // qwen3, qwen3moe: attn_{q,k}_norm of head_dim entries, one RMSNorm per head
  kWhole,    // olmoe: attn_{q,k}_norm over the whole q (k) row, n_embd entries
};

// The architectures make-model writes, with llama.cpp's tensor layout for each.
struct ArchInfo {
  const char* name;       // --arch
  const char* gguf_name;  // general.architecture (mixtral: llama)
  bool qkv_bias = false;  // qwen2, qwen2moe: blk.N.attn_{q,k,v}.bias
  QkNorm qk_norm = QkNorm::kNone;
  bool post_norms = false;    // gemma2: post_attention_norm, post_ffw_norm; soft-caps; window
  bool fused = false;         // phi3: attn_qkv (q, k, v rows) and ffn_up (gate rows, then up rows)
  bool tied = false;          // gemma2: no output.weight
  bool untied = false;        // qwen2moe, olmoe: llama.cpp requires output.weight
  bool head_lengths = false;  // writes attention.key_length / value_length
  float rope_theta = 0.0f;    // 0: the shape's
  float norm_eps = 0.0f;      // 0: the shape's
  uint32_t sliding_window = 0;  // 0: none written
  bool experts = false;         // mixture of experts: router and 3-D expert stacks for the FFN
  bool expert_ffn_key = false;  // writes expert_feed_forward_length (else feed_forward_length is
                                // the expert width, as llama.cpp reads it for llama and olmoe)
  bool shared_expert = false;   // qwen2moe: ffn_{gate,up,down}_shexp and ffn_gate_inp_shexp
  bool kv_all_heads = false;    // olmoe: head_count_kv = head_count (attn_k_norm is n_embd long)
};
// Values as the released models of each family have them (Qwen2/3 rope base 1e6, Gemma 2's
// 4096-token window on alternate layers and soft-caps 50 / 30, Phi-3-mini-4k's 2047 window,
// Mixtral-8x7B's rope base 1e6, Qwen1.5-MoE's and Qwen3-MoE's 1e6 and eps 1e-6, OLMoE's 10000
// and 1e-5).
constexpr ArchInfo kArchs[] = {
    {.name = "llama", .gguf_name = "llama"},
    {.name = "qwen2",
     .gguf_name = "qwen2",
     .qkv_bias = true,
     .rope_theta = 1e6f,
     .norm_eps = 1e-6f},
    {.name = "qwen3",
     .gguf_name = "qwen3",
     .qk_norm = QkNorm::kPerHead,
     .head_lengths = true,
     .rope_theta = 1e6f,
     .norm_eps = 1e-6f},
    {.name = "gemma2",
     .gguf_name = "gemma2",
     .post_norms = true,
     .tied = true,
     .head_lengths = true,
     .rope_theta = 10000.0f,
     .norm_eps = 1e-6f,
     .sliding_window = 4096},
    {.name = "phi3",
     .gguf_name = "phi3",
     .fused = true,
     .rope_theta = 10000.0f,
     .norm_eps = 1e-5f,
     .sliding_window = 2047},
    {.name = "mixtral",
     .gguf_name = "llama",
     .rope_theta = 1e6f,
     .norm_eps = 1e-5f,
     .experts = true},
    {.name = "qwen2moe",
     .gguf_name = "qwen2moe",
     .qkv_bias = true,
     .untied = true,
     .rope_theta = 1e6f,
     .norm_eps = 1e-6f,
     .experts = true,
     .expert_ffn_key = true,
     .shared_expert = true},
    {.name = "olmoe",
     .gguf_name = "olmoe",
     .qk_norm = QkNorm::kWhole,
     .untied = true,
     .rope_theta = 10000.0f,
     .norm_eps = 1e-5f,
     .experts = true,
     .kv_all_heads = true},
    {.name = "qwen3moe",
     .gguf_name = "qwen3moe",
     .qk_norm = QkNorm::kPerHead,
     .head_lengths = true,
     .rope_theta = 1e6f,
     .norm_eps = 1e-6f,
     .experts = true,
     .expert_ffn_key = true},
};
constexpr const char* kArchList =
    "llama, qwen2, qwen3, gemma2, phi3, mixtral, qwen2moe, olmoe, qwen3moe";

ArchInfo arch_info(const std::string& name) {
  const std::string n = lower(name);
  for (const ArchInfo& a : kArchs)
    if (n == a.name) return a;
  throw std::invalid_argument("make-model: unknown architecture '" + name + "' (expected one of " +
                              kArchList + ")");
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
std::function<void(uint8_t*, size_t)> random_matrix(const std::string& name, kernels::DType type,
                                                    int64_t rows, int64_t cols, float stddev,
                                                    uint64_t seed) {
  const uint64_t tensor_key = fnv1a(name) ^ (seed * 0x2545f4914f6cdd1dull);
  return [=](uint8_t* dst, size_t n_bytes) {
    const size_t rb = kernels::row_bytes(type, cols);
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
        kernels::quantize_row(type, row.data(), dst + r * rb, cols);
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
  } else if (n == "mini") {
    // The zoo's llama3 shape: every row length a multiple of 256, so K-quants need no fallback.
    s = shape_of("mini", 256, 4, 4, 2, 768, kSmallVocab);
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
                                "' (expected tiny, mini, 15M, 110M, 1B or 8B)");
  }
  return s;
}

kernels::DType make_model_tensor_type(const std::string& dtype, const std::string& name, int layer,
                                      int n_layers, int64_t cols, bool tied, int n_experts) {
  using T = kernels::DType;
  const DTypeInfo dt = dtype_info(dtype);
  // llama-quantize never quantizes the router, and llama.cpp's converters write it as F32.
  if (ends_with(name, "ffn_gate_inp.weight")) return T::F32;
  T t = dt.type;
  if (dt.mix != Mix::kPure) {
    // llama-quantize matches names by substring: ffn_down also takes ffn_down_exps and
    // ffn_down_shexp, with the layer read from the name.
    const bool ffn_down = name.find("ffn_down") != std::string::npos;
    if (name == "output.weight" || (tied && name == "token_embd.weight")) {
      t = T::Q6_K;
    } else if (ends_with(name, "attn_v.weight")) {
      if (layer >= 0 && use_more_bits(layer, n_layers)) t = T::Q6_K;
      // llama.cpp: "for the 8-expert model, bumping this to Q8_0 trades just ~128MB".
      if (n_experts == 8) t = T::Q8_0;
    } else if (ends_with(name, "attn_k.weight")) {
      if (n_experts == 8) t = T::Q8_0;
    } else if (ffn_down) {
      if (layer >= 0 && use_more_bits(layer, n_layers)) t = T::Q6_K;
    } else if (ends_with(name, "attn_output.weight")) {
      if (n_experts == 8 && dt.mix == Mix::kQ4KM) t = T::Q5_K;
    } else if (ends_with(name, "attn_qkv.weight")) {
      t = dt.mix == Mix::kQ4KM ? T::Q5_K : T::Q6_K;
    }
  }
  return fallback(t, cols);
}

const char* make_model_dtypes() {
  return kDTypeList;
}

void make_model(const MakeModelOptions& opts) {
  const ModelShape s = model_shape(opts.shape);
  const ArchInfo arch = arch_info(opts.arch);
  const DTypeInfo dt = dtype_info(opts.dtype);
  if (opts.out.empty()) throw std::invalid_argument("make-model: no output path given");
  // The GGUF key is a u32; positions beyond INT32_MAX would overflow the engine's slot arithmetic.
  if (opts.ctx_len < 0 || opts.ctx_len > INT32_MAX) {
    throw std::invalid_argument("make-model: --ctx must be in [0, " + std::to_string(INT32_MAX) +
                                "] (0: the shape's)");
  }
  if (!arch.experts && (opts.n_experts != 0 || opts.n_experts_used != 0 || opts.expert_ffn != 0)) {
    throw std::invalid_argument(
        "make-model: --experts, --experts-used and --expert-ffn are for the mixture-of-experts "
        "architectures (mixtral, qwen2moe, olmoe, qwen3moe), not '" +
        std::string(arch.name) + "'");
  }
  // llama.cpp's LLAMA_MAX_EXPERTS; our loader's bound too.
  constexpr int kMaxExperts = 256;
  const int n_exp = opts.n_experts != 0 ? opts.n_experts : kDefaultExperts;
  const int n_used = opts.n_experts_used != 0 ? opts.n_experts_used : kDefaultExpertsUsed;
  if (arch.experts && (n_exp < 1 || n_exp > kMaxExperts))
    throw std::invalid_argument("make-model: --experts must be in [1, " +
                                std::to_string(kMaxExperts) + "]");
  if (arch.experts && (n_used < 1 || n_used > n_exp))
    throw std::invalid_argument("make-model: --experts-used must be in [1, --experts]");
  // Bounded as the loader bounds a width, so that no product of sizes can overflow.
  constexpr int kMaxExpertFfn = 1 << 20;
  if (opts.expert_ffn < 0 || opts.expert_ffn > kMaxExpertFfn)
    throw std::invalid_argument("make-model: --expert-ffn must be in [0, " +
                                std::to_string(kMaxExpertFfn) + "] (0: the shape's ffn_dim)");
  const int64_t expert_ffn = opts.expert_ffn > 0 ? opts.expert_ffn : s.ffn_dim;
  const int n_experts = arch.experts ? n_exp : 0;

  const int64_t ctx_len = opts.ctx_len > 0 ? opts.ctx_len : s.ctx_len;
  const bool tied = (s.tied_output && !arch.untied) || arch.tied;
  const std::string a = arch.gguf_name;
  const std::string arch_part =
      std::string(arch.name) == "llama" ? "" : std::string(arch.name) + "-";

  gguf::Writer w;
  w.add_string("general.architecture", a);
  w.add_string("general.name", "switchyard-random-" + s.name + "-" + arch_part + dt.name);
  w.add_u32("general.file_type", dt.file_type);
  // ggml's quantization format version of the block layouts (2 is the current one).
  if (kernels::dtype_block_elems(dt.type) > 1) w.add_u32("general.quantization_version", 2);

  const int n_vocab = opts.vocab_from.empty() ? s.n_vocab : copy_vocab(w, opts.vocab_from);
  if (opts.vocab_from.empty()) add_builtin_vocab(w, n_vocab);

  const int n_kv_heads = arch.kv_all_heads ? s.n_heads : s.n_kv_heads;
  const int head_dim = s.dim / s.n_heads;
  const int q_dim = head_dim * s.n_heads;
  const int kv_dim = head_dim * n_kv_heads;
  // The dense FFN width written as feed_forward_length: where llama.cpp reads that key as the
  // width of one expert (llama, olmoe), the expert width.
  const int64_t ffn_len = arch.experts && !arch.expert_ffn_key ? expert_ffn : s.ffn_dim;
  // qwen2moe's shared expert is as wide as the shape's dense FFN (as Qwen1.5-MoE's, whose
  // shared_expert_intermediate_size equals its intermediate_size).
  const int64_t shared_ffn = s.ffn_dim;
  const std::string p = a + ".";
  w.add_u32(p + "context_length", static_cast<uint32_t>(ctx_len));
  w.add_u32(p + "embedding_length", static_cast<uint32_t>(s.dim));
  w.add_u32(p + "block_count", static_cast<uint32_t>(s.n_layers));
  w.add_u32(p + "feed_forward_length", static_cast<uint32_t>(ffn_len));
  w.add_u32(p + "attention.head_count", static_cast<uint32_t>(s.n_heads));
  w.add_u32(p + "attention.head_count_kv", static_cast<uint32_t>(n_kv_heads));
  if (arch.head_lengths) {
    w.add_u32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.add_u32(p + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  w.add_u32(p + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.add_f32(p + "rope.freq_base", arch.rope_theta > 0 ? arch.rope_theta : s.rope_theta);
  w.add_f32(p + "attention.layer_norm_rms_epsilon", arch.norm_eps > 0 ? arch.norm_eps : s.norm_eps);
  if (arch.sliding_window > 0) w.add_u32(p + "attention.sliding_window", arch.sliding_window);
  if (arch.post_norms) {
    w.add_f32(p + "attn_logit_softcapping", 50.0f);
    w.add_f32(p + "final_logit_softcapping", 30.0f);
  }
  if (arch.experts) {
    w.add_u32(p + "expert_count", static_cast<uint32_t>(n_experts));
    w.add_u32(p + "expert_used_count", static_cast<uint32_t>(n_used));
    if (arch.expert_ffn_key)
      w.add_u32(p + "expert_feed_forward_length", static_cast<uint32_t>(expert_ffn));
    if (arch.shared_expert)
      w.add_u32(p + "expert_shared_feed_forward_length", static_cast<uint32_t>(shared_ffn));
  }
  w.add_u32(p + "vocab_size", static_cast<uint32_t>(n_vocab));

  // Matrices get standard deviation 1/sqrt(fan_in): each projection then keeps the activation
  // scale, and logits over an RMS-normed state come out with standard deviation about 1 (the
  // routers' too: softmax over about unit-variance logits spreads the tokens over the experts).
  // Every matrix's type is checked to have a quantizer before anything is written.
  enum class Kind { kMatrix, kNorm, kVector };
  struct Planned {
    std::string name;
    Kind kind;
    kernels::DType type;
    int64_t rows, cols;   // vectors: one row; expert stacks: the rows of one expert
    int64_t n = 0;        // expert stacks: the experts (GGUF dims {cols, rows, n}); else 0
    float stddev = 0.0f;  // kVector: of its random values
  };
  std::vector<Planned> planned;
  auto stack = [&](const std::string& name, int layer, int64_t rows, int64_t cols, int64_t n) {
    const kernels::DType t =
        make_model_tensor_type(dt.name, name, layer, s.n_layers, cols, tied, n_experts);
    const bool direct = t == kernels::DType::F32 || t == kernels::DType::F16 ||
                        t == kernels::DType::BF16 || t == kernels::DType::Q8_0 ||
                        t == kernels::DType::Q4_0;
    const kernels::quant::TypeOps* o = direct ? nullptr : kernels::quant::ops(t);
    if (!direct && (o == nullptr || o->quantize == nullptr)) {
      throw std::invalid_argument("make-model: dtype " + std::string(dt.name) + " stores '" + name +
                                  "' as " + gguf::type_label(static_cast<uint32_t>(t)) +
                                  ", which this build cannot quantize");
    }
    planned.push_back({name, Kind::kMatrix, t, rows, cols, n});
  };
  auto matrix = [&](const std::string& name, int layer, int64_t rows, int64_t cols) {
    stack(name, layer, rows, cols, 0);
  };
  // Norm vectors and biases stay f32 whatever the dtype: llama.cpp requires that.
  auto norm = [&](const std::string& name, int64_t n) {
    planned.push_back({name, Kind::kNorm, kernels::DType::F32, 1, n});
  };
  // Biases get small random values (standard deviation 0.1): a loader that ignores them
  // changes the output.
  auto vector = [&](const std::string& name, int64_t n, float stddev) {
    planned.push_back({name, Kind::kVector, kernels::DType::F32, 1, n, 0, stddev});
  };
  auto bias = [&](const std::string& name, int64_t n) { vector(name, n, 0.1f); };

  matrix("token_embd.weight", -1, n_vocab, s.dim);
  norm("output_norm.weight", s.dim);
  if (!tied) matrix("output.weight", -1, n_vocab, s.dim);
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    norm(b + "attn_norm.weight", s.dim);
    if (arch.fused) {
      matrix(b + "attn_qkv.weight", l, q_dim + 2 * kv_dim, s.dim);  // q rows, k rows, v rows
    } else {
      matrix(b + "attn_q.weight", l, q_dim, s.dim);
      matrix(b + "attn_k.weight", l, kv_dim, s.dim);
      matrix(b + "attn_v.weight", l, kv_dim, s.dim);
    }
    if (arch.qkv_bias) {
      bias(b + "attn_q.bias", q_dim);
      bias(b + "attn_k.bias", kv_dim);
      bias(b + "attn_v.bias", kv_dim);
    }
    if (arch.qk_norm != QkNorm::kNone) {
      const bool whole = arch.qk_norm == QkNorm::kWhole;
      norm(b + "attn_q_norm.weight", whole ? q_dim : head_dim);
      norm(b + "attn_k_norm.weight", whole ? kv_dim : head_dim);
    }
    matrix(b + "attn_output.weight", l, s.dim, q_dim);
    if (arch.post_norms) norm(b + "post_attention_norm.weight", s.dim);
    norm(b + "ffn_norm.weight", s.dim);
    if (arch.experts) {
      matrix(b + "ffn_gate_inp.weight", l, n_experts, s.dim);  // the router
      // One (rows x cols) matrix per expert, expert after expert (ne[2] is the expert).
      stack(b + "ffn_gate_exps.weight", l, expert_ffn, s.dim, n_experts);
      stack(b + "ffn_up_exps.weight", l, expert_ffn, s.dim, n_experts);
      stack(b + "ffn_down_exps.weight", l, s.dim, expert_ffn, n_experts);
      if (arch.shared_expert) {
        // The shared expert's gate is sigmoid(this . x): standard deviation 1/sqrt(dim) spreads
        // the gates around 1/2 rather than making them one constant.
        vector(b + "ffn_gate_inp_shexp.weight", s.dim, 1.0f / std::sqrt(static_cast<float>(s.dim)));
        matrix(b + "ffn_gate_shexp.weight", l, shared_ffn, s.dim);
        matrix(b + "ffn_up_shexp.weight", l, shared_ffn, s.dim);
        matrix(b + "ffn_down_shexp.weight", l, s.dim, shared_ffn);
      }
    } else if (arch.fused) {
      matrix(b + "ffn_up.weight", l, 2 * int64_t{s.ffn_dim}, s.dim);  // gate rows, then up rows
      matrix(b + "ffn_down.weight", l, s.dim, s.ffn_dim);
    } else {
      matrix(b + "ffn_gate.weight", l, s.ffn_dim, s.dim);
      matrix(b + "ffn_up.weight", l, s.ffn_dim, s.dim);
      matrix(b + "ffn_down.weight", l, s.dim, s.ffn_dim);
    }
    if (arch.post_norms) norm(b + "post_ffw_norm.weight", s.dim);
  }

  for (const Planned& t : planned) {
    const auto cols = static_cast<uint64_t>(t.cols);
    switch (t.kind) {
      case Kind::kMatrix: {
        const float stddev = 1.0f / std::sqrt(static_cast<float>(t.cols));
        std::vector<uint64_t> dims = {cols, static_cast<uint64_t>(t.rows)};
        if (t.n > 0) dims.push_back(static_cast<uint64_t>(t.n));
        // An expert stack is quantized as one matrix of n * rows rows: every row is whole
        // blocks, so each expert's slice is quantized exactly as a matrix of its own would be.
        const int64_t all_rows = t.rows * std::max<int64_t>(t.n, 1);
        w.add_tensor(t.name, t.type, std::move(dims),
                     random_matrix(t.name, t.type, all_rows, t.cols, stddev, opts.seed));
        break;
      }
      case Kind::kNorm:
        w.add_tensor(t.name, t.type, {cols}, ones_f32(t.cols));
        break;
      case Kind::kVector:
        w.add_tensor(t.name, t.type, {cols},
                     random_matrix(t.name, t.type, 1, t.cols, t.stddev, opts.seed));
        break;
    }
  }
  w.write(opts.out);
}

void make_model_keep_layers(const std::string& from, int n_layers, const std::string& out) {
  const gguf::File f = gguf::File::open(from);
  const auto arch = f.get_string("general.architecture");
  if (!arch) throw gguf::Error(from + ": general.architecture is missing");
  const std::string count_key = *arch + ".block_count";
  const auto have = f.get_int(count_key);
  if (!have) throw gguf::Error(from + ": " + count_key + " is missing");
  if (n_layers < 1 || n_layers > *have)
    throw std::invalid_argument("--keep-layers must be in [1, " + std::to_string(*have) + "] (" +
                                count_key + " of " + from + ")");
  gguf::Writer w(f.alignment());
  for (const auto& [key, value] : f.metadata()) {
    if (key == count_key)
      w.add_u32(key, static_cast<uint32_t>(n_layers));
    else if (key != "general.alignment" || f.alignment() != 32)
      w.add(key, value);
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) == 0) {
      const int layer = std::atoi(t.name.c_str() + 4);
      if (layer >= n_layers) continue;
    }
    const uint8_t* src = f.data(t);
    const size_t n = t.n_bytes;
    w.add_tensor(t.name, t.type, t.dims, [src, n](uint8_t* dst, size_t bytes) {
      std::memcpy(dst, src, std::min(n, bytes));
    });
  }
  w.write(out);
}

}  // namespace sy
