// The legacy block types Q4_1, Q5_0, Q5_1 and IQ4_NL: block sizes, dequantization of the blocks
// llama-quantize wrote into the zoo files against the f32 weights they came from, the fast
// matmul against the reference, and this project's quantizers.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/quants.hpp"
#include "model/gguf.hpp"

BOOST_AUTO_TEST_SUITE(test_kernels_legacy)

using namespace sy::kernels;
namespace gguf = sy::gguf;

namespace {

const std::string kZoo = std::string(SY_MODELS_DIR) + "/zoo/";

struct TypeCase {
  DType type;
  const char* zoo;  // zoo-llama3-<zoo>.gguf
  size_t block_bytes;
  // Relative RMS error (|x - deq(q(x))| / |x| over a whole tensor) bounds, measured on the zoo's
  // normal weights: llama-quantize's blocks (worst tensor: Q4_1 0.0794, Q5_0 0.0431, Q5_1 0.0381,
  // IQ4_NL 0.0766) and, the same for our quantizer, with a margin of about 5 %.
  double rel_rms;
};
const TypeCase kCases[] = {
    {DType::Q4_1, "q4_1", 20, 0.084},
    {DType::Q5_0, "q5_0", 22, 0.046},
    {DType::Q5_1, "q5_1", 24, 0.041},
    {DType::IQ4_NL, "iq4_nl", 18, 0.081},
};

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

std::vector<float> dequant(DType t, const uint8_t* src, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const size_t rb = row_bytes(t, cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t, src + r * rb, out.data() + r * cols, cols);
  return out;
}

std::vector<uint8_t> quantize_rows(DType t, const float* x, int64_t rows, int64_t cols) {
  const size_t rb = row_bytes(t, cols);
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, x + r * cols, out.data() + r * rb, cols);
  return out;
}

double rel_rms(const float* x, const float* y, size_t n) {
  double e = 0, s = 0;
  for (size_t i = 0; i < n; ++i) {
    e += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    s += double{x[i]} * x[i];
  }
  return std::sqrt(e / s);
}

/// Per-element error bound of one block of a linear type, from the block's stored scale d (and
/// minimum m): rounding to the nearest level costs d/2 (Q5_0's clamped extreme a whole d), and
/// the f16 rounding of d and m (relative 2^-11) moves each level by at most |q| |d| 2^-11 + |m|
/// 2^-11. Subnormal f16 values round to a spacing of 2^-24 instead: at most 2^-25 per field,
/// times |q| for d.
double linear_bound(DType t, const uint8_t* blk) {
  const double d = std::fabs(half_at(blk));
  const double eps = 0x1p-11, sub = 0x1p-25;
  switch (t) {
    case DType::Q4_1:
      return d * (0.5 + 15 * eps) + std::fabs(half_at(blk + 2)) * eps + 16 * sub;
    case DType::Q5_1:
      return d * (0.5 + 31 * eps) + std::fabs(half_at(blk + 2)) * eps + 32 * sub;
    case DType::Q5_0:
      return d * (1.0 + 16 * eps) + 16 * sub;
    default:
      return 1e30;
  }
}

struct ZooTensor {
  std::vector<float> f32;  // the weights before quantization
  const uint8_t* q;        // llama-quantize's blocks (inside qf)
  int64_t rows, cols;
};

ZooTensor zoo_tensor(const gguf::File& ff, const gguf::File& qf, const gguf::TensorInfo& qt) {
  const gguf::TensorInfo* ft = ff.tensor(qt.name);
  BOOST_REQUIRE_MESSAGE(ft != nullptr, qt.name);
  BOOST_REQUIRE(ft->type == DType::F32);
  BOOST_REQUIRE(ft->dims == qt.dims);
  ZooTensor z;
  z.cols = static_cast<int64_t>(qt.dims[0]);
  z.rows = static_cast<int64_t>(qt.n_elements) / z.cols;
  z.f32.resize(qt.n_elements);
  std::memcpy(z.f32.data(), ff.data(*ft), qt.n_elements * 4);
  z.q = qf.data(qt);
  return z;
}

}  // namespace

BOOST_AUTO_TEST_CASE(block_sizes) {
  for (const TypeCase& c : kCases) {
    const quant::TypeOps* o = quant::ops(c.type);
    BOOST_REQUIRE_MESSAGE(o != nullptr, dtype_name(c.type));
    BOOST_TEST(static_cast<size_t>(dtype_block_bytes(c.type)) == c.block_bytes);
    BOOST_TEST(row_bytes(c.type, 32) == c.block_bytes);
    BOOST_TEST(row_bytes(c.type, 4096) == 128 * c.block_bytes);
    BOOST_TEST(dtype_block_elems(c.type) == 32);
    BOOST_CHECK_THROW(row_bytes(c.type, 48), std::invalid_argument);
    // activations: one int8 per element plus a float per block (and a sum for Q4_1 / Q5_1)
    const bool sums = c.type == DType::Q4_1 || c.type == DType::Q5_1;
    BOOST_TEST(o->act_bytes(256) == 256u + 8 * (sums ? 8u : 4u));
  }
}

BOOST_AUTO_TEST_CASE(hand_made_blocks) {
  // One block per type with known fields, decoded by the layout rules of ggml-common.h.
  const uint16_t d = f32_to_f16(0.5f), m = f32_to_f16(-2.0f);
  uint8_t qs[16];
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  const uint32_t qh = 0xA5C3F00Fu;
  auto nib = [&](int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; };
  auto bit5 = [&](int j) { return static_cast<int>(qh >> j & 1u) << 4; };
  const int kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (const TypeCase& c : kCases) {
    std::vector<uint8_t> blk(c.block_bytes);
    std::memcpy(blk.data(), &d, 2);
    size_t at = 2;
    if (c.type == DType::Q4_1 || c.type == DType::Q5_1) {
      std::memcpy(blk.data() + at, &m, 2);
      at += 2;
    }
    if (c.type == DType::Q5_0 || c.type == DType::Q5_1) {
      std::memcpy(blk.data() + at, &qh, 4);
      at += 4;
    }
    std::memcpy(blk.data() + at, qs, 16);
    BOOST_REQUIRE(at + 16 == c.block_bytes);
    float out[32];
    dequantize_row(c.type, blk.data(), out, 32);
    for (int j = 0; j < 32; ++j) {
      float want = 0;
      switch (c.type) {
        case DType::Q4_1:
          want = 0.5f * static_cast<float>(nib(j)) - 2.0f;
          break;
        case DType::Q5_0:
          want = 0.5f * static_cast<float>((nib(j) | bit5(j)) - 16);
          break;
        case DType::Q5_1:
          want = 0.5f * static_cast<float>(nib(j) | bit5(j)) - 2.0f;
          break;
        default:
          want = 0.5f * static_cast<float>(kv[nib(j)]);
          break;
      }
      BOOST_TEST(out[j] == want, dtype_name(c.type) << " element " << j);
    }
  }
}

BOOST_AUTO_TEST_CASE(zoo_blocks_match_the_f32_weights) {
  // The zoo's quantized llama3 files were made by llama-quantize from the f32 file's weights:
  // every tensor of the file's type decodes to within the type's bounds of its f32 source.
  const gguf::File ff = gguf::File::open(kZoo + "zoo-llama3-f32.gguf");
  for (const TypeCase& c : kCases) {
    const gguf::File qf = gguf::File::open(kZoo + "zoo-llama3-" + c.zoo + ".gguf");
    int n_tensors = 0;
    double worst = 0;
    for (const gguf::TensorInfo& qt : qf.tensors()) {
      if (qt.type != c.type) continue;
      ++n_tensors;
      const ZooTensor z = zoo_tensor(ff, qf, qt);
      const std::vector<float> y = dequant(c.type, z.q, z.rows, z.cols);
      const double e = rel_rms(z.f32.data(), y.data(), y.size());
      worst = std::max(worst, e);
      BOOST_TEST(e <= c.rel_rms, c.zoo << " " << qt.name << " rel rms " << e);
      if (c.type == DType::IQ4_NL) continue;
      const size_t nb = y.size() / 32;
      size_t bad = 0;
      for (size_t b = 0; b < nb; ++b) {
        const double bound = linear_bound(c.type, z.q + b * c.block_bytes);
        for (size_t j = b * 32; j < b * 32 + 32; ++j)
          if (std::fabs(double{z.f32[j]} - y[j]) > bound) ++bad;
      }
      BOOST_TEST(bad == 0u, c.zoo << " " << qt.name);
    }
    BOOST_TEST_MESSAGE(c.zoo << ": " << n_tensors << " tensors, worst rel rms " << worst);
    BOOST_TEST(n_tensors == 29, c.zoo);  // token_embd and 7 matrices x 4 layers
  }
}

BOOST_AUTO_TEST_CASE(own_quantizer_matches_llama_quantize) {
  // On the same f32 weights our quantizers write what llama-quantize wrote (Q4_1, Q5_0, Q5_1:
  // the same reference rules, so the same bytes but for float rounding ties) or (IQ4_NL, a
  // search) blocks at least as accurate within 1 %.
  const gguf::File ff = gguf::File::open(kZoo + "zoo-llama3-f32.gguf");
  for (const TypeCase& c : kCases) {
    const gguf::File qf = gguf::File::open(kZoo + "zoo-llama3-" + c.zoo + ".gguf");
    size_t blocks = 0, same = 0;
    for (const char* name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"}) {
      const ZooTensor z = zoo_tensor(ff, qf, *qf.tensor(name));
      const std::vector<uint8_t> ours = quantize_rows(c.type, z.f32.data(), z.rows, z.cols);
      const size_t nb = ours.size() / c.block_bytes;
      for (size_t b = 0; b < nb; ++b, ++blocks)
        same += std::memcmp(ours.data() + b * c.block_bytes, z.q + b * c.block_bytes,
                            c.block_bytes) == 0;
      const std::vector<float> yo = dequant(c.type, ours.data(), z.rows, z.cols);
      const std::vector<float> yl = dequant(c.type, z.q, z.rows, z.cols);
      const double eo = rel_rms(z.f32.data(), yo.data(), yo.size());
      const double el = rel_rms(z.f32.data(), yl.data(), yl.size());
      BOOST_TEST_MESSAGE(c.zoo << " " << name << ": ours " << eo << ", llama-quantize " << el);
      BOOST_TEST(eo <= el * 1.01, c.zoo << " " << name);
      BOOST_TEST(eo <= c.rel_rms);
    }
    const double frac = static_cast<double>(same) / static_cast<double>(blocks);
    BOOST_TEST_MESSAGE(c.zoo << ": " << same << " of " << blocks << " blocks byte-identical");
    if (c.type != DType::IQ4_NL) BOOST_TEST(frac >= 0.999, c.zoo << " identical " << frac);
  }
}

BOOST_AUTO_TEST_CASE(quantizer_round_trip) {
  // Normal data with outliers, an all-zero block, a constant block, tiny values and a block whose
  // extreme is negative: per-element bounds for the linear types, RMS bounds for IQ4_NL.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 32 * 64;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = nd(rng);
  for (int i = 0; i < 20; ++i) x[static_cast<size_t>(rng() % n)] *= 12.0f;  // outliers
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
  std::fill(x.begin() + 64, x.begin() + 96, 3.25f);
  for (int j = 96; j < 128; ++j) x[static_cast<size_t>(j)] = 1e-6f * static_cast<float>(j - 110);
  x[130] = -40.0f;
  const int64_t nn = 32 * 256;
  std::vector<float> normal(static_cast<size_t>(nn));
  for (float& v : normal) v = nd(rng);
  for (const TypeCase& c : kCases) {
    const std::vector<uint8_t> q = quantize_rows(c.type, x.data(), 1, n);
    const std::vector<float> y = dequant(c.type, q.data(), 1, n);
    for (int j = 32; j < 64; ++j) BOOST_TEST(y[static_cast<size_t>(j)] == 0.0f, c.zoo);
    if (c.type == DType::Q4_1 || c.type == DType::Q5_1) {
      for (int j = 64; j < 96; ++j) BOOST_TEST(y[static_cast<size_t>(j)] == 3.25f, c.zoo);
    }
    // Plain normal data: the relative RMS bound measured on the zoo's normal weights.
    const std::vector<float> yn =
        dequant(c.type, quantize_rows(c.type, normal.data(), 1, nn).data(), 1, nn);
    BOOST_TEST(rel_rms(normal.data(), yn.data(), yn.size()) <= c.rel_rms, c.zoo);
    if (c.type == DType::IQ4_NL) {
      // A 16-level codebook: the extreme element kept within 1/8 of its value (its level is
      // searched near the codebook's end), tiny values within 1/8 of the block's extreme.
      BOOST_TEST(std::fabs(y[130] + 40.0f) <= 40.0f / 8);
      for (int j = 96; j < 128; ++j)
        BOOST_TEST(std::fabs(y[static_cast<size_t>(j)] - x[static_cast<size_t>(j)]) <= 17e-6 / 8);
      continue;
    }
    for (int64_t b = 0; b < n / 32; ++b) {
      const double bound = linear_bound(c.type, q.data() + b * c.block_bytes);
      for (int64_t j = b * 32; j < b * 32 + 32; ++j)
        BOOST_TEST(std::fabs(double{x[j]} - y[j]) <= bound, c.zoo << " element " << j);
    }
  }
}

namespace {

// What the fast path computes, emulated in double: activations quantized per block of 32 as
// llama.cpp's Q8_0 / Q8_1 (d = amax / 127 stored as f16, values rounded to nearest), then the
// exact dot product with the dequantized weights. Returns the quantized x in xq.
void emulate_act(const float* x, int64_t n, std::vector<double>& xq) {
  xq.resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const double d16 = f16_to_f32(f32_to_f16(d));
    for (int j = 0; j < 32; ++j) xq[b * 32 + j] = std::nearbyint(x[b * 32 + j] * id) * d16;
  }
}

void check_matmul(DType t, const uint8_t* wq, int64_t rows, int64_t cols, int64_t n_tok,
                  ThreadPool* pool, const char* what) {
  std::mt19937 rng(static_cast<unsigned>(rows * 31 + n_tok));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tok * cols));
  for (float& v : x) v = nd(rng);
  const WeightView w{t, wq, rows, cols};
  std::vector<float> fast(static_cast<size_t>(n_tok * rows)), ref(fast.size());
  matmul(w, x.data(), n_tok, fast.data(), pool);
  ref::matmul(w, x.data(), n_tok, ref.data());
  const std::vector<float> wd = dequant(t, wq, rows, cols);
  std::vector<double> xq;
  size_t bad_bound = 0, bad_emul = 0;
  for (int64_t tk = 0; tk < n_tok; ++tk) {
    const float* xt = x.data() + tk * cols;
    emulate_act(xt, cols, xq);
    for (int64_t r = 0; r < rows; ++r) {
      const float* wr = wd.data() + r * cols;
      // Bound from 8-bit activations: each block's values move by at most d/2 (rounding) plus
      // 127 d 2^-11 (the f16 scale), d = amax / 127; Q4_1/Q5_1 add the f16 rounding of d*sum.
      double bound = 0, emul = 0, mag = 0;
      for (int64_t b = 0; b < cols / 32; ++b) {
        float amax = 0;
        double wabs = 0;
        for (int j = 0; j < 32; ++j) {
          amax = std::max(amax, std::fabs(xt[b * 32 + j]));
          wabs += std::fabs(wr[b * 32 + j]);
        }
        const double d = amax / 127.0;
        bound += wabs * d * (0.5 + 127 * 0x1p-11) * 1.01;
        if (t == DType::Q4_1 || t == DType::Q5_1) {
          const uint8_t* blk = wq + r * row_bytes(t, cols) + b * row_bytes(t, 32);
          bound += std::fabs(half_at(blk + 2)) * 32 * amax * 0x1p-11;
        }
      }
      for (int64_t k = 0; k < cols; ++k) {
        emul += double{wr[k]} * xq[k];
        mag += std::fabs(double{wr[k]} * xq[k]);
      }
      const double yf = fast[tk * rows + r], yr = ref[tk * rows + r];
      if (std::fabs(yf - yr) > bound + 1e-6 * mag) ++bad_bound;
      // Float summation order and the f16 block sum of Q8_1 are all that separate the fast path
      // from the emulation: 2^-10 of the magnitude covers both.
      if (std::fabs(yf - emul) > 1e-3 * mag + 1e-6) ++bad_emul;
    }
  }
  BOOST_TEST(bad_bound == 0u, what << " " << dtype_name(t) << " tokens " << n_tok);
  BOOST_TEST(bad_emul == 0u, what << " " << dtype_name(t) << " tokens " << n_tok);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fast_matmul_vs_reference_zoo_weights) {
  // llama-quantize's blocks (an FFN-down matrix, 768 columns = 24 blocks) times random tokens.
  ThreadPool pool(2);
  for (const TypeCase& c : kCases) {
    const gguf::File qf = gguf::File::open(kZoo + "zoo-llama3-" + c.zoo + ".gguf");
    const gguf::TensorInfo* t = qf.tensor("blk.1.ffn_down.weight");
    BOOST_REQUIRE(t != nullptr);
    BOOST_REQUIRE(t->type == c.type);
    for (int64_t n_tok : {1, 2, 7})
      check_matmul(c.type, qf.data(*t), static_cast<int64_t>(t->dims[1]),
                   static_cast<int64_t>(t->dims[0]), n_tok, n_tok == 7 ? &pool : nullptr, "zoo");
  }
}

BOOST_AUTO_TEST_CASE(fast_matmul_vs_reference_odd_shapes) {
  // Our quantizer's blocks; 13 blocks per row (an odd count: the two-block SIMD loop's tail)
  // and 37 rows (not a multiple of the 16-row tasks).
  ThreadPool pool(2);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  const int64_t rows = 37, cols = 32 * 13;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = nd(rng) + 0.01f;  // an offset, so Q4_1/Q5_1 minima matter
  for (const TypeCase& c : kCases) {
    const std::vector<uint8_t> q = quantize_rows(c.type, w.data(), rows, cols);
    for (int64_t n_tok : {1, 3, 5}) check_matmul(c.type, q.data(), rows, cols, n_tok, &pool, "own");
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_kernels_legacy
