// Sampling kernel: one block per row. Top-k and top-p cut-offs are thresholds on the logit found
// by bisection (each probe one block-wide count or sum), so nothing is sorted.
#include "kernels/cuda/sample.cuh"

namespace sy::cuda {
namespace {

constexpr int kThreads = 512;
// Bisection steps on a float threshold: the bracket [min, max] of logits shrinks 2^-40 times,
// below float resolution for any finite logits.
constexpr int kBisect = 40;

__host__ __device__ inline uint64_t mix64(uint64_t x) {
  // splitmix64 finaliser: a bijection that spreads every input bit over the output
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__host__ __device__ inline float uniform(uint64_t seed, uint64_t counter) {
  const uint64_t r = mix64(mix64(seed) ^ counter);
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // 24 bits: exact in a float
}

__global__ void sample_kernel(const float* logits, int n_vocab, const SampleParams* params,
                              int32_t* out) {
  __shared__ float red[kThreads / 32];
  __shared__ int red_i[kThreads / 32];
  __shared__ float part[kThreads];
  __shared__ int32_t chosen;
  const float* x = logits + int64_t{blockIdx.x} * n_vocab;
  const SampleParams p = params[blockIdx.x];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // argmax, ties to the lowest id; with the row's health, as the host Sampler judges it: 2 for a
  // NaN or +inf anywhere, 1 for a finite value at least, 0 for nothing but -inf
  float bv = -INFINITY;
  int bi = n_vocab;
  float mn = INFINITY;
  float health = 0.0f;
  // kUnroll loads in flight per thread before the first comparison: one block reads the whole
  // row, so a loop that waits on each load in turn is bound by memory latency.
  constexpr int kUnroll = 8;
  for (int i0 = tid; i0 < n_vocab; i0 += kUnroll * blockDim.x) {
    float vs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * static_cast<int>(blockDim.x);
      vs[u] = i < n_vocab ? x[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * static_cast<int>(blockDim.x);
      if (i >= n_vocab) break;
      const float v = vs[u];
      if (!(v < INFINITY)) {
        health = 2.0f;  // NaN fails every comparison
      } else if (v > -INFINITY) {
        health = fmaxf(health, 1.0f);
      }
      if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
      }
      mn = fminf(mn, v);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (lane == 0) {
    red[warp] = bv;
    red_i[warp] = bi;
  }
  __syncthreads();
  if (tid == 0) {
    float v = red[0];
    int k = red_i[0];
    for (int w = 1; w < kThreads / 32; ++w) {
      if (red[w] > v || (red[w] == v && red_i[w] < k)) {
        v = red[w];
        k = red_i[w];
      }
    }
    chosen = k;
  }
  mn = dev::block_max(-mn, red) * -1.0f;  // block-wide minimum
  const int32_t best = chosen;            // published before block_max's barriers
  // A row that names no distribution gets kNoToken, whatever its parameters: no token is drawn
  // from it (and x[best] below may not even be an index: n_vocab when every logit is NaN). Every
  // thread gets the same answer, so all return together; block_max's first barrier also waits
  // for the reads of `red` in the reduction above.
  if (dev::block_max(health, red) != 1.0f) {
    if (tid == 0) out[blockIdx.x] = kNoToken;
    return;
  }
  const float mx = x[best];
  if (p.temperature <= 0.0f || p.top_k == 1 || mn == mx) {
    if (tid == 0) out[blockIdx.x] = best;
    return;
  }
  const float inv_t = 1.0f / p.temperature;

  // top-k: the largest threshold that keeps at least k logits
  float lo = mn;
  if (p.top_k > 0 && p.top_k < n_vocab) {
    float hi = mx;
    for (int it = 0; it < kBisect; ++it) {
      const float mid = 0.5f * (lo + hi);
      float c = 0.0f;
      for (int i = tid; i < n_vocab; i += blockDim.x) c += x[i] >= mid ? 1.0f : 0.0f;
      c = dev::block_sum(c, red);
      if (c >= static_cast<float>(p.top_k))
        lo = mid;
      else
        hi = mid;
    }
  }
  // top-p: the largest threshold >= lo whose kept mass reaches top_p of the mass above lo
  float total = 0.0f;
  for (int i = tid; i < n_vocab; i += blockDim.x) {
    if (x[i] >= lo) total += expf((x[i] - mx) * inv_t);
  }
  total = dev::block_sum(total, red);
  if (p.top_p < 1.0f) {
    float a = lo, b = mx;
    const float need = p.top_p * total;
    for (int it = 0; it < kBisect; ++it) {
      const float mid = 0.5f * (a + b);
      float s = 0.0f;
      for (int i = tid; i < n_vocab; i += blockDim.x) {
        if (x[i] >= mid) s += expf((x[i] - mx) * inv_t);
      }
      s = dev::block_sum(s, red);
      if (s >= need)
        a = mid;
      else
        b = mid;
    }
    lo = a;
  }

  // inverse-CDF draw over the kept logits in id order: each thread owns a contiguous chunk
  const int chunk = (n_vocab + kThreads - 1) / kThreads;
  const int c0 = min(n_vocab, tid * chunk), c1 = min(n_vocab, c0 + chunk);
  float mine = 0.0f;
  for (int i = c0; i < c1; ++i) {
    if (x[i] >= lo) mine += expf((x[i] - mx) * inv_t);
  }
  part[tid] = mine;
  __syncthreads();
  if (tid == 0) {
    float run = 0.0f;
    for (int k = 0; k < kThreads; ++k) {
      const float v = part[k];
      part[k] = run;  // exclusive prefix
      run += v;
    }
    red[0] = run;
    chosen = best;  // kept if rounding puts the target past the last kept logit
  }
  __syncthreads();
  const float target = uniform(p.seed, p.counter) * red[0];
  if (mine > 0.0f && target >= part[tid] && target < part[tid] + mine) {
    float acc = part[tid];
    int32_t pick = -1;
    for (int i = c0; i < c1; ++i) {
      if (x[i] < lo) continue;
      pick = i;
      acc += expf((x[i] - mx) * inv_t);
      if (acc > target) break;
    }
    chosen = pick;
  }
  __syncthreads();
  if (tid == 0) out[blockIdx.x] = chosen;
}

}  // namespace

float sample_uniform(uint64_t seed, uint64_t counter) {
  return uniform(seed, counter);
}

cudaError_t sample(const float* logits, int n_rows, int n_vocab, const SampleParams* params,
                   int32_t* out_tokens, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  if (n_vocab <= 0) return cudaErrorInvalidValue;
  sample_kernel<<<n_rows, kThreads, 0, stream>>>(logits, n_vocab, params, out_tokens);
  return cudaGetLastError();
}

}  // namespace sy::cuda
