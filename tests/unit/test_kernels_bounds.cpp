// Matmul reads no byte past a weight matrix: the matrix ends where a PROT_NONE page begins, so
// any over-read faults. The batch-1 kernels load a pair of blocks 64 bytes at a time, more than
// a Q4_0 pair holds; shapes cover odd block counts (a scalar tail block), row counts that are not
// a multiple of the 4-row tile, and 1 to 5 tokens.
#include <sys/mman.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "tests/support/random_data.hpp"

BOOST_AUTO_TEST_SUITE(test_kernels_bounds)

using namespace sy::kernels;

using sy::test::randn;
using sy::test::rel_err;

namespace {

/// `bytes` bytes that end exactly where an inaccessible page starts.
class GuardedBytes {
 public:
  explicit GuardedBytes(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    data_pages_ = (bytes + page - 1) / page;
    len_ = (data_pages_ + 1) * page;
    void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    BOOST_TEST_REQUIRE(p != MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
    BOOST_TEST_REQUIRE(mprotect(base_ + data_pages_ * page, page, PROT_NONE) == 0);
    data_ = base_ + data_pages_ * page - bytes;
  }
  ~GuardedBytes() { munmap(base_, len_); }
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;
  uint8_t* data() { return data_; }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t data_pages_ = 0;
  size_t len_ = 0;
};

}  // namespace

BOOST_AUTO_TEST_CASE(matmul_reads_nothing_past_the_last_row) {
  ThreadPool pool(2);
  uint32_t seed = 7;
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::F16, DType::BF16, DType::F32}) {
    for (int64_t rows : {1, 3, 4, 5, 9}) {
      for (int64_t cols : {32, 64, 96, 160, 224, 768}) {
        const size_t rb = row_bytes(t, cols);
        GuardedBytes mem(rb * static_cast<size_t>(rows));
        const auto f = randn(static_cast<size_t>(rows * cols), ++seed);
        for (int64_t r = 0; r < rows; ++r)
          quantize_row(t, f.data() + r * cols, mem.data() + r * rb, cols);
        const WeightView w{t, mem.data(), rows, cols};
        const bool quant = t == DType::Q4_0 || t == DType::Q8_0;
        for (int64_t nt : {1, 2, 5}) {
          const auto x = randn(static_cast<size_t>(nt * cols), ++seed);
          // Quantized weights: the fast path quantizes the activations to Q8_0, so the reference
          // runs on those same quantized values.
          std::vector<float> xr = x;
          if (quant) {
            std::vector<BlockQ8_0> blocks(static_cast<size_t>(cols / kQK));
            for (int64_t i = 0; i < nt; ++i) {
              quantize_row_q8_0(x.data() + i * cols, blocks.data(), cols);
              dequantize_row(DType::Q8_0, blocks.data(), xr.data() + i * cols, cols);
            }
          }
          std::vector<float> want(static_cast<size_t>(nt * rows));
          ref::matmul(w, xr.data(), nt, want.data());
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
            matmul(w, x.data(), nt, got.data(), p);
            // The integer block products are exact; what differs is the f32 order of summing
            // <= 24 scaled block terms (quantized) or <= 768 products (float), a few ulp each.
            const double err = rel_err(got, want);
            BOOST_TEST(err <= (quant ? 1e-4 : 1e-5), dtype_name(t)
                                                         << " rows " << rows << " cols " << cols
                                                         << " tokens " << nt << " err " << err);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_kernels_bounds
