// Split-K paged decode attention: pass 1 scores one key range of one row per block (up to kMaxG
// query heads of one KV head together, so each key and value is read once per group), pass 2
// merges. A row's keys are its sink slots (if any) followed by its window, numbered 0.. as one
// range. Pass 1 walks its range in tiles of kTile keys, in three phases separated by barriers:
// scores (a group of 8 lanes per key, 16-byte loads of the key), the online softmax of the tile
// (a lane per key), and the weighted values (each thread 8 dimensions of every v_groups-th key
// of the tile; the groups' sums are added through shared memory at the end).
#include <algorithm>
#include <cstring>

#include "kernels/cuda/attention_decode.cuh"

namespace sy::cuda {
namespace {

constexpr int kWarps = 4;        // 128 threads per block
constexpr int kTile = 32;        // keys per tile: one per lane in the softmax phase
constexpr int kMaxG = 8;         // query heads per block; a KV head with more takes several blocks
constexpr int kChunk = 8;        // dimensions per 16-byte half load (two for a float cache)
constexpr int kMaxVGroups = 16;  // key groups of the value phase (8 for head_dim 128)

/// The 8 values at p (16-byte aligned) as floats.
__device__ __forceinline__ void load8(const half* p, float* out) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  half h[8];
  memcpy(h, &u, sizeof(u));
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = __half2float(h[k]);
}
__device__ __forceinline__ void load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
  out[4] = b.x;
  out[5] = b.y;
  out[6] = b.z;
  out[7] = b.w;
}

// Block (split, kvh * g_blocks + gb, i): query heads kvh * G + gb * kMaxG + [0, gn) of row
// rows[i] over key range `split`. head_dim hd is a multiple of 8. The registers are sized by the
// template: kG >= gn query heads, kChunks >= hd / 64 chunks of a key per scoring lane. v_groups
// (value_groups(hd)) key groups share the value phase.
template <class C, int kG, int kChunks>
__global__ void __launch_bounds__(kWarps * 32)
    decode_partial_kernel(const float* q, int64_t q_stride, PagedKv<C> kv, const int32_t* rows,
                          int n_heads, int n_kv_heads, int hd, int n_splits, int v_groups,
                          float scale, float* ws) {
  extern __shared__ float smem[];
  const int G = n_heads / n_kv_heads;
  const int g_blocks = (G + kMaxG - 1) / kMaxG;
  const int kvh = blockIdx.y / g_blocks, gb = blockIdx.y % g_blocks;
  const int g0 = gb * kMaxG, gn = min(kMaxG, G - g0);
  const int h0 = kvh * G + g0;  // first query head of the block
  const bool sinks = kv.row_sinks != nullptr;
  float* sq = smem;                         // (gn, hd) scaled queries
  float* sqs = sq + gn * hd;                // (gn, hd) scaled sink queries, only with sinks
  float* ss = sqs + (sinks ? gn * hd : 0);  // (gn, kTile) the tile's scores, then weights
  float* sm = ss + gn * kTile;              // (gn) running maxima
  float* sl = sm + gn;                      // (gn) running sums
  float* sc = sl + gn;                      // (gn) the tile's rescale factors
  int64_t* sslot = reinterpret_cast<int64_t*>(sc + gn + (gn & 1));  // (kTile) cache slots
  float* sred = reinterpret_cast<float*>(sslot + kTile);  // (v_groups, gn, hd) the groups' sums
  const int i = blockIdx.z, split = blockIdx.x;
  const int64_t t = rows[i];
  const int nk = kv.row_nkeys[t];
  const int start = window_start(kv, t, nk);
  const int ns = sink_count(kv, t, start);
  // Key j < ns is sink slot j; key j >= ns is window slot start + j - ns.
  const int n_keys = ns + nk - start;
  const int chunk = (n_keys + n_splits - 1) / n_splits;
  const int k0 = split * chunk;
  const int k1 = min(n_keys, k0 + chunk);
  const int64_t kv_dim = int64_t{n_kv_heads} * hd;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  for (int e = tid; e < gn * hd; e += blockDim.x) {
    sq[e] = q[t * q_stride + int64_t{h0} * hd + e] * scale;
    if (sinks) sqs[e] = kv.q_sink[t * kv.q_sink_stride + int64_t{h0} * hd + e] * scale;
  }
  for (int g = tid; g < gn; g += blockDim.x) {
    sm[g] = -INFINITY;
    sl[g] = 0.0f;
  }

  const int32_t* bt = kv.block_tables + kv.seq_bt_off[kv.row_seq[t]];
  const C* kbase = kv.k + int64_t{kvh} * hd;
  const C* vbase = kv.v + int64_t{kvh} * hd;
  const int n_chunks = hd / kChunk;
  // Scores: 8 lanes per key (lane `sub` of group `grp` takes chunks sub, sub + 8, ...).
  const int grp = lane >> 3, sub = lane & 7;
  // Values: each thread 8 dimensions (chunk vc) of keys vg, vg + v_groups, ... of the tile.
  const int vc = tid / v_groups, vg = tid % v_groups;
  float acc[kG][kChunk];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) acc[g][k] = 0.0f;
  }

  for (int kb = k0; kb < k1; kb += kTile) {
    const int nt = min(kTile, k1 - kb);
    __syncthreads();  // the previous tile's weights and slots are read; the queries are written
    // Phase 1: scores of the tile's keys.
    for (int jj = warp * 4 + grp; jj < kTile; jj += kWarps * 4) {
      int64_t slot = 0;
      const bool real = jj < nt;
      const float* qb = sq;
      if (real) {
        const int j = kb + jj;
        const int key = j < ns ? j : start + j - ns;
        if (j < ns) qb = sqs;
        slot = int64_t{bt[key / kv.block_size]} * kv.block_size + key % kv.block_size;
      }
      float kr[kChunks][kChunk] = {};
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int c = sub + 8 * u;
        if (real && c < n_chunks) load8(kbase + slot * kv_dim + c * kChunk, kr[u]);
      }
      for (int g = 0; g < gn; ++g) {
        float s = 0.0f;
#pragma unroll
        for (int u = 0; u < kChunks; ++u) {
          const int c = sub + 8 * u;
          if (real && c < n_chunks) {
            const float* qc = qb + g * hd + c * kChunk;
#pragma unroll
            for (int k = 0; k < kChunk; ++k) s = fmaf(qc[k], kr[u][k], s);
          }
        }
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (sub == 0) ss[g * kTile + jj] = real ? capped(kv, s) : -INFINITY;
      }
      if (sub == 0) sslot[jj] = slot;
    }
    __syncthreads();
    // Phase 2: the online softmax over the tile, one warp per query head, one lane per key.
    for (int g = warp; g < gn; g += kWarps) {
      const float s = ss[g * kTile + lane];
      const float m_old = sm[g];
      const float m_new = fmaxf(m_old, dev::warp_max(s));  // finite: the tile has a real key
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float sum = dev::warp_sum(p);
      ss[g * kTile + lane] = p;
      __syncwarp();  // every lane has read sm[g] before lane 0 replaces it
      if (lane == 0) {
        const float corr = expf(m_old - m_new);  // m_old = -inf gives 0: nothing to rescale
        sm[g] = m_new;
        sl[g] = sl[g] * corr + sum;
        sc[g] = corr;
      }
    }
    __syncthreads();
    // Phase 3: the weighted values.
    if (vc < n_chunks) {
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g < gn) {
          const float corr = sc[g];
#pragma unroll
          for (int k = 0; k < kChunk; ++k) acc[g][k] *= corr;
        }
      }
      for (int jj = vg; jj < nt; jj += v_groups) {
        float vr[kChunk];
        load8(vbase + sslot[jj] * kv_dim + vc * kChunk, vr);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          if (g < gn) {
            const float p = ss[g * kTile + jj];
#pragma unroll
            for (int k = 0; k < kChunk; ++k) acc[g][k] = fmaf(p, vr[k], acc[g][k]);
          }
        }
      }
    }
  }
  // The key groups' sums, added in group order (the same result on every run); the softmax
  // state as phase 2 left it (published by its barrier).
  if (vc < n_chunks) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < gn) {
#pragma unroll
        for (int k = 0; k < kChunk; ++k) sred[(vg * gn + g) * hd + vc * kChunk + k] = acc[g][k];
      }
    }
  }
  __syncthreads();
  float* const w0 = ws + (int64_t{i} * n_heads + h0) * n_splits * (hd + 2);
  for (int e = tid; e < gn * hd; e += blockDim.x) {
    const int g = e / hd, d = e % hd;
    float a = 0.0f;
    for (int r = 0; r < v_groups; ++r) a += sred[r * gn * hd + e];
    float* p = w0 + (int64_t{g} * n_splits + split) * (hd + 2);
    if (d == 0) {
      p[0] = sm[g];
      p[1] = sl[g];
    }
    p[2 + d] = a;
  }
}

// One block per (row, head): the splits' weights exp(m - M) once, then each dimension's sum.
template <class T>
__global__ void decode_combine_kernel(const float* ws, const int32_t* rows, int n_heads, int hd,
                                      int n_splits, T* out, int64_t out_stride) {
  extern __shared__ float wgt[];  // (n_splits)
  __shared__ float red[32];
  const int i = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int64_t t = rows[i];
  const float* base = ws + (int64_t{i} * n_heads + h) * n_splits * (hd + 2);
  float m = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) m = fmaxf(m, base[s * (hd + 2)]);
  const float M = dev::block_max(m, red);
  float l = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float ms = base[s * (hd + 2)];
    const float f = ms == -INFINITY ? 0.0f : expf(ms - M);  // a split that saw no key: 0
    wgt[s] = f;
    l += base[s * (hd + 2) + 1] * f;
  }
  const float inv = 1.0f / dev::block_sum(l, red);  // its barriers also publish wgt
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float A = 0.0f;
    for (int s = 0; s < n_splits; ++s) A = fmaf(base[s * (hd + 2) + 2 + d], wgt[s], A);
    out[t * out_stride + int64_t{h} * hd + d] = dev::from_f<T>(A * inv);
  }
}

// Key groups of the value phase for head_dim hd: a power of two, as many as the block's threads
// allow with 8 dimensions a thread (at most kMaxVGroups).
int value_groups(int hd) {
  int v = 1;
  while (v * 2 <= std::min(kWarps * 32 / (hd / kChunk), kMaxVGroups)) v *= 2;
  return v;
}

}  // namespace

size_t attention_decode_workspace(int n_rows, int n_heads, int head_dim, int n_splits) {
  return static_cast<size_t>(n_rows) * n_heads * n_splits * (head_dim + 2);
}

template <class C, class T>
cudaError_t attention_decode(const float* q, int64_t q_stride, const PagedKv<C>& kv,
                             const int32_t* rows, int n_rows, int n_heads, int n_kv_heads,
                             int head_dim, int n_splits, float* workspace, T* out,
                             int64_t out_stride, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  if (head_dim > kMaxHeadDim || head_dim % kChunk != 0 || n_kv_heads <= 0 ||
      n_heads % n_kv_heads != 0 || n_splits < 1) {
    return cudaErrorInvalidValue;
  }
  const int G = n_heads / n_kv_heads;
  if (kv.row_sinks && !kv.q_sink) return cudaErrorInvalidValue;
  const int gn = std::min(G, kMaxG), g_blocks = (G + kMaxG - 1) / kMaxG;
  const size_t n_q = kv.row_sinks ? 2 : 1;  // the sink queries take a second (gn, hd) array
  const int v_groups = value_groups(head_dim);
  const size_t smem =
      sizeof(float) * ((n_q + v_groups) * gn * head_dim + static_cast<size_t>(gn) * kTile +
                       3 * static_cast<size_t>(gn) + (gn & 1)) +
      sizeof(int64_t) * kTile;
  // At most 50 KB (head_dim 256, 8 query heads, sinks): above 48 KB a kernel must opt in.
  const bool big = smem > 48 * 1024;
  const float scale = score_scale(kv, head_dim);
  const dim3 grid(n_splits, n_kv_heads * g_blocks, n_rows);
  // Register arrays for at most 4 or 8 query heads and 128 or 256 dimensions per key.
  auto kernel =
      gn <= 4 ? (head_dim <= 128 ? decode_partial_kernel<C, 4, 2> : decode_partial_kernel<C, 4, 4>)
              : (head_dim <= 128 ? decode_partial_kernel<C, 8, 2> : decode_partial_kernel<C, 8, 4>);
  if (big) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<grid, kWarps * 32, smem, stream>>>(q, q_stride, kv, rows, n_heads, n_kv_heads, head_dim,
                                              n_splits, v_groups, scale, workspace);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  decode_combine_kernel<T><<<n_rows * n_heads, 128, sizeof(float) * n_splits, stream>>>(
      workspace, rows, n_heads, head_dim, n_splits, out, out_stride);
  return cudaGetLastError();
}

// Every (cache, output) pair the engine runs: f32 or f16 cache, f32 or bf16 activations.
#define SY_ATTENTION_DECODE(C, T)                                                                  \
  template cudaError_t attention_decode<C, T>(const float*, int64_t, const PagedKv<C>&,            \
                                              const int32_t*, int, int, int, int, int, float*, T*, \
                                              int64_t, cudaStream_t)
SY_ATTENTION_DECODE(float, float);
SY_ATTENTION_DECODE(float, bf16);
SY_ATTENTION_DECODE(half, float);
SY_ATTENTION_DECODE(half, bf16);
#undef SY_ATTENTION_DECODE

}  // namespace sy::cuda
