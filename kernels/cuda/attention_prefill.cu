// Tiled prefill attention: one block per (query tile, query head); key/value tiles staged in
// shared memory, running max / sum per query row, output rescaled as the max grows. Two
// versions: plain f32 arithmetic (any type, any head_dim) and, for 16-bit caches (half; bf16
// would do too) with head_dim a multiple of 16, the two tile products on tensor cores (wmma, f32
// accumulation). With sinks a tile makes two passes sharing one running softmax: the sink slots
// with the sink queries, then the window slots with the ordinary queries.
#include <mma.h>

#include <type_traits>

#include "kernels/cuda/attention_prefill.cuh"

namespace sy::cuda {
namespace {

constexpr int kBQ = kPrefillTileRows;
constexpr int kBK = 32;  // keys per tile: one per lane when the scores of a row are formed
constexpr int kThreads = 128;

size_t prefill_smem(int hd) {
  // Q (BQ, hd), K (BK, hd + 1: padded so that lanes reading different keys hit different banks),
  // V (BK, hd), S (BQ, BK), O (BQ, hd), max / sum / rescale per row.
  return sizeof(float) * (size_t{kBQ} * hd + size_t{kBK} * (hd + 1) + size_t{kBK} * hd +
                          size_t{kBQ} * kBK + size_t{kBQ} * hd + 3 * kBQ);
}

template <class C, class T>
__global__ void prefill_kernel(const float* q, int64_t q_stride, PagedKv<C> kv,
                               const int32_t* tile_row0, const int32_t* tile_len, int n_heads,
                               int n_kv_heads, int hd, float scale, T* out, int64_t out_stride) {
  extern __shared__ float smem[];
  float* sQ = smem;
  float* sK = sQ + kBQ * hd;
  float* sV = sK + kBK * (hd + 1);
  float* sS = sV + kBK * hd;
  float* sO = sS + kBQ * kBK;
  float* sM = sO + kBQ * hd;
  float* sL = sM + kBQ;
  float* sC = sL + kBQ;

  const int64_t r0 = tile_row0[blockIdx.x];
  const int nr = tile_len[blockIdx.x];
  const int h = blockIdx.y;
  const int kvh = h / (n_heads / n_kv_heads);
  const int64_t kv_dim = int64_t{n_kv_heads} * hd;
  const int32_t* bt = kv.block_tables + kv.seq_bt_off[kv.row_seq[r0]];
  const int nk_first = kv.row_nkeys[r0];
  const int nk_last = kv.row_nkeys[r0 + nr - 1];
  const int kstart = window_start(kv, r0, nk_first);
  // Window starts grow with the row, so the last row sees the most sink slots.
  const int ns_last = sink_count(kv, r0 + nr - 1, window_start(kv, r0 + nr - 1, nk_last));

  for (int e = threadIdx.x; e < kBQ * hd; e += blockDim.x) sO[e] = 0.0f;
  if (threadIdx.x < kBQ) {
    sM[threadIdx.x] = -INFINITY;
    sL[threadIdx.x] = 0.0f;
  }

  // pass 0: sink slots [0, ns_last) with the sink queries; pass 1: the windows with the queries
  for (int pass = ns_last > 0 ? 0 : 1; pass < 2; ++pass) {
    const float* qsrc = pass == 0 ? kv.q_sink : q;
    const int64_t qst = pass == 0 ? kv.q_sink_stride : q_stride;
    __syncthreads();  // the previous pass has finished reading sQ
    for (int e = threadIdx.x; e < kBQ * hd; e += blockDim.x) {
      const int r = e / hd, d = e % hd;
      sQ[e] = r < nr ? qsrc[(r0 + r) * qst + int64_t{h} * hd + d] * scale : 0.0f;
    }
    const int kfrom = pass == 0 ? 0 : kstart, kto = pass == 0 ? ns_last : nk_last;
    for (int kb = kfrom; kb < kto; kb += kBK) {
      const int nkt = min(kBK, kto - kb);
      __syncthreads();  // the previous tile's K, V and S are no longer read
      for (int e = threadIdx.x; e < nkt * hd; e += blockDim.x) {
        const int j = e / hd, d = e % hd;
        const int key = kb + j;
        const int64_t slot = int64_t{bt[key / kv.block_size]} * kv.block_size + key % kv.block_size;
        sK[j * (hd + 1) + d] = dev::to_f(kv.k[slot * kv_dim + int64_t{kvh} * hd + d]);
        sV[j * hd + d] = dev::to_f(kv.v[slot * kv_dim + int64_t{kvh} * hd + d]);
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kBQ * kBK; e += blockDim.x) {
        const int r = e / kBK, j = e % kBK;
        float s = -INFINITY;
        if (r < nr && j < nkt) {
          const int nk = kv.row_nkeys[r0 + r];
          const int st = window_start(kv, r0 + r, nk);
          const int key = kb + j;
          const bool seen = pass == 0 ? key < sink_count(kv, r0 + r, st) : key < nk && key >= st;
          if (seen) {
            s = 0.0f;
            for (int d = 0; d < hd; ++d) s += sQ[r * hd + d] * sK[j * (hd + 1) + d];
            s = capped(kv, s);
          }
        }
        sS[e] = s;
      }
      __syncthreads();
      if (threadIdx.x < kBQ) {
        const int r = threadIdx.x;
        float* sr = sS + r * kBK;
        float mx = -INFINITY;
        for (int j = 0; j < kBK; ++j) mx = fmaxf(mx, sr[j]);
        const float m_old = sM[r];
        const float m_new = fmaxf(m_old, mx);
        if (m_new == -INFINITY) {  // nothing visible to this row yet
          for (int j = 0; j < kBK; ++j) sr[j] = 0.0f;
          sC[r] = 1.0f;
        } else {
          float sum = 0.0f;
          for (int j = 0; j < kBK; ++j) {
            const float p = expf(sr[j] - m_new);  // masked keys (-inf) give 0
            sr[j] = p;
            sum += p;
          }
          const float corr = expf(m_old - m_new);
          sL[r] = sL[r] * corr + sum;
          sM[r] = m_new;
          sC[r] = corr;
        }
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kBQ * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        const float* pr = sS + r * kBK;
        float acc = sO[e] * sC[r];
        for (int j = 0; j < nkt; ++j) acc += pr[j] * sV[j * hd + d];
        sO[e] = acc;
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nr * hd; e += blockDim.x) {
    const int r = e / hd, d = e % hd;
    out[(r0 + r) * out_stride + int64_t{h} * hd + d] = dev::from_f<T>(sO[e] / sL[r]);
  }
}

// ---- tensor-core version (16-bit caches) ----

namespace wmma = nvcuda::wmma;
constexpr int kTcBK = 64;      // keys per tile, staged once for the whole block
constexpr int kWarpRows = 16;  // query rows per warp: one wmma row of tiles
constexpr int kTcWarps = kBQ / kWarpRows;
// Row strides of a warp's scores (f32) and probabilities (16-bit): padded so that the 16 rows'
// lane pairs of the softmax fall on different banks (wmma wants multiples of 16 bytes).
constexpr int kLdS = kTcBK + 4;
constexpr int kLdP = kTcBK + 8;
static_assert(kTcWarps * 32 == kThreads, "one warp per 16 query rows of the tile");

// Whether the tensor-core kernel takes caches of C: wmma multiplies 16-bit half or bf16 tiles.
template <class C>
constexpr bool kTensorCoreCache = std::is_same_v<C, half> || std::is_same_v<C, bf16>;

size_t prefill_tc_smem(int hd) {
  // Block: Q (BQ, hd), K and V (BK, hd) in C. Each warp: scores f32 and probabilities C
  // (16, BK), its output rows f32 (16, hd), the rows' rescale factors and sums. Every part is a
  // multiple of 32 bytes, as wmma loads and stores require.
  return size_t{2} * (size_t{kBQ} * hd + 2 * size_t{kTcBK} * hd) +
         kTcWarps * (size_t{4} * kWarpRows * kLdS + size_t{2} * kWarpRows * kLdP +
                     size_t{4} * kWarpRows * hd + size_t{4} * 2 * kWarpRows);
}

// Block (tile, head): the tile's rows (at most kBQ of one sequence), warp w rows 16 w .. 16 w + 15.
// Each key tile is staged once for the block; each warp then forms its scores S = Q K^T on tensor
// cores, runs the online softmax of its rows (two lanes per row, 32 keys each), rescales its
// output rows and adds P V on tensor cores, with only warp barriers between those phases.
template <class C, class T>
__global__ void __launch_bounds__(kThreads)
    prefill_tc_kernel(const float* q, int64_t q_stride, PagedKv<C> kv, const int32_t* tile_row0,
                      const int32_t* tile_len, int n_heads, int n_kv_heads, int hd, float scale,
                      T* out, int64_t out_stride) {
  static_assert(kTensorCoreCache<C>);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  C* sQ = reinterpret_cast<C*>(smem_raw);  // (BQ, hd)
  C* sK = sQ + kBQ * hd;                   // (BK, hd)
  C* sV = sK + kTcBK * hd;                 // (BK, hd)
  unsigned char* wbase = reinterpret_cast<unsigned char*>(sV + kTcBK * hd);
  const size_t wbytes = size_t{4} * kWarpRows * kLdS + size_t{2} * kWarpRows * kLdP +
                        size_t{4} * kWarpRows * hd + size_t{4} * 2 * kWarpRows;
  float* sS = reinterpret_cast<float*>(wbase + warp * wbytes);  // (16, BK) this warp's scores
  C* sP = reinterpret_cast<C*>(sS + kWarpRows * kLdS);          // (16, BK) its probabilities
  float* sO = reinterpret_cast<float*>(sP + kWarpRows * kLdP);  // (16, hd) its output rows
  float* sC = sO + kWarpRows * hd;                              // (16) rescale factors
  float* sL = sC + kWarpRows;                                   // (16) final sums

  const int64_t r0 = tile_row0[blockIdx.x];
  const int nr = tile_len[blockIdx.x];
  const int h = blockIdx.y;
  const int kvh = h / (n_heads / n_kv_heads);
  const int64_t kv_dim = int64_t{n_kv_heads} * hd;
  const int32_t* bt = kv.block_tables + kv.seq_bt_off[kv.row_seq[r0]];
  const int nk_first = kv.row_nkeys[r0];
  const int nk_last = kv.row_nkeys[r0 + nr - 1];
  const int kstart = window_start(kv, r0, nk_first);
  const int ns_last = sink_count(kv, r0 + nr - 1, window_start(kv, r0 + nr - 1, nk_last));
  const int vec = hd / 8;  // 16-byte vectors per key row

  // This lane's row (two lanes per row: the even and the odd keys of each tile) and what it sees.
  const int rr = lane >> 1, odd = lane & 1;
  const int wr0 = warp * kWarpRows;  // the warp's first row in the tile
  const int r = wr0 + rr;
  const bool row_ok = r < nr;
  const int nk = row_ok ? kv.row_nkeys[r0 + r] : 0;
  const int st = row_ok ? window_start(kv, r0 + r, nk) : 0;
  const int ns = row_ok ? sink_count(kv, r0 + r, st) : 0;
  // The warp's rows are consecutive rows of one sequence: its last valid row sees the most keys
  // (and the most sink slots). A warp with no valid row skips every tile.
  const int wlast = min(nr, wr0 + kWarpRows) - 1;
  const bool warp_ok = wr0 < nr;
  const int w_nk = warp_ok ? kv.row_nkeys[r0 + wlast] : 0;
  const int w_ns = warp_ok ? sink_count(kv, r0 + wlast, window_start(kv, r0 + wlast, w_nk)) : 0;
  float m_run = -INFINITY, l_run = 0.0f;  // the row's softmax state (both lanes of a row)

  for (int e = lane; e < kWarpRows * hd; e += 32) sO[e] = 0.0f;

  // pass 0: sink slots [0, ns_last) with the sink queries; pass 1: the windows with the queries
  for (int pass = ns_last > 0 ? 0 : 1; pass < 2; ++pass) {
    const float* qsrc = pass == 0 ? kv.q_sink : q;
    const int64_t qst = pass == 0 ? kv.q_sink_stride : q_stride;
    __syncthreads();  // the previous pass has finished reading sQ
    for (int e = threadIdx.x; e < kBQ * hd; e += blockDim.x) {
      const int qr = e / hd, d = e % hd;
      sQ[e] = dev::from_f<C>(qr < nr ? qsrc[(r0 + qr) * qst + int64_t{h} * hd + d] * scale : 0.0f);
    }
    const int kfrom = pass == 0 ? 0 : kstart, kto = pass == 0 ? ns_last : nk_last;
    const int w_kto = pass == 0 ? w_ns : w_nk;  // the warp sees no key at or past this
    for (int kb = kfrom; kb < kto; kb += kTcBK) {
      const int nkt = min(kTcBK, kto - kb);
      __syncthreads();  // every warp is done with the previous tile's K and V (and sQ is written)
      for (int e = threadIdx.x; e < kTcBK * vec; e += blockDim.x) {
        const int j = e / vec, c = e % vec;
        uint4 kx = make_uint4(0, 0, 0, 0), vx = make_uint4(0, 0, 0, 0);
        if (j < nkt) {
          const int key = kb + j;
          const int64_t slot =
              int64_t{bt[key / kv.block_size]} * kv.block_size + key % kv.block_size;
          const int64_t off = slot * kv_dim + int64_t{kvh} * hd;
          kx = reinterpret_cast<const uint4*>(kv.k + off)[c];
          vx = reinterpret_cast<const uint4*>(kv.v + off)[c];
        }
        reinterpret_cast<uint4*>(sK + j * hd)[c] = kx;  // zeros past the last key: no NaN in P V
        reinterpret_cast<uint4*>(sV + j * hd)[c] = vx;
      }
      __syncthreads();
      if (!warp_ok || kb >= w_kto) continue;  // nothing in this tile for the warp's rows
      // S = Q K^T for the warp's 16 rows: K row-major (BK, hd) is K^T column-major with ld hd
      for (int nt = 0; nt < kTcBK / 16; ++nt) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < hd; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, C, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, C, wmma::col_major> b;
          wmma::load_matrix_sync(a, sQ + wr0 * hd + k, hd);
          wmma::load_matrix_sync(b, sK + nt * 16 * hd + k, hd);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(sS + nt * 16, acc, kLdS, wmma::mem_row_major);
      }
      __syncwarp();
      // online softmax: lane pairs, each lane 32 keys of its row
      float mx = -INFINITY;
      for (int u = 0; u < 32; ++u) {
        const int j = odd + 2 * u, key = kb + j;
        const bool seen = pass == 0 ? key < ns : key < nk && key >= st;
        const float sv = (row_ok && j < nkt && seen) ? capped(kv, sS[rr * kLdS + j]) : -INFINITY;
        sS[rr * kLdS + j] = sv;
        mx = fmaxf(mx, sv);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_new = fmaxf(m_run, mx);
      float sum = 0.0f;
      for (int u = 0; u < 32; ++u) {
        const int j = odd + 2 * u;
        const float p = m_new == -INFINITY ? 0.0f : expf(sS[rr * kLdS + j] - m_new);
        sP[rr * kLdP + j] = dev::from_f<C>(p);
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const float corr = m_new == -INFINITY ? 1.0f : expf(m_run - m_new);
      l_run = l_run * corr + sum;
      m_run = m_new;
      if (odd == 0) sC[rr] = corr;
      __syncwarp();
      for (int e = lane; e < kWarpRows * hd; e += 32) sO[e] *= sC[e / hd];
      __syncwarp();
      // O += P V, one 16-column strip at a time, accumulated in place
      for (int nt = 0; nt < hd / 16; ++nt) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, sO + nt * 16, hd, wmma::mem_row_major);
#pragma unroll
        for (int k = 0; k < kTcBK; k += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, C, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, C, wmma::row_major> b;
          wmma::load_matrix_sync(a, sP + k, kLdP);
          wmma::load_matrix_sync(b, sV + k * hd + nt * 16, hd);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(sO + nt * 16, acc, hd, wmma::mem_row_major);
      }
      __syncwarp();
    }
  }
  if (odd == 0) sL[rr] = l_run;
  __syncwarp();
  for (int e = lane; e < kWarpRows * hd; e += 32) {
    const int wr = e / hd, d = e % hd;
    if (wr0 + wr < nr) {
      out[(r0 + wr0 + wr) * out_stride + int64_t{h} * hd + d] = dev::from_f<T>(sO[e] / sL[wr]);
    }
  }
}

}  // namespace

template <class C, class T>
cudaError_t attention_prefill(const float* q, int64_t q_stride, const PagedKv<C>& kv,
                              const int32_t* tile_row0, const int32_t* tile_len, int n_tiles,
                              int n_heads, int n_kv_heads, int head_dim, T* out, int64_t out_stride,
                              cudaStream_t stream, bool tensor_cores) {
  if (n_tiles <= 0) return cudaSuccess;
  if (head_dim > 256 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return cudaErrorInvalidValue;
  if (kv.row_sinks && !kv.q_sink) return cudaErrorInvalidValue;
  const float scale = score_scale(kv, head_dim);
  if constexpr (kTensorCoreCache<C>) {
    if (tensor_cores && head_dim % 16 == 0) {
      const size_t smem = prefill_tc_smem(head_dim);
      if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(prefill_tc_kernel<C, T>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return e;
      }
      const dim3 grid(n_tiles, n_heads);
      prefill_tc_kernel<C, T><<<grid, kThreads, smem, stream>>>(q, q_stride, kv, tile_row0,
                                                                tile_len, n_heads, n_kv_heads,
                                                                head_dim, scale, out, out_stride);
      return cudaGetLastError();
    }
  }
  const size_t smem = prefill_smem(head_dim);
  if (smem > 48 * 1024) {
    // Above 48 KB a kernel must opt in to more dynamic shared memory.
    const cudaError_t e = cudaFuncSetAttribute(
        prefill_kernel<C, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(n_tiles, n_heads);
  prefill_kernel<C, T><<<grid, kThreads, smem, stream>>>(
      q, q_stride, kv, tile_row0, tile_len, n_heads, n_kv_heads, head_dim, scale, out, out_stride);
  return cudaGetLastError();
}

// Every (cache, output) pair the engine runs: f32 or f16 cache, f32 or bf16 activations.
#define SY_ATTENTION_PREFILL(C, T)                                                                 \
  template cudaError_t attention_prefill<C, T>(const float*, int64_t, const PagedKv<C>&,           \
                                               const int32_t*, const int32_t*, int, int, int, int, \
                                               T*, int64_t, cudaStream_t, bool)
SY_ATTENTION_PREFILL(float, float);
SY_ATTENTION_PREFILL(float, bf16);
SY_ATTENTION_PREFILL(half, float);
SY_ATTENTION_PREFILL(half, bf16);
#undef SY_ATTENTION_PREFILL

}  // namespace sy::cuda
