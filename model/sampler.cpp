// Token sampling: greedy argmax, or temperature + top-k + min-p + top-p filtering followed by one
// seeded draw, after the logit bias, penalties and a constraint's filter; also the
// log-probabilities of the model's own (unfiltered) distribution for reporting.
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
  const SamplingControls& c = p.controls;
  if (!(c.min_p >= 0.0f && c.min_p <= 1.0f))
    throw std::invalid_argument("sampling: min_p must be in [0, 1], got " + show(c.min_p));
  if (!(c.presence_penalty >= -2.0f && c.presence_penalty <= 2.0f))
    throw std::invalid_argument("sampling: presence_penalty must be in [-2, 2], got " +
                                show(c.presence_penalty));
  if (!(c.frequency_penalty >= -2.0f && c.frequency_penalty <= 2.0f))
    throw std::invalid_argument("sampling: frequency_penalty must be in [-2, 2], got " +
                                show(c.frequency_penalty));
  if (!(c.repetition_penalty > 0.0f && std::isfinite(c.repetition_penalty)))
    throw std::invalid_argument("sampling: repetition_penalty must be finite and > 0, got " +
                                show(c.repetition_penalty));
  if (c.repeat_last_n < -1)
    throw std::invalid_argument("sampling: repeat_last_n must be >= -1 (-1: all tokens), got " +
                                std::to_string(c.repeat_last_n));
  for (const auto& [id, bias] : c.logit_bias)
    if (!(bias >= -100.0f && bias <= 100.0f))
      throw std::invalid_argument("sampling: logit_bias of token " + std::to_string(id) +
                                  " must be in [-100, 100], got " + show(bias));
  if (p.n_logprobs < 0 || p.n_logprobs > kMaxLogprobs)
    throw std::invalid_argument("sampling: n_logprobs must be in [0, " +
                                std::to_string(kMaxLogprobs) + "], got " +
                                std::to_string(p.n_logprobs));
}

bool Sampler::penalties() const {
  const SamplingControls& c = p_.controls;
  return c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f ||
         (c.repetition_penalty != 1.0f && c.repeat_last_n != 0);
}

void Sampler::accept(int32_t id, bool output) {
  const SamplingControls& c = p_.controls;
  if (output && (c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f)) ++out_counts_[id];
  if (c.repetition_penalty == 1.0f || c.repeat_last_n == 0) return;
  if (c.repeat_last_n > 0) {
    const size_t window = static_cast<size_t>(c.repeat_last_n);
    if (recent_.size() < window) {
      recent_.push_back(id);
    } else {  // the ring is full: the oldest token leaves the window
      const int32_t old = recent_[recent_next_];
      if (auto it = recent_counts_.find(old); it != recent_counts_.end() && --it->second == 0)
        recent_counts_.erase(it);
      recent_[recent_next_] = id;
      recent_next_ = (recent_next_ + 1) % window;
    }
  }
  ++recent_counts_[id];
}

// Logit bias first (OpenAI adds it to the logits), then the repetition penalty as llama.cpp
// defines it (divide a positive logit, multiply a negative one), then presence and frequency as
// OpenAI defines them (subtract once, and once per occurrence in the output).
void Sampler::apply_controls(float* logits, int32_t n_vocab) const {
  const SamplingControls& c = p_.controls;
  for (const auto& [id, bias] : c.logit_bias)
    if (id >= 0 && id < n_vocab) logits[id] += bias;
  if (c.repetition_penalty != 1.0f)
    for (const auto& [id, count] : recent_counts_) {
      if (id < 0 || id >= n_vocab || count == 0) continue;
      float& l = logits[id];
      l = l > 0.0f ? l / c.repetition_penalty : l * c.repetition_penalty;
    }
  for (const auto& [id, count] : out_counts_) {
    if (id < 0 || id >= n_vocab || count == 0) continue;
    logits[id] -= c.presence_penalty + c.frequency_penalty * static_cast<float>(count);
  }
}

namespace {

// The highest logit's id (ties to the lowest id); -1 when every logit is -inf.
int32_t argmax(const float* logits, int32_t n_vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < n_vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return logits[best] == -std::numeric_limits<float>::infinity() ? -1 : best;
}

}  // namespace

// One draw from `logits` under temperature, top-k, min-p and top-p (best: the highest logit's
// id, which greedy returns).
int32_t Sampler::draw(const float* logits, int32_t n_vocab, int32_t best) {
  const size_t n = static_cast<size_t>(n_vocab);
  const float inv_t = p_.temperature > 0.0f ? 1.0f / p_.temperature : 0.0f;
  // A temperature so small that 1/T overflows is greedy in all but name.
  if (!(p_.temperature > 0.0f && std::isfinite(inv_t))) return best;
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
  // Min-p (after temperature, as vLLM): the top token weighs 1, so a candidate stays when its
  // weight reaches min_p. Compaction keeps the order (and the best-first prefix) intact.
  if (p_.controls.min_p > 0.0f) {
    size_t kept = 0;
    total = 0.0;
    for (size_t i = 0; i < m; ++i) {
      if (!(scratch_[i].first >= p_.controls.min_p)) continue;
      scratch_[kept++] = scratch_[i];
      total += scratch_[i].first;
    }
    // A sorted prefix stays sorted after dropping entries from it, but its length shrinks.
    sorted = std::min(sorted, kept);
    m = kept;  // the max weighs 1 >= min_p (min_p <= 1), so m >= 1
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
  int32_t chosen = scratch_[m - 1].second;  // rounding at the top end falls to the last candidate
  for (size_t i = 0; i < m; ++i) {
    cum += scratch_[i].first;
    if (target < cum) {
      chosen = scratch_[i].second;
      break;
    }
  }
  return chosen;
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab, std::vector<TokenLogprob>* top,
                        float* chosen_logprob, TokenFilter* filter) {
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

  // The logits drawn from: the model's own, or a copy changed by the bias and penalties (and by
  // the filter's mask where that is needed).
  const float* src = logits;
  int32_t src_best = best;
  const bool controls = !p_.controls.logit_bias.empty() || penalties();
  const auto to_work = [&] {
    if (src == work_.data()) return;
    work_.assign(logits, logits + n);
    src = work_.data();
  };
  if (controls) {
    to_work();
    apply_controls(work_.data(), n_vocab);
    src_best = argmax(src, n_vocab);
  }
  const bool sampling = p_.temperature > 0.0f && std::isfinite(1.0f / p_.temperature);
  // Top-k, top-p and min-p choose among the allowed tokens, so with them the filter masks before
  // the draw. Without them (greedy, or temperature alone) the drawn token is checked first and
  // the mask made only when it is refused: a refused draw followed by a draw from the allowed
  // tokens, renormalised, is exactly a draw from the allowed part of the distribution (and the
  // greedy pick, when allowed, is the allowed tokens' greedy pick too).
  const bool truncating = sampling && (p_.top_k > 0 || p_.top_p < 1.0f || p_.controls.min_p > 0);
  if (filter != nullptr && truncating) {
    to_work();
    filter->mask(work_.data(), n_vocab);
    src_best = argmax(src, n_vocab);
  }
  if (src_best < 0)
    throw SamplingError(filter ? "sampling: the constraint allows no token here"
                               : "sampling: the logit bias leaves no token (every logit -inf)");
  int32_t chosen = draw(src, n_vocab, src_best);
  if (filter != nullptr && !truncating && !filter->allows(chosen)) {
    to_work();
    filter->mask(work_.data(), n_vocab);
    src_best = argmax(src, n_vocab);
    if (src_best < 0) throw SamplingError("sampling: the constraint allows no token here");
    chosen = draw(src, n_vocab, src_best);
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
