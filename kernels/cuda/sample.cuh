// On-device sampling of the next token of each row: greedy, temperature, top-k and top-p, with a
// counter-based random stream per sequence, so that only token ids cross to the host.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// out_tokens[r] of a row with a NaN or +inf anywhere, or with every logit -inf (the rows the host
/// Sampler refuses with SamplingError): no token can be drawn from it.
inline constexpr int32_t kNoToken = -1;

/// For each row r of logits (n_rows, n_vocab), picks out_tokens[r] under params[r]:
/// temperature <= 0 or top_k == 1: the highest logit (ties to the lowest id); otherwise a draw
/// from softmax(logits / temperature) restricted to the top_k highest logits (top_k > 0) and then
/// to the smallest set of highest logits whose probability reaches top_p (top_p < 1). The draw is
/// a pure function of (seed, counter), so a sequence replays exactly. A row with no finite
/// distribution gets kNoToken.
cudaError_t sample(const float* logits, int n_rows, int n_vocab, const SampleParams* params,
                   int32_t* out_tokens, cudaStream_t stream);

/// The uniform number in [0, 1) that sample() draws for (seed, counter); exposed for tests.
float sample_uniform(uint64_t seed, uint64_t counter);

}  // namespace sy::cuda
