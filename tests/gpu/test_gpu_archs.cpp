// The architectures beyond the plain llama block on the CUDA engine: the kernels they add (NEOX
// RoPE with frequency factors and scaling, per-head RMSNorm, bias add, GELU(tanh) gate, soft-cap,
// embedding scale, the mixture-of-experts routing, grouping, grouped product and combine)
// against the CPU reference, and the zoo's f32 llama3 (rope_freqs), qwen2, gemma2, phi3,
// mixtral, qwen2moe and olmoe files, its mixtral Q4_K_M file, plus a make-model qwen3 file run
// through the CUDA engine (f32 weights): logits of a prefill and the decode steps after it
// against the CPU reference engine's, greedy ids against llama.cpp's (NAME.json).
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
#include "kernels/cuda/moe.cuh"
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

// ---- mixture of experts ----

namespace {

// The CPU engine's routing and grouping (gpu/cpu_engine.cpp: route, moe_fast's counting sort),
// written out for the kernels' parity tests.
struct Routing {
  std::vector<int32_t> pick, pos, src, offset, tiles;
  std::vector<float> weight, gate;
};

Routing route_ref(const std::vector<float>& logits, int ld, int T, int E, int K, bool renorm,
                  float scale, bool gate, int64_t n_tiles) {
  Routing r;
  r.pick.resize(size_t(T * K));
  r.weight.resize(size_t(T * K));
  for (int t = 0; t < T; ++t) {
    std::vector<float> p(logits.begin() + t * ld, logits.begin() + t * ld + E);
    ref::softmax(p.data(), E);
    float sum = 0.0f;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        const bool taken = std::find(r.pick.begin() + t * K, r.pick.begin() + t * K + j, e) !=
                           r.pick.begin() + t * K + j;
        if (!taken && (best < 0 || p[size_t(e)] > p[size_t(best)])) best = e;
      }
      r.pick[size_t(t * K + j)] = best;
      r.weight[size_t(t * K + j)] = p[size_t(best)];
      sum += p[size_t(best)];
    }
    for (int j = 0; j < K; ++j) r.weight[size_t(t * K + j)] *= (renorm ? 1.0f / sum : 1.0f) * scale;
    if (gate) r.gate.push_back(1.0f / (1.0f + std::exp(-logits[size_t(t * ld + E)])));
  }
  // Counting sort by expert, token order kept within an expert.
  r.offset.assign(size_t(E + 1), 0);
  for (int32_t e : r.pick) ++r.offset[size_t(e + 1)];
  for (int e = 0; e < E; ++e) r.offset[size_t(e + 1)] += r.offset[size_t(e)];
  std::vector<int32_t> cursor(r.offset.begin(), r.offset.end() - 1);
  r.pos.resize(r.pick.size());
  r.src.resize(r.pick.size());
  for (size_t i = 0; i < r.pick.size(); ++i) {
    const int32_t p = cursor[size_t(r.pick[i])]++;
    r.pos[i] = p;
    r.src[size_t(p)] = static_cast<int32_t>(i) / K;
  }
  for (int e = 0; e < E; ++e) {
    for (int32_t p = r.offset[size_t(e)]; p < r.offset[size_t(e + 1)];
         p += sy::cuda::kMoeTileRows) {
      r.tiles.push_back(e);
      r.tiles.push_back(p);
    }
  }
  while (static_cast<int64_t>(r.tiles.size()) < 2 * n_tiles) {
    r.tiles.push_back(-1);
    r.tiles.push_back(0);
  }
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(moe_route_matches_reference) {
  struct Case {
    int T, E, K;
    bool renorm;
    float scale;
    bool gate;
  };
  // Mixtral's routing (4 experts, top 2, renormalised); qwen2moe's (8, top 2, as they are, a
  // shared-expert gate); a wide one (60 experts, top 4, scaled) whose 600 picks take the grouping
  // block three chunks, so picks of one expert land in several chunks.
  for (const Case& k : {Case{5, 4, 2, true, 1.0f, false}, Case{9, 8, 2, false, 1.0f, true},
                        Case{150, 60, 4, true, 2.5f, false}}) {
    BOOST_TEST_CONTEXT("T " << k.T << " E " << k.E << " K " << k.K) {
      const int ld = k.E + (k.gate ? 1 : 0) + 3;  // rows wider than the router's: ld is honoured
      // Each row's expert logits a shuffled ladder 0.1 apart plus noise below 0.05: no two
      // probabilities tie within float rounding, so the top k cannot flip between the two sides.
      std::vector<float> logits = randn(size_t(k.T * ld), 2.0f);
      std::vector<int> rank(static_cast<size_t>(k.E));
      for (int t = 0; t < k.T; ++t) {
        for (int e = 0; e < k.E; ++e) rank[size_t(e)] = e;
        std::shuffle(rank.begin(), rank.end(), rng());
        for (int e = 0; e < k.E; ++e) {
          logits[size_t(t * ld + e)] = 0.1f * static_cast<float>(rank[size_t(e)] - k.E / 2) +
                                       std::uniform_real_distribution<float>(0.0f, 0.05f)(rng());
        }
      }
      const int64_t n_tiles = sy::cuda::moe_max_tiles(k.T, k.K, k.E);
      const Routing want = route_ref(logits, ld, k.T, k.E, k.K, k.renorm, k.scale, k.gate, n_tiles);
      DevArray<float> dl(logits), w(size_t(k.T * k.K)), g(size_t(k.T));
      DevArray<int32_t> pos(size_t(k.T * k.K)), src(size_t(k.T * k.K)), off(size_t(k.E + 1)),
          tiles(size_t(2 * n_tiles));
      sy::cuda::MoeRouting r;
      r.weight = w.get();
      r.gate = k.gate ? g.get() : nullptr;
      r.pos = pos.get();
      r.src = src.get();
      r.offset = off.get();
      r.tiles = tiles.get();
      r.n_tiles = n_tiles;
      check(sy::cuda::moe_route(dl.get(), ld, k.T, k.E, k.K, k.renorm, k.scale, r, nullptr),
            "moe_route");
      BOOST_TEST(rel_err(w.download(), want.weight) < kTolF32);
      if (k.gate) BOOST_TEST(rel_err(g.download(), want.gate) < kTolF32);
      BOOST_TEST(off.download() == want.offset, boost::test_tools::per_element());
      BOOST_TEST(pos.download() == want.pos, boost::test_tools::per_element());
      BOOST_TEST(src.download() == want.src, boost::test_tools::per_element());
      BOOST_TEST(tiles.download() == want.tiles, boost::test_tools::per_element());
      // Too few tile entries, or more experts than the grouping block has threads: refused.
      r.n_tiles = n_tiles - 1;
      BOOST_TEST(sy::cuda::moe_route(dl.get(), ld, k.T, k.E, k.K, k.renorm, k.scale, r, nullptr) ==
                 cudaErrorInvalidValue);
    }
  }
  sy::cuda::MoeRouting none;
  BOOST_TEST(sy::cuda::moe_route(nullptr, 300, 1, sy::cuda::kMoeMaxExperts + 1, 2, true, 1.0f, none,
                                 nullptr) == cudaErrorInvalidValue);
}

// The grouped product on a grouping made here: 5 experts holding 3, 0, 11 (two tiles), 1 and 9
// rows, spare tile entries at the end. f32 and bf16 weights, 16-byte loads (256 columns) and
// one element at a time (90), gathered (token rows) and in place (x_rows nullptr) inputs.
BOOST_AUTO_TEST_CASE(moe_matmul_matches_reference) {
  const std::vector<int32_t> counts = {3, 0, 11, 1, 9};
  const int E = static_cast<int>(counts.size()), T = 30;
  std::vector<int32_t> offset = {0}, tiles;
  for (int e = 0; e < E; ++e) offset.push_back(offset.back() + counts[size_t(e)]);
  const int P = offset.back();
  for (int e = 0; e < E; ++e) {
    for (int32_t p = offset[size_t(e)]; p < offset[size_t(e + 1)]; p += sy::cuda::kMoeTileRows) {
      tiles.push_back(e);
      tiles.push_back(p);
    }
  }
  for (int i = 0; i < 3; ++i) tiles.insert(tiles.end(), {-1, 0});
  const int64_t n_tiles = static_cast<int64_t>(tiles.size() / 2);
  std::vector<int32_t> rows(static_cast<size_t>(P));
  for (int32_t& r : rows) r = std::uniform_int_distribution<int32_t>(0, T - 1)(rng());
  DevArray<int32_t> doff(offset), dtiles(tiles), drows(rows);
  const int64_t out_rows = 40;
  for (int64_t cols : {256, 90}) {
    for (bool gathered : {true, false}) {
      BOOST_TEST_CONTEXT("cols " << cols << " gathered " << gathered) {
        const std::vector<float> w = round_bf16(randn(size_t(E * out_rows * cols)));
        const std::vector<float> x = randn(size_t((gathered ? T : P) * cols));
        std::vector<float> want(size_t(P * out_rows));
        for (int e = 0; e < E; ++e) {
          for (int32_t p = offset[size_t(e)]; p < offset[size_t(e + 1)]; ++p) {
            const int64_t xr = gathered ? rows[size_t(p)] : p;
            for (int64_t r = 0; r < out_rows; ++r) {
              double s = 0.0;
              for (int64_t c = 0; c < cols; ++c)
                s += double{w[size_t((e * out_rows + r) * cols + c)]} * x[size_t(xr * cols + c)];
              want[size_t(p * out_rows + r)] = static_cast<float>(s);
            }
          }
        }
        DevArray<float> dx(x), dwf(w), yf(want.size()), yb(want.size());
        DevArray<uint16_t> dwb(to_bf16_bits(w));
        const int32_t* xr = gathered ? drows.get() : nullptr;
        check(sy::cuda::moe_matmul<float>(dwf.get(), out_rows, cols, dx.get(), xr, doff.get(),
                                          dtiles.get(), n_tiles, yf.get(), nullptr),
              "moe_matmul f32");
        check(sy::cuda::moe_matmul<bf16>(dwb.as<bf16>(), out_rows, cols, dx.get(), xr, doff.get(),
                                         dtiles.get(), n_tiles, yb.get(), nullptr),
              "moe_matmul bf16");
        // The weights are bf16 values in both: only the order of the f32 sums differs.
        BOOST_TEST(rel_err(yf.download(), want) < kTolF32);
        BOOST_TEST(rel_err(yb.download(), want) < kTolF32);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(moe_gather_and_combine_match_reference) {
  const int T = 6, K = 3, P = T * K;
  const int64_t dim = 70;
  // Each token's picks at scattered grouped rows.
  std::vector<int32_t> pos(static_cast<size_t>(P)), src(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i) pos[size_t(i)] = (i * 7) % P;  // 7 is prime to 18: a permutation
  for (int i = 0; i < P; ++i) src[size_t(pos[size_t(i)])] = i / K;
  const std::vector<float> x = randn(size_t(T * dim)), ye = randn(size_t(P * dim)),
                           ys = randn(size_t(T * dim)), w = randn(static_cast<size_t>(P)),
                           g = randn(size_t(T));
  std::vector<float> gathered(size_t(P * dim));
  for (int p = 0; p < P; ++p)
    for (int64_t d = 0; d < dim; ++d)
      gathered[size_t(p * dim + d)] = x[size_t(src[size_t(p)] * dim + d)];
  DevArray<int32_t> dpos(pos), dsrc(src);
  DevArray<float> dx(x), dye(ye), dys(ys), dw(w), dg(g), gf(gathered.size());
  DevArray<uint16_t> gb(gathered.size());
  check(sy::cuda::moe_gather<float>(dx.get(), dsrc.get(), P, dim, gf.get(), nullptr), "gather");
  check(sy::cuda::moe_gather<bf16>(dx.get(), dsrc.get(), P, dim, gb.as<bf16>(), nullptr),
        "gather bf16");
  BOOST_TEST(rel_err(gf.download(), gathered) == 0.0);  // copies: exact
  BOOST_TEST(rel_err(from_bf16_bits(gb.download()), round_bf16(gathered)) == 0.0);
  for (int with_gate = 0; with_gate < 2; ++with_gate) {
    std::vector<float> want(size_t(T * dim));
    for (int t = 0; t < T; ++t) {
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0.0f;
        for (int j = 0; j < K; ++j)
          acc += w[size_t(t * K + j)] * ye[size_t(pos[size_t(t * K + j)] * dim + d)];
        if (with_gate) acc += g[size_t(t)] * ys[size_t(t * dim + d)];
        want[size_t(t * dim + d)] = acc;
      }
    }
    DevArray<float> out(want.size());
    check(sy::cuda::moe_combine(dye.get(), dpos.get(), dw.get(), T, K, dim,
                                with_gate ? dg.get() : nullptr, with_gate ? dys.get() : nullptr,
                                out.get(), nullptr),
          "combine");
    BOOST_TEST(rel_err(out.download(), want) < kTolF32, "gate " << with_gate);
  }
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
// The same for a quantized file run with f32 weights: the CPU reference engine's arithmetic
// (dequantized weights, f32 activations), while llama.cpp rounds every quantized product's
// activations to 8 bits. The zoo's README measured that gap on zoo-mixtral-q4_k_m at up to 0.32
// in logprob; test_engine_zoo allows a first difference below llama.cpp margins of 0.35.
constexpr double kQuantNearTie = 0.35;
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

// The zoo file zoo-`file` on case `index`: logits against the CPU and greedy ids against
// llama.cpp's, up to a first difference where llama.cpp's margin is below `near_tie` (or, for a
// quantized file, withheld: test_engine_zoo's rule).
void check_zoo_file(const std::string& file, size_t index, double near_tie = kNearTie,
                    bool quantized = false) {
  BOOST_TEST_CONTEXT("zoo-" << file << " case " << index) {
    const Reference r = zoo_case(file, index);
    const auto model = sy::Model::load(zoo_path(file, ".gguf"));
    const std::vector<int32_t> ids = run_both(model, r.prompt);
    BOOST_REQUIRE_GE(r.generated.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == r.generated[i]) continue;
      BOOST_TEST(((r.margin[i] >= 0.0 || quantized) && r.margin[i] < near_tie),
                 "token " << i << ": " << ids[i] << " where llama.cpp has " << r.generated[i]
                          << " at margin " << r.margin[i]);
      break;  // past a near-tie the continuations legitimately part
    }
  }
}

void check_zoo(const std::string& name, size_t index) {
  check_zoo_file(name + "-f32", index);
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

// ---- mixtures of experts ----
// The zoo's router margins are >= 0.62 along every reference sequence (its README), so both
// engines pick the same experts and kLogitTol holds as for the dense files: measured 0.8e-6 to
// 1.2e-6 (f32 and Q4_K_M files, one and several sequences). A wrong step moves them by far more:
// Mixtral's weights not renormalised 0.017 to 0.038, qwen2moe's shared expert ungated 0.28 to
// 0.40, olmoe's q/k norms per head instead of whole-row 0.058 to 0.091. Prompts of more than 16
// tokens (kMoeDeviceMaxTokens in gpu/cuda_engine.cu) take the cuBLASLt expert path in their
// prefill, shorter ones and every decode step the device-grouped path.

// Mixtral-style llama: 4 experts, top 2 renormalised; a 19-token prompt (cuBLASLt path).
BOOST_AUTO_TEST_CASE(zoo_mixtral_experts) {
  check_zoo("mixtral", 3);
}

// qwen2moe: 8 experts, top 2 as they are, the sigmoid-gated shared expert, Q/K/V biases; a
// 14-token prompt (device path).
BOOST_AUTO_TEST_CASE(zoo_qwen2moe_shared_expert) {
  check_zoo("qwen2moe", 0);
}

// olmoe: RMSNorm over the whole q and k rows before NEOX RoPE, 8 experts top 2; a 14-token
// prompt (device path).
BOOST_AUTO_TEST_CASE(zoo_olmoe_whole_row_qk_norm) {
  check_zoo("olmoe", 0);
}

// llama-quantize's Mixtral Q4_K_M: Q4_K gate/up experts, Q4_K (layers 0-1) and Q6_K (2-3) down
// experts, each expert's slice converted by its own type; an 18-token prompt (cuBLASLt path).
// With f32 weights, as the CPU reference engine; with bf16 weights (how a quantized file is
// served), the logits of a prefill of the whole prompt (cuBLASLt path) and of its first 12
// tokens (device path) within kBf16LogitTol of the CPU reference engine's.
BOOST_AUTO_TEST_CASE(zoo_mixtral_q4_k_m_experts) {
  const std::string file = "mixtral-q4_k_m";
  check_zoo_file(file, 2, kQuantNearTie, true);
  const Reference r = zoo_case(file, 2);
  const auto model = sy::Model::load(zoo_path(file, ".gguf"));
  BOOST_REQUIRE(model->weights().layers.at(3).exp_down.at(0).type == sy::kernels::DType::Q6_K);
  BOOST_REQUIRE(model->weights().layers.at(0).exp_down.at(0).type == sy::kernels::DType::Q4_K);
  const auto prefill = [&](sy::Engine& e, size_t n) {
    const std::vector<int32_t> bt = {*e.pool().alloc(), *e.pool().alloc()};
    sy::SeqStep s;
    s.tokens = r.prompt.data();
    s.n_tokens = static_cast<int32_t>(n);
    s.block_table = bt.data();
    s.n_blocks = 2;
    sy::StepOutput out;
    e.step({s}, out);
    return std::vector<float>(out.row(0), out.row(0) + out.n_vocab);
  };
  sy::EngineOptions co;
  co.reference = true;
  co.n_blocks = 8;
  const auto cpu = sy::make_cpu_engine(model, co);
  sy::CudaEngineOptions o;
  o.n_blocks = 8;
  o.max_batch_tokens = 64;
  o.max_logit_rows = 4;
  const auto bf = sy::make_cuda_engine(model, o);
  for (size_t n : {r.prompt.size(), size_t{12}}) {
    const double e = rel_err(prefill(*bf, n), prefill(*cpu, n));
    BOOST_TEST_MESSAGE("mixtral q4_k_m bf16, " << n << " tokens: normwise logit gap to the CPU "
                                               << e);
    BOOST_TEST(e < kBf16LogitTol, n << " tokens");
  }
}

// Several sequences per step through the routing (zoo-mixtral-f32): prompts of 2 to 4 tokens in
// one prefill step, then decode steps of every sequence at once. With 3 sequences the
// decode steps take the device path and, with cuda_graphs, replay as graphs (padded to 4 rows);
// with 17 (a 51-token prefill) they exceed kMoeDeviceMaxTokens, so they run directly on the
// cuBLASLt path even with cuda_graphs on (a synchronisation inside a capture fails on the
// emulator). The direct engine's logits against the CPU reference engine's; the graph engine's
// device-greedy ids against the direct engine's argmax.
BOOST_AUTO_TEST_CASE(moe_batches_and_graphs) {
  constexpr int kSteps = 2;     // decode steps after the prefill: a graph captured, then replayed
  constexpr int kMaxSeqs = 17;  // one 16-slot KV block each: every sequence stays under 8 tokens
  const auto model = sy::Model::load(zoo_path("mixtral-f32", ".gguf"));
  const int32_t V = model->config().n_vocab;
  // The same engines for both batches: each batch starts its sequences afresh in blocks 0..n-1.
  sy::EngineOptions co;
  co.reference = true;
  co.n_blocks = kMaxSeqs;
  co.kv_type = sy::kernels::DType::F32;
  auto cpu = sy::make_cpu_engine(model, co);
  sy::CudaEngineOptions go;
  go.f32_weights = true;
  go.kv_type = sy::kernels::DType::F32;
  go.n_blocks = kMaxSeqs;
  go.max_batch_tokens = 64;
  go.max_logit_rows = 32;
  auto direct = sy::make_cuda_engine(model, go);
  go.cuda_graphs = true;
  auto graphs = sy::make_cuda_engine(model, go);
  for (int n_seq : {3, kMaxSeqs}) {
    BOOST_TEST_CONTEXT(n_seq << " sequences") {
      std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(n_seq));
      std::vector<int32_t> n_past(size_t(n_seq), 0), bt(static_cast<size_t>(n_seq));
      for (int i = 0; i < n_seq; ++i) {
        for (int k = 0; k < 2 + i % 3; ++k)
          tokens[size_t(i)].push_back(1 + (37 * i + 11 * k) % (V - 1));
        bt[size_t(i)] = i;
      }
      double worst = 0.0;
      for (int step = 0; step <= kSteps; ++step) {
        std::vector<sy::SeqStep> batch(static_cast<size_t>(n_seq));
        for (int i = 0; i < n_seq; ++i) {
          sy::SeqStep& s = batch[size_t(i)];
          s.tokens = tokens[size_t(i)].data() + n_past[size_t(i)];
          s.n_tokens = static_cast<int32_t>(tokens[size_t(i)].size()) - n_past[size_t(i)];
          s.n_past = n_past[size_t(i)];
          s.block_table = &bt[size_t(i)];
          s.n_blocks = 1;
        }
        sy::StepOutput oc, og;
        cpu->step(batch, oc);
        direct->step(batch, og);
        std::vector<int32_t> ids(static_cast<size_t>(n_seq)), dev;
        for (int i = 0; i < n_seq; ++i) {
          const double e = row_err(og.row(size_t(i)), oc.row(size_t(i)), V);
          BOOST_TEST(e < kLogitTol, "step " << step << " seq " << i << ": " << e);
          worst = std::max(worst, e);
          ids[size_t(i)] = argmax(og.row(size_t(i)), V);
        }
        if (step == 0) {
          sy::StepOutput ograph;
          graphs->step(batch, ograph);
          for (int i = 0; i < n_seq; ++i) dev.push_back(argmax(ograph.row(size_t(i)), V));
        } else {
          BOOST_REQUIRE(graphs->step_greedy(batch, dev));
        }
        BOOST_TEST(dev == ids, boost::test_tools::per_element());
        for (int i = 0; i < n_seq; ++i) {
          n_past[size_t(i)] = static_cast<int32_t>(tokens[size_t(i)].size());
          tokens[size_t(i)].push_back(ids[size_t(i)]);
        }
      }
      BOOST_TEST_MESSAGE("mixtral, "
                         << n_seq << " sequences: largest normwise logit gap to the CPU " << worst);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_gpu_archs
