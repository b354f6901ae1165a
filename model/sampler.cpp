// Token sampling: greedy argmax, or temperature + top-k + top-p filtering followed by one seeded
// draw; also the log-probabilities of the full (unfiltered) distribution for reporting.
#include "model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace sy {

namespace {

// OpenAI's API caps top logprobs at 20; vLLM and llama.cpp follow. Larger requests would make the
// per-token report cost grow without a client that asks for it.
constexpr int kMaxLogprobs = 20;

// Orders candidates by logit, higher first; equal logits by lower id, so every ordering below is
// a strict total order and the result does not depend on the standard library's sort.
bool better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  if (a.first != b.first) return a.first > b.first;
  return a.second < b.second;
}

// Uniform in [0, 1) from the top 53 bits of one 64-bit draw: identical on every platform, unlike
// std::uniform_real_distribution whose algorithm is left to the library.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// A float for messages: "%g" keeps tiny values readable (std::to_string prints 1e-40 as 0.000000).
std::string show(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

}  // namespace

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  if (std::isnan(p.temperature))
    throw std::invalid_argument("sampling: temperature must be a number");
  if (std::isinf(p.temperature))
    throw std::invalid_argument("sampling: temperature must be finite");
  if (p.top_k < 0)
    throw std::invalid_argument("sampling: top_k must be >= 0 (0 disables it), got " +
                                std::to_string(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    throw std::invalid_argument("sampling: top_p must be in (0, 1], got " + show(p.top_p));
  if (p.n_logprobs < 0 || p.n_logprobs > kMaxLogprobs)
    throw std::invalid_argument("sampling: n_logprobs must be in [0, " +
                                std::to_string(kMaxLogprobs) + "], got " +
                                std::to_string(p.n_logprobs));
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab, std::vector<TokenLogprob>* top,
                        float* chosen_logprob) {
  if (n_vocab <= 0) throw std::invalid_argument("sampling: n_vocab must be > 0");
  const size_t n = static_cast<size_t>(n_vocab);

  // Greedy pick (also needed for the log-sum-exp's maximum). The same pass refuses logits that
  // name no distribution: a NaN or +inf (a numerical fault upstream) or nothing but -inf (every
  // token masked). Any of them would otherwise yield an arbitrary token without a word.
  int32_t best = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    const float l = logits[i];
    if (!(l < std::numeric_limits<float>::infinity()))
      throw SamplingError(std::string("sampling: the logits are not finite (") +
                          (std::isnan(l) ? "NaN" : "+inf") + " at token id " + std::to_string(i) +
                          ")");
    if (l > logits[best]) best = i;  // strict: ties keep the lowest id
  }
  if (logits[best] == -std::numeric_limits<float>::infinity())
    throw SamplingError("sampling: every logit is -inf (no token can be drawn)");

  int32_t chosen = best;
  const float inv_t = p_.temperature > 0.0f ? 1.0f / p_.temperature : 0.0f;
  // A temperature so small that 1/T overflows is greedy in all but name.
  if (p_.temperature > 0.0f && std::isfinite(inv_t)) {
    const float mx = logits[best];
    scratch_.resize(n);  // no reallocation after the first call at this vocabulary size
    for (size_t i = 0; i < n; ++i) scratch_[i] = {logits[i], static_cast<int32_t>(i)};

    // Candidates: scratch_[0, m); `sorted` of them are in best-first order.
    size_t m = n;
    size_t sorted = 0;
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
      m = static_cast<size_t>(p_.top_k);
      std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(m),
                        scratch_.end(), better);
      sorted = m;
    }
    // Weights exp((l - max) / T) replace the logits in place (order-preserving; the max maps to 1).
    double total = 0.0;
    for (size_t i = 0; i < m; ++i) {
      const float w = std::exp((scratch_[i].first - mx) * inv_t);
      scratch_[i].first = w;
      total += w;
    }
    if (p_.top_p < 1.0f) {
      // Nucleus: the smallest best-first prefix whose probability reaches top_p (at least one).
      // Without top-k, sort only a growing head: the nucleus is usually far smaller than the
      // vocabulary, and a full sort of 100k+ candidates per token would dominate sampling.
      const double need = static_cast<double>(p_.top_p) * total;
      size_t head = sorted == m ? m : std::min<size_t>(m, 64);
      for (;;) {
        if (sorted < head) {
          std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(head),
                            scratch_.begin() + static_cast<ptrdiff_t>(m), better);
          sorted = head;
        }
        double cum = 0.0;
        size_t keep = 0;
        while (keep < head && cum < need) cum += scratch_[keep++].first;
        if (cum >= need || head == m) {  // need > 0 (the max weighs 1), so keep >= 1
          m = keep;
          total = cum;
          break;
        }
        head = std::min(m, head * 4);
      }
    }
    // One draw over the kept weights.
    const double target = uniform01(rng_) * total;
    double cum = 0.0;
    chosen = scratch_[m - 1].second;  // rounding at the top end falls to the last candidate
    for (size_t i = 0; i < m; ++i) {
      cum += scratch_[i].first;
      if (target < cum) {
        chosen = scratch_[i].second;
        break;
      }
    }
  }

  // Log-probabilities under softmax(logits), independent of temperature and filters.
  const bool want_top = top != nullptr && p_.n_logprobs > 0;
  if (want_top || chosen_logprob != nullptr) {
    const float mx = logits[best];
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
    const float log_z = mx + static_cast<float>(std::log(sum));
    if (chosen_logprob != nullptr) *chosen_logprob = logits[chosen] - log_z;
    if (want_top) {
      // Insertion into a short best-first list: one pass, k <= 20 so the inner shifts are cheap.
      const size_t k = std::min(static_cast<size_t>(p_.n_logprobs), n);
      top->clear();
      top->reserve(static_cast<size_t>(kMaxLogprobs));
      for (size_t i = 0; i < n; ++i) {
        const float l = logits[i];
        if (top->size() == k && !(l > top->back().logprob)) continue;  // ties keep lower ids
        if (top->size() < k) top->push_back({});
        size_t j = top->size() - 1;
        while (j > 0 && l > (*top)[j - 1].logprob) {
          (*top)[j] = (*top)[j - 1];
          --j;
        }
        (*top)[j] = {static_cast<int32_t>(i), l};
      }
      for (auto& t : *top) t.logprob -= log_z;
    }
  } else if (top != nullptr) {
    top->clear();
  }
  return chosen;
}

}  // namespace sy
