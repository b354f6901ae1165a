// Split-K paged decode attention: pass 1 scores one key range of one row per block (all query
// heads of one KV head together, so each key and value is read once per group), pass 2 merges.
// A row's keys are its sink slots (if any) followed by its window, numbered 0.. as one range.
#include "kernels/cuda/attention_decode.cuh"

namespace sy::cuda {
namespace {

constexpr int kWarps = 4;                   // keys of a range are dealt round-robin to the warps
constexpr int kPerLane = kMaxHeadDim / 32;  // head_dim values each lane holds

template <class C>
__global__ void decode_partial_kernel(const float* q, int64_t q_stride, PagedKv<C> kv,
                                      const int32_t* rows, int n_heads, int n_kv_heads, int hd,
                                      int n_splits, float scale, float* ws) {
  extern __shared__ float smem[];
  const int G = n_heads / n_kv_heads;
  const bool sinks = kv.row_sinks != nullptr;
  float* sq = smem;                          // (G, hd) scaled queries
  float* sqs = sq + G * hd;                  // (G, hd) scaled sink queries, only with sinks
  float* sacc = sqs + (sinks ? G * hd : 0);  // (warps, G, hd) unnormalised outputs
  float* sm = sacc + kWarps * G * hd;        // (warps, G) running maxima
  float* sl = sm + kWarps * G;               // (warps, G) running sums
  const int i = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x;
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

  for (int e = threadIdx.x; e < G * hd; e += blockDim.x) {
    sq[e] = q[t * q_stride + int64_t{kvh} * G * hd + e] * scale;
    if (sinks) sqs[e] = kv.q_sink[t * kv.q_sink_stride + int64_t{kvh} * G * hd + e] * scale;
  }
  for (int e = threadIdx.x; e < kWarps * G * hd; e += blockDim.x) sacc[e] = 0.0f;
  for (int e = threadIdx.x; e < kWarps * G; e += blockDim.x) {
    sm[e] = -INFINITY;
    sl[e] = 0.0f;
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* wacc = sacc + warp * G * hd;
  float* wm = sm + warp * G;
  float* wl = sl + warp * G;
  const int32_t* bt = kv.block_tables + kv.seq_bt_off[kv.row_seq[t]];
  for (int j = k0 + warp; j < k1; j += kWarps) {
    const int key = j < ns ? j : start + j - ns;
    const float* qbase = j < ns ? sqs : sq;
    const int64_t slot = int64_t{bt[key / kv.block_size]} * kv.block_size + key % kv.block_size;
    const C* kp = kv.k + slot * kv_dim + int64_t{kvh} * hd;
    const C* vp = kv.v + slot * kv_dim + int64_t{kvh} * hd;
    float kr[kPerLane], vr[kPerLane];
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int d = lane + 32 * u;
      kr[u] = d < hd ? dev::to_f(kp[d]) : 0.0f;
      vr[u] = d < hd ? dev::to_f(vp[d]) : 0.0f;
    }
    for (int g = 0; g < G; ++g) {
      const float* qg = qbase + g * hd;
      float s = 0.0f;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int d = lane + 32 * u;
        if (d < hd) s += qg[d] * kr[u];
      }
      s = capped(kv, dev::warp_sum(s));
      const float m_old = wm[g];
      const float m_new = fmaxf(m_old, s);
      const float corr = expf(m_old - m_new);  // m_old = -inf gives 0: nothing to rescale
      const float p = expf(s - m_new);
      float* ag = wacc + g * hd;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int d = lane + 32 * u;
        if (d < hd) ag[d] = ag[d] * corr + p * vr[u];
      }
      __syncwarp();  // every lane has read wm[g] before lane 0 replaces it
      if (lane == 0) {
        wm[g] = m_new;
        wl[g] = wl[g] * corr + p;
      }
      __syncwarp();
    }
  }
  __syncthreads();

  for (int e = threadIdx.x; e < G * hd; e += blockDim.x) {
    const int g = e / hd, d = e % hd;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w * G + g]);
    float L = 0.0f, A = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm[w * G + g];
      if (mw == -INFINITY) continue;  // a warp that saw no key
      const float f = expf(mw - M);
      L += sl[w * G + g] * f;
      A += sacc[(w * G + g) * hd + d] * f;
    }
    const int h = kvh * G + g;
    float* p = ws + ((int64_t{i} * n_heads + h) * n_splits + split) * (hd + 2);
    if (d == 0) {
      p[0] = M;
      p[1] = L;
    }
    p[2 + d] = A;
  }
}

template <class T>
__global__ void decode_combine_kernel(const float* ws, const int32_t* rows, int n_heads, int hd,
                                      int n_splits, T* out, int64_t out_stride) {
  const int i = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int64_t t = rows[i];
  const float* base = ws + (int64_t{i} * n_heads + h) * n_splits * (hd + 2);
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, base[s * (hd + 2)]);
  float L = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float m = base[s * (hd + 2)];
    if (m != -INFINITY) L += base[s * (hd + 2) + 1] * expf(m - M);
  }
  const float inv = 1.0f / L;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float A = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float m = base[s * (hd + 2)];
      if (m != -INFINITY) A += base[s * (hd + 2) + 2 + d] * expf(m - M);
    }
    out[t * out_stride + int64_t{h} * hd + d] = dev::from_f<T>(A * inv);
  }
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
  if (head_dim > kMaxHeadDim || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || n_splits < 1) {
    return cudaErrorInvalidValue;
  }
  const int G = n_heads / n_kv_heads;
  if (kv.row_sinks && !kv.q_sink) return cudaErrorInvalidValue;
  const size_t n_q = kv.row_sinks ? 2 : 1;  // the sink queries take a second (G, hd) array
  const size_t smem =
      sizeof(float) * (n_q * G * head_dim + size_t{kWarps} * G * head_dim + 2 * size_t{kWarps} * G);
  if (smem > 48 * 1024) {
    // Above 48 KB a kernel must opt in to more dynamic shared memory.
    const cudaError_t e =
        cudaFuncSetAttribute(decode_partial_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const float scale = score_scale(kv, head_dim);
  const dim3 grid(n_splits, n_kv_heads, n_rows);
  decode_partial_kernel<C><<<grid, kWarps * 32, smem, stream>>>(
      q, q_stride, kv, rows, n_heads, n_kv_heads, head_dim, n_splits, scale, workspace);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  decode_combine_kernel<T><<<n_rows * n_heads, 128, 0, stream>>>(workspace, rows, n_heads, head_dim,
                                                                 n_splits, out, out_stride);
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
