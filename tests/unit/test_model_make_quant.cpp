// make-model's quantized dtypes and architectures: each dtype writes a file that reads back, its
// dequantized matrices match the f32 file of the same seed within the type's bound, the type of
// every tensor follows llama.cpp's rules (checked against llama-quantize's zoo files), the
// architectures use llama.cpp's keys and tensor names (checked against the zoo), and where this
// build computes the types and architecture, greedy output is stable.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpu/engine.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/quants.hpp"
#include "model/gguf.hpp"
#include "model/make_model.hpp"
#include "model/model.hpp"
#include "tests/support/seq_step.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_model_make_quant)

using namespace sy;
using kernels::DType;

namespace {

struct TempDir : sy::test::TempDir {
  TempDir() : sy::test::TempDir("sy_model_make_quant_") {}
};

const std::string kZoo = std::string(SY_MODELS_DIR) + "/zoo/";
// The zoo's 512-token SentencePiece vocabulary keeps the files small (the embedding is 512 rows).
const std::string kVocab = kZoo + "zoo-llama3-f32.gguf";

// The mini-shape file of (arch, dtype), written once per test process (quantizing takes the
// time here) into a folder removed at exit.
std::string make(const std::string& arch, const std::string& dtype) {
  static TempDir dir;
  static std::map<std::string, std::string> made;
  const std::string key = arch + "-" + dtype;
  if (auto it = made.find(key); it != made.end()) return it->second;
  MakeModelOptions o;
  o.shape = "mini";
  o.arch = arch;
  o.dtype = dtype;
  o.seed = 11;
  o.vocab_from = kVocab;
  o.out = dir.path() + "/mini-" + key + ".gguf";
  make_model(o);
  made[key] = o.out;
  return o.out;
}

// Relative RMS error bounds of one matrix stored as `t`, for make-model's uniform weights (the
// error over the whole tensor divided by its RMS). A linear b-bit type steps by about
// range / (2^b - 1) over a block, so the relative error is near 1 / (2^b - 1). Measured on the
// mini shape (worst tensor of the type): Q8_0 0.0038, Q4_0 0.065, Q4_1 0.061, Q5_0 0.031, Q5_1
// 0.030, IQ4_NL 0.065, Q2_K 0.299, Q3_K 0.142, Q4_K 0.062, Q5_K 0.030, Q6_K 0.0146; bounds are
// those plus about 15 %. IQ4_XS (not measured: no quantizer yet when written) gets IQ4_NL's
// codebook error plus a margin for its 6-bit sub-block scales.
double rms_bound(DType t) {
  switch (t) {
    case DType::F32:
      return 0.0;
    case DType::F16:
      return 5e-4;  // 11-bit significand: 2^-12 relative per element at most
    case DType::BF16:
      return 4e-3;  // 8-bit significand: 2^-9
    case DType::Q8_0:
      return 0.0045;
    case DType::Q4_0:
      return 0.075;
    case DType::Q4_1:
      return 0.07;
    case DType::Q5_0:
      return 0.036;
    case DType::Q5_1:
      return 0.034;
    case DType::IQ4_NL:
      return 0.075;
    case DType::Q2_K:
      return 0.34;
    case DType::Q3_K:
      return 0.165;
    case DType::Q4_K:
      return 0.072;
    case DType::Q5_K:
      return 0.035;
    case DType::Q6_K:
      return 0.017;
    case DType::IQ4_XS:
      return 0.085;
    default:
      return -1.0;
  }
}

// Whether this build can quantize and compute with t.
bool computes(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
      return true;
    default: {
      const kernels::quant::TypeOps* o = kernels::quant::ops(t);
      return o != nullptr && o->quantize != nullptr;
    }
  }
}

// The types make-model picks for every matrix of `arch` at the mini shape with `dtype`.
std::set<DType> planned_types(const std::string& dtype) {
  std::set<DType> out;
  // mini: rows of 256 (dim) and 768 (FFN) elements; the rule depends on name and layer only.
  for (const char* name : {"token_embd.weight", "output.weight"})
    out.insert(make_model_tensor_type(dtype, name, -1, 4, 256));
  for (int l = 0; l < 4; ++l) {
    for (const char* m : {"attn_q", "attn_v", "attn_output", "ffn_up"})
      out.insert(make_model_tensor_type(dtype, "blk." + std::to_string(l) + "." + m + ".weight", l,
                                        4, 256));
    out.insert(
        make_model_tensor_type(dtype, "blk." + std::to_string(l) + ".ffn_down.weight", l, 4, 768));
  }
  return out;
}

bool buildable(const std::string& dtype) {
  for (DType t : planned_types(dtype))
    if (!computes(t)) return false;
  return true;
}

std::vector<float> dequant(const gguf::File& f, const gguf::TensorInfo& t) {
  const auto cols = static_cast<int64_t>(t.dims[0]);
  const auto rows = static_cast<int64_t>(t.n_elements) / cols;
  std::vector<float> out(t.n_elements);
  const size_t rb = kernels::row_bytes(t.type, cols);
  for (int64_t r = 0; r < rows; ++r)
    kernels::dequantize_row(t.type, f.data(t) + r * rb, out.data() + r * cols, cols);
  return out;
}

const char* kAllDTypes[] = {"q4_1", "q5_0", "q5_1",   "iq4_nl", "q2_k",   "q3_k", "q4_k",
                            "q5_k", "q6_k", "iq4_xs", "q4_k_m", "q5_k_m", "q8_0", "q4_0"};

// Greedy decoding of `n` tokens after `prompt` on one engine; also each step's top-1 margin.
std::vector<int32_t> greedy(Engine& e, std::vector<int32_t> prompt, int n,
                            std::vector<float>* margins = nullptr,
                            const std::vector<int32_t>* forced = nullptr) {
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b < e.pool().n_total(); ++b) blocks.push_back(b);
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  int32_t n_past = 0;
  for (int i = 0; i < n; ++i) {
    StepOutput o;
    e.step({test::seq_step(feed, n_past, blocks)}, o);
    const float* row = o.row(0);
    int32_t best = 0;
    for (int32_t v = 1; v < o.n_vocab; ++v)
      if (row[v] > row[best]) best = v;
    float second = -INFINITY;
    for (int32_t v = 0; v < o.n_vocab; ++v)
      if (v != best) second = std::max(second, row[v]);
    if (margins) margins->push_back(row[best] - second);
    out.push_back(best);
    n_past += static_cast<int32_t>(feed.size());
    feed.assign(1, forced ? (*forced)[static_cast<size_t>(i)] : best);
  }
  return out;
}

std::unique_ptr<Engine> engine(std::shared_ptr<Model> m, bool reference) {
  EngineOptions o;
  o.reference = reference;
  o.n_threads = 2;
  o.block_size = 16;
  o.n_blocks = 8;
  return make_cpu_engine(std::move(m), o);
}

bool arch_loads(const std::string& arch) {
  const std::vector<std::string> a = supported_architectures();
  return std::find(a.begin(), a.end(), arch) != a.end();
}

}  // namespace

BOOST_AUTO_TEST_CASE(tensor_types_follow_llama_quantize) {
  // Every tensor of llama-quantize's Q4_K_M and Q5_K_M zoo files (llama3, qwen2) has the type
  // make-model's rule gives it (the mini shape: 4 layers, rows of 256 and 768).
  const std::pair<const char*, const char*> files[] = {{"q4_k_m", "zoo-llama3-q4_k_m"},
                                                       {"q5_k_m", "zoo-llama3-q5_k_m"},
                                                       {"q4_k_m", "zoo-qwen2-q4_k_m"}};
  for (const auto& [mix, file] : files) {
    const gguf::File f = gguf::File::open(kZoo + file + ".gguf");
    int n = 0;
    for (const gguf::TensorInfo& t : f.tensors()) {
      if (t.dims.size() != 2) continue;
      int layer = -1;
      if (t.name.rfind("blk.", 0) == 0) layer = std::stoi(t.name.substr(4));
      const DType want =
          make_model_tensor_type(mix, t.name, layer, 4, static_cast<int64_t>(t.dims[0]));
      BOOST_TEST(std::string(kernels::dtype_name(want)) == kernels::dtype_name(t.type),
                 file << " " << t.name);
      ++n;
    }
    BOOST_TEST(n == 30);
  }
  // The rule at other layer counts (llama.cpp's use_more_bits: first and last eighth, every
  // third between), tied output, fused QKV, and the fallback for rows not of 256.
  std::vector<int> more;
  for (int l = 0; l < 32; ++l)
    if (make_model_tensor_type("q4_k_m", "blk.x.attn_v.weight", l, 32, 4096) == DType::Q6_K)
      more.push_back(l);
  BOOST_TEST(more == (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}),
             boost::test_tools::per_element());
  BOOST_TEST(kernels::dtype_name(make_model_tensor_type("q4_k_m", "token_embd.weight", -1, 4,
                                                        256)) == std::string("Q4_K"));
  BOOST_TEST(kernels::dtype_name(make_model_tensor_type("q4_k_m", "token_embd.weight", -1, 4, 256,
                                                        true)) == std::string("Q6_K"));
  BOOST_TEST(kernels::dtype_name(make_model_tensor_type("q4_k_m", "blk.0.attn_qkv.weight", 0, 4,
                                                        256)) == std::string("Q5_K"));
  BOOST_TEST(kernels::dtype_name(make_model_tensor_type("q5_k_m", "blk.0.attn_qkv.weight", 0, 4,
                                                        256)) == std::string("Q6_K"));
  const std::pair<const char*, const char*> fallbacks[] = {
      {"q2_k", "IQ4_NL"}, {"q3_k", "IQ4_NL"}, {"iq4_xs", "IQ4_NL"}, {"q4_k", "Q5_0"},
      {"q5_k", "Q5_1"},   {"q6_k", "Q8_0"},   {"q4_k_m", "Q5_0"},   {"q5_0", "Q5_0"}};
  for (const auto& [dtype, want] : fallbacks)
    BOOST_TEST(kernels::dtype_name(make_model_tensor_type(dtype, "blk.0.attn_q.weight", 0, 4,
                                                          288)) == std::string(want),
               dtype);
  BOOST_TEST(kernels::dtype_name(make_model_tensor_type("q4_k_m", "output.weight", -1, 4, 288)) ==
             std::string("Q8_0"));  // Q6_K's fallback
  BOOST_CHECK_THROW(make_model_tensor_type("q7_k", "output.weight", -1, 4, 256),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(every_dtype_round_trips) {
  TempDir d;
  const gguf::File src = gguf::File::open(make("llama", "f32"));
  for (const char* dtype : kAllDTypes) {
    BOOST_TEST_CONTEXT("dtype " << dtype) {
      if (!buildable(dtype)) {
        // Until this build has the quantizer, make-model refuses by type name.
        MakeModelOptions o;
        o.shape = "mini";
        o.dtype = dtype;
        o.vocab_from = kVocab;
        o.out = d.path() + "/refused.gguf";
        BOOST_CHECK_EXCEPTION(
            make_model(o), std::invalid_argument, [](const std::invalid_argument& e) {
              return std::string(e.what()).find("cannot quantize") != std::string::npos;
            });
        BOOST_TEST_MESSAGE(dtype << ": no quantizer in this build");
        continue;
      }
      const gguf::File f = gguf::File::open(make("llama", dtype));
      BOOST_TEST(f.tensors().size() == src.tensors().size());
      std::map<std::string, double> worst;
      for (const gguf::TensorInfo& t : f.tensors()) {
        const gguf::TensorInfo* s = src.tensor(t.name);
        BOOST_REQUIRE(s != nullptr);
        BOOST_TEST(t.dims == s->dims, boost::test_tools::per_element());
        if (t.dims.size() == 1) {
          BOOST_TEST(kernels::dtype_name(t.type) == std::string("F32"), t.name);
          continue;
        }
        int layer = -1;
        if (t.name.rfind("blk.", 0) == 0) layer = std::stoi(t.name.substr(4));
        BOOST_TEST((t.type == make_model_tensor_type(dtype, t.name, layer, 4,
                                                     static_cast<int64_t>(t.dims[0]))),
                   t.name);
        const std::vector<float> x = dequant(src, *s), y = dequant(f, t);
        double e = 0, n = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          e += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
          n += double{x[i]} * x[i];
        }
        const double rel = std::sqrt(e / n);
        const std::string tn = kernels::dtype_name(t.type);
        worst[tn] = std::max(worst[tn], rel);
        BOOST_TEST(rel <= rms_bound(t.type), t.name << " " << tn << " rel rms " << rel);
      }
      for (const auto& [tn, e] : worst) BOOST_TEST_MESSAGE(dtype << " " << tn << ": " << e);
      const int64_t q = *f.get_int("general.quantization_version");
      BOOST_TEST(q == 2);
    }
  }
}

BOOST_AUTO_TEST_CASE(architectures_use_llama_cpp_names) {
  // Tensor names, dims and keys against files llama.cpp's tool chain wrote: qwen2 has the mini
  // shape, so every tensor matches; for gemma2 and phi3 the names of the global tensors and of
  // one layer match and every key of the zoo file exists with the same value type.
  TempDir d;
  for (const char* arch : {"llama", "qwen2", "gemma2", "phi3"}) {
    BOOST_TEST_CONTEXT("arch " << arch) {
      const std::string zoo_name = std::string(arch) == "llama" ? "llama3" : arch;
      const gguf::File z = gguf::File::open(kZoo + "zoo-" + zoo_name + "-f32.gguf");
      const gguf::File f = gguf::File::open(make(arch, "f32"));
      BOOST_TEST(*f.get_string("general.architecture") == arch);
      auto names = [](const gguf::File& g, bool dims) {
        std::set<std::string> out;
        for (const gguf::TensorInfo& t : g.tensors()) {
          // rope_freqs is the zoo's Llama 3.1 RoPE; make-model writes plain RoPE
          if (t.name == "rope_freqs.weight") continue;
          if (!dims && t.name.rfind("blk.", 0) == 0 && t.name.rfind("blk.0.", 0) != 0) continue;
          std::string n = t.name;
          if (dims)
            for (uint64_t x : t.dims) {
              n += ' ';
              n += std::to_string(x);
            }
          out.insert(n);
        }
        return out;
      };
      const bool same_shape = zoo_name == "llama3" || zoo_name == "qwen2";
      BOOST_TEST(names(f, same_shape) == names(z, same_shape), boost::test_tools::per_element());
      for (const auto& [k, v] : z.metadata()) {
        if (k.rfind(std::string(arch) + ".", 0) != 0) continue;
        const gguf::Value* ours = f.find(k);
        BOOST_TEST(ours != nullptr, k);
        if (ours) BOOST_TEST(static_cast<int>(ours->type) == static_cast<int>(v.type), k);
      }
    }
  }
  // qwen3 (no zoo file): per-head q/k norms, no biases, head lengths written.
  const gguf::File q3 = gguf::File::open(make("qwen3", "f32"));
  BOOST_TEST(*q3.get_string("general.architecture") == "qwen3");
  BOOST_TEST(*q3.get_int("qwen3.attention.key_length") == 64);
  BOOST_TEST(*q3.get_int("qwen3.attention.value_length") == 64);
  BOOST_TEST(*q3.get_int("qwen3.block_count") == 4);
  for (int l = 0; l < 4; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* n : {"attn_q_norm.weight", "attn_k_norm.weight"}) {
      const gguf::TensorInfo* t = q3.tensor(b + n);
      BOOST_REQUIRE(t != nullptr);
      BOOST_TEST(t->dims == (std::vector<uint64_t>{64}), boost::test_tools::per_element());
    }
    BOOST_TEST(q3.tensor(b + "attn_q.bias") == nullptr);
    BOOST_TEST(q3.tensor(b + "attn_q.weight") != nullptr);
  }
  // phi3's fused matrices: q, k, v rows (4 + 2 + 2 heads of 64 at mini) and gate + up rows.
  const gguf::File p3 = gguf::File::open(make("phi3", "f32"));
  BOOST_TEST(p3.tensor("blk.0.attn_qkv.weight")->dims == (std::vector<uint64_t>{256, 512}),
             boost::test_tools::per_element());
  BOOST_TEST(p3.tensor("blk.0.ffn_up.weight")->dims == (std::vector<uint64_t>{256, 1536}),
             boost::test_tools::per_element());
  BOOST_TEST(*p3.get_int("phi3.attention.sliding_window") == 2047);
  const gguf::File g2 = gguf::File::open(make("gemma2", "f32"));
  BOOST_TEST(g2.tensor("output.weight") == nullptr);  // tied
  BOOST_TEST(*g2.get_float("gemma2.attn_logit_softcapping") == 50.0);
  BOOST_TEST(*g2.get_float("gemma2.final_logit_softcapping") == 30.0);
  BOOST_TEST(*g2.get_int("gemma2.attention.sliding_window") == 4096);
  MakeModelOptions o;
  o.arch = "mamba";
  o.out = d.path() + "/x.gguf";
  BOOST_CHECK_EXCEPTION(make_model(o), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("unknown architecture 'mamba'") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(greedy_output_is_stable) {
  // For every architecture and dtype this build loads and computes: the same ids from two loads
  // of the file (fast path), and the fast path, teacher-forced on the reference path's greedy
  // ids, picks the same top-1 wherever the reference's margin exceeds what 8-bit activations
  // can move (0.25 here, against logits of standard deviation about 1).
  const std::vector<int32_t> prompt = {1, 45, 300, 7, 128};
  constexpr int kSteps = 8;
  int checked = 0;
  // Every architecture with the Q4_K_M mix (which holds Q4_K and Q6_K), llama and qwen2 with
  // Q5_0, llama with the other legacy types and IQ4_XS.
  std::vector<std::pair<std::string, std::string>> runs;
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma2", "phi3"})
    runs.emplace_back(arch, "q4_k_m");
  runs.emplace_back("qwen2", "q5_0");
  for (const char* dtype : {"q5_0", "q4_1", "q5_1", "iq4_nl", "iq4_xs"})
    runs.emplace_back("llama", dtype);
  int compared = 0;
  for (const auto& [arch, dtype] : runs) {
    if (!arch_loads(arch) || !buildable(dtype)) continue;
    {
      BOOST_TEST_CONTEXT(arch << " " << dtype) {
        const std::string path = make(arch, dtype);
        auto m1 = Model::load(path);
        auto m2 = Model::load(path);
        auto f1 = engine(m1, false);
        auto f2 = engine(m2, false);
        auto r = engine(m1, true);
        const std::vector<int32_t> a = greedy(*f1, prompt, kSteps);
        const std::vector<int32_t> b = greedy(*f2, prompt, kSteps);
        BOOST_TEST(a == b, boost::test_tools::per_element());
        std::vector<float> margins;
        const std::vector<int32_t> ref = greedy(*r, prompt, kSteps, &margins);
        const std::vector<int32_t> tf = greedy(*f1, prompt, kSteps, nullptr, &ref);
        for (int i = 0; i < kSteps; ++i)
          if (margins[static_cast<size_t>(i)] > 0.25f) {
            BOOST_TEST(tf[static_cast<size_t>(i)] == ref[static_cast<size_t>(i)], "step " << i);
            ++compared;
          }
        ++checked;
      }
    }
  }
  BOOST_TEST_MESSAGE(checked << " (architecture, dtype) pairs ran, " << compared
                             << " steps compared with the reference");
  BOOST_TEST(checked >= 5);                      // the legacy types on llama at least
  BOOST_TEST(compared >= checked * kSteps / 2);  // most steps are not near-ties
}

BOOST_AUTO_TEST_SUITE_END()  // test_model_make_quant
