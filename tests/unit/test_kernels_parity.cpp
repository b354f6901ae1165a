// Parity of the fast kernels with the reference ones: every op, every weight dtype, several token
// counts, odd shapes, and thread pools of 1 to 3 threads.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "tests/support/random_data.hpp"

BOOST_AUTO_TEST_SUITE(test_kernels_parity)

using namespace sy::kernels;

using sy::test::randn;
using sy::test::rel_err;

namespace {

/// max |a - b| / (||w_r|| ||x_t||) over outputs, +inf on anything not finite.
double scaled_err(const WeightView& w, const std::vector<float>& x, int64_t nt,
                  const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  double worst = 0.0;
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * row_bytes(w.type, w.cols),
                   row.data(), w.cols);
    double wn = 0.0;
    for (float v : row) wn += static_cast<double>(v) * v;
    for (int64_t t = 0; t < nt; ++t) {
      double xn = 0.0;
      for (int64_t k = 0; k < w.cols; ++k)
        xn += static_cast<double>(x[t * w.cols + k]) * x[t * w.cols + k];
      const size_t i = static_cast<size_t>(t * w.rows + r);
      if (!std::isfinite(a[i]) || !std::isfinite(b[i]))
        return std::numeric_limits<double>::infinity();
      worst = std::max(worst,
                       std::fabs(static_cast<double>(a[i]) - b[i]) / (std::sqrt(wn * xn) + 1e-30));
    }
  }
  return worst;
}

struct Weights {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Weights make_weights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  const auto f = randn(static_cast<size_t>(rows * cols), seed, 0.5f);
  Weights w;
  const size_t rb = row_bytes(t, cols);
  w.bytes.resize(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(t, f.data() + r * cols, w.bytes.data() + r * rb, cols);
  w.view = WeightView{t, w.bytes.data(), rows, cols};
  return w;
}

const char* name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::Q8_0:
      return "q8_0";
    case DType::Q4_0:
      return "q4_0";
    default:
      return sy::kernels::dtype_name(t);
  }
}

constexpr DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};

}  // namespace

BOOST_AUTO_TEST_CASE(matmul_all_dtypes_tokens_pools) {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  pools.push_back(nullptr);
  for (int n : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(n));
  const int64_t shapes[][2] = {{1, 32}, {7, 64}, {37, 96}, {130, 256}, {67, 768}, {300, 160}};
  uint32_t seed = 100;
  for (DType t : kAllTypes) {
    for (const auto& s : shapes) {
      const int64_t rows = s[0], cols = s[1];
      const Weights w = make_weights(t, rows, cols, ++seed);
      for (int64_t nt : {1, 3, 17, 33, 64}) {
        const auto x = randn(static_cast<size_t>(nt * cols), ++seed);
        std::vector<float> want(static_cast<size_t>(nt * rows));
        ref::matmul(w.view, x.data(), nt, want.data());
        // For quantized weights the fast path quantizes activations to Q8_0 first; the same
        // product on already-quantized activations must then agree closely.
        std::vector<float> want_q;
        if (t == DType::Q8_0 || t == DType::Q4_0) {
          std::vector<float> xq(x.size());
          std::vector<BlockQ8_0> blocks(static_cast<size_t>(cols / kQK));
          for (int64_t i = 0; i < nt; ++i) {
            quantize_row_q8_0(x.data() + i * cols, blocks.data(), cols);
            dequantize_row(DType::Q8_0, blocks.data(), xq.data() + i * cols, cols);
          }
          want_q.resize(want.size());
          ref::matmul(w.view, xq.data(), nt, want_q.data());
        }
        for (const auto& pool : pools) {
          std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
          matmul(w.view, x.data(), nt, got.data(), pool.get());
          // f32 accumulation over <= 768 terms in a different order. Quantized activations add
          // noise of about 0.3% of |w| |x| per output, so the bound there is on that scale.
          const double err =
              want_q.empty() ? rel_err(got, want) : scaled_err(w.view, x, nt, got, want);
          const double bound = want_q.empty() ? 1e-5 : 1e-2;
          BOOST_TEST(err <= bound, name(t) << " rows " << rows << " cols " << cols << " tokens "
                                           << nt << " threads " << (pool ? pool->size() : 0)
                                           << " err " << err);
          if (!want_q.empty()) {
            const double errq = rel_err(got, want_q);
            BOOST_TEST(errq <= 1e-4, name(t)
                                         << " (vs quantized activations) rows " << rows << " cols "
                                         << cols << " tokens " << nt << " err " << errq);
          }
        }
      }
    }
  }
}

// matmul_many: the rows of several matrices split as one range (pieces that straddle a matrix
// boundary, row counts that are no multiple of a tile) must give each matrix exactly what its own
// matmul gives; matrices of different types or widths fall back to one matmul each.
BOOST_AUTO_TEST_CASE(matmul_many_equals_separate_matmuls) {
  // Every fast dtype, and the K-quants (one quantization of the activations, or one set of
  // panels from 8 tokens on, for all three matrices), whose rows must be whole super-blocks.
  ThreadPool pool(2);
  uint32_t seed = 900;
  std::vector<DType> types(std::begin(kAllTypes), std::end(kAllTypes));
  types.insert(types.end(), {DType::Q4_K, DType::Q6_K});
  for (DType t : types) {
    const bool k_quant = t == DType::Q4_K || t == DType::Q6_K;
    for (int64_t nt : {1, 5, 8, 16, 33}) {
      const int64_t cols = k_quant ? 512 : 96;
      const Weights a = make_weights(t, 37, cols, ++seed);
      const Weights b = make_weights(t, 13, cols, ++seed);
      const Weights c = make_weights(t, 66, cols, ++seed);
      const DType other_t = k_quant ? (t == DType::Q4_K ? DType::Q6_K : DType::Q4_K)
                                    : (t == DType::F32 ? DType::F16 : DType::F32);
      const Weights other = make_weights(other_t, 9, cols, ++seed);
      const auto x = randn(static_cast<size_t>(nt * cols), ++seed);
      for (bool mixed : {false, true}) {
        const WeightView* ws[3] = {&a.view, mixed ? &other.view : &b.view, &c.view};
        std::vector<std::vector<float>> got(3), want(3);
        float* ys[3];
        for (int i = 0; i < 3; ++i) {
          got[i].assign(static_cast<size_t>(nt * ws[i]->rows),
                        std::numeric_limits<float>::quiet_NaN());
          want[i].resize(got[i].size());
          matmul(*ws[i], x.data(), nt, want[i].data(), &pool);
          ys[i] = got[i].data();
        }
        matmul_many(ws, ys, 3, x.data(), nt, &pool);
        for (int i = 0; i < 3; ++i)
          BOOST_TEST(got[i] == want[i], name(t) << " tokens " << nt << " matrix " << i
                                                << (mixed ? " (mixed types)" : ""));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(matmul_nan_propagates) {
  ThreadPool pool(2);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Weights w = make_weights(t, 20, 64, 5);
    auto x = randn(64 * 3, 6);
    x[64 + 10] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> y(20 * 3, 0.0f);
    matmul(w.view, x.data(), 3, y.data(), &pool);
    for (int r = 0; r < 20; ++r) {
      BOOST_TEST(std::isfinite(y[r]));
      BOOST_TEST(std::isnan(y[20 + r]), name(t) << " row " << r);
    }
  }
}

BOOST_AUTO_TEST_CASE(dot_axpy) {
  for (int64_t n : {1, 7, 16, 33, 100, 768, 2049}) {
    const auto a = randn(static_cast<size_t>(n), 1);
    const auto b = randn(static_cast<size_t>(n), 2);
    const float want = ref::dot(a.data(), b.data(), n);
    const float got = dot(a.data(), b.data(), n);
    BOOST_TEST(std::fabs(got - want) <= 1e-5 * std::sqrt(static_cast<double>(n)) + 1e-6, "n " << n);
    auto y1 = randn(static_cast<size_t>(n), 3);
    auto y2 = y1;
    ref::axpy(0.75f, a.data(), y1.data(), n);
    axpy(0.75f, a.data(), y2.data(), n);
    BOOST_TEST(rel_err(y2, y1) <= 1e-6, "n " << n);
  }
}

BOOST_AUTO_TEST_CASE(rmsnorm_parity_and_alias) {
  for (int64_t n : {1, 7, 64, 100, 768, 2048}) {
    const auto x = randn(static_cast<size_t>(n), 11, 3.0f);
    const auto w = randn(static_cast<size_t>(n), 12);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    ref::rmsnorm(want.data(), x.data(), w.data(), n, 1e-5f);
    rmsnorm(got.data(), x.data(), w.data(), n, 1e-5f);
    BOOST_TEST(rel_err(got, want) <= 1e-6, "n " << n);
    auto inplace = x;
    rmsnorm(inplace.data(), inplace.data(), w.data(), n, 1e-5f);
    BOOST_TEST(rel_err(inplace, want) <= 1e-6, "alias n " << n);
  }
}

BOOST_AUTO_TEST_CASE(rope_parity) {
  struct Case {
    int heads, head_dim, rope_dim, pos;
    float base;
  };
  const Case cases[] = {{1, 2, 2, 0, 10000.0f},
                        {4, 64, 64, 1, 10000.0f},
                        {6, 48, 48, 511, 10000.0f},
                        {3, 128, 64, 2047, 500000.0f},
                        {12, 64, 64, 100000, 10000.0f}};
  for (const auto& c : cases) {
    const auto x = randn(static_cast<size_t>(c.heads * c.head_dim), 21);
    auto want = x, got = x;
    ref::rope(want.data(), c.heads, c.head_dim, c.rope_dim, c.pos, c.base);
    rope(got.data(), c.heads, c.head_dim, c.rope_dim, c.pos, c.base);
    BOOST_TEST(rel_err(got, want) <= 1e-5, "pos " << c.pos << " head_dim " << c.head_dim);
    for (int h = 0; h < c.heads; ++h)  // dims past rope_dim do not move
      for (int i = c.rope_dim; i < c.head_dim; ++i)
        BOOST_TEST(got[h * c.head_dim + i] == x[h * c.head_dim + i]);
  }
}

BOOST_AUTO_TEST_CASE(softmax_swiglu_parity) {
  for (int64_t n : {1, 5, 16, 31, 257, 2048}) {
    auto x = randn(static_cast<size_t>(n), 31, 4.0f);
    x[0] = -std::numeric_limits<float>::infinity();  // a masked position
    if (n == 1) x[0] = 2.0f;
    auto want = x, got = x;
    ref::softmax(want.data(), n);
    softmax(got.data(), n);
    BOOST_TEST(rel_err(got, want) <= 1e-6, "softmax n " << n);
    double sum = 0.0;
    for (float v : got) sum += v;
    BOOST_TEST(std::fabs(sum - 1.0) <= 1e-5);
    const auto g = randn(static_cast<size_t>(n), 32, 3.0f);
    const auto u = randn(static_cast<size_t>(n), 33);
    auto gw = g, gg = g;
    ref::swiglu(gw.data(), u.data(), n);
    swiglu(gg.data(), u.data(), n);
    BOOST_TEST(rel_err(gg, gw) <= 1e-6, "swiglu n " << n);
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_kernels_parity
