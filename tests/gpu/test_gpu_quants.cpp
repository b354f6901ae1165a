// Parity of the CUDA backend's quantized types with the CPU reference: every quantized weight
// type dequantized on the device (f32 and bf16) against kernels::dequantize_row, gemv_q against
// a double-precision product of the CPU-dequantized weights, the refusals of partial blocks and
// unknown types, and Q4_K_M and IQ4_XS models (make-model's and the zoo's: types mixed per
// tensor) whose CUDA logits match the CPU reference engine's, through prefill products and
// through gemv_q decode steps.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/gemv_q.cuh"
#include "model/make_model.hpp"
#include "tests/gpu/gpu_test.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_gpu_quants)

using namespace sy::gputest;
using sy::cuda::bf16;
using sy::kernels::DType;

BOOST_TEST_GLOBAL_FIXTURE(RequireGpu);

namespace {

// Every quantized type the CPU side reads (Q8_0 and Q4_0 too: they share the decoders now).
const DType kTypes[] = {DType::Q8_0, DType::Q4_0,   DType::Q4_1, DType::Q5_0,
                        DType::Q5_1, DType::IQ4_NL, DType::Q2_K, DType::Q3_K,
                        DType::Q4_K, DType::Q5_K,   DType::Q6_K, DType::IQ4_XS};

std::string name(DType t) {
  return sy::kernels::dtype_name(t);
}

std::vector<uint8_t> quantized_rows(DType t, const std::vector<float>& x, int64_t rows,
                                    int64_t cols) {
  const size_t rb = sy::kernels::row_bytes(t, cols);
  std::vector<uint8_t> q(rb * rows);
  for (int64_t r = 0; r < rows; ++r)
    sy::kernels::quantize_row(t, x.data() + r * cols, q.data() + r * rb, cols);
  return q;
}
std::vector<float> dequantized(DType t, const std::vector<uint8_t>& q, int64_t rows, int64_t cols) {
  const size_t rb = sy::kernels::row_bytes(t, cols);
  std::vector<float> o(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    sy::kernels::dequantize_row(t, q.data() + r * rb, o.data() + r * cols, cols);
  return o;
}

// Byte offsets of the f16 scale fields in one block of t (ggml-common.h's layouts).
std::vector<int> f16_fields(DType t) {
  switch (t) {
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
      return {0, 2};
    case DType::Q2_K:
      return {80, 82};
    case DType::Q3_K:
      return {108};
    case DType::Q6_K:
      return {208};
    default:
      return {0};
  }
}

// Rows of random bytes (every code, scale and sign-bit pattern, including those a quantizer
// never writes) with finite f16 scales of either sign in [2^-8, 2).
std::vector<uint8_t> random_blocks(DType t, int64_t rows, int64_t cols) {
  const size_t rb = sy::kernels::row_bytes(t, cols);
  const int64_t be = sy::kernels::dtype_block_elems(t);
  const size_t bb = rb / static_cast<size_t>(cols / be);
  std::vector<uint8_t> q(rb * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> mag(-8.0f, 1.0f);
  for (uint8_t& b : q) b = static_cast<uint8_t>(byte(rng()));
  for (size_t at = 0; at < q.size(); at += bb) {
    for (int off : f16_fields(t)) {
      const float v = std::exp2(mag(rng())) * (byte(rng()) < 128 ? -1.0f : 1.0f);
      const uint16_t h = sy::kernels::f32_to_f16(v);
      std::memcpy(q.data() + at + off, &h, 2);
    }
  }
  return q;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, std::fabs(double{x}));
  return m;
}

// Device dequantization of q (rows, cols of t) against the CPU reference `want`:
// - f32: within 2^-22 of the matrix's largest magnitude. The device forms mul * code + add as one
//   FMA with mul and add rounded as the reference rounds them; a reference built without FMA
//   differs by one rounding of the product (2^-24 relative to it, and |product| is at most twice
//   the largest magnitude, as |add| is). Exact where both fuse alike (the emulator here).
// - bf16: the f32 value rounded to nearest even: within 2^-9 relative of it, so within
//   2^-8 * |want| + the f32 bound of the reference value.
void check_dequant(DType t, const std::vector<uint8_t>& q, int64_t rows, int64_t cols,
                   const char* what) {
  const std::vector<float> want = dequantized(t, q, rows, cols);
  const double f32_bound = std::ldexp(max_abs(want), -22);
  DevArray<uint8_t> dq(q);
  DevArray<float> of(want.size());
  DevArray<uint16_t> ob(want.size());
  check(sy::cuda::convert_rows<float>(t, dq.get(), rows, cols, of.get(), nullptr), "f32");
  check(sy::cuda::convert_rows<bf16>(t, dq.get(), rows, cols, ob.as<bf16>(), nullptr), "bf16");
  const std::vector<float> got = of.download();
  const std::vector<float> gotb = from_bf16_bits(ob.download());
  size_t bad = 0, badb = 0, exact = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i];
    if (!(std::fabs(got[i] - w) <= f32_bound)) ++bad;
    if (!(std::fabs(gotb[i] - w) <= std::ldexp(std::fabs(w), -8) + f32_bound)) ++badb;
    exact += got[i] == want[i] ? 1 : 0;
  }
  BOOST_TEST(bad == 0u, name(t) << " " << what << ": " << bad << " f32 values off");
  BOOST_TEST(badb == 0u, name(t) << " " << what << ": " << badb << " bf16 values off");
  BOOST_TEST_MESSAGE(name(t) << " " << what << ": " << exact << " of " << want.size()
                             << " f32 values exact");
}

}  // namespace

// Three rows of two super-blocks (16 legacy blocks) each, so block and row indexing both show:
// rows quantized by the CPU quantizer (row scales 0.1, 1, 10), and rows of random bytes.
BOOST_AUTO_TEST_CASE(dequantize_every_type_matches_cpu_reference) {
  const int64_t rows = 3, cols = 512;
  for (DType t : kTypes) {
    std::vector<float> x = randn(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) x[r * cols + c] *= std::pow(10.0f, float(r - 1));
    check_dequant(t, quantized_rows(t, x, rows, cols), rows, cols, "quantized");
    check_dequant(t, random_blocks(t, rows, cols), rows, cols, "random blocks");
  }
}

BOOST_AUTO_TEST_CASE(partial_blocks_and_unknown_types_are_refused) {
  DevArray<uint8_t> buf(4096);
  DevArray<float> out(1024), x(1024);
  // 128 columns: half a K-quant super-block; 48: not whole 32-element blocks either
  for (DType t : {DType::Q2_K, DType::Q4_K, DType::Q6_K, DType::IQ4_XS}) {
    BOOST_TEST(sy::cuda::convert_rows<float>(t, buf.get(), 2, 128, out.get(), nullptr) ==
                   cudaErrorInvalidValue,
               name(t));
    BOOST_TEST(sy::cuda::gemv_q(t, buf.get(), 2, 128, x.get(), 1, out.get(), nullptr) ==
                   cudaErrorInvalidValue,
               name(t));
  }
  BOOST_TEST(sy::cuda::convert_rows<float>(DType::Q5_0, buf.get(), 2, 48, out.get(), nullptr) ==
             cudaErrorInvalidValue);
  BOOST_TEST(sy::cuda::convert_rows<float>(static_cast<DType>(99), buf.get(), 2, 256, out.get(),
                                           nullptr) == cudaErrorInvalidValue);
  // a ggml type the converter has no decoder for (Q8_1: sized by the reader, no kernels)
  BOOST_TEST(!sy::cuda::convert_supports(DType::Q8_1));
  BOOST_TEST(sy::cuda::convert_rows<float>(DType::Q8_1, buf.get(), 2, 256, out.get(), nullptr) ==
             cudaErrorInvalidValue);
  // gemv_q reads quantized blocks only; an output stride below the row count and activations
  // off 16-byte alignment are refused
  BOOST_TEST(sy::cuda::gemv_q(DType::F16, buf.get(), 2, 256, x.get(), 1, out.get(), nullptr) ==
             cudaErrorInvalidValue);
  BOOST_TEST(sy::cuda::gemv_q(DType::Q4_K, buf.get(), 4, 256, x.get(), 1, out.get(), nullptr,
                              3) == cudaErrorInvalidValue);
  BOOST_TEST(sy::cuda::gemv_q(DType::Q4_K, buf.get(), 2, 256, x.get(),
                              sy::cuda::kGemvMaxTokens + 1, out.get(),
                              nullptr) == cudaErrorInvalidValue);
  BOOST_TEST(sy::cuda::gemv_q(DType::Q8_0, buf.get(), 2, 32, x.get() + 1, 1, out.get(),
                              nullptr) == cudaErrorInvalidValue);
  check(cudaDeviceSynchronize(), "no launch was made");
  std::vector<float> o = out.download();
  BOOST_TEST(std::all_of(o.begin(), o.end(), [](float v) { return std::isnan(v); }));
}

// gemv_q on 37 rows (a partial block of 8 warps) of 1280 columns (40 chunks of 32: lanes 0-7
// take two, so the lane loop wraps) for 1, 3 and 8 tokens, written with an output stride of
// rows + 3: the 3 entries between token rows keep their NaN poison. The reference is the double
// product of the CPU-dequantized weights; the device sums in f32 (per group, then per lane, then
// across the warp), whose error is far below 1e-4 of the largest output for 1280 terms of
// unit-scale inputs.
BOOST_AUTO_TEST_CASE(gemv_every_type_matches_cpu_product) {
  const int64_t rows = 37, cols = 1280, ldy = rows + 3;
  for (DType t : kTypes) {
    const std::vector<uint8_t> q = quantized_rows(t, randn(size_t(rows * cols)), rows, cols);
    const std::vector<float> w = dequantized(t, q, rows, cols);
    DevArray<uint8_t> dq(q);
    for (int n : {1, 3, 8}) {
      const std::vector<float> x = randn(size_t(n * cols));
      std::vector<float> want(size_t(n * rows));
      for (int i = 0; i < n; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0.0;
          for (int64_t c = 0; c < cols; ++c) s += double{w[r * cols + c]} * x[i * cols + c];
          want[i * rows + r] = static_cast<float>(s);
        }
      }
      DevArray<float> dx(x), dy(size_t(n * ldy));
      check(sy::cuda::gemv_q(t, dq.get(), rows, cols, dx.get(), n, dy.get(), nullptr, ldy),
            "gemv_q");
      const std::vector<float> y = dy.download();
      std::vector<float> got(want.size());
      bool gaps_untouched = true;
      for (int i = 0; i < n; ++i) {
        std::copy_n(y.begin() + i * ldy, rows, got.begin() + i * rows);
        for (int64_t r = rows; r < ldy; ++r)
          gaps_untouched = gaps_untouched && std::isnan(y[i * ldy + r]);
      }
      BOOST_TEST(rel_err(got, want) < kTolF32, name(t) << " n=" << n);
      BOOST_TEST(gaps_untouched, name(t) << " n=" << n);
    }
  }
}

namespace {

// Logits of two sequences, every row: they prefill 9 and 6 tokens in one step (15 rows: matrix
// products on the dequantized copies), then decode 3 steps of one token each (2 rows: gemv_q
// with quantized_decode).
std::vector<float> two_sequences(sy::Engine& e, const std::vector<std::vector<int32_t>>& toks) {
  const int32_t prompt[2] = {9, 6};
  std::vector<std::vector<int32_t>> bt(2);
  for (auto& b : bt) b.push_back(*e.pool().alloc());
  std::vector<float> all;
  sy::StepOutput o;
  for (int step = 0; step < 4; ++step) {
    std::vector<sy::SeqStep> batch;
    for (size_t i = 0; i < 2; ++i) {
      sy::SeqStep s;
      s.n_past = step == 0 ? 0 : prompt[i] + step - 1;
      s.n_tokens = step == 0 ? prompt[i] : 1;
      s.tokens = toks[i].data() + s.n_past;
      s.block_table = bt[i].data();
      s.n_blocks = 1;
      s.all_logits = true;
      batch.push_back(s);
    }
    e.step(batch, o);
    all.insert(all.end(), o.logits.begin(), o.logits.end());
  }
  for (auto& b : bt) e.pool().free(b[0]);
  return all;
}

// two_sequences on the CUDA engine against the CPU reference engine (which dequantizes each row
// with kernels::dequantize_row and sums in f32):
// - f32 weights: the device's dequantized weights equal the CPU reference's (or within 2^-22, as
//   above), so only summation order differs: 1e-3, as for the f32 files of test_gpu_engine;
// - the same with quantized_decode (the decode steps through gemv_q): another order, 1e-3; its
//   weight_bytes() grows by the file bytes of the layer and output matrices, which shows that
//   the engine took the gemv_q path;
// - bf16 weights and activations: roundings of 2^-9 compounded over 4 layers, 5e-2 as elsewhere.
void matches_cpu_engine(const std::shared_ptr<sy::LlamaModel>& model, const std::string& what) {
  const auto& wts = model->weights();
  const int32_t n_vocab = model->config().n_vocab;
  std::vector<std::vector<int32_t>> toks(2, std::vector<int32_t>(12));
  for (auto& t : toks)
    for (int32_t& x : t) x = std::uniform_int_distribution<int32_t>(3, n_vocab - 1)(rng());
  sy::EngineOptions co;
  co.reference = true;
  const std::vector<float> want = two_sequences(*sy::make_cpu_engine(model, co), toks);
  size_t qbytes = sy::kernels::row_bytes(wts.output.type, wts.output.cols) * wts.output.rows;
  for (const auto& L : wts.layers) {
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      qbytes += sy::kernels::row_bytes(m->type, m->cols) * m->rows;
  }
  const auto bytes = [](const std::unique_ptr<sy::Engine>& e) {
    return dynamic_cast<const sy::CudaEngine&>(*e).weight_bytes();
  };
  sy::CudaEngineOptions o;
  o.n_blocks = 8;
  o.f32_weights = true;
  const auto plain = sy::make_cuda_engine(model, o);
  const double e_plain = rel_err(two_sequences(*plain, toks), want);
  BOOST_TEST(e_plain < 1e-3, what << ": f32 " << e_plain);
  o.quantized_decode = true;
  const auto gemv = sy::make_cuda_engine(model, o);
  BOOST_TEST(bytes(gemv) == bytes(plain) + qbytes, what);
  const double e_gemv = rel_err(two_sequences(*gemv, toks), want);
  BOOST_TEST(e_gemv < 1e-3, what << ": gemv_q " << e_gemv);
  o.f32_weights = false;
  const auto bf = sy::make_cuda_engine(model, o);
  const double e_bf = rel_err(two_sequences(*bf, toks), want);
  BOOST_TEST(e_bf < 5e-2, what << ": bf16 " << e_bf);
}

}  // namespace

// A Q4_K_M file of make-model's mini shape (dim 256, 4 layers, FFN 768; every row a whole number
// of super-blocks) with a 512-token vocabulary: Q4_K matrices, Q6_K output and the attn_v /
// ffn_down of layers 2 and 3 (so their fused q|k|v is two runs of two types), f32 norms.
BOOST_AUTO_TEST_CASE(q4_k_m_model_matches_cpu_engine) {
  std::shared_ptr<sy::LlamaModel> model;
  {
    const sy::test::TempDir dir("sy_gpu_quants_");  // gone at the brace: the model is loaded
    sy::MakeModelOptions mo;
    mo.shape = "mini";
    mo.dtype = "q4_k_m";
    mo.seed = rng()();
    mo.vocab_from = std::string(SY_MODELS_DIR) + "/zoo/zoo-llama3-f32.gguf";
    mo.out = dir.file("m.gguf");
    sy::make_model(mo);
    model = sy::LlamaModel::load(mo.out);
  }
  const auto& wts = model->weights();
  BOOST_REQUIRE(wts.layers.size() == 4u);
  BOOST_TEST(name(wts.output.type) == "Q6_K");
  BOOST_TEST(name(wts.layers[0].wq.type) == "Q4_K");
  BOOST_TEST(name(wts.layers[0].wv.type) == "Q4_K");
  BOOST_TEST(name(wts.layers[3].wv.type) == "Q6_K");
  BOOST_TEST(name(wts.layers[3].w_down.type) == "Q6_K");
  BOOST_REQUIRE(model->config().n_vocab == 512);
  matches_cpu_engine(model, "make-model q4_k_m");
}

// llama-quantize's own files from the zoo (Llama-3.1-style, with rope_freqs), as people
// download them: its Q4_K_M mix (Q4_K, Q6_K for output and the attn_v / ffn_down of layers 2
// and 3) and IQ4_XS (the non-linear codebook in 256-element super-blocks, Q6_K output).
BOOST_AUTO_TEST_CASE(zoo_quantized_files_match_cpu_engine) {
  for (const char* f : {"zoo-llama3-q4_k_m.gguf", "zoo-llama3-iq4_xs.gguf"}) {
    matches_cpu_engine(sy::LlamaModel::load(std::string(SY_MODELS_DIR) + "/zoo/" + f), f);
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_gpu_quants
