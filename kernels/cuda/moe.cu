// Mixture-of-experts kernels. Routing is a thread per token; the grouping is one block, so that
// its counting sort needs no atomics and no second launch: counts per expert, their prefix sums,
// then each pick's place, in token order within an expert (the CPU engine's order). In the
// grouped product a warp streams kRowsPerWarp weight rows of the tile's expert, applying each
// element to the tile's up to kMoeTileRows grouped rows; the lanes' partial sums meet in shared
// memory once per block rather than in a shuffle tree per sum. Tiles past the grouping's end
// leave at once.
#include <algorithm>

#include "kernels/cuda/moe.cuh"

namespace sy::cuda {
namespace {

constexpr int kRouteThreads = 128;             // a token per thread: a decode step fits one block
constexpr int kGroupThreads = kMoeMaxExperts;  // a thread per expert counts and advances it
constexpr int kWarps = 8;                      // warps per block of moe_matmul
constexpr int kRowsPerWarp = 4;                // each activation load serves 4 weight rows
constexpr int kBlockRows = kWarps * kRowsPerWarp;
// (weight row, grouped row) sums per block: one per thread in the final reduction.
constexpr int kPairs = kBlockRows * kMoeTileRows;
static_assert(kPairs == kWarps * 32, "moe_matmul: one block thread per (row, grouped row) sum");
constexpr int kThreads = 256;  // element-wise kernels
// Grid-stride loops: 64k blocks is far more than enough to fill any GPU.
constexpr int64_t kMaxBlocks = 65536;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// One token's choice, as the CPU engine's route(): p = softmax of the experts' logits, the n_used
// largest p (the lower index on ties), their weights; the expert of pick j goes to pick[j].
__global__ void route_kernel(const float* logits, int64_t ld, int n_tokens, int n_experts,
                             int n_used, bool renorm, float scale, float* weight, float* gate,
                             int32_t* pick) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  const float* lg = logits + int64_t{t} * ld;
  float mx = lg[0];
  for (int e = 1; e < n_experts; ++e) mx = fmaxf(mx, lg[e]);
  float sum = 0.0f;
  for (int e = 0; e < n_experts; ++e) sum += expf(lg[e] - mx);
  const float inv = 1.0f / sum;
  int32_t* pk = pick + int64_t{t} * n_used;
  float* wt = weight + int64_t{t} * n_used;
  float chosen = 0.0f;
  for (int j = 0; j < n_used; ++j) {
    int best = -1;
    float best_p = 0.0f;
    for (int e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || pk[i] == e;
      if (taken) continue;
      const float p = expf(lg[e] - mx) * inv;
      if (best < 0 || p > best_p) {
        best = e;
        best_p = p;
      }
    }
    pk[j] = best;
    wt[j] = best_p;
    chosen += best_p;
  }
  const float k = (renorm ? 1.0f / chosen : 1.0f) * scale;
  for (int j = 0; j < n_used; ++j) wt[j] *= k;
  if (gate) gate[t] = 1.0f / (1.0f + expf(-lg[n_experts]));
}

// The counting sort of the n_picks picks by expert, in one block of kGroupThreads. `pos` holds
// each pick's expert on entry and its grouped row on exit.
__global__ void group_kernel(int n_picks, int n_experts, int n_used, int32_t* pos, int32_t* src,
                             int32_t* offset, int32_t* tiles, int n_tiles) {
  __shared__ int32_t chunk[kGroupThreads];    // experts of the picks of one chunk
  __shared__ int32_t cursor[kMoeMaxExperts];  // each expert's next grouped row
  __shared__ int32_t first_tile[kMoeMaxExperts + 1];
  const int tid = threadIdx.x;
  const int nt = blockDim.x;
  // Thread e counts expert e's picks, a chunk of nt picks at a time.
  int32_t count = 0;
  for (int b = 0; b < n_picks; b += nt) {
    chunk[tid] = b + tid < n_picks ? pos[b + tid] : -1;
    __syncthreads();
    if (tid < n_experts) {
      for (int j = 0; j < nt; ++j) count += chunk[j] == tid ? 1 : 0;
    }
    __syncthreads();
  }
  if (tid < n_experts) cursor[tid] = count;
  __syncthreads();
  if (tid == 0) {
    // Prefix sums: rows and tiles (few hundred experts at most: one thread is quick enough).
    int32_t row = 0, tile = 0;
    for (int e = 0; e < n_experts; ++e) {
      const int32_t n = cursor[e];
      offset[e] = row;
      cursor[e] = row;
      first_tile[e] = tile;
      row += n;
      tile += (n + kMoeTileRows - 1) / kMoeTileRows;
    }
    offset[n_experts] = row;
    first_tile[n_experts] = tile;
  }
  __syncthreads();
  if (tiles) {
    if (tid < n_experts) {
      int32_t i = first_tile[tid];
      for (int32_t p = cursor[tid]; p < cursor[tid] + count; p += kMoeTileRows, ++i) {
        tiles[2 * i] = tid;
        tiles[2 * i + 1] = p;
      }
    }
    for (int i = first_tile[n_experts] + tid; i < n_tiles; i += nt) {
      tiles[2 * i] = -1;
      tiles[2 * i + 1] = 0;
    }
  }
  // Each pick to its place: after the earlier chunks' picks of its expert and the earlier picks
  // of its own chunk.
  for (int b = 0; b < n_picks; b += nt) {
    const int i = b + tid;
    const int32_t e = i < n_picks ? pos[i] : -1;
    chunk[tid] = e;
    __syncthreads();
    if (e >= 0) {
      int32_t rank = 0;
      for (int j = 0; j < tid; ++j) rank += chunk[j] == e ? 1 : 0;
      const int32_t p = cursor[e] + rank;
      src[p] = i / n_used;
      pos[i] = p;
    }
    __syncthreads();
    if (tid < n_experts) {
      int32_t n = 0;
      for (int j = 0; j < nt; ++j) n += chunk[j] == tid ? 1 : 0;
      cursor[tid] += n;
    }
    __syncthreads();
  }
}

// V weights from w (V = 1, or 16 bytes' worth) as f32.
template <int V>
__device__ __forceinline__ void load_w(const float* w, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = w[0];
  } else {
    static_assert(V == 4);
    const float4 v = *reinterpret_cast<const float4*>(w);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
}
template <int V>
__device__ __forceinline__ void load_w(const bf16* w, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = dev::to_f(w[0]);
  } else {
    static_assert(V == 8);
    // Little-endian pairs: the lower half of each word is the first element; a bf16's bits are
    // the upper half of its f32.
    const uint4 v = *reinterpret_cast<const uint4*>(w);
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
}

// V f32 activations from x (16-byte loads where V > 1).
template <int V>
__device__ __forceinline__ void load_x(const float* x, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = x[0];
  } else {
#pragma unroll
    for (int i = 0; i < V; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(x + i);
      out[i] = v.x;
      out[i + 1] = v.y;
      out[i + 2] = v.z;
      out[i + 3] = v.w;
    }
  }
}

// Block (kBlockRows weight rows, tile of grouped rows): warp w takes rows kRowsPerWarp * w + i of
// the block's, lane l their elements V at a time, at l * V, (l + 32) * V, ...; then thread t adds
// the 32 lanes' partials of sum t.
template <class T, int V>
__global__ void moe_matmul_kernel(const T* w, int64_t rows, int64_t cols, const float* x,
                                  const int32_t* x_rows, const int32_t* offset,
                                  const int32_t* tiles, float* y) {
  // [lane][sum], padded: the lanes of a warp write one sum each to distinct banks.
  __shared__ float part[32][kPairs + 1];
  const int32_t e = tiles[2 * blockIdx.y];
  if (e < 0) return;  // a tile the grouping left unused: the whole block leaves
  const int32_t p0 = tiles[2 * blockIdx.y + 1];
  const int n = min(kMoeTileRows, offset[e + 1] - p0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = int64_t{blockIdx.x} * kBlockRows;
  const T* wr[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    // Rows past the matrix repeat its last one (in bounds); their sums are never written.
    const int64_t ri = row0 + warp * kRowsPerWarp + i;
    const int64_t r = ri < rows ? ri : rows - 1;
    wr[i] = w + (int64_t{e} * rows + r) * cols;
  }
  const float* xs[kMoeTileRows];
#pragma unroll
  for (int s = 0; s < kMoeTileRows; ++s) {
    const int32_t p = p0 + min(s, n - 1);  // rows past n are never read; keep them in bounds
    xs[s] = x + int64_t{x_rows ? x_rows[p] : p} * cols;
  }
  float acc[kRowsPerWarp][kMoeTileRows];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
#pragma unroll
    for (int s = 0; s < kMoeTileRows; ++s) acc[i][s] = 0.0f;
  }
  for (int64_t c = int64_t{lane} * V; c < cols; c += 32 * V) {
    float wv[kRowsPerWarp][V];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) load_w<V>(wr[i] + c, wv[i]);
#pragma unroll
    for (int s = 0; s < kMoeTileRows; ++s) {
      if (s < n) {
        float xv[V];
        load_x<V>(xs[s] + c, xv);
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
#pragma unroll
          for (int v = 0; v < V; ++v) acc[i][s] = fmaf(wv[i][v], xv[v], acc[i][s]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
#pragma unroll
    for (int s = 0; s < kMoeTileRows; ++s)
      part[lane][(warp * kRowsPerWarp + i) * kMoeTileRows + s] = acc[i][s];
  }
  __syncthreads();
  const int t = threadIdx.x, s = t % kMoeTileRows;
  const int64_t r = row0 + t / kMoeTileRows;
  if (s < n && r < rows) {
    float sum = 0.0f;
    for (int l = 0; l < 32; ++l) sum += part[l][t];
    y[int64_t{p0 + s} * rows + r] = sum;
  }
}

template <class T>
__global__ void gather_kernel(const float* x, const int32_t* src, int64_t n, int64_t dim, T* out) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = k / dim, d = k % dim;
    out[k] = dev::from_f<T>(x[int64_t{src[p]} * dim + d]);
  }
}

__global__ void combine_kernel(const float* ye, const int32_t* pos, const float* weight, int n_used,
                               int64_t n, int64_t dim, const float* gate, const float* ys,
                               float* out) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = k / dim, d = k % dim;
    float acc = 0.0f;
    for (int j = 0; j < n_used; ++j) {
      const int64_t i = t * n_used + j;
      acc += weight[i] * ye[int64_t{pos[i]} * dim + d];
    }
    if (gate) acc += gate[t] * ys[k];
    out[k] = acc;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

cudaError_t moe_route(const float* logits, int64_t ld, int n_tokens, int n_experts, int n_used,
                      bool renorm, float scale, const MoeRouting& r, cudaStream_t stream) {
  if (n_experts < 1 || n_experts > kMoeMaxExperts || n_used < 1 || n_used > n_experts ||
      ld < n_experts + (r.gate ? 1 : 0) ||
      (r.tiles && r.n_tiles < moe_max_tiles(n_tokens, n_used, n_experts))) {
    return cudaErrorInvalidValue;
  }
  if (n_tokens <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n_tokens + kRouteThreads - 1) / kRouteThreads);
  route_kernel<<<blocks, kRouteThreads, 0, stream>>>(logits, ld, n_tokens, n_experts, n_used,
                                                     renorm, scale, r.weight, r.gate, r.pos);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  group_kernel<<<1, kGroupThreads, 0, stream>>>(n_tokens * n_used, n_experts, n_used, r.pos, r.src,
                                                r.offset, r.tiles,
                                                r.tiles ? static_cast<int>(r.n_tiles) : 0);
  return cudaGetLastError();
}

template <class T>
cudaError_t moe_matmul(const T* w, int64_t rows, int64_t cols, const float* x,
                       const int32_t* x_rows, const int32_t* offset, const int32_t* tiles,
                       int64_t n_tiles, float* y, cudaStream_t stream) {
  if (n_tiles > 65535 || cols <= 0) return cudaErrorInvalidValue;
  if (rows <= 0 || n_tiles <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows),
                  static_cast<unsigned>(n_tiles));
  // 16-byte loads where every row starts on 16 bytes (a whole number of them per row, aligned
  // bases), else one element at a time.
  constexpr int kVec = 16 / sizeof(T);
  if (cols % kVec == 0 && aligned16(w) && aligned16(x)) {
    moe_matmul_kernel<T, kVec>
        <<<grid, kWarps * 32, 0, stream>>>(w, rows, cols, x, x_rows, offset, tiles, y);
  } else {
    moe_matmul_kernel<T, 1>
        <<<grid, kWarps * 32, 0, stream>>>(w, rows, cols, x, x_rows, offset, tiles, y);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t moe_gather(const float* x, const int32_t* src, int64_t n_rows, int64_t dim, T* out,
                       cudaStream_t stream) {
  const int64_t n = n_rows * dim;
  if (n <= 0) return cudaSuccess;
  gather_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, src, n, dim, out);
  return cudaGetLastError();
}

cudaError_t moe_combine(const float* ye, const int32_t* pos, const float* weight, int n_tokens,
                        int n_used, int64_t dim, const float* gate, const float* ys, float* out,
                        cudaStream_t stream) {
  const int64_t n = int64_t{n_tokens} * dim;
  if (n <= 0) return cudaSuccess;
  combine_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ye, pos, weight, n_used, n, dim, gate, ys,
                                                         out);
  return cudaGetLastError();
}

template cudaError_t moe_matmul<float>(const float*, int64_t, int64_t, const float*, const int32_t*,
                                       const int32_t*, const int32_t*, int64_t, float*,
                                       cudaStream_t);
template cudaError_t moe_matmul<bf16>(const bf16*, int64_t, int64_t, const float*, const int32_t*,
                                      const int32_t*, const int32_t*, int64_t, float*,
                                      cudaStream_t);
template cudaError_t moe_gather<float>(const float*, const int32_t*, int64_t, int64_t, float*,
                                       cudaStream_t);
template cudaError_t moe_gather<bf16>(const float*, const int32_t*, int64_t, int64_t, bf16*,
                                      cudaStream_t);

}  // namespace sy::cuda
