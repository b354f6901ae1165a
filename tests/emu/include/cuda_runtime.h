// CUDA emulator: the part of the CUDA runtime API and of the device language that Switchyard's
// kernels and CUDA engine use, so that their unmodified sources run on a CPU (tests/emu/README.md).
// Kernel threads are fibers; a block's threads run interleaved at barriers on the calling thread.
#pragma once

#include <math.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- execution-space qualifiers: every function is a host function here ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// Static shared arrays: one copy per emulating OS thread, shared by the fibers of the block it
// runs (blocks run one at a time on a thread). Dynamic (extern) shared memory is rewritten by
// tests/emu/rewrite_cu.py into a pointer from sy_emu::dynamic_smem().
#define __shared__ static thread_local
#define __align__(n) alignas(n)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) {
  return float4{x, y, z, w};
}

// ---- runtime types ----
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorNoDevice = 100,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
constexpr unsigned cudaStreamDefault = 0x0;
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaHostAllocDefault = 0x0;
constexpr unsigned cudaEventDefault = 0x0;

namespace sy_emu {
struct Stream;
struct Event;
struct Graph;
struct GraphExec;
}  // namespace sy_emu
using cudaStream_t = sy_emu::Stream*;
using cudaEvent_t = sy_emu::Event*;
using cudaGraph_t = sy_emu::Graph*;
using cudaGraphExec_t = sy_emu::GraphExec*;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int warpSize;
  int maxThreadsPerBlock;
  int maxGridSize[3];
  int multiProcessorCount;
  int major;
  int minor;
  int l2CacheSize;
};

// ---- runtime API ----
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);

cudaError_t cudaMalloc(void** p, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
template <class T>
cudaError_t cudaHostAlloc(T** p, size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(p), bytes, flags);
}
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);

namespace sy_emu {
cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value);
}
template <class F>
cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute attr, int value) {
  return sy_emu::func_set_attribute(reinterpret_cast<const void*>(fn), attr, value);
}

// ---- the emulator's launch machinery (what rewrite_cu.py turns `k<<<...>>>(args)` into) ----
namespace sy_emu {

/// Grid, block, dynamic shared bytes and stream of one launch, as written between <<< >>>.
struct LaunchCfg {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  LaunchCfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
      : grid(g), block(b), smem(s), stream(st) {}
};

/// A launch's body as the emulator runs it: call() runs one thread of the kernel.
struct KernelBody {
  virtual ~KernelBody() = default;
  virtual void call() const = 0;
};
template <class Fn, class Tuple>
struct KernelBodyImpl final : KernelBody {
  Fn fn;
  Tuple args;
  KernelBodyImpl(Fn f, Tuple a) : fn(f), args(std::move(a)) {}
  // Each thread gets its own copy of the parameters, as on the device.
  void call() const override {
    Tuple copy = args;
    std::apply(fn, copy);
  }
};

/// Checks the configuration, then queues (or captures) the launch on its stream.
void enqueue_launch(const char* name, const void* fn, const LaunchCfg& cfg, KernelBody* body,
                    const void* const* ptr_args, size_t n_ptr_args);

template <class T>
void collect_ptr(const T& v, const void** out, size_t& n) {
  if constexpr (std::is_pointer_v<T>) out[n++] = static_cast<const void*>(v);
}

/// `name<<<cfg>>>(args...)` becomes `launch("name", LaunchCfg(cfg), name)(args...)`: the
/// arguments are converted to the kernel's parameter types at the launch, as CUDA copies them.
template <class... P>
auto launch(const char* name, const LaunchCfg& cfg, void (*fn)(P...)) {
  return [name, cfg, fn](auto&&... a) {
    using Tuple = std::tuple<std::decay_t<P>...>;
    Tuple args(std::forward<decltype(a)>(a)...);
    const void* ptrs[sizeof...(P) + 1] = {};
    size_t n = 0;
    std::apply([&](const auto&... v) { (collect_ptr(v, ptrs, n), ...); }, args);
    enqueue_launch(name, reinterpret_cast<const void*>(fn), cfg,
                   new KernelBodyImpl<void (*)(P...), Tuple>(fn, std::move(args)), ptrs, n);
  };
}

// ---- what a running kernel thread sees ----
extern thread_local dim3 t_thread_idx, t_block_idx, t_block_dim, t_grid_dim;
/// The dynamic shared memory of the running block (128-byte aligned, NaN-filled at block start).
void* dynamic_smem_raw();
template <class T>
T* dynamic_smem() {
  return static_cast<T*>(dynamic_smem_raw());
}
void sync_block();
void sync_warp();
/// Warp exchange: every live lane of the warp publishes v, then reads lane src_lane's value.
void warp_exchange(const void* v, void* out, size_t bytes, int src_lane);
int lane_id();

}  // namespace sy_emu

#define threadIdx (::sy_emu::t_thread_idx)
#define blockIdx (::sy_emu::t_block_idx)
#define blockDim (::sy_emu::t_block_dim)
#define gridDim (::sy_emu::t_grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() {
  sy_emu::sync_block();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  sy_emu::sync_warp();
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  T out;
  const int lane = sy_emu::lane_id();
  sy_emu::warp_exchange(&v, &out, sizeof(T),
                        (lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1)));
  return out;
}
template <class T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  T out;
  const int lane = sy_emu::lane_id();
  sy_emu::warp_exchange(&v, &out, sizeof(T), (lane & ~(width - 1)) | (src & (width - 1)));
  return out;
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  T out;
  const int lane = sy_emu::lane_id();
  const int seg = lane & ~(width - 1), src = (lane & (width - 1)) + static_cast<int>(delta);
  sy_emu::warp_exchange(&v, &out, sizeof(T), src < width ? seg | src : lane);
  return out;
}

// ---- device math ----
inline float rsqrtf(float x) {
  return 1.0f / sqrtf(x);
}
inline float __expf(float x) {
  return expf(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float __uint_as_float(unsigned u) {
  return std::bit_cast<float>(u);
}
inline unsigned __float_as_uint(float f) {
  return std::bit_cast<unsigned>(f);
}
inline float __int_as_float(int i) {
  return std::bit_cast<float>(i);
}
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
  return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
  return a > b ? a : b;
}
inline long long min(long long a, long long b) {
  return a < b ? a : b;
}
inline long long max(long long a, long long b) {
  return a > b ? a : b;
}
inline long min(long a, long b) {
  return a < b ? a : b;
}
inline long max(long a, long b) {
  return a > b ? a : b;
}
