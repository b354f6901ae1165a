// ThreadPool: persistent workers that spin briefly, then sleep, between parallel_for calls.
// Built for many short jobs (several per transformer layer), so a wake-up must cost little.
// Work is cut into a few chunks per thread that every thread, the caller included, claims from
// one atomic word: a worker that the scheduler runs late (other processes on the same cores)
// finds its share already done by the others instead of holding the whole call up.
#include <algorithm>
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
// Chunks per thread: enough that a late thread's share is small and is taken over by the others,
// few enough that claiming (one atomic operation each) stays negligible next to a chunk's work.
constexpr int64_t kChunksPerThread = 4;
// The work word: call number (generation) in the high 32 bits, then the call's chunk count and
// the next unclaimed chunk, 16 bits each. One word, so a claim (a compare-and-swap) can only
// succeed for the call it was read from: a thread late from an earlier call claims nothing.
constexpr int64_t kMaxChunks = 0xffff;
constexpr uint64_t word_of(uint64_t gen, uint64_t chunks, uint64_t next) {
  return gen << 32 | chunks << 16 | next;
}
constexpr uint64_t gen_of(uint64_t w) {
  return w >> 32;
}
constexpr uint64_t chunks_of(uint64_t w) {
  return (w >> 16) & 0xffff;
}
constexpr uint64_t next_of(uint64_t w) {
  return w & 0xffff;
}
}  // namespace

struct ThreadPool::Impl {
  std::vector<std::thread> workers;
  // Written by the caller before it publishes a call in `work`, read only by a thread holding
  // a claimed chunk of that call: the caller does not start the next call before every chunk is
  // done, so they never change under a reader.
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  std::atomic<uint64_t> work{0};
  std::atomic<int64_t> done{0};  // chunks of the current call finished
  std::atomic<int> sleepers{0};
  std::atomic<bool> caller_sleeping{false};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable wake_cv;
  std::condition_variable done_cv;
  std::mutex err_mu;
  std::exception_ptr error;

  // Claims and runs chunks of the call `gen` until none is left. Returns whether this thread
  // finished the call's last chunk.
  bool run_chunks(uint64_t gen) {
    bool last = false;
    uint64_t w = work.load(std::memory_order_acquire);
    for (;;) {
      if (gen_of(w) != gen || next_of(w) >= chunks_of(w)) return last;
      if (!work.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        continue;  // w now holds the current word
      }
      const int64_t chunks = static_cast<int64_t>(chunks_of(w));
      const int64_t c = static_cast<int64_t>(next_of(w));
      const int64_t begin = n * c / chunks;
      const int64_t end = n * (c + 1) / chunks;
      if (begin < end) {
        try {
          (*fn)(begin, end);
        } catch (...) {
          std::lock_guard<std::mutex> lk(err_mu);
          if (!error) error = std::current_exception();
        }
      }
      last = done.fetch_add(1, std::memory_order_seq_cst) + 1 == chunks;
      w = work.load(std::memory_order_acquire);
    }
  }

  void worker() {
    uint64_t seen = 0;  // the last call this thread looked at
    for (;;) {
      uint64_t g = gen_of(work.load(std::memory_order_acquire));
      for (int i = 0; g == seen && i < kSpinIters; ++i) {
        SY_CPU_RELAX();
        g = gen_of(work.load(std::memory_order_acquire));
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mu);
        sleepers.fetch_add(1, std::memory_order_seq_cst);
        wake_cv.wait(lk, [&] {
          return gen_of(work.load(std::memory_order_seq_cst)) != seen ||
                 stop.load(std::memory_order_relaxed);
        });
        sleepers.fetch_sub(1, std::memory_order_relaxed);
        g = gen_of(work.load(std::memory_order_acquire));
      }
      if (stop.load(std::memory_order_acquire)) return;
      seen = g;
      if (run_chunks(g) && caller_sleeping.load(std::memory_order_seq_cst)) {
        std::lock_guard<std::mutex> lk(mu);
        done_cv.notify_one();
      }
    }
  }
};

ThreadPool::ThreadPool(int n_threads, std::function<void(int)> on_start)
    : impl_(new Impl), n_threads_(n_threads < 1 ? 1 : n_threads) {
  impl_->workers.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) {
    impl_->workers.emplace_back([this, i, on_start] {
      if (on_start) on_start(i);
      impl_->worker();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop.store(true, std::memory_order_seq_cst);
    uint64_t g = gen_of(impl_->work.load(std::memory_order_relaxed)) + 1;
    if (g == (uint64_t{1} << 32)) g = 1;  // as in parallel_for: never back to 0
    impl_->work.store(word_of(g, 0, 0), std::memory_order_seq_cst);
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
  const int64_t chunks = std::min<int64_t>({n, int64_t{n_threads_} * kChunksPerThread, kMaxChunks});
  im.fn = &fn;
  im.n = n;
  im.error = nullptr;
  im.done.store(0, std::memory_order_relaxed);
  // Generation 0 is "no call yet"; the counter would take 2^32 calls to wrap.
  uint64_t gen = gen_of(im.work.load(std::memory_order_relaxed)) + 1;
  if (gen == (uint64_t{1} << 32)) gen = 1;
  im.work.store(word_of(gen, static_cast<uint64_t>(chunks), 0), std::memory_order_seq_cst);
  if (im.sleepers.load(std::memory_order_seq_cst) > 0) {
    // Taking the lock orders this wake after a sleeper's check of `work`.
    { std::lock_guard<std::mutex> lk(im.mu); }
    im.wake_cv.notify_all();
  }
  im.run_chunks(gen);
  for (int i = 0; im.done.load(std::memory_order_acquire) != chunks && i < kSpinIters; ++i)
    SY_CPU_RELAX();
  if (im.done.load(std::memory_order_acquire) != chunks) {
    std::unique_lock<std::mutex> lk(im.mu);
    im.caller_sleeping.store(true, std::memory_order_seq_cst);
    im.done_cv.wait(lk, [&] { return im.done.load(std::memory_order_seq_cst) == chunks; });
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
