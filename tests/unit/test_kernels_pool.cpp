// ThreadPool: every index is covered exactly once, repeated calls work, errors come back.
#define BOOST_TEST_MODULE kernels_pool
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/kernels.hpp"

using namespace sy::kernels;

BOOST_AUTO_TEST_CASE(covers_each_index_once) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    BOOST_TEST(pool.size() == threads);
    for (int64_t n : {0, 1, 2, 3, 4, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        BOOST_REQUIRE(b < e);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) BOOST_TEST_REQUIRE(h.load() == 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(many_short_calls) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  const int calls = 5000;
  for (int c = 0; c < calls; ++c) {
    pool.parallel_for(6, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  }
  BOOST_TEST(total.load() == 6 * static_cast<int64_t>(calls));
}

BOOST_AUTO_TEST_CASE(exception_is_rethrown_and_pool_stays_usable) {
  ThreadPool pool(2);
  BOOST_CHECK_THROW(pool.parallel_for(10,
                                      [&](int64_t b, int64_t) {
                                        if (b > 0) throw std::runtime_error("worker failed");
                                      }),
                    std::runtime_error);
  std::atomic<int64_t> total{0};
  pool.parallel_for(10, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  BOOST_TEST(total.load() == 10);
}
