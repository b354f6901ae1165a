// ThreadPool: persistent workers that spin briefly, then sleep, between parallel_for calls.
// Built for many short jobs (several per transformer layer), so a wake-up must cost little.
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SY_CPU_RELAX() _mm_pause()
#else
#define SY_CPU_RELAX() ((void)0)
#endif

#include "kernels/cpu/kernels.hpp"

namespace sy::kernels {

namespace {
// Pause iterations (tens of ns each) a thread spins before blocking: about 50-100 us, longer than
// the gap between the ops of one step, shorter than a scheduler tick so an idle pool sleeps soon.
constexpr int kSpinIters = 2000;
}  // namespace

struct ThreadPool::Impl {
  std::vector<std::thread> workers;
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int n_parts = 0;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};
  std::atomic<int> sleepers{0};
  std::atomic<bool> caller_sleeping{false};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable wake_cv;
  std::condition_variable done_cv;
  std::mutex err_mu;
  std::exception_ptr error;

  void run_part(int part) {
    const int64_t begin = n * part / n_parts;
    const int64_t end = n * (part + 1) / n_parts;
    if (begin >= end) return;
    try {
      (*fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu);
      if (!error) error = std::current_exception();
    }
  }

  void worker(int part) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = generation.load(std::memory_order_acquire);
      for (int i = 0; g == seen && i < kSpinIters; ++i) {
        SY_CPU_RELAX();
        g = generation.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mu);
        sleepers.fetch_add(1, std::memory_order_seq_cst);
        wake_cv.wait(lk, [&] {
          return generation.load(std::memory_order_seq_cst) != seen ||
                 stop.load(std::memory_order_relaxed);
        });
        sleepers.fetch_sub(1, std::memory_order_relaxed);
        g = generation.load(std::memory_order_acquire);
      }
      if (stop.load(std::memory_order_acquire)) return;
      seen = g;
      if (part < n_parts) run_part(part);
      if (pending.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
          caller_sleeping.load(std::memory_order_seq_cst)) {
        std::lock_guard<std::mutex> lk(mu);
        done_cv.notify_one();
      }
    }
  }
};

ThreadPool::ThreadPool(int n_threads) : impl_(new Impl), n_threads_(n_threads < 1 ? 1 : n_threads) {
  impl_->workers.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) impl_->workers.emplace_back([this, i] { impl_->worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop.store(true, std::memory_order_seq_cst);
    impl_->generation.fetch_add(1, std::memory_order_seq_cst);
  }
  impl_->wake_cv.notify_all();
  for (auto& t : impl_->workers) t.join();
  delete impl_;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // One item, or no workers: nothing to share, skip the hand-off.
  if (n_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  Impl& im = *impl_;
  im.fn = &fn;
  im.n = n;
  im.n_parts = n_threads_;
  im.error = nullptr;
  im.pending.store(n_threads_ - 1, std::memory_order_relaxed);
  im.generation.fetch_add(1, std::memory_order_seq_cst);
  if (im.sleepers.load(std::memory_order_seq_cst) > 0) {
    // Taking the lock orders this wake after a sleeper's check of `generation`.
    { std::lock_guard<std::mutex> lk(im.mu); }
    im.wake_cv.notify_all();
  }
  im.run_part(0);
  for (int i = 0; im.pending.load(std::memory_order_acquire) != 0 && i < kSpinIters; ++i)
    SY_CPU_RELAX();
  if (im.pending.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lk(im.mu);
    im.caller_sleeping.store(true, std::memory_order_seq_cst);
    im.done_cv.wait(lk, [&] { return im.pending.load(std::memory_order_seq_cst) == 0; });
    im.caller_sleeping.store(false, std::memory_order_relaxed);
  }
  im.fn = nullptr;
  if (im.error) {
    std::exception_ptr e = im.error;
    im.error = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace sy::kernels
