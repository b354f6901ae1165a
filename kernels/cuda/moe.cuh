// Mixture-of-experts kernels: the router's choice per token (softmax over every expert, the top
// k, their weights), the grouping of a step's (token, choice) picks by expert on the device, the
// grouped expert product that reads its sizes from that grouping, and the gather and weighted
// combine around the experts' products.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// Most experts moe_route groups: one thread of its grouping block per expert (the model loader's
/// own bound on expert_count).
constexpr int kMoeMaxExperts = 256;
/// Grouped rows per tile of moe_matmul: a warp applies each weight row it reads to this many
/// rows at once.
constexpr int kMoeTileRows = 8;

/// Tiles of kMoeTileRows grouped rows that moe_route may write for P = n_tokens * n_used picks:
/// an expert with n rows has ceil(n / kMoeTileRows) of them, at most n / kMoeTileRows + 1, and at
/// most min(n_experts, P) experts have rows.
constexpr int64_t moe_max_tiles(int64_t n_tokens, int n_used, int n_experts) {
  const int64_t p = n_tokens * n_used;
  return (p + kMoeTileRows - 1) / kMoeTileRows + (n_experts < p ? n_experts : p);
}

/// The device buffers one routing fills, for T tokens, E experts and K choices each.
struct MoeRouting {
  float* weight = nullptr;    // (T, K) each pick's weight
  float* gate = nullptr;      // (T) sigmoid of the shared expert's gate logit, or nullptr: none
  int32_t* pos = nullptr;     // (T, K) each pick's row in the grouped order
  int32_t* src = nullptr;     // (T * K) the token of each grouped row
  int32_t* offset = nullptr;  // (E + 1) expert e's grouped rows are [offset[e], offset[e + 1])
  /// (2 * n_tiles) or nullptr: tile i is (expert, first grouped row), expert -1 where unused.
  int32_t* tiles = nullptr;
  int64_t n_tiles = 0;  // moe_max_tiles(T, K, E) where tiles is set
};

/// Routes n_tokens rows of router logits (ld floats apart; columns [0, n_experts) the experts,
/// column n_experts the shared expert's gate logit where r.gate is set): p = softmax over the
/// experts' logits; the n_used most probable experts (ties to the lower index) get weight p,
/// divided by the chosen ones' sum when `renorm`, times `scale`; gate = sigmoid(gate logit).
/// Then groups the picks by expert (token order within an expert) into r.pos, r.src,
/// r.offset and r.tiles, without the host. n_experts <= kMoeMaxExperts, 1 <= n_used <=
/// n_experts (else cudaErrorInvalidValue).
cudaError_t moe_route(const float* logits, int64_t ld, int n_tokens, int n_experts, int n_used,
                      bool renorm, float scale, const MoeRouting& r, cudaStream_t stream);

/// The experts' products over their grouped rows, sized on the device: for each used tile
/// (expert e, first row p0) of `tiles` (n_tiles of them, as moe_route writes) and each grouped
/// row p in [p0, min(p0 + kMoeTileRows, offset[e + 1])):
///   y[p * rows + r] = sum_c w[(e * rows + r) * cols + c] * x[src(p) * cols + c],  r < rows,
/// src(p) = x_rows[p], or p where x_rows is nullptr. w holds every expert's (rows, cols) matrix
/// back to back, as T (float or bf16); x and y are f32. n_tiles <= 65535.
template <class T>
cudaError_t moe_matmul(const T* w, int64_t rows, int64_t cols, const float* x,
                       const int32_t* x_rows, const int32_t* offset, const int32_t* tiles,
                       int64_t n_tiles, float* y, cudaStream_t stream);

/// out[p * dim + d] = x[src[p] * dim + d] as T, for p < n_rows: the grouped inputs of the experts'
/// cuBLASLt products.
template <class T>
cudaError_t moe_gather(const float* x, const int32_t* src, int64_t n_rows, int64_t dim, T* out,
                       cudaStream_t stream);

/// out[t * dim + d] = sum_{j < n_used} weight[t * n_used + j] * ye[pos[t * n_used + j] * dim + d]
///   (+ gate[t] * ys[t * dim + d] where gate is set), for t < n_tokens: each token's experts'
/// outputs (grouped order) weighted in its choice order, then its shared expert's.
cudaError_t moe_combine(const float* ye, const int32_t* pos, const float* weight, int n_tokens,
                        int n_used, int64_t dim, const float* gate, const float* ys, float* out,
                        cudaStream_t stream);

}  // namespace sy::cuda
