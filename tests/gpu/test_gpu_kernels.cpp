// Parity of every CUDA kernel with the CPU reference (kernels::ref or a plain loop here): fresh
// random inputs each run, outputs poisoned with NaN before the launch, error bounds by dtype.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemv_q.cuh"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sample.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "tests/gpu/gpu_test.hpp"

BOOST_AUTO_TEST_SUITE(test_gpu_kernels)

using namespace sy::gputest;
namespace ref = sy::kernels::ref;
using sy::cuda::bf16;

BOOST_TEST_GLOBAL_FIXTURE(RequireGpu);

BOOST_AUTO_TEST_CASE(embedding_gathers_rows) {
  const int V = 97, dim = 80, T = 13;
  const std::vector<float> table = round_bf16(randn(size_t{V} * dim));
  std::vector<int32_t> tok(T);
  for (int32_t& t : tok) t = std::uniform_int_distribution<int>(0, V - 1)(rng());
  std::vector<float> want(size_t{T} * dim);
  for (int t = 0; t < T; ++t)
    std::copy_n(table.begin() + tok[t] * dim, dim, want.begin() + t * dim);

  DevArray<float> tf(table);
  DevArray<uint16_t> tb(to_bf16_bits(table));
  DevArray<int32_t> dt(tok);
  DevArray<float> out(want.size());
  check(sy::cuda::embedding<float>(tf.get(), dt.get(), T, dim, out.get(), nullptr), "f32");
  BOOST_TEST(rel_err(out.download(), want) == 0.0);
  out.poison();
  check(sy::cuda::embedding<bf16>(tb.as<bf16>(), dt.get(), T, dim, out.get(), nullptr), "bf16");
  BOOST_TEST(rel_err(out.download(), want) == 0.0);
}

BOOST_AUTO_TEST_CASE(rmsnorm_with_residual_add) {
  const int rows = 9, dim = 300;
  const float eps = 1e-5f;
  const std::vector<float> x = randn(size_t{rows} * dim), add = randn(size_t{rows} * dim),
                           w = randn(dim);
  std::vector<float> sum(x.size()), want(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + add[i];
  for (int r = 0; r < rows; ++r)
    ref::rmsnorm(want.data() + r * dim, sum.data() + r * dim, w.data(), dim, eps);

  DevArray<float> dx(x), da(add), dw(w), out(want.size());
  check(sy::cuda::rmsnorm_add<float>(dx.get(), da.get(), dw.get(), nullptr, out.get(), rows, dim,
                                     eps, nullptr),
        "f32");
  BOOST_TEST(rel_err(out.download(), want) < kTolF32);
  BOOST_TEST(rel_err(dx.download(), sum) < kTolF32);

  // bf16 output, no add, and a row map picking rows 7 and 2
  DevArray<float> dx2(sum);
  const std::vector<int32_t> map = {7, 2};
  DevArray<int32_t> dmap(map);
  DevArray<uint16_t> ob(2 * size_t{dim});
  check(sy::cuda::rmsnorm_add<bf16>(dx2.get(), nullptr, dw.get(), dmap.get(), ob.as<bf16>(), 2, dim,
                                    eps, nullptr),
        "bf16");
  std::vector<float> want2(2 * size_t{dim});
  std::copy_n(want.begin() + 7 * dim, dim, want2.begin());
  std::copy_n(want.begin() + 2 * dim, dim, want2.begin() + dim);
  BOOST_TEST(rel_err(from_bf16_bits(ob.download()), want2) < kTolBf16);
}

BOOST_AUTO_TEST_CASE(rope_matches_reference) {
  const int T = 11, n_heads = 6, hd = 64, rope_dim = 48;
  const int64_t stride = n_heads * hd + 40;  // rows wider than the rotated heads, as in q|k|v
  const float base = 10000.0f;
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(rope_dim));
  std::vector<float> x = randn(size_t(T * stride));
  std::vector<int32_t> pos(T);
  for (int32_t& p : pos) p = std::uniform_int_distribution<int>(0, 4095)(rng());
  std::vector<float> want = x;
  for (int t = 0; t < T; ++t)
    ref::rope(want.data() + t * stride, n_heads, hd, rope_dim, pos[t], base);

  DevArray<float> dx(x);
  DevArray<int32_t> dp(pos);
  check(sy::cuda::rope(dx.get(), stride, T, n_heads, hd, rope_dim, dp.get(), theta_scale, nullptr),
        "rope");
  BOOST_TEST(rel_err(dx.download(), want) < kTolF32);
}

BOOST_AUTO_TEST_CASE(swiglu_matches_reference) {
  const int rows = 5, ffn = 333;
  const std::vector<float> gu = randn(size_t{rows} * 2 * ffn, 3.0f);
  std::vector<float> want(size_t{rows} * ffn);
  for (int r = 0; r < rows; ++r) {
    std::vector<float> g(gu.begin() + r * 2 * ffn, gu.begin() + r * 2 * ffn + ffn);
    ref::swiglu(g.data(), gu.data() + r * 2 * ffn + ffn, ffn);
    std::copy(g.begin(), g.end(), want.begin() + r * ffn);
  }
  DevArray<float> dgu(gu), of(want.size());
  DevArray<uint16_t> ob(want.size());
  check(sy::cuda::swiglu<float>(dgu.get(), rows, ffn, of.get(), nullptr), "f32");
  check(sy::cuda::swiglu<bf16>(dgu.get(), rows, ffn, ob.as<bf16>(), nullptr), "bf16");
  BOOST_TEST(rel_err(of.download(), want) < kTolF32);
  BOOST_TEST(rel_err(from_bf16_bits(ob.download()), want) < kTolBf16);
}

// ---- paged attention ----

namespace {

// The host's image of a device element type U (float, bf16 or half): what a host vector of it
// holds, and the values U can hold exactly.
template <class U>
struct Host {
  using type = float;
  static std::vector<float> round(const std::vector<float>& v) { return v; }
  static std::vector<float> encode(const std::vector<float>& v) { return v; }
  static std::vector<float> decode(const std::vector<float>& v) { return v; }
};
template <const Bits16& F>
struct Host16 {
  using type = uint16_t;
  static std::vector<float> round(const std::vector<float>& v) { return decode(encode(v)); }
  static std::vector<uint16_t> encode(const std::vector<float>& v) { return to_bits(v, F); }
  static std::vector<float> decode(const std::vector<uint16_t>& v) { return from_bits(v, F); }
};
template <>
struct Host<bf16> : Host16<kBf16Bits> {};
template <>
struct Host<half> : Host16<kF16Bits> {};

// A batch of sequences over a shuffled paged cache, its reference outputs, and device copies of
// the metadata in the layout the kernels read.
struct AttnCase {
  int n_heads = 8, n_kv = 2, hd = 64, bs = 16, window = 0;
  int sinks = 0;  // with window > 0: StreamingLLM sinks, scored with the second query qs
  // The layer's own attention (PagedKv): window (replaces a wider or absent row window, and then
  // no sinks), score scale (0: 1 / sqrt(hd)) and soft-cap (0: none).
  int layer_window = 0;
  float scale = 0.0f, softcap = 0.0f;
  std::vector<int> n_past, n_new;
  int T = 0, n_slots = 0;
  std::vector<float> q, qs, k, v;  // q, qs (T, n_heads * hd); k, v (n_slots, n_kv * hd)
  std::vector<int32_t> bt, bt_off, row_seq, nkeys, row_sinks;
  std::vector<float> want;  // (T, n_heads * hd)

  // The cache holds C: its keys and values are drawn as values C holds exactly.
  template <class C>
  void build() {
    const int kv_dim = n_kv * hd, q_dim = n_heads * hd;
    int n_blocks = 0;
    for (size_t s = 0; s < n_past.size(); ++s) n_blocks += (n_past[s] + n_new[s] + bs - 1) / bs;
    n_blocks += 3;  // unused blocks, so that a wrong table entry reads foreign data
    n_slots = n_blocks * bs;
    std::vector<int32_t> perm(n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    k = Host<C>::round(randn(size_t(n_slots) * kv_dim));
    v = Host<C>::round(randn(size_t(n_slots) * kv_dim));
    int used = 0;
    for (size_t s = 0; s < n_past.size(); ++s) {
      bt_off.push_back(static_cast<int32_t>(bt.size()));
      const int nb = (n_past[s] + n_new[s] + bs - 1) / bs;
      for (int b = 0; b < nb; ++b) bt.push_back(perm[used++]);
      for (int i = 0; i < n_new[s]; ++i) {
        row_seq.push_back(static_cast<int32_t>(s));
        nkeys.push_back(n_past[s] + i + 1);
        row_sinks.push_back(sinks);
      }
    }
    T = static_cast<int>(row_seq.size());
    q = randn(size_t(T) * q_dim);
    qs = randn(size_t(T) * q_dim);
    want.assign(size_t(T) * q_dim, 0.0f);
    const float sc_mul = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(hd));
    const bool layer_rules = layer_window > 0 && (window == 0 || layer_window < window);
    const int w = layer_rules ? layer_window : window;
    for (int t = 0; t < T; ++t) {
      const int32_t* table = bt.data() + bt_off[row_seq[t]];
      const int nk = nkeys[t];
      const int start = w > 0 ? std::max(0, nk - w) : 0;
      // visible: sink slots [0, ns) with the sink query, then window slots [start, nk)
      const int ns = w > 0 && !layer_rules ? std::min(sinks, start) : 0;
      std::vector<int> keys;
      for (int j = 0; j < ns; ++j) keys.push_back(j);
      for (int j = start; j < nk; ++j) keys.push_back(j);
      for (int h = 0; h < n_heads; ++h) {
        const int g = h / (n_heads / n_kv);
        std::vector<float> sc;
        for (size_t x = 0; x < keys.size(); ++x) {
          const int j = keys[x];
          const int64_t slot = int64_t{table[j / bs]} * bs + j % bs;
          const float* qh = (j < ns ? qs : q).data() + t * q_dim + h * hd;
          sc.push_back(ref::dot(qh, k.data() + slot * kv_dim + g * hd, hd) * sc_mul);
        }
        if (softcap > 0.0f) ref::softcap(sc.data(), static_cast<int64_t>(sc.size()), softcap);
        ref::softmax(sc.data(), static_cast<int64_t>(sc.size()));
        float* o = want.data() + t * q_dim + h * hd;
        for (size_t x = 0; x < keys.size(); ++x) {
          const int j = keys[x];
          const int64_t slot = int64_t{table[j / bs]} * bs + j % bs;
          ref::axpy(sc[x], v.data() + slot * kv_dim + g * hd, o, hd);
        }
      }
    }
  }
};

// The case on a cache of C (float or half) with output T (float or bf16), against the reference.
template <class C, class T>
void run_attention(AttnCase& c, bool prefill, int n_splits, bool tensor_cores = false) {
  c.build<C>();
  const int q_dim = c.n_heads * c.hd;
  DevArray<float> dq(c.q), dqs(c.qs);
  DevArray<int32_t> dbt(c.bt), doff(c.bt_off), dseq(c.row_seq), dnk(c.nkeys), dsinks(c.row_sinks);
  DevArray<typename Host<C>::type> dk(Host<C>::encode(c.k)), dv(Host<C>::encode(c.v));
  DevArray<typename Host<T>::type> out(c.want.size());
  sy::cuda::PagedKv<C> kv;
  kv.k = dk.template as<C>();
  kv.v = dv.template as<C>();
  kv.block_tables = dbt.get();
  kv.seq_bt_off = doff.get();
  kv.row_seq = dseq.get();
  kv.row_nkeys = dnk.get();
  kv.block_size = c.bs;
  kv.window = c.window;
  kv.layer_window = c.layer_window;
  kv.scale = c.scale;
  kv.softcap = c.softcap;
  if (c.sinks > 0) {
    kv.row_sinks = dsinks.get();
    kv.q_sink = dqs.get();
    kv.q_sink_stride = q_dim;
  }
  if (prefill) {
    // tiles of consecutive rows of one sequence
    std::vector<int32_t> r0, len;
    int row = 0;
    for (size_t s = 0; s < c.n_new.size(); ++s) {
      for (int i = 0; i < c.n_new[s]; i += sy::cuda::kPrefillTileRows) {
        r0.push_back(row + i);
        len.push_back(std::min(sy::cuda::kPrefillTileRows, c.n_new[s] - i));
      }
      row += c.n_new[s];
    }
    DevArray<int32_t> dr0(r0), dlen(len);
    check(sy::cuda::attention_prefill(dq.get(), q_dim, kv, dr0.get(), dlen.get(),
                                      static_cast<int>(r0.size()), c.n_heads, c.n_kv, c.hd,
                                      out.template as<T>(), q_dim, nullptr, tensor_cores),
          "prefill");
  } else {
    std::vector<int32_t> rows(c.T);
    std::iota(rows.begin(), rows.end(), 0);
    DevArray<int32_t> drows(rows);
    DevArray<float> ws(sy::cuda::attention_decode_workspace(c.T, c.n_heads, c.hd, n_splits));
    check(sy::cuda::attention_decode(dq.get(), q_dim, kv, drows.get(), c.T, c.n_heads, c.n_kv, c.hd,
                                     n_splits, ws.get(), out.template as<T>(), q_dim, nullptr),
          "decode");
  }
  // The reference sees the cache's exact values, so f32 arithmetic on them stays within
  // kTolF32; the tensor-core prefill rounds queries and probabilities to half (kTolF16), and a
  // bf16 output adds a rounding of up to 2^-8 (kTolBf16), which outweighs both.
  const bool tc = prefill && tensor_cores && std::is_same_v<C, half> && c.hd % 16 == 0;
  const double tol = std::is_same_v<T, bf16> ? kTolBf16 : tc ? kTolF16 : kTolF32;
  const double err = rel_err(Host<T>::decode(out.download()), c.want);
  BOOST_TEST_MESSAGE((prefill ? "prefill" : "decode")
                     << (tc ? " (tensor cores)" : "") << ": rel_err " << err);
  BOOST_TEST(err < tol);
}

}  // namespace

// f32 outputs over an f32 cache and over an f16 one (the engine's default cache; its values are
// exact inputs to f32 arithmetic, so kTolF32 holds for both).
BOOST_AUTO_TEST_CASE(decode_attention_gqa_split_f32_and_f16_cache) {
  for (int splits : {1, 3, 16}) {
    AttnCase c;
    c.n_past = {0, 17, 300, 1029};
    c.n_new = {1, 1, 2, 1};
    AttnCase h = c;  // copied unbuilt: build() appends to the metadata
    run_attention<float, float>(c, false, splits);
    run_attention<half, float>(h, false, splits);
  }
}

// bf16 outputs (the bf16 engine's activations) over an f16 cache (its default) and an f32 one;
// and stories260K's small heads.
BOOST_AUTO_TEST_CASE(decode_attention_bf16_output_and_small_heads) {
  AttnCase c;
  c.n_past = {5, 130, 700};
  c.n_new = {1, 1, 1};
  AttnCase f = c;
  run_attention<half, bf16>(c, false, 4);
  run_attention<float, bf16>(f, false, 4);
  AttnCase s;  // stories260K's shape: head_dim 8, 8 query heads on 4 KV heads
  s.n_heads = 8;
  s.n_kv = 4;
  s.hd = 8;
  s.n_past = {3, 40};
  s.n_new = {1, 1};
  AttnCase h = s;  // copied unbuilt: build() appends to the metadata
  run_attention<float, float>(s, false, 2);
  run_attention<half, float>(h, false, 2);
}

BOOST_AUTO_TEST_CASE(decode_attention_sliding_window) {
  AttnCase c;
  c.window = 50;
  c.n_past = {10, 200};
  c.n_new = {1, 1};
  run_attention<float, float>(c, false, 3);
}

BOOST_AUTO_TEST_CASE(prefill_attention_causal_tiles) {
  AttnCase c;
  c.n_past = {0, 45, 0};
  c.n_new = {37, 20, 5};
  run_attention<float, float>(c, true, 1);
  AttnCase b;
  b.hd = 128;
  b.n_heads = 4;
  b.n_kv = 1;
  b.n_past = {64};
  b.n_new = {50};
  AttnCase f = b;  // copied unbuilt: build() appends to the metadata
  run_attention<half, bf16>(b, true, 1);
  run_attention<float, bf16>(f, true, 1);
  for (bool tc : {false, true}) {
    AttnCase t;  // Llama-3-8B's head shape, several key tiles, GQA 4:1
    t.hd = 128;
    t.n_heads = 8;
    t.n_kv = 2;
    t.n_past = {0, 100};
    t.n_new = {150, 33};
    // f32 output (an f32-weight engine's f16 cache): the half roundings of the tensor-core
    // kernel alone, against the tighter kTolF16
    AttnCase t32 = t;
    run_attention<half, bf16>(t, true, 1, tc);
    run_attention<half, float>(t32, true, 1, tc);
    AttnCase u;  // head_dim 64, a window cutting into the tiles
    u.window = 70;
    u.n_past = {90};
    u.n_new = {40};
    AttnCase u32 = u;
    run_attention<half, bf16>(u, true, 1, tc);
    run_attention<half, float>(u32, true, 1, tc);
  }
  AttnCase w;
  w.window = 20;
  w.n_past = {30};
  w.n_new = {40};
  run_attention<float, float>(w, true, 1);
}

// StreamingLLM sinks: a row sees slots [0, min(sinks, start)) scored with its sink query, then its
// window; rows still inside sinks + window see everything (no sink query at all).
BOOST_AUTO_TEST_CASE(decode_attention_sinks) {
  for (int splits : {1, 3, 16}) {
    AttnCase c;
    c.window = 20;
    c.sinks = 4;
    c.n_past = {10, 21, 30, 300};
    c.n_new = {1, 1, 2, 1};
    run_attention<float, float>(c, false, splits);
  }
  AttnCase b;  // f16 cache, sinks spanning several blocks, a window of one key
  b.window = 1;
  b.sinks = 37;
  b.n_past = {5, 60, 500};
  b.n_new = {1, 1, 1};
  run_attention<half, bf16>(b, false, 4);
  AttnCase z;  // sinks(0, W) is the plain sliding window
  z.window = 50;
  z.sinks = 0;
  z.n_past = {10, 200};
  z.n_new = {1, 1};
  run_attention<float, float>(z, false, 3);
}

// A layer's own attention (gemma2, phi3): its window where narrower than the row's (then without
// sinks), its query scale and its score soft-cap, in both kernels. Scores of std ~2 against a cap
// of 3 are changed a lot by the cap, so a kernel ignoring it fails at once.
BOOST_AUTO_TEST_CASE(attention_layer_window_scale_softcap) {
  // (layer window, row window, sinks, f16 cache and bf16 output, prefill, splits, tensor cores)
  const auto run = [](AttnCase c, int lw, int w, int sinks, bool f16, bool prefill, int splits,
                      bool tc) {
    c.layer_window = lw;
    c.window = w;
    c.sinks = sinks;
    c.scale = 0.3f;
    c.softcap = 3.0f;
    if (f16) {
      run_attention<half, bf16>(c, prefill, splits, tc);
    } else {
      run_attention<float, float>(c, prefill, splits, tc);
    }
  };
  AttnCase d;
  d.n_past = {5, 40, 100};
  d.n_new = {1, 2, 1};
  run(d, 16, 0, 0, false, false, 3, false);   // the layer's window alone
  run(d, 16, 50, 4, false, false, 2, false);  // narrower than the row's: no sinks
  run(d, 80, 20, 4, false, false, 3, false);  // wider: the row's window and sinks
  run(d, 0, 0, 0, true, false, 1, false);     // scale and cap alone
  AttnCase p;
  p.n_past = {0, 30};
  p.n_new = {40, 20};
  run(p, 20, 0, 0, false, true, 1, false);
  run(p, 20, 45, 4, false, true, 1, false);
  for (bool tc : {false, true}) run(p, 24, 0, 0, true, true, 1, tc);
}

BOOST_AUTO_TEST_CASE(prefill_attention_sinks) {
  AttnCase c;  // rows crossing sinks + window inside one tile, several tiles
  c.window = 16;
  c.sinks = 4;
  c.n_past = {0, 7};
  c.n_new = {60, 40};
  run_attention<float, float>(c, true, 1);
  AttnCase w;  // more sinks than one key tile of either kernel (32 and 64 keys)
  w.window = 50;
  w.sinks = 70;
  w.n_past = {100};
  w.n_new = {45};
  run_attention<float, float>(w, true, 1);
  for (bool tc : {false, true}) {
    AttnCase t;
    t.hd = 128;
    t.window = 24;
    t.sinks = 4;
    t.n_past = {0, 100};
    t.n_new = {90, 33};
    run_attention<half, bf16>(t, true, 1, tc);
    AttnCase u;
    u.window = 50;
    u.sinks = 70;
    u.n_past = {100};
    u.n_new = {45};
    run_attention<half, float>(u, true, 1, tc);
  }
}

namespace {
// kv_store into a cache of C: every written entry is the source value rounded once to C (the
// CPU's rounding, to the bit), every other slot keeps its poison.
template <class C>
void check_kv_store() {
  const int T = 4, kv_dim = 48, stride = 200, k_off = 64, v_off = 112, n_slots = 10;
  const std::vector<float> src = randn(size_t{T} * stride);
  const std::vector<int32_t> slot = {7, 0, 3, 9};
  DevArray<float> dsrc(src);
  DevArray<typename Host<C>::type> kc(size_t{n_slots} * kv_dim), vc(size_t{n_slots} * kv_dim);
  DevArray<int32_t> ds(slot);
  check(sy::cuda::kv_store(dsrc.get(), stride, k_off, v_off, T, kv_dim, ds.get(),
                           kc.template as<C>(), vc.template as<C>(), nullptr),
        "kv_store");
  const std::vector<float> k = Host<C>::decode(kc.download()), v = Host<C>::decode(vc.download());
  const std::vector<float> want = Host<C>::round(src);
  for (int t = 0; t < T; ++t) {
    for (int d = 0; d < kv_dim; ++d) {
      BOOST_TEST(k[slot[t] * kv_dim + d] == want[t * stride + k_off + d]);
      BOOST_TEST(v[slot[t] * kv_dim + d] == want[t * stride + v_off + d]);
    }
  }
  BOOST_TEST(std::isnan(k[1 * kv_dim]));  // untouched slots keep their poison
}
}  // namespace

BOOST_AUTO_TEST_CASE(kv_store_writes_slots) {
  check_kv_store<float>();
  check_kv_store<half>();
}

// ---- weights: conversion, quantized GEMV, cuBLASLt ----

namespace {
std::vector<uint8_t> quantized_rows(sy::kernels::DType t, const std::vector<float>& x, int64_t rows,
                                    int64_t cols) {
  const size_t rb = sy::kernels::row_bytes(t, cols);
  std::vector<uint8_t> q(rb * rows);
  for (int64_t r = 0; r < rows; ++r)
    sy::kernels::quantize_row(t, x.data() + r * cols, q.data() + r * rb, cols);
  return q;
}
std::vector<float> dequantized(sy::kernels::DType t, const std::vector<uint8_t>& q, int64_t rows,
                               int64_t cols) {
  const size_t rb = sy::kernels::row_bytes(t, cols);
  std::vector<float> o(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    sy::kernels::dequantize_row(t, q.data() + r * rb, o.data() + r * cols, cols);
  return o;
}
}  // namespace

BOOST_AUTO_TEST_CASE(convert_every_type) {
  using sy::kernels::DType;
  const int64_t rows = 7, cols = 96;
  const std::vector<float> x = randn(size_t(rows * cols));
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    const std::vector<uint8_t> q = quantized_rows(t, x, rows, cols);
    const std::vector<float> want = dequantized(t, q, rows, cols);
    DevArray<uint8_t> dq(q);
    DevArray<float> of(want.size());
    DevArray<uint16_t> ob(want.size());
    check(sy::cuda::convert_rows<float>(t, dq.get(), rows, cols, of.get(), nullptr), "f32");
    check(sy::cuda::convert_rows<bf16>(t, dq.get(), rows, cols, ob.as<bf16>(), nullptr), "bf16");
    BOOST_TEST(rel_err(of.download(), want) == 0.0, "type " << static_cast<int>(t));
    BOOST_TEST(rel_err(from_bf16_bits(ob.download()), want) < kTolBf16);
  }
}

BOOST_AUTO_TEST_CASE(gemv_quantized) {
  using sy::kernels::DType;
  const int64_t rows = 300, cols = 1024;
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    for (int n : {1, 3, 8}) {
      const std::vector<uint8_t> q = quantized_rows(t, randn(size_t(rows * cols)), rows, cols);
      const std::vector<float> w = dequantized(t, q, rows, cols);
      const std::vector<float> x = randn(size_t(n * cols));
      std::vector<float> want(size_t(n * rows));
      for (int i = 0; i < n; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0.0;
          for (int64_t c = 0; c < cols; ++c) s += double{w[r * cols + c]} * x[i * cols + c];
          want[i * rows + r] = static_cast<float>(s);
        }
      }
      DevArray<uint8_t> dq(q);
      DevArray<float> dx(x), dy(want.size());
      check(sy::cuda::gemv_q(t, dq.get(), rows, cols, dx.get(), n, dy.get(), nullptr), "gemv_q");
      BOOST_TEST(rel_err(dy.download(), want) < kTolF32);
    }
  }
}

BOOST_AUTO_TEST_CASE(gemm_cublaslt_f32_and_bf16) {
  sy::cuda::Gemm gemm;
  for (auto [rows, cols, n] : {std::tuple{64, 64, 1}, {172, 64, 5}, {512, 256, 37}, {96, 172, 2}}) {
    const std::vector<float> w = round_bf16(randn(size_t(rows * cols))),
                             x = round_bf16(randn(size_t(n * cols)));
    std::vector<float> want(size_t(n * rows));
    ref::matmul(sy::kernels::WeightView{sy::kernels::DType::F32, w.data(), rows, cols}, x.data(), n,
                want.data());
    DevArray<float> dw(w), dx(x), dy(want.size());
    CUBLAS_CHECK(gemm.run<float>(dw.get(), dx.get(), rows, cols, n, dy.get(), nullptr));
    BOOST_TEST(rel_err(dy.download(), want) < kTolF32);
    DevArray<uint16_t> bw(to_bf16_bits(w)), bx(to_bf16_bits(x));
    dy.poison();
    CUBLAS_CHECK(gemm.run<bf16>(bw.as<bf16>(), bx.as<bf16>(), rows, cols, n, dy.get(), nullptr));
    // bf16 inputs are exact here (pre-rounded); only the f32 summation order differs
    BOOST_TEST(rel_err(dy.download(), want) < 1e-3);
  }
}

// ---- sampling ----

BOOST_AUTO_TEST_CASE(sample_greedy_topk_topp) {
  const int rows = 64, V = 5000;
  std::vector<float> logits = randn(size_t(rows) * V, 2.0f);
  logits[3 * V + 10] = logits[3 * V + 20] = 50.0f;  // a tie: the lower id wins
  std::vector<sy::cuda::SampleParams> p(rows);
  DevArray<float> dl(logits);
  DevArray<int32_t> out(rows);
  const auto run = [&] {
    DevArray<sy::cuda::SampleParams> dp(p);
    out.poison();
    check(sy::cuda::sample(dl.get(), rows, V, dp.get(), out.get(), nullptr), "sample");
    return out.download();
  };
  const auto rank_of = [&](int r, int32_t id) {
    int above = 0;
    for (int i = 0; i < V; ++i) above += logits[r * V + i] > logits[r * V + id];
    return above;
  };
  // greedy, and top_k = 1 at any temperature, is the argmax
  std::vector<int32_t> got = run();
  for (int r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * V;
    BOOST_TEST(got[r] == std::max_element(x, x + V) - x);
  }
  BOOST_TEST(got[3] == 10);
  for (auto& q : p) {
    q.temperature = 0.8f;
    q.top_k = 1;
  }
  BOOST_TEST(run() == got);
  // top_k = 5: always one of the five highest; the same seed draws the same token
  for (int r = 0; r < rows; ++r) {
    p[r].top_k = 5;
    p[r].seed = 1000 + r;
    p[r].counter = 7;
  }
  got = run();
  for (int r = 0; r < rows; ++r) BOOST_TEST(rank_of(r, got[r]) < 5);
  BOOST_TEST(run() == got);
  // top_p: the draw lies in the nucleus (ranks whose mass before them is below top_p)
  for (int r = 0; r < rows; ++r) {
    p[r].top_k = 0;
    p[r].top_p = 0.3f;
    p[r].temperature = 1.0f;
  }
  got = run();
  for (int r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * V;
    const float mx = *std::max_element(x, x + V);
    double z = 0.0, before = 0.0;
    for (int i = 0; i < V; ++i) z += std::exp(double{x[i]} - mx);
    for (int i = 0; i < V; ++i)
      if (x[i] > x[got[r]]) before += std::exp(double{x[i]} - mx);
    BOOST_TEST(before / z < 0.3 + 1e-4);
  }
}

// A row with a NaN or +inf anywhere, or nothing but -inf, gets kNoToken under any parameters (as
// the host Sampler refuses it); the other rows of the launch keep their own argmax.
BOOST_AUTO_TEST_CASE(sample_non_finite_row_gets_no_token) {
  const int rows = 8, V = 3000;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = randn(size_t(rows) * V, 2.0f);
  logits[1 * V + 7] = std::numeric_limits<float>::quiet_NaN();  // one NaN among finite values
  for (int i = 0; i < V; ++i) logits[3 * V + i] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < V; ++i) logits[4 * V + i] = -inf;  // every token masked
  logits[5 * V + V - 1] = inf;
  for (int i = 0; i < V; ++i) logits[6 * V + i] = i % 2 ? -inf : 1.0f;  // masked, but finite
  const std::vector<bool> bad = {false, true, false, true, true, true, false, false};
  DevArray<float> dl(logits);
  std::vector<sy::cuda::SampleParams> p(rows);
  for (bool greedy : {true, false}) {
    // Not the poison's 0xff bytes: those read as -1, kNoToken itself.
    DevArray<int32_t> out(std::vector<int32_t>(rows, V + 1));
    for (int r = 0; r < rows; ++r) {
      p[r] = sy::cuda::SampleParams{};
      if (!greedy) {
        p[r].temperature = 0.7f;
        p[r].top_k = 40;
        p[r].top_p = 0.9f;
        p[r].seed = 50 + r;
      }
    }
    DevArray<sy::cuda::SampleParams> dp(p);
    check(sy::cuda::sample(dl.get(), rows, V, dp.get(), out.get(), nullptr), "sample");
    const std::vector<int32_t> got = out.download();
    for (int r = 0; r < rows; ++r) {
      BOOST_TEST_CONTEXT("row " << r << (greedy ? " greedy" : " sampled")) {
        const float* x = logits.data() + r * V;
        if (bad[r]) {
          BOOST_TEST(got[r] == sy::cuda::kNoToken);
        } else if (greedy) {
          BOOST_TEST(got[r] == std::max_element(x, x + V) - x);
        } else {
          BOOST_TEST(got[r] >= 0);
          BOOST_TEST(got[r] < V);
          BOOST_TEST(std::isfinite(x[got[r]]));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sample_frequencies_follow_softmax) {
  // Four tokens with probabilities 0.1 .. 0.4 at temperature 1; 20000 draws (different seeds)
  // land within 0.02 of them (about 6 standard deviations).
  const int rows = 20000, V = 4;
  const std::vector<float> probs = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r)
    for (float pr : probs) logits.push_back(std::log(pr));
  std::vector<sy::cuda::SampleParams> p(rows);
  const uint64_t base = rng()();
  for (int r = 0; r < rows; ++r) {
    p[r].temperature = 1.0f;
    p[r].seed = base + r;
  }
  DevArray<float> dl(logits);
  DevArray<sy::cuda::SampleParams> dp(p);
  DevArray<int32_t> out(rows);
  check(sy::cuda::sample(dl.get(), rows, V, dp.get(), out.get(), nullptr), "sample");
  std::vector<int> count(V, 0);
  for (int32_t t : out.download()) {
    BOOST_REQUIRE(t >= 0 && t < V);
    ++count[t];
  }
  for (int i = 0; i < V; ++i) BOOST_TEST(std::fabs(count[i] / double(rows) - probs[i]) < 0.02);
}

BOOST_AUTO_TEST_SUITE_END()  // test_gpu_kernels
