// CUDA emulator runtime: device memory with guard pages (host code may not touch it between
// operations), streams that run their work only when synchronized (so a missing synchronization
// shows as stale data), graph capture that records launches with the arguments of the moment,
// and kernels whose threads are fibers interleaved at barriers and warp exchanges.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emu_internal.hpp"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace sy_emu {

thread_local dim3 t_thread_idx, t_block_idx, t_block_dim, t_grid_dim;

namespace {

// The emulated device: an H200-like profile, with a small memory so that tests stay small.
constexpr size_t kDeviceMemory = size_t{2} << 30;
constexpr size_t kStaticSmemLimit = 48 * 1024;  // without cudaFuncSetAttribute
constexpr size_t kOptinSmemLimit = 232448;      // Hopper: 227 KB per block
constexpr unsigned kMaxThreads = 1024;
constexpr size_t kPoisonLimit = size_t{256} << 20;  // larger allocations stay zero pages
constexpr size_t kFiberStack = size_t{256} << 10;   // per kernel thread
// Allocations up to this size are closed to host code between device operations; larger ones
// (the cuBLASLt workspace, big KV pools) stay open, as reprotecting them at every
// synchronization would cost more than the rest of the emulation.
constexpr size_t kProtectLimit = size_t{8} << 20;

std::recursive_mutex& api_mutex() {
  static std::recursive_mutex m;
  return m;
}
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// ---- memory ----
struct Alloc {
  char* map = nullptr;  // the mapping: guard page, data pages, guard page
  size_t map_len = 0;
  char* data = nullptr;
  size_t size = 0;
  bool device = false;
};
std::map<uintptr_t, Alloc>& allocs() {
  static std::map<uintptr_t, Alloc> m;
  return m;
}
size_t g_device_used = 0;
// Device pages are readable and writable only while the emulator runs device work or copies:
// host code that dereferences a device pointer faults, as it would with a real GPU.
bool g_device_open = false;

void protect_device(bool open) {
  if (g_device_open == open) return;
  g_device_open = open;
  for (auto& [k, a] : allocs()) {
    if (!a.device || a.size > kProtectLimit) continue;
    mprotect(a.map + page_size(), a.map_len - 2 * page_size(),
             open ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
}
/// Device pages stay open while the emulator works on them (a scope).
struct DeviceOpen {
  bool was = g_device_open;
  DeviceOpen() { protect_device(true); }
  ~DeviceOpen() { protect_device(was); }
};

const Alloc* find_alloc(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto& m = allocs();
  auto it = m.upper_bound(u);
  if (it == m.begin()) return nullptr;
  --it;
  const Alloc& a = it->second;
  return u <= reinterpret_cast<uintptr_t>(a.data) + a.size ? &a : nullptr;
}

cudaError_t allocate(void** p, size_t bytes, bool device) {
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  const size_t ps = page_size();
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;  // device alignment
  if (device && g_device_used + rounded > kDeviceMemory) return fail(cudaErrorMemoryAllocation);
  const size_t data_pages = (rounded + ps - 1) / ps;
  const size_t len = (data_pages + 2) * ps;
  void* m = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  char* base = static_cast<char*>(m);
  mprotect(base + ps, data_pages * ps, PROT_READ | PROT_WRITE);
  Alloc a;
  a.map = base;
  a.map_len = len;
  a.data = base + ps + data_pages * ps - rounded;  // the end touches the guard page
  a.size = bytes;
  a.device = device;
  // Fresh device memory holds garbage on a GPU: here all-ones bytes (NaN as f32 and bf16), so
  // that a read of something never written shows.
  if (device && rounded <= kPoisonLimit) std::memset(a.data, 0xff, rounded);
  if (device && !g_device_open && bytes <= kProtectLimit) {
    mprotect(base + ps, data_pages * ps, PROT_NONE);
  }
  allocs()[reinterpret_cast<uintptr_t>(a.data)] = a;
  if (device) g_device_used += rounded;
  *p = a.data;
  return cudaSuccess;
}

cudaError_t release(void* p, bool device) {
  if (!p) return cudaSuccess;
  auto& m = allocs();
  auto it = m.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.end() || it->second.device != device) {
    std::fprintf(stderr, "CUDA emulator: %s(%p): not a pointer from %s\n",
                 device ? "cudaFree" : "cudaFreeHost", p, device ? "cudaMalloc" : "cudaHostAlloc");
    return fail(cudaErrorInvalidValue);
  }
  if (device) g_device_used -= (std::max<size_t>(it->second.size, 1) + 255) / 256 * 256;
  munmap(it->second.map, it->second.map_len);
  m.erase(it);
  return cudaSuccess;
}

// [p, p + n) within one allocation (device only, or device or pinned host)?
bool in_alloc(const void* p, size_t n, bool device_only) {
  const Alloc* a = find_alloc(p);
  if (!a || (device_only && !a->device)) return false;
  return static_cast<const char*>(p) + n <= a->data + a->size;
}

// ---- kernel execution: fibers ----
#if defined(__x86_64__)
extern "C" void sy_emu_switch(void** save_sp, void* next_sp);
// Saves the callee-saved registers, the SSE and x87 control words, and the stack pointer, then
// resumes the other context: a few nanoseconds, where swapcontext makes a system call.
asm(R"(
.text
.globl sy_emu_switch
.type sy_emu_switch,@function
sy_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr 8(%rsp)
  fldcw (%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size sy_emu_switch,.-sy_emu_switch
)");
#endif

// A barrier of a block or of a warp: it opens when every live thread has arrived; a thread that
// exits counts as arrived, as on the device.
struct Barrier {
  int live = 0, arrived = 0;
  uint64_t gen = 0;  // bumped at every opening
  // One more thread here; true when that opened the barrier.
  bool arrive() { return ++arrived == live ? (open(), true) : false; }
  void leave() {
    --live;
    if (arrived > 0 && arrived == live) open();
  }
  void open() {
    arrived = 0;
    ++gen;
  }
};

struct Fiber {
  dim3 tid;
  int lane = 0, warp = 0;
  bool started = false, done = false;
  const Barrier* waits_on = nullptr;  // until its gen moves past wait_gen
  uint64_t wait_gen = 0;
  char* stack = nullptr;  // top of its stack
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
};

struct WarpState {
  Barrier barrier;
  unsigned char slot[32][16];
};

struct BlockRun {
  const char* name = nullptr;
  const KernelBody* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  Barrier barrier;  // __syncthreads
  std::vector<unsigned char> smem_storage;
  unsigned char* smem = nullptr;
  uint64_t progress = 0;  // barrier releases and exits: a round without any is a deadlock
};

thread_local BlockRun* t_run = nullptr;
thread_local Fiber* t_cur = nullptr;
#if defined(__x86_64__)
thread_local void* t_sched_sp = nullptr;
#else
thread_local ucontext_t t_sched_ctx;
#endif

std::vector<char*>& stack_pool() {
  static thread_local std::vector<char*> pool;
  return pool;
}
char* stack_top(size_t i) {
  auto& pool = stack_pool();
  while (pool.size() <= i) {
    // A guard page under each stack: an overflow faults instead of writing into a neighbour.
    const size_t len = kFiberStack + page_size();
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "CUDA emulator: no memory for fiber stacks\n");
      std::abort();
    }
    mprotect(m, page_size(), PROT_NONE);
    pool.push_back(static_cast<char*>(m) + len);
  }
  return pool[i];
}

[[noreturn]] void fatal_in_kernel(const std::string& what) {
  std::fprintf(stderr, "CUDA emulator: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s\n",
               t_run ? t_run->name : "?", t_block_idx.x, t_block_idx.y, t_block_idx.z,
               t_thread_idx.x, t_thread_idx.y, t_thread_idx.z, what.c_str());
  std::abort();
}

void yield_to_scheduler() {
  Fiber* f = t_cur;
#if defined(__x86_64__)
  sy_emu_switch(&f->sp, t_sched_sp);
#else
  swapcontext(&f->ctx, &t_sched_ctx);
#endif
}

void on_exit_thread(Fiber& f) {
  BlockRun& R = *t_run;
  f.done = true;
  ++R.progress;
  R.barrier.leave();
  R.warps[static_cast<size_t>(f.warp)].barrier.leave();
}

void fiber_main() {
  Fiber* f = t_cur;
  try {
    t_run->body->call();
  } catch (const std::exception& e) {
    fatal_in_kernel(std::string("exception: ") + e.what());
  } catch (...) {
    fatal_in_kernel("unknown exception");
  }
  on_exit_thread(*f);
  yield_to_scheduler();
  std::abort();  // a finished fiber is never resumed
}

#if !defined(__x86_64__)
void fiber_trampoline() {
  fiber_main();
}
#endif

void start_fiber(Fiber& f, size_t i) {
  char* top = stack_top(i);
#if defined(__x86_64__)
  // The frame sy_emu_switch pops: control words, six registers, then "return" into fiber_main
  // with the stack aligned as after a call.
  auto* sp = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t{15});
  sp -= 2;  // sp[1]: a null return address for fiber_main; sp[0]: fiber_main
  sp[1] = 0;
  sp[0] = reinterpret_cast<uint64_t>(&fiber_main);
  sp -= 6;  // r15 .. rbp
  for (int k = 0; k < 6; ++k) sp[k] = 0;
  sp -= 2;
  sp[0] = 0x037f;  // x87 control word: default
  sp[1] = 0x1f80;  // MXCSR: default
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = top - kFiberStack;
  f.ctx.uc_stack.ss_size = kFiberStack;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_trampoline, 0);
#endif
  f.started = true;
}

void resume(Fiber& f) {
  t_cur = &f;
  t_thread_idx = f.tid;
#if defined(__x86_64__)
  sy_emu_switch(&t_sched_sp, f.sp);
#else
  swapcontext(&t_sched_ctx, &f.ctx);
#endif
}

void run_block(BlockRun& R, const dim3& block, bool reverse) {
  const unsigned n = block.x * block.y * block.z;
  R.fibers.assign(n, Fiber{});
  R.warps.assign((n + 31) / 32, WarpState{});
  R.barrier = Barrier{};
  R.barrier.live = static_cast<int>(n);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = R.fibers[i];
    f.tid = dim3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
    f.lane = static_cast<int>(i % 32);
    f.warp = static_cast<int>(i / 32);
    ++R.warps[i / 32].barrier.live;
  }
  // Dynamic shared memory starts as NaN bytes in every block, as garbage would on a device.
  std::fill(R.smem_storage.begin(), R.smem_storage.end(), static_cast<unsigned char>(0xff));
  size_t finished = 0;
  while (finished < n) {
    const uint64_t before = R.progress;
    bool ran = false;
    for (unsigned k = 0; k < n; ++k) {
      const unsigned i = reverse ? n - 1 - k : k;
      Fiber& f = R.fibers[i];
      if (f.done) continue;
      if (f.waits_on && f.waits_on->gen == f.wait_gen) continue;
      f.waits_on = nullptr;
      if (!f.started) start_fiber(f, i);
      resume(f);
      ran = true;
      if (f.done) ++finished;
    }
    if (!ran && R.progress == before) {
      int at_block = 0, at_warp = 0;
      for (const Fiber& f : R.fibers) {
        if (!f.done) (f.waits_on == &R.barrier ? at_block : at_warp)++;
      }
      fatal_in_kernel("deadlock: " + std::to_string(at_block) + " threads wait at __syncthreads, " +
                      std::to_string(at_warp) +
                      " at a warp-wide step (a barrier not reached by every live thread)");
    }
  }
}

// ---- streams, graphs, events ----
struct Op {
  virtual ~Op() = default;
  virtual void run() = 0;
};

struct KernelOp final : Op {
  std::string name;
  LaunchCfg cfg;
  std::unique_ptr<KernelBody> body;
  KernelOp(const char* n, const LaunchCfg& c, KernelBody* b) : name(n), cfg(c), body(b) {}
  void run() override {
    BlockRun R;
    R.name = name.c_str();
    R.body = body.get();
    R.smem_storage.assign(cfg.smem + 128, 0);
    R.smem = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<uintptr_t>(R.smem_storage.data()) + 127) & ~uintptr_t{127});
    BlockRun* outer = t_run;
    t_run = &R;
    t_block_dim = cfg.block;
    t_grid_dim = cfg.grid;
    uint64_t linear = 0;
    for (unsigned z = 0; z < cfg.grid.z; ++z) {
      for (unsigned y = 0; y < cfg.grid.y; ++y) {
        for (unsigned x = 0; x < cfg.grid.x; ++x) {
          t_block_idx = dim3(x, y, z);
          // Alternate blocks run their threads in reverse order: a read that relies on another
          // thread's write without a barrier in between then sees the wrong value in one order.
          run_block(R, cfg.block, (linear++ & 1) != 0);
        }
      }
    }
    t_run = outer;
  }
};

struct FnOp final : Op {
  std::function<void()> fn;
  explicit FnOp(std::function<void()> f) : fn(std::move(f)) {}
  void run() override { fn(); }
};

}  // namespace

struct Stream {
  unsigned flags = 0;
  std::vector<std::shared_ptr<Op>> queue;
  bool capturing = false;
  std::vector<std::shared_ptr<Op>> captured;
};
struct Graph {
  std::vector<std::shared_ptr<Op>> ops;
};
struct GraphExec {
  std::vector<std::shared_ptr<Op>> ops;
};
struct Event {
  Stream* stream = nullptr;
  bool done = false;
  std::chrono::steady_clock::time_point at;
};

namespace {

Stream& legacy_stream() {
  static Stream s;
  return s;
}
std::vector<Stream*>& all_streams() {
  static std::vector<Stream*> v;
  return v;
}
Stream& resolve(cudaStream_t s) {
  return s ? *s : legacy_stream();
}

void flush(Stream& s) {
  if (s.queue.empty()) return;
  DeviceOpen open;
  // Ops may queue more work (none do today); take the list first.
  auto ops = std::move(s.queue);
  s.queue.clear();
  for (auto& op : ops) op->run();
}
// What the legacy default stream waits for: itself and every blocking stream.
void flush_legacy() {
  for (Stream* s : all_streams()) {
    if ((s->flags & cudaStreamNonBlocking) == 0) flush(*s);
  }
  flush(legacy_stream());
}
void flush_all() {
  for (Stream* s : all_streams()) flush(*s);
  flush(legacy_stream());
}

void submit(cudaStream_t st, std::shared_ptr<Op> op) {
  Stream& s = resolve(st);
  if (s.capturing) {
    s.captured.push_back(std::move(op));
  } else {
    s.queue.push_back(std::move(op));
  }
}

std::map<const void*, int>& func_smem_limits() {
  static std::map<const void*, int> m;
  return m;
}

}  // namespace

// ---- what kernels call ----
void* dynamic_smem_raw() {
  return t_run ? t_run->smem : nullptr;
}
int lane_id() {
  return t_cur ? t_cur->lane : 0;
}
namespace {
// The running thread arrives at `b`: the last to arrive opens it and goes on, the others wait.
void wait_at(Barrier& b) {
  if (b.arrive()) {
    ++t_run->progress;
    return;
  }
  t_cur->waits_on = &b;
  t_cur->wait_gen = b.gen;
  yield_to_scheduler();
}
}  // namespace
void sync_block() {
  wait_at(t_run->barrier);
}
void sync_warp() {
  wait_at(t_run->warps[static_cast<size_t>(t_cur->warp)].barrier);
}
void warp_exchange(const void* v, void* out, size_t bytes, int src_lane) {
  if (bytes > 16) fatal_in_kernel("warp shuffle of more than 16 bytes");
  WarpState& W = t_run->warps[static_cast<size_t>(t_cur->warp)];
  std::memcpy(W.slot[t_cur->lane], v, bytes);
  sync_warp();
  const size_t src = static_cast<size_t>(t_cur->warp) * 32 + static_cast<size_t>(src_lane);
  if (src >= t_run->fibers.size() || t_run->fibers[src].done) {
    fatal_in_kernel("warp shuffle reads lane " + std::to_string(src_lane) +
                    ", which has exited or does not exist");
  }
  std::memcpy(out, W.slot[src_lane], bytes);
  sync_warp();
}

cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > kOptinSmemLimit)
      return fail(cudaErrorInvalidValue);
    func_smem_limits()[fn] = value;
  }
  return cudaSuccess;
}

void enqueue_launch(const char* name, const void* fn, const LaunchCfg& cfg, KernelBody* body,
                    const void* const* ptr_args, size_t n_ptr_args) {
  std::unique_ptr<KernelBody> owned(body);
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  const dim3 g = cfg.grid, b = cfg.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0 || threads > kMaxThreads || b.z > 64 ||
      g.y > 65535 || g.z > 65535) {
    std::fprintf(stderr, "CUDA emulator: launch of %s with grid (%u,%u,%u), block (%u,%u,%u)\n",
                 name, g.x, g.y, g.z, b.x, b.y, b.z);
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  size_t limit = kStaticSmemLimit;
  if (auto it = func_smem_limits().find(fn); it != func_smem_limits().end()) {
    limit = std::max(limit, static_cast<size_t>(it->second));
  }
  if (cfg.smem > limit) {
    std::fprintf(stderr,
                 "CUDA emulator: launch of %s asks for %zu bytes of dynamic shared memory, above "
                 "its limit of %zu (cudaFuncSetAttribute raises it up to %zu)\n",
                 name, cfg.smem, limit, kOptinSmemLimit);
    fail(cudaErrorInvalidValue);
    return;
  }
  for (size_t k = 0; k < n_ptr_args; ++k) {
    const void* p = ptr_args[k];
    if (p && !in_alloc(p, 0, false)) {
      // A pointer the device cannot read: the kernel would fault with an illegal address.
      std::fprintf(stderr,
                   "CUDA emulator: launch of %s: pointer argument %zu (%p) is not device memory "
                   "or pinned host memory\n",
                   name, k, p);
      fail(cudaErrorInvalidValue);
      return;
    }
  }
  submit(cfg.stream, std::make_shared<KernelOp>(name, cfg, owned.release()));
}

// ---- for the cuBLASLt emulation ----
std::recursive_mutex& lock_api() {
  return api_mutex();
}
void submit_fn(cudaStream_t s, std::function<void()> fn) {
  submit(s, std::make_shared<FnOp>(std::move(fn)));
}
bool is_device_range(const void* p, size_t bytes) {
  return in_alloc(p, bytes, true);
}

}  // namespace sy_emu

using namespace sy_emu;

namespace {

struct SegvSetup {
  SegvSetup() {
    static std::vector<char> alt(size_t{64} << 10);
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = &SegvSetup::handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
  }
  static void handler(int sig, siginfo_t* info, void*) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const char* what = "an address outside any emulated allocation";
    for (const auto& [k, a] : allocs()) {
      const auto lo = reinterpret_cast<uintptr_t>(a.map), hi = lo + a.map_len;
      if (addr < lo || addr >= hi) continue;
      const auto d0 = reinterpret_cast<uintptr_t>(a.data), d1 = d0 + a.size;
      if (addr >= d0 && addr < d1) {
        what = "device memory, from host code (copy it with cudaMemcpy first)";
      } else {
        what = a.device ? "past the ends of a device allocation"
                        : "past the ends of a pinned host allocation";
      }
      std::fprintf(stderr, "CUDA emulator: allocation %p of %zu bytes\n",
                   static_cast<void*>(a.data), a.size);
      break;
    }
    if (t_run) {
      std::fprintf(stderr,
                   "CUDA emulator: kernel %s, block (%u,%u,%u), thread (%u,%u,%u) touched %p: %s\n",
                   t_run->name, t_block_idx.x, t_block_idx.y, t_block_idx.z, t_thread_idx.x,
                   t_thread_idx.y, t_thread_idx.z, info->si_addr, what);
    } else {
      std::fprintf(stderr, "CUDA emulator: signal %d at %p: %s\n", sig, info->si_addr, what);
    }
  }
};
void ensure_setup() {
  static SegvSetup s;
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* n) {
  ensure_setup();
  if (!n) return fail(cudaErrorInvalidValue);
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  ensure_setup();
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p || device != 0) return fail(cudaErrorInvalidValue);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "Switchyard CUDA emulator (CPU)");
  p->totalGlobalMem = kDeviceMemory;
  p->sharedMemPerBlock = kStaticSmemLimit;
  p->sharedMemPerBlockOptin = kOptinSmemLimit;
  p->warpSize = 32;
  p->maxThreadsPerBlock = static_cast<int>(kMaxThreads);
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  p->l2CacheSize = 50 << 20;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  flush_all();
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  return t_last_error;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureWrongThread:
      return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    default:
      return cudaGetErrorName(e);
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  ensure_setup();
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  return allocate(p, bytes, true);
}
cudaError_t cudaFree(void* p) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  flush_all();  // cudaFree waits for the device, so queued work may still use the memory
  return release(p, true);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  ensure_setup();
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  return allocate(p, bytes, false);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}
cudaError_t cudaFreeHost(void* p) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  flush_all();
  return release(p, false);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue);
  *total_bytes = kDeviceMemory;
  *free_bytes = kDeviceMemory - g_device_used;
  return cudaSuccess;
}

namespace {
// Device ends of a copy must lie in device allocations; host ends must not (pinned is fine).
cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       const char* what) {
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  bool ok = true;
  if (kind == cudaMemcpyDefault) {
    ok = true;
  } else {
    if (dst_dev && !in_alloc(dst, bytes, true)) ok = false;
    if (src_dev && !in_alloc(src, bytes, true)) ok = false;
    if (!dst_dev && in_alloc(dst, 0, true)) ok = false;
    if (!src_dev && in_alloc(src, 0, true)) ok = false;
  }
  if (!ok) {
    std::fprintf(stderr,
                 "CUDA emulator: %s of %zu bytes from %p to %p, kind %d: a device end is not "
                 "inside one cudaMalloc allocation, or a host end is device memory\n",
                 what, bytes, src, dst, static_cast<int>(kind));
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (const cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpy"); e != cudaSuccess)
    return e;
  // A synchronous copy runs on the legacy default stream: it waits for that stream and the
  // blocking streams, not for streams made with cudaStreamNonBlocking.
  flush_legacy();
  DeviceOpen open;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (const cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpyAsync"); e != cudaSuccess)
    return e;
  submit(stream, std::make_shared<FnOp>([=] { std::memmove(dst, src, bytes); }));
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (height == 0 || width == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue);
  // Each end's whole span, checked as a copy of that many bytes.
  const size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((dst_dev && !in_alloc(dst, dspan, true)) || (src_dev && !in_alloc(src, sspan, true))) {
    std::fprintf(stderr, "CUDA emulator: cudaMemcpy2DAsync outside a device allocation\n");
    return fail(cudaErrorInvalidValue);
  }
  submit(stream, std::make_shared<FnOp>([=] {
           for (size_t r = 0; r < height; ++r) {
             std::memmove(static_cast<char*>(dst) + r * dpitch,
                          static_cast<const char*>(src) + r * spitch, width);
           }
         }));
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!in_alloc(p, bytes, true)) return fail(cudaErrorInvalidValue);
  flush_legacy();
  DeviceOpen open;
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!in_alloc(p, bytes, true)) return fail(cudaErrorInvalidValue);
  submit(stream, std::make_shared<FnOp>([=] { std::memset(p, value, bytes); }));
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  ensure_setup();
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!s) return fail(cudaErrorInvalidValue);
  *s = new Stream;
  (*s)->flags = flags;
  all_streams().push_back(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  flush(*s);  // the device finishes a destroyed stream's work
  auto& v = all_streams();
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  Stream& st = resolve(s);
  if (st.capturing) {
    st.capturing = false;  // the capture is invalidated
    st.captured.clear();
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (s) {
    flush(st);
  } else {
    flush_legacy();
  }
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!s) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  if (s->capturing) return fail(cudaErrorInvalidValue);
  s->capturing = true;
  s->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!s || !g) return fail(cudaErrorInvalidValue);
  if (!s->capturing) {
    *g = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  s->capturing = false;
  *g = new Graph{std::move(s->captured)};
  s->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!exec || !g) return fail(cudaErrorInvalidValue);
  *exec = new GraphExec{g->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!exec) return fail(cudaErrorInvalidResourceHandle);
  for (const auto& op : exec->ops) submit(s, op);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  if (!e) return fail(cudaErrorInvalidValue);
  *e = new Event;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  e->stream = &resolve(s);
  e->done = false;
  submit(s, std::make_shared<FnOp>([e] {
           e->done = true;
           e->at = std::chrono::steady_clock::now();
         }));
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> lock(api_mutex());
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (e->stream) flush(*e->stream);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b || !a->done || !b->done) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}
