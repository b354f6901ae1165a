// Teacher-forced log-probabilities for the executor: the log-softmax of one logits row at a
// given token, with the row's most likely tokens (prompt_logprobs, score requests).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace sy {

/// The log-probability of `target` in the softmax of `row` (n_vocab logits), in double for the
/// sum; appends the `n_top` most likely ids and their log-probabilities (most likely first, ties
/// to the lower id) to top_ids/top_lps. Returns NaN, appending nothing, when the row is not
/// finite (a NaN or +inf anywhere, or every logit -inf).
inline float target_logprob(const float* row, int32_t n_vocab, int32_t target, uint32_t n_top,
                            std::vector<int32_t>& top_ids, std::vector<float>& top_lps,
                            std::vector<int32_t>& scratch) {
  float mx = -INFINITY;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (std::isnan(row[i]) || row[i] == INFINITY) return NAN;
    mx = std::max(mx, row[i]);
  }
  if (mx == -INFINITY) return NAN;
  double sum = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
  const double lse = static_cast<double>(mx) + std::log(sum);
  if (n_top > 0) {
    const auto k = static_cast<size_t>(std::min<int64_t>(n_top, n_vocab));
    scratch.resize(static_cast<size_t>(n_vocab));
    std::iota(scratch.begin(), scratch.end(), 0);
    std::partial_sort(
        scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k), scratch.end(),
        [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (size_t j = 0; j < k; ++j) {
      top_ids.push_back(scratch[j]);
      top_lps.push_back(static_cast<float>(static_cast<double>(row[scratch[j]]) - lse));
    }
    // A vocabulary smaller than n_top: padded so that every target keeps n_top entries.
    for (size_t j = k; j < n_top; ++j) {
      top_ids.push_back(0);
      top_lps.push_back(-INFINITY);
    }
  }
  return static_cast<float>(static_cast<double>(row[target]) - lse);
}

}  // namespace sy
