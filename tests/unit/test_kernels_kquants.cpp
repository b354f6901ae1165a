// Tests of the K-quants (Q2_K..Q6_K, IQ4_XS): block sizes, dequantization of llama.cpp-quantized
// zoo files against the f32 weights they were made from, Q8_K activations, the SIMD and portable
// dot products, and the quantizers' layout and error bound.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/quants.hpp"

BOOST_AUTO_TEST_SUITE(test_kernels_kquants)

using namespace sy::kernels;

namespace {

const std::string kZoo = std::string(SY_MODELS_DIR) + "/zoo/";

// ---- a minimal GGUF tensor directory (v2/v3), independent of model/gguf ----

struct Tensor {
  uint32_t type = 0;
  std::vector<uint64_t> dims;
  uint64_t offset = 0;
};

class Gguf {
 public:
  explicit Gguf(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    bytes_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (bytes_.size() < 24 || std::memcmp(bytes_.data(), "GGUF", 4) != 0)
      throw std::runtime_error(path + " is not a GGUF file");
    pos_ = 8;  // magic, version
    const uint64_t n_tensors = get<uint64_t>();
    const uint64_t n_kv = get<uint64_t>();
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const uint32_t t = get<uint32_t>();
      if (key == "general.alignment" && t == 4) {
        alignment = get<uint32_t>();
      } else {
        skip(t);
      }
    }
    for (uint64_t i = 0; i < n_tensors; ++i) {
      const std::string name = str();
      Tensor t;
      t.dims.resize(get<uint32_t>());
      for (auto& d : t.dims) d = get<uint64_t>();
      t.type = get<uint32_t>();
      t.offset = get<uint64_t>();
      tensors_[name] = t;
    }
    data_ = (pos_ + alignment - 1) / alignment * alignment;
  }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const uint8_t* data(const Tensor& t) const { return bytes_.data() + data_ + t.offset; }

 private:
  template <class T>
  T get() {
    if (pos_ + sizeof(T) > bytes_.size()) throw std::runtime_error("truncated GGUF");
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (pos_ + n > bytes_.size()) throw std::runtime_error("truncated GGUF");
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void skip(uint32_t t) {
    static const size_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == 8) {
      (void)str();
    } else if (t == 9) {
      const uint32_t et = get<uint32_t>();
      const uint64_t n = get<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) skip(et);
    } else if (t < 13) {
      pos_ += kSize[t];
    } else {
      throw std::runtime_error("bad GGUF value type");
    }
  }
  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
  size_t data_ = 0;
  std::map<std::string, Tensor> tensors_;
};

const Gguf& f32_zoo() {
  static const Gguf g(kZoo + "zoo-llama3-f32.gguf");
  return g;
}

int64_t elements(const Tensor& t) {
  int64_t n = 1;
  for (uint64_t d : t.dims) n *= static_cast<int64_t>(d);
  return n;
}

const DType kKTypes[] = {DType::Q2_K, DType::Q3_K, DType::Q4_K,
                         DType::Q5_K, DType::Q6_K, DType::IQ4_XS};
bool is_k(uint32_t t) {
  for (DType k : kKTypes)
    if (static_cast<uint32_t>(k) == t) return true;
  return false;
}

double rel_rms(const std::vector<float>& got, const float* want, size_t n) {
  double e = 0.0, s = 0.0;
  for (size_t i = 0; i < n; ++i) {
    e += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    s += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(e / s);
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Q8_K activation block as documented in ggml-common.h: f32 d, int8 qs[256], int16 bsums[16].
constexpr size_t kQ8KBytes = 4 + 256 + 32;

/// The decoded activations d * q of one token, read straight from the Q8_K bytes.
std::vector<double> decode_q8k(const uint8_t* a, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / 256; ++b) {
    const uint8_t* blk = a + b * kQ8KBytes;
    float d;
    std::memcpy(&d, blk, 4);
    for (int j = 0; j < 256; ++j)
      v[b * 256 + j] = static_cast<double>(d) * static_cast<int8_t>(blk[4 + j]);
  }
  return v;
}

// Per-type bounds on the relative RMS error of llama.cpp's quantization of the zoo weights
// (normal random weights): the measured values (see the dequantization test's message) with
// about 20% margin. A misplaced bit, nibble or scale gives errors near or above 100%.
double zoo_bound(DType t) {
  switch (t) {
    case DType::Q2_K:
      return 0.36;  // measured 0.296 (worst tensor 0.298)
    case DType::Q3_K:
      return 0.18;  // 0.151 (0.152)
    case DType::Q4_K:
      return 0.087;  // 0.0711 (0.0721)
    case DType::Q5_K:
      return 0.044;  // 0.0360 (0.0364)
    case DType::Q6_K:
      return 0.022;  // 0.0177 (0.0179)
    default:         // IQ4_XS: 0.0766 (0.0772)
      return 0.093;
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(block_sizes_are_ggml_ones) {
  BOOST_TEST(row_bytes(DType::Q2_K, 256) == 84u);
  BOOST_TEST(row_bytes(DType::Q3_K, 256) == 110u);
  BOOST_TEST(row_bytes(DType::Q4_K, 256) == 144u);
  BOOST_TEST(row_bytes(DType::Q5_K, 256) == 176u);
  BOOST_TEST(row_bytes(DType::Q6_K, 256) == 210u);
  BOOST_TEST(row_bytes(DType::IQ4_XS, 256) == 136u);
  BOOST_TEST(row_bytes(DType::Q4_K, 768) == 3u * 144u);
  for (DType t : kKTypes) {
    BOOST_TEST(dtype_block_elems(t) == 256);
    const quant::TypeOps* o = quant::ops(t);
    BOOST_REQUIRE(o != nullptr);
    BOOST_TEST(o->act_bytes(768) == 3 * kQ8KBytes);
    // The SIMD paths this build compiles are all reachable for the dot-product tests.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    BOOST_TEST(quant::k_ops_isa(t, 1) != nullptr);
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
    BOOST_TEST(quant::k_ops_isa(t, 2) != nullptr);
#endif
    BOOST_CHECK_THROW(row_bytes(t, 128), std::invalid_argument);
    std::vector<float> out(288);
    std::vector<uint8_t> in(2 * row_bytes(t, 256));
    BOOST_CHECK_THROW(dequantize_row(t, in.data(), out.data(), 288), std::invalid_argument);
  }
  try {
    (void)row_bytes(DType::Q6_K, 100);
    BOOST_FAIL("no error");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("Q6_K") != std::string::npos);
  }
}

// The zoo's K-quant files were made by llama-quantize from zoo-llama3-f32.gguf, so dequantizing
// a tensor must give back its f32 weights up to each type's quantization error; any mistake in
// the layout (field order, bit positions, scale packing) shows up as an error near 100%.
BOOST_AUTO_TEST_CASE(zoo_tensors_dequantize_to_their_f32_weights) {
  const Gguf& ref = f32_zoo();
  std::map<DType, std::pair<double, double>> err;  // type -> (sum sq error, sum sq weight)
  std::map<DType, int> count;
  std::map<DType, double> worst;  // the largest per-tensor error
  for (const char* file : {"q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"}) {
    const Gguf g(kZoo + "zoo-llama3-" + file + ".gguf");
    for (const auto& [name, t] : g.tensors()) {
      if (!is_k(t.type)) continue;
      const auto dt = static_cast<DType>(t.type);
      const auto it = ref.tensors().find(name);
      BOOST_REQUIRE(it != ref.tensors().end());
      BOOST_REQUIRE(it->second.type == 0u);
      BOOST_REQUIRE(elements(it->second) == elements(t));
      const int64_t n = elements(t);
      std::vector<float> got(static_cast<size_t>(n));
      dequantize_row(dt, g.data(t), got.data(), n);
      const auto* want = reinterpret_cast<const float*>(ref.data(it->second));
      const double r = rel_rms(got, want, got.size());
      BOOST_TEST_CONTEXT(file << " " << name << " " << dtype_name(dt)) {
        BOOST_TEST(r < zoo_bound(dt));
      }
      for (size_t i = 0; i < got.size(); ++i) {
        const double e = static_cast<double>(got[i]) - want[i];
        err[dt].first += e * e;
        err[dt].second += static_cast<double>(want[i]) * want[i];
      }
      worst[dt] = std::max(worst[dt], r);
      ++count[dt];
    }
  }
  for (DType t : kKTypes) {
    BOOST_TEST_CONTEXT(dtype_name(t)) {
      BOOST_TEST(count[t] > 0);
      const double r = std::sqrt(err[t].first / err[t].second);
      BOOST_TEST_MESSAGE(dtype_name(t) << ": " << count[t] << " tensors, relative RMS error " << r
                                       << ", worst tensor " << worst[t]);
      BOOST_TEST(r < zoo_bound(t));
    }
  }
}

// Q8_K as llama.cpp makes it: the value of largest magnitude becomes -127, d = -max / 127, codes
// round half to even, bsums hold the sums of 16 codes.
BOOST_AUTO_TEST_CASE(activations_quantize_to_q8k) {
  const quant::TypeOps* o = quant::ops(DType::Q4_K);
  std::vector<float> x = gaussian(512, 7);
  x[300] = 5.0f;  // the second block's extreme is positive: its code is -127, d negative
  std::vector<uint8_t> a(o->act_bytes(512));
  o->quantize_act(x.data(), a.data(), 512);
  for (int b = 0; b < 2; ++b) {
    const uint8_t* blk = a.data() + b * kQ8KBytes;
    float d;
    std::memcpy(&d, blk, 4);
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(x[b * 256 + j]) > amax) {
        amax = std::fabs(x[b * 256 + j]);
        mx = x[b * 256 + j];
      }
    }
    BOOST_TEST(d == 1.0f / (-127.0f / mx));
    for (int j = 0; j < 256; ++j) {
      const auto q = static_cast<int8_t>(blk[4 + j]);
      BOOST_TEST(q == static_cast<int>(std::nearbyint(-127.0f / mx * x[b * 256 + j])));
      BOOST_TEST(std::fabs(x[b * 256 + j] - d * q) <= std::fabs(d) * 0.5f * (1 + 1e-5f));
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += static_cast<int8_t>(blk[4 + g * 16 + j]);
      int16_t bs;
      std::memcpy(&bs, blk + 4 + 256 + 2 * g, 2);
      BOOST_TEST(bs == s);
    }
  }
  BOOST_TEST(static_cast<int8_t>(a[kQ8KBytes + 4 + 300 - 256]) == -127);
  // Two values of largest magnitude: the first (here negative) sets the scale; with a scale of
  // exactly 1, halves round to even (2.5 -> 2, 3.5 -> 4, -2.5 -> -2).
  std::vector<float> t(256, 0.0f);
  t[3] = -127.0f;
  t[10] = 127.0f;
  t[20] = 2.5f;
  t[21] = 3.5f;
  t[22] = -2.5f;
  o->quantize_act(t.data(), a.data(), 256);
  float dt;
  std::memcpy(&dt, a.data(), 4);
  BOOST_TEST(dt == 1.0f);
  BOOST_TEST(static_cast<int8_t>(a[4 + 3]) == -127);
  BOOST_TEST(static_cast<int8_t>(a[4 + 10]) == 127);
  BOOST_TEST(static_cast<int8_t>(a[4 + 20]) == 2);
  BOOST_TEST(static_cast<int8_t>(a[4 + 21]) == 4);
  BOOST_TEST(static_cast<int8_t>(a[4 + 22]) == -2);
  int16_t bs1;
  std::memcpy(&bs1, a.data() + 4 + 256 + 2, 2);
  BOOST_TEST(bs1 == 4);  // codes 16..31: 2 + 4 - 2
  // An all-zero block quantizes to zeros, not NaN.
  std::vector<float> z(256, 0.0f);
  o->quantize_act(z.data(), a.data(), 256);
  for (size_t i = 0; i < kQ8KBytes; ++i) BOOST_TEST(a[i] == 0);
}

namespace {

/// Rows of type t for the dot-product tests: real rows from the zoo where a file has the type.
struct Rows {
  std::vector<uint8_t> bytes;
  int64_t rows = 0, cols = 0;
};

Rows zoo_rows(DType t, int64_t max_rows) {
  for (const char* file : {"q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"}) {
    const Gguf g(kZoo + "zoo-llama3-" + file + ".gguf");
    for (const auto& [name, ten] : g.tensors()) {
      if (ten.type != static_cast<uint32_t>(t) || ten.dims.size() != 2) continue;
      Rows r;
      r.cols = static_cast<int64_t>(ten.dims[0]);
      r.rows = std::min<int64_t>(max_rows, static_cast<int64_t>(ten.dims[1]));
      const size_t n = row_bytes(t, r.cols) * static_cast<size_t>(r.rows);
      r.bytes.assign(g.data(ten), g.data(ten) + n);
      return r;
    }
  }
  throw std::runtime_error("no zoo tensor of the type");
}

/// Random blocks: every byte random, then the f16 scales replaced by sane values (random bits
/// would include infinities and NaNs).
Rows random_rows(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Rows r;
  r.rows = rows;
  r.cols = cols;
  r.bytes.resize(row_bytes(t, cols) * static_cast<size_t>(rows));
  for (auto& b : r.bytes) b = static_cast<uint8_t>(rng());
  const size_t bb = row_bytes(t, 256);
  std::uniform_real_distribution<float> u(0.001f, 0.05f);
  for (size_t off = 0; off < r.bytes.size(); off += bb) {
    auto put = [&](size_t at) {
      const uint16_t h = f32_to_f16(u(rng));
      std::memcpy(r.bytes.data() + off + at, &h, 2);
    };
    switch (t) {
      case DType::Q2_K:
        put(80);
        put(82);
        break;
      case DType::Q3_K:
        put(108);
        break;
      case DType::Q4_K:
      case DType::Q5_K:
        put(0);
        put(2);
        break;
      case DType::Q6_K:
        put(208);
        break;
      default:
        put(0);
        break;
    }
  }
  return r;
}

/// Checks the dot products of the rows with one activation vector.
void check_dots(DType t, const Rows& r, uint32_t seed) {
  const quant::TypeOps* o = quant::ops(t);
  BOOST_REQUIRE(o != nullptr);
  BOOST_REQUIRE(quant::k_ops_isa(t, 0) != nullptr);
  const size_t rb = row_bytes(t, r.cols);
  std::vector<float> x = gaussian(static_cast<size_t>(r.cols), seed);
  std::vector<uint8_t> a(o->act_bytes(r.cols) + 64);
  o->quantize_act(x.data(), a.data(), r.cols);
  const std::vector<double> xq = decode_q8k(a.data(), r.cols);
  const WeightView w{t, r.bytes.data(), r.rows, r.cols};
  std::vector<float> y_fast(static_cast<size_t>(r.rows)), y_ref(y_fast.size()),
      y_pool(y_fast.size());
  matmul(w, x.data(), 1, y_fast.data(), nullptr);
  ThreadPool pool(2);
  matmul(w, x.data(), 1, y_pool.data(), &pool);
  ref::matmul(w, x.data(), 1, y_ref.data());
  std::vector<float> row(static_cast<size_t>(r.cols));
  for (int64_t i = 0; i < r.rows; ++i) {
    const uint8_t* wr = r.bytes.data() + i * rb;
    dequantize_row(t, wr, row.data(), r.cols);
    // Exact value of what the integer kernels compute: dequantized weights times the decoded
    // Q8_K activations. The kernels' sums are exact integers per super-block, so only f32
    // rounding of a few products per super-block separates them from it.
    double exact = 0.0, mag = 0.0, act_bound = 0.0;
    for (int64_t k = 0; k < r.cols; ++k) {
      exact += row[k] * xq[k];
      mag += std::fabs(row[k] * xq[k]);
    }
    // Against the unquantized activations: each x differs from its code by at most half a step,
    // amax / 254 for its super-block, so |dot(w, x) - dot(w, xq)| <= sum |w| * amax / 254.
    for (int64_t b = 0; b < r.cols / 256; ++b) {
      float amax = 0.0f;
      double wsum = 0.0;
      for (int j = 0; j < 256; ++j) {
        amax = std::max(amax, std::fabs(x[b * 256 + j]));
        wsum += std::fabs(row[b * 256 + j]);
      }
      act_bound += wsum * amax / 254.0;
    }
    const double tol = 1e-5 * mag + 1e-6;
    BOOST_TEST_CONTEXT(dtype_name(t) << " row " << i) {
      // Every dot-product implementation this build has: portable, AVX2, AVX-512.
      for (int isa = 0; isa < 3; ++isa) {
        const quant::TypeOps* oi = quant::k_ops_isa(t, isa);
        if (oi == nullptr) continue;
        BOOST_TEST_CONTEXT("isa " << isa) {
          BOOST_TEST(std::fabs(oi->vec_dot(wr, a.data(), r.cols) - exact) <= tol);
        }
      }
      BOOST_TEST(std::fabs(y_fast[i] - exact) <= tol);
      BOOST_TEST(y_pool[i] == y_fast[i]);
      BOOST_TEST(std::fabs(y_fast[i] - y_ref[i]) <= act_bound + tol + 1e-5 * std::fabs(y_ref[i]));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(dot_products_match_on_real_rows) {
  for (DType t : kKTypes) check_dots(t, zoo_rows(t, 48), 11);
}

BOOST_AUTO_TEST_CASE(dot_products_match_on_random_blocks) {
  uint32_t seed = 100;
  for (DType t : kKTypes) {
    check_dots(t, random_rows(t, 40, 768, seed), seed + 1);
    seed += 2;
  }
}

BOOST_AUTO_TEST_CASE(four_token_dot_products_equal_one_token_ones) {
  // vec_dot_4 unpacks a weight row once for four tokens; each output must be exactly vec_dot's
  // for that token, and a matmul of 7 tokens (a group of four and three single tokens; from
  // kPanelMinTokens on the panel kernel takes over) exactly the one-token products.
  int with4 = 0;
  uint32_t seed = 300;
  for (DType t : kKTypes) {
    const quant::TypeOps* o = quant::ops(t);
    BOOST_REQUIRE(o != nullptr);
    for (const Rows& r : {zoo_rows(t, 16), random_rows(t, 16, 768, seed++)}) {
      const size_t rb = row_bytes(t, r.cols);
      const size_t xs = (o->act_bytes(r.cols) + 63) & ~size_t{63};
      constexpr int kTok = 7;
      static_assert(kTok < quant::kPanelMinTokens);
      std::vector<float> x = gaussian(static_cast<size_t>(r.cols * kTok), seed++);
      std::vector<uint8_t> a(xs * kTok + 64);
      uint8_t* a0 = a.data() + (64 - reinterpret_cast<uintptr_t>(a.data()) % 64) % 64;
      for (int k = 0; k < kTok; ++k) o->quantize_act(x.data() + k * r.cols, a0 + k * xs, r.cols);
      std::vector<float> y(static_cast<size_t>(r.rows * kTok));
      matmul(WeightView{t, r.bytes.data(), r.rows, r.cols}, x.data(), kTok, y.data(), nullptr);
      for (int64_t i = 0; i < r.rows; ++i) {
        const uint8_t* wr = r.bytes.data() + i * rb;
        BOOST_TEST_CONTEXT(dtype_name(t) << " row " << i) {
          if (o->vec_dot_4) {
            float four[quant::kDotTokens];
            o->vec_dot_4(wr, a0 + xs, xs, four, r.cols);  // tokens 1..4
            for (int k = 0; k < quant::kDotTokens; ++k)
              BOOST_TEST(four[k] == o->vec_dot(wr, a0 + (k + 1) * xs, r.cols));
          }
          for (int k = 0; k < kTok; ++k)
            BOOST_TEST(y[static_cast<size_t>(k * r.rows + i)] ==
                       o->vec_dot(wr, a0 + k * xs, r.cols));
        }
      }
    }
    with4 += o->vec_dot_4 != nullptr;
  }
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
  BOOST_TEST(with4 == 3);  // Q4_K, Q5_K, Q6_K
#endif
}

namespace {

/// The decoded grid of each element of a block of t, read from the bytes at the ggml-common.h
/// offsets: its step (d * sub-block scale) and its lowest and highest levels.
struct Grid {
  float step, low, high;
};
std::vector<Grid> grids(DType t, const uint8_t* b) {
  auto f16 = [&](size_t at) {
    uint16_t h;
    std::memcpy(&h, b + at, 2);
    return f16_to_f32(h);
  };
  auto k4 = [&](int s, bool min) {  // 6-bit scales (min = false) or mins of Q4_K/Q5_K
    const uint8_t* p = b + 4;
    if (s < 4) return p[s + (min ? 4 : 0)] & 63;
    return min ? ((p[s + 4] >> 4) | ((p[s] >> 6) << 4))
               : ((p[s + 4] & 15) | ((p[s - 4] >> 6) << 4));
  };
  auto sym = [](float step, int z) {  // levels step * v, v in -z..z-1
    return Grid{std::fabs(step), std::min(-z * step, (z - 1) * step),
                std::max(-z * step, (z - 1) * step)};
  };
  std::vector<Grid> g(256);
  for (int e = 0; e < 256; ++e) {
    switch (t) {
      case DType::Q2_K: {
        const float st = f16(80) * static_cast<float>(b[e / 16] & 15);
        const float off = f16(82) * static_cast<float>(b[e / 16] >> 4);
        g[e] = {st, -off, 3 * st - off};
        break;
      }
      case DType::Q3_K: {
        const uint8_t* p = b + 96;
        const int s = e / 16;
        const int lo = s < 8 ? (p[s] & 15) : (p[s - 8] >> 4);
        const int hi = (p[8 + s % 4] >> (2 * (s / 4))) & 3;
        g[e] = sym(f16(108) * static_cast<float>((lo | (hi << 4)) - 32), 4);
        break;
      }
      case DType::Q4_K:
      case DType::Q5_K: {
        const float st = f16(0) * static_cast<float>(k4(e / 32, false));
        const float off = f16(2) * static_cast<float>(k4(e / 32, true));
        g[e] = {st, -off, (t == DType::Q4_K ? 15 : 31) * st - off};
        break;
      }
      default:  // Q6_K
        g[e] = sym(f16(208) * static_cast<float>(static_cast<int8_t>(b[192 + e / 16])), 32);
        break;
    }
  }
  return g;
}

/// Quantizes x (whole super-blocks) with t's quantizer; checks that every value got the nearest
/// level of its decoded grid (within half a step, or beyond an end level and coded to it);
/// returns the relative RMS error.
double round_trip(DType t, const float* x, int64_t n) {
  std::vector<uint8_t> q(row_bytes(t, n));
  quantize_row(t, x, q.data(), n);
  std::vector<float> back(static_cast<size_t>(n));
  dequantize_row(t, q.data(), back.data(), n);
  const size_t bb = row_bytes(t, 256);
  int bad = 0;
  if (t == DType::IQ4_XS) {
    // Non-linear levels step * kIQ4NL[k]: the decoded value must be the nearest of the 16.
    static const int kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
    for (int64_t b = 0; b < n / 256; ++b) {
      const uint8_t* blk = q.data() + b * bb;
      uint16_t h, sh;
      std::memcpy(&h, blk, 2);
      std::memcpy(&sh, blk + 2, 2);
      for (int j = 0; j < 256; ++j) {
        const int ib = j / 32;
        const int ls =
            (((blk[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
        const float step = f16_to_f32(h) * static_cast<float>(ls);
        const float xi = x[b * 256 + j];
        float nearest = 1e30f;
        for (int k : kIQ4NL)
          nearest = std::min(nearest, std::fabs(xi - step * static_cast<float>(k)));
        if (std::fabs(back[b * 256 + j] - xi) >
            nearest + 1e-5f * (std::fabs(xi) + 127 * std::fabs(step)) + 1e-7f)
          ++bad;
      }
    }
    BOOST_TEST(bad == 0);
    return rel_rms(back, x, static_cast<size_t>(n));
  }
  for (int64_t b = 0; b < n / 256; ++b) {
    const std::vector<Grid> g = grids(t, q.data() + b * bb);
    for (int j = 0; j < 256; ++j) {
      const float xi = x[b * 256 + j], yi = back[b * 256 + j];
      const float eps =
          1e-5f * (std::fabs(xi) + std::fabs(g[j].low) + std::fabs(g[j].high)) + 1e-7f;
      const bool near = std::fabs(yi - xi) <= g[j].step * 0.5f + eps;
      const bool below = xi < g[j].low && std::fabs(yi - g[j].low) <= eps;
      const bool above = xi > g[j].high && std::fabs(yi - g[j].high) <= eps;
      if (!near && !below && !above) ++bad;
    }
  }
  BOOST_TEST(bad == 0);
  return rel_rms(back, x, static_cast<size_t>(n));
}

// Our quantizers' relative RMS error on N(0, 1) rows: measured values with about 20% margin.
double own_bound(DType t) {
  switch (t) {
    case DType::Q2_K:
      return 0.32;  // measured 0.269
    case DType::Q3_K:
      return 0.17;  // 0.144
    case DType::Q4_K:
      return 0.088;  // 0.0731
    case DType::Q5_K:
      return 0.044;  // 0.0366
    case DType::Q6_K:
      return 0.021;  // 0.0171
    default:         // IQ4_XS: 0.0752
      return 0.09;
  }
}

const DType kQuantizable[] = {DType::Q2_K, DType::Q3_K, DType::Q4_K,
                              DType::Q5_K, DType::Q6_K, DType::IQ4_XS};

}  // namespace

BOOST_AUTO_TEST_CASE(panel_matmul_matches_exact_dot_products) {
  // From 8 tokens on, Q4_K, Q5_K and Q6_K go through the tokens-in-lanes panel kernel (VNNI
  // builds): its integer sums per super-block are exact, so each output must be the exact dot
  // product of the dequantized row with the token's decoded Q8_K activations up to f32 rounding,
  // for token counts that fill panels partly, row counts that are not whole tiles, with and
  // without a pool (which must not change a bit).
  uint32_t seed = 700;
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const quant::TypeOps* o = quant::ops(t);
    BOOST_REQUIRE(o != nullptr);
    for (const Rows& r : {zoo_rows(t, 37), random_rows(t, 45, 512, seed++)}) {
      const size_t rb = row_bytes(t, r.cols);
      std::vector<float> row(static_cast<size_t>(r.cols));
      std::vector<uint8_t> a(o->act_bytes(r.cols) + 64);
      for (int n_tok : {8, 9, 16, 17, 40}) {
        std::vector<float> x = gaussian(static_cast<size_t>(r.cols * n_tok), seed++);
        const WeightView w{t, r.bytes.data(), r.rows, r.cols};
        std::vector<float> y(static_cast<size_t>(r.rows * n_tok)), y_pool(y.size());
        matmul(w, x.data(), n_tok, y.data(), nullptr);
        ThreadPool pool(2);
        matmul(w, x.data(), n_tok, y_pool.data(), &pool);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
        std::vector<float> y_direct(y.size());
        BOOST_TEST(quant::matmul_panel(w, x.data(), n_tok, y_direct.data(), nullptr));
        BOOST_TEST((y_direct == y));
#endif
        BOOST_TEST((y_pool == y));
        for (int k = 0; k < n_tok; ++k) {
          o->quantize_act(x.data() + k * r.cols, a.data(), r.cols);
          const std::vector<double> xq = decode_q8k(a.data(), r.cols);
          for (int64_t i = 0; i < r.rows; ++i) {
            dequantize_row(t, r.bytes.data() + i * rb, row.data(), r.cols);
            double exact = 0.0, mag = 0.0;
            for (int64_t c = 0; c < r.cols; ++c) {
              exact += row[c] * xq[c];
              mag += std::fabs(row[c] * xq[c]);
            }
            BOOST_TEST_CONTEXT(dtype_name(t)
                               << " tokens " << n_tok << " token " << k << " row " << i) {
              BOOST_TEST(std::fabs(y[static_cast<size_t>(k * r.rows + i)] - exact) <=
                         1e-5 * mag + 1e-6);
            }
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(quantizers_code_each_value_to_its_nearest_level) {
  std::vector<float> x = gaussian(256 * 16, 21);
  // Blocks with special structure: all zero, all equal positive, all negative, one outlier.
  std::fill(x.begin(), x.begin() + 256, 0.0f);
  std::fill(x.begin() + 256, x.begin() + 512, 0.75f);
  for (int j = 512; j < 768; ++j) x[j] = -std::fabs(x[j]) - 0.1f;
  x[1000] = 40.0f;
  for (DType t : kQuantizable) {
    BOOST_TEST_CONTEXT(dtype_name(t)) {
      const double r = round_trip(t, x.data(), static_cast<int64_t>(x.size()));
      BOOST_TEST_MESSAGE(dtype_name(t) << " own quantizer, relative RMS error " << r);
      const std::vector<float> g = gaussian(256 * 64, 22);
      const double rg = round_trip(t, g.data(), static_cast<int64_t>(g.size()));
      BOOST_TEST_MESSAGE(dtype_name(t) << " own quantizer on N(0,1), relative RMS error " << rg);
      BOOST_TEST(rg < own_bound(t));
      // An all-zero block comes back as zeros exactly.
      std::vector<float> back(256);
      std::vector<uint8_t> q(row_bytes(t, 256));
      quantize_row(t, x.data(), q.data(), 256);
      dequantize_row(t, q.data(), back.data(), 256);
      for (float v : back) BOOST_TEST(v == 0.0f);
    }
  }
}

// On the zoo's real f32 weights our quantizers stay close to llama-quantize's own error for the
// same tensors (its files are the reference tool chain's output). Measured ratios of the
// relative RMS errors, own / llama-quantize: Q2_K 0.89, Q3_K 0.95, Q4_K 1.02, Q5_K 1.02,
// Q6_K 0.97, IQ4_XS 0.98.
BOOST_AUTO_TEST_CASE(quantizers_compare_with_llama_quantize_on_zoo_weights) {
  const Gguf& ref = f32_zoo();
  const std::map<DType, const char*> file = {{DType::Q2_K, "q2_k"},   {DType::Q3_K, "q3_k_m"},
                                             {DType::Q4_K, "q4_k_m"}, {DType::Q5_K, "q5_k_m"},
                                             {DType::Q6_K, "q6_k"},   {DType::IQ4_XS, "iq4_xs"}};
  for (const auto& [t, f] : file) {
    const Gguf g(kZoo + "zoo-llama3-" + f + ".gguf");
    double ours = 0.0, theirs = 0.0, norm = 0.0;
    for (const auto& [name, ten] : g.tensors()) {
      if (ten.type != static_cast<uint32_t>(t)) continue;
      const Tensor& rt = ref.tensors().at(name);
      // The first 64 super-blocks of every tensor of the type: the weights are i.i.d., so this
      // measures the same ratio as whole tensors at a tenth of the quantizing time.
      const int64_t n = std::min<int64_t>(elements(ten), 64 * 256);
      const auto* want = reinterpret_cast<const float*>(ref.data(rt));
      std::vector<uint8_t> q(row_bytes(t, n));
      quantize_row(t, want, q.data(), n);
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      dequantize_row(t, q.data(), a.data(), n);
      dequantize_row(t, g.data(ten), b.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ours += (static_cast<double>(a[i]) - want[i]) * (static_cast<double>(a[i]) - want[i]);
        theirs += (static_cast<double>(b[i]) - want[i]) * (static_cast<double>(b[i]) - want[i]);
        norm += static_cast<double>(want[i]) * want[i];
      }
    }
    const double ro = std::sqrt(ours / norm), rt = std::sqrt(theirs / norm);
    BOOST_TEST_MESSAGE(dtype_name(t) << ": own " << ro << ", llama-quantize " << rt);
    BOOST_TEST_CONTEXT(dtype_name(t)) {
      BOOST_TEST(ro < 1.1 * rt);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_kernels_kquants
