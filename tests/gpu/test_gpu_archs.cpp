// The architectures beyond the plain llama block on the CUDA engine: the kernels they add (NEOX
// RoPE with frequency factors and scaling, per-head RMSNorm, bias add, GELU(tanh) gate, soft-cap,
// embedding scale) against the CPU reference, and the zoo's f32 llama3 (rope_freqs), qwen2,
// gemma2 and phi3 files plus a make-model qwen3 file run through the CUDA engine (f32 weights):
// logits of a prefill and the decode steps after it against the CPU reference engine's, greedy
// ids against llama.cpp's (NAME.json).
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/bias_add.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/head_rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/softcap.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "model/make_model.hpp"
#include "tests/gpu/gpu_test.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_gpu_archs)

using namespace sy::gputest;
namespace ref = sy::kernels::ref;
using sy::cuda::bf16;

BOOST_TEST_GLOBAL_FIXTURE(RequireGpu);

// ---- kernels ----

BOOST_AUTO_TEST_CASE(rope_neox_factors_and_scaling_match_reference) {
  const int T = 7, n_heads = 3, hd = 64;
  const int64_t stride = n_heads * hd + 24;  // rows wider than the rotated heads, as in q|k|v
  const float base = 500000.0f;
  for (int rope_dim : {64, 32}) {
    const float theta_scale = std::pow(base, -2.0f / static_cast<float>(rope_dim));
    std::vector<float> factors(static_cast<size_t>(rope_dim / 2));
    for (float& f : factors) f = std::uniform_real_distribution<float>(1.0f, 8.0f)(rng());
    DevArray<float> dfac(factors);
    for (bool neox : {false, true}) {
      for (bool with_factors : {false, true}) {
        for (float freq_scale : {1.0f, 0.25f}) {
          BOOST_TEST_CONTEXT("rope_dim " << rope_dim << " neox " << neox << " factors "
                                         << with_factors << " scale " << freq_scale) {
            const std::vector<float> x = randn(size_t(T * stride));
            std::vector<int32_t> pos(T);
            for (int32_t& p : pos) p = std::uniform_int_distribution<int>(0, 2047)(rng());
            sy::kernels::RopeSpec spec;
            spec.head_dim = hd;
            spec.rope_dim = rope_dim;
            spec.theta_base = base;
            spec.freq_scale = freq_scale;
            spec.freq_factors = with_factors ? factors.data() : nullptr;
            spec.neox = neox;
            std::vector<float> want = x;
            for (int t = 0; t < T; ++t)
              ref::rope_ext(want.data() + t * stride, n_heads, spec, pos[t]);
            DevArray<float> dx(x);
            DevArray<int32_t> dp(pos);
            check(sy::cuda::rope(dx.get(), stride, T, n_heads, hd, rope_dim, dp.get(), theta_scale,
                                 nullptr, with_factors ? dfac.get() : nullptr, freq_scale, neox),
                  "rope");
            BOOST_TEST(rel_err(dx.download(), want) < kTolF32);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(head_rmsnorm_matches_reference) {
  // qwen3-shaped: the k heads of q|k|v rows (offset, stride), head_dim above one warp's 32
  for (int hd : {32, 128}) {
    const int T = 5, n_heads = 6;
    const int64_t stride = n_heads * hd * 2 + 8;
    const int64_t off = 3;  // the normed heads start inside the row
    const std::vector<float> x = randn(size_t(T * stride), 2.0f);
    std::vector<float> w = randn(size_t(hd), 0.3f);
    for (float& v : w) v += 1.0f;
    std::vector<float> want = x;
    for (int t = 0; t < T; ++t)
      ref::rmsnorm_heads(want.data() + t * stride + off, n_heads, hd, w.data(), 1e-6f);
    DevArray<float> dx(x), dw(w);
    check(sy::cuda::head_rmsnorm(dx.get() + off, stride, T, n_heads, hd, dw.get(), 1e-6f, nullptr),
          "head_rmsnorm");
    BOOST_TEST(rel_err(dx.download(), want) < kTolF32, "head_dim " << hd);
  }
}

BOOST_AUTO_TEST_CASE(bias_add_adds_each_row) {
  const int T = 4;
  const int64_t n = 300, stride = 333;
  const std::vector<float> y = randn(size_t(T * stride)), b = randn(size_t(n));
  std::vector<float> want = y;
  for (int t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) want[size_t(t * stride + i)] += b[size_t(i)];
  DevArray<float> dy(y), db(b);
  check(sy::cuda::bias_add(dy.get(), stride, T, n, db.get(), nullptr), "bias_add");
  BOOST_TEST(rel_err(dy.download(), want) == 0.0);  // one f32 add per element: exact
}

BOOST_AUTO_TEST_CASE(softcap_matches_reference) {
  const std::vector<float> x = randn(5000, 40.0f);  // well into tanh's flat part at cap 30
  std::vector<float> want = x;
  ref::softcap(want.data(), static_cast<int64_t>(want.size()), 30.0f);
  DevArray<float> dx(x);
  check(sy::cuda::softcap(dx.get(), static_cast<int64_t>(x.size()), 30.0f, nullptr), "softcap");
  BOOST_TEST(rel_err(dx.download(), want) < kTolF32);
  BOOST_TEST(sy::cuda::softcap(dx.get(), 1, 0.0f, nullptr) == cudaErrorInvalidValue);
}

BOOST_AUTO_TEST_CASE(gelu_tanh_gate_matches_reference) {
  const int rows = 3, ffn = 257;
  const std::vector<float> gu = randn(size_t{rows} * 2 * ffn, 3.0f);
  std::vector<float> want(size_t{rows} * ffn);
  for (int r = 0; r < rows; ++r) {
    std::vector<float> g(gu.begin() + r * 2 * ffn, gu.begin() + r * 2 * ffn + ffn);
    ref::geglu(g.data(), gu.data() + r * 2 * ffn + ffn, ffn);
    std::copy(g.begin(), g.end(), want.begin() + r * ffn);
  }
  DevArray<float> dgu(gu), of(want.size());
  DevArray<uint16_t> ob(want.size());
  const auto act = sy::cuda::GateAct::GeluTanh;
  check(sy::cuda::swiglu<float>(dgu.get(), rows, ffn, of.get(), nullptr, act), "f32");
  check(sy::cuda::swiglu<bf16>(dgu.get(), rows, ffn, ob.as<bf16>(), nullptr, act), "bf16");
  BOOST_TEST(rel_err(of.download(), want) < kTolF32);
  BOOST_TEST(rel_err(from_bf16_bits(ob.download()), want) < kTolBf16);
}

BOOST_AUTO_TEST_CASE(embedding_scaled_rows) {
  const int V = 20, dim = 96;
  const std::vector<float> table = randn(size_t(V * dim));
  const std::vector<int32_t> tokens = {3, 19, 0, 3};
  const float scale = std::sqrt(static_cast<float>(dim));
  std::vector<float> want;
  for (int32_t t : tokens)
    for (int i = 0; i < dim; ++i) want.push_back(table[size_t(t * dim + i)] * scale);
  DevArray<float> dt(table), out(want.size());
  DevArray<int32_t> dtok(tokens);
  check(sy::cuda::embedding<float>(dt.get(), dtok.get(), 4, dim, out.get(), nullptr, scale),
        "embedding");
  BOOST_TEST(rel_err(out.download(), want) == 0.0);  // one f32 product per element: exact
}

// ---- the engine on each architecture ----

namespace {

// CUDA (f32 weights) against the CPU reference engine, normwise over a logit row: both run f32
// through the same description, so they differ by summation order (cuBLASLt, the split softmax)
// and libm (sincosf, expf, tanhf) only. Measured on the emulator: 0.7e-6 to 1.3e-6 (each case's
// message). Dropping one step of the description moves them by far more than 1e-4: NEOX as NORM
// 0.27, the q|k|v biases 0.44, qwen3's q/k norms 0.11, gemma2's layer window 0.24, its final cap
// 4.6e-3, its attention cap 8.7e-4, llama3's rope_freqs 1.6e-3.
constexpr double kLogitTol = 1e-4;
// bf16 weights and activations against f32 through gemma2's 26 layers: each product rounds its
// inputs to 2^-9 relative, and the errors add over the layers rather than cancel. Measured 0.015.
// 5e-2 still fails the coarse errors (a missing window or bias: 0.24 and more); the f32 cases
// above judge the fine ones.
constexpr double kBf16LogitTol = 5e-2;
// llama.cpp's own margin below which a different greedy id is a near-tie, not an error (the zoo's
// README: summation order and its f16 KV cache).
constexpr double kNearTie = 0.005;
// Decode steps after the prefill: through the decode kernel, and (gemma2, prompt 19 + 4 > 16)
// past the sliding window of its even layers. The emulator is slow; a few steps suffice.
constexpr int kDecodeSteps = 4;

struct Reference {
  std::vector<int32_t> prompt, generated;
  std::vector<double> margin;  // llama.cpp's top1 - top2 per generated position; < 0: withheld
};

std::string zoo_path(const std::string& name, const char* ext) {
  return std::string(SY_MODELS_DIR) + "/zoo/zoo-" + name + ext;
}

Reference zoo_case(const std::string& name, size_t index) {
  std::ifstream f(zoo_path(name, ".json"));
  BOOST_REQUIRE_MESSAGE(f, "cannot open " << zoo_path(name, ".json"));
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json root = nlohmann::json::parse(ss.str());
  const auto& c = root.at("cases").at(index);
  Reference r;
  for (const auto& v : c.at("prompt_token_ids")) r.prompt.push_back(v.get<int32_t>());
  for (const auto& v : c.at("generated_token_ids")) r.generated.push_back(v.get<int32_t>());
  for (const auto& p : c.at("positions")) {
    const auto& m = p.at("top1_minus_top2");
    r.margin.push_back(m.is_number() ? m.get<double>() : -1.0);
  }
  return r;
}

int32_t argmax(const float* x, int32_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

double row_err(const float* got, const float* want, int32_t n) {
  return rel_err(std::vector<float>(got, got + n), std::vector<float>(want, want + n));
}

// Prefill `prompt` then kDecodeSteps greedy one-token steps on the CUDA engine and the CPU
// reference engine, both fed the CUDA engine's ids. Checks every logit row against the CPU's and
// returns the greedy ids (the prefill's first).
std::vector<int32_t> run_both(const std::shared_ptr<sy::Model>& model,
                              const std::vector<int32_t>& prompt) {
  sy::EngineOptions co;
  co.reference = true;
  co.n_blocks = 8;
  co.kv_type = sy::kernels::DType::F32;  // f32 caches on both sides: only summation order differs
  auto cpu = sy::make_cpu_engine(model, co);
  sy::CudaEngineOptions go;
  go.f32_weights = true;
  go.kv_type = sy::kernels::DType::F32;
  go.n_blocks = 8;
  go.max_batch_tokens = 64;
  go.max_logit_rows = 4;
  auto gpu = sy::make_cuda_engine(model, go);
  const int32_t V = model->config().n_vocab;
  std::vector<int32_t> bt_cpu, bt_gpu;
  const size_t need = (prompt.size() + kDecodeSteps + 15) / 16;
  for (size_t i = 0; i < need; ++i) {
    bt_cpu.push_back(*cpu->pool().alloc());
    bt_gpu.push_back(*gpu->pool().alloc());
  }
  std::vector<int32_t> tokens = prompt, ids;
  sy::StepOutput oc, og;
  double worst = 0.0;
  int32_t n_past = 0;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    sy::SeqStep s;
    s.tokens = tokens.data() + n_past;
    s.n_tokens = static_cast<int32_t>(tokens.size()) - n_past;
    s.n_past = n_past;
    s.n_blocks = static_cast<int32_t>(need);
    s.block_table = bt_cpu.data();
    cpu->step({s}, oc);
    s.block_table = bt_gpu.data();
    gpu->step({s}, og);
    const double e = row_err(og.row(0), oc.row(0), V);
    BOOST_TEST(e < kLogitTol, "step " << step << ": logits differ by " << e);
    worst = std::max(worst, e);
    ids.push_back(argmax(og.row(0), V));
    BOOST_TEST(ids.back() == argmax(oc.row(0), V), "step " << step);
    n_past = static_cast<int32_t>(tokens.size());
    tokens.push_back(ids.back());
  }
  BOOST_TEST_MESSAGE(model->config().arch << ": largest normwise logit gap to the CPU " << worst);
  return ids;
}

// Greedy ids of a prefill and kDecodeSteps decode steps on `e`: with `on_device`, the decode steps
// sample on the device (step_greedy; replayed as CUDA graphs where the engine has them), else
// the host takes the argmax of the returned logits. `logits` gets every step's row.
std::vector<int32_t> greedy(sy::Engine& e, const std::vector<int32_t>& prompt, bool on_device,
                            std::vector<std::vector<float>>* logits = nullptr) {
  const size_t need = (prompt.size() + kDecodeSteps + 15) / 16;
  std::vector<int32_t> bt;
  for (size_t i = 0; i < need; ++i) bt.push_back(*e.pool().alloc());
  std::vector<int32_t> tokens = prompt, ids(1);
  sy::StepOutput out;
  int32_t n_past = 0;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    sy::SeqStep s;
    s.tokens = tokens.data() + n_past;
    s.n_tokens = static_cast<int32_t>(tokens.size()) - n_past;
    s.n_past = n_past;
    s.n_blocks = static_cast<int32_t>(need);
    s.block_table = bt.data();
    if (on_device && step > 0) {
      BOOST_REQUIRE(e.step_greedy({s}, ids));
    } else {
      e.step({s}, out);
      ids[0] = argmax(out.row(0), out.n_vocab);
      if (logits) logits->emplace_back(out.row(0), out.row(0) + out.n_vocab);
    }
    n_past = static_cast<int32_t>(tokens.size());
    tokens.push_back(ids[0]);
  }
  for (int32_t b : bt) e.pool().free(b);
  return {tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), tokens.end()};
}

// The zoo file `name` on case `index`: logits against the CPU and greedy ids against llama.cpp's,
// up to a first difference where llama.cpp's margin is a near-tie.
void check_zoo(const std::string& name, size_t index) {
  BOOST_TEST_CONTEXT("zoo-" << name << "-f32 case " << index) {
    const Reference r = zoo_case(name + "-f32", index);
    const auto model = sy::Model::load(zoo_path(name + "-f32", ".gguf"));
    const std::vector<int32_t> ids = run_both(model, r.prompt);
    BOOST_REQUIRE_GE(r.generated.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == r.generated[i]) continue;
      BOOST_TEST((r.margin[i] >= 0.0 && r.margin[i] < kNearTie),
                 "token " << i << ": " << ids[i] << " where llama.cpp has " << r.generated[i]
                          << " at margin " << r.margin[i]);
      break;  // past a near-tie the continuations legitimately part
    }
  }
}

}  // namespace

// Llama 3.1-style RoPE: rope_freqs frequency factors, base 500000.
BOOST_AUTO_TEST_CASE(zoo_llama3_rope_freqs) {
  check_zoo("llama3", 0);
}

// Q/K/V biases, NEOX RoPE.
BOOST_AUTO_TEST_CASE(zoo_qwen2_biases_neox) {
  check_zoo("qwen2", 1);
}

// Embedding scale, post norms, GELU(tanh), soft-caps, the window of 16 on even layers (a 19-token
// prompt and 4 decode steps attend past it), 26 layers.
BOOST_AUTO_TEST_CASE(zoo_gemma2) {
  check_zoo("gemma2", 3);
}

// Fused attn_qkv and gate|up, NEOX RoPE, the file's window on every layer, 32064-token vocabulary.
BOOST_AUTO_TEST_CASE(zoo_phi3_fused) {
  check_zoo("phi3", 4);
}

// Per-head q/k RMSNorm before NEOX RoPE: no zoo file, so the CPU reference engine is the judge
// (itself checked against numpy's forward pass in test_engine_archs).
BOOST_AUTO_TEST_CASE(make_model_qwen3_q_k_norms) {
  sy::test::TempDir dir("sy_gpu_qwen3_");
  sy::MakeModelOptions o;
  o.shape = "tiny";
  o.arch = "qwen3";
  o.seed = 7;
  o.out = dir.file("qwen3.gguf");
  sy::make_model(o);
  const auto model = sy::Model::load(o.out);
  BOOST_REQUIRE(model->weights().layers.at(0).q_norm != nullptr);
  BOOST_REQUIRE(model->config().rope_layout == sy::RopeLayout::Neox);
  run_both(model, {1, 5, 9, 14, 2, 33, 7, 21});
}

// gemma2's soft-capped logits and layer windows through the device's greedy sampling and CUDA
// graph replays give the host argmax's ids; bf16 weights stay near the f32 logits.
BOOST_AUTO_TEST_CASE(gemma2_device_greedy_graphs_and_bf16) {
  const Reference r = zoo_case("gemma2-f32", 3);
  const auto model = sy::Model::load(zoo_path("gemma2-f32", ".gguf"));
  sy::CudaEngineOptions o;
  o.f32_weights = true;
  o.n_blocks = 8;
  o.max_batch_tokens = 64;
  o.max_logit_rows = 4;
  std::vector<std::vector<float>> want;
  const auto direct = greedy(*sy::make_cuda_engine(model, o), r.prompt, false, &want);
  o.cuda_graphs = true;
  BOOST_TEST(greedy(*sy::make_cuda_engine(model, o), r.prompt, true) == direct,
             boost::test_tools::per_element());
  o.cuda_graphs = false;
  o.f32_weights = false;
  std::vector<std::vector<float>> got;
  greedy(*sy::make_cuda_engine(model, o), r.prompt, false, &got);
  // Only the prefill's row is compared: later rows follow each run's own ids.
  const double e = rel_err(got.at(0), want.at(0));
  BOOST_TEST_MESSAGE("gemma2 bf16: normwise logit gap to f32 " << e);
  BOOST_TEST(e < kBf16LogitTol);
}

// qwen2's biases on the quantized-decode path (gemv_q on the file's Q8_0 blocks, f32 inputs)
// against the bf16 path of the same file: the decode steps' logits agree within the bf16 bound.
BOOST_AUTO_TEST_CASE(qwen2_q8_0_quantized_decode_matches_bf16) {
  const Reference r = zoo_case("qwen2-q8_0", 1);
  const auto model = sy::Model::load(zoo_path("qwen2-q8_0", ".gguf"));
  sy::CudaEngineOptions o;
  o.n_blocks = 8;
  o.max_batch_tokens = 64;
  o.max_logit_rows = 4;
  std::vector<std::vector<float>> want, got;
  const auto ids = greedy(*sy::make_cuda_engine(model, o), r.prompt, false, &want);
  o.quantized_decode = true;
  BOOST_TEST(greedy(*sy::make_cuda_engine(model, o), r.prompt, false, &got) == ids,
             boost::test_tools::per_element());
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 1; i < got.size(); ++i) worst = std::max(worst, rel_err(got[i], want[i]));
  BOOST_TEST_MESSAGE("qwen2 q8_0: normwise gap of quantized decode to bf16 " << worst);
  BOOST_TEST(worst < kBf16LogitTol);
}

// No expert kernels yet: a mixture of experts is refused by name before anything is allocated,
// pointing at the CPU backend, which runs it.
BOOST_AUTO_TEST_CASE(mixture_of_experts_is_refused_by_name) {
  for (const char* name : {"mixtral-f32", "olmoe-f32"}) {
    const auto model = sy::Model::load(zoo_path(name, ".gguf"));
    sy::CudaEngineOptions o;
    o.n_blocks = 8;
    try {
      sy::make_cuda_engine(model, o);
      BOOST_ERROR(name << " was not refused");
    } catch (const std::exception& e) {
      const std::string what = e.what();
      BOOST_TEST(what.find("mixture-of-experts") != std::string::npos, what);
      BOOST_TEST(what.find("--backend cpu") != std::string::npos, what);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_gpu_archs
