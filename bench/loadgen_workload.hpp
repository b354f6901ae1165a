// bench_loadgen's workload shapes, as plain functions: prompt lengths drawn from a named profile
// or a distribution (fixed, uniform, normal, lognormal; clamped to bounds) and the arrival
// instants of open-loop load (Poisson, or bursts of N jobs at Poisson-spaced instants).
// Header-only and free of sockets, so the unit tests draw from it directly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

namespace sy::bench::loadgen {

/// A length distribution's bounds: fixed (lo == hi) or the clamp range [lo, hi].
struct Range {
  uint32_t lo = 1, hi = 1;
};

/// How prompt lengths are drawn.
enum class LenDist { fixed, uniform, normal, lognormal };

inline std::optional<LenDist> parse_len_dist(const std::string& s) {
  if (s == "fixed") return LenDist::fixed;
  if (s == "uniform") return LenDist::uniform;
  if (s == "normal") return LenDist::normal;
  if (s == "lognormal") return LenDist::lognormal;
  return std::nullopt;
}

inline const char* len_dist_name(LenDist d) {
  switch (d) {
    case LenDist::fixed:
      return "fixed";
    case LenDist::uniform:
      return "uniform";
    case LenDist::normal:
      return "normal";
    case LenDist::lognormal:
      return "lognormal";
  }
  return "?";
}

/// The prompt lengths of a run: `fixed` sends `mean` every time; `uniform` draws on [bounds.lo,
/// bounds.hi]; `normal` draws N(mean, (cv * mean)^2) and `lognormal` a lognormal of that mean and
/// standard deviation (the right-skewed shape of real text lengths), each rounded to the nearest
/// integer and clamped into [bounds.lo, bounds.hi].
struct PromptShape {
  LenDist dist = LenDist::fixed;
  Range bounds{16, 16};
  double mean = 16;
  double cv = 0.5;  // standard deviation / mean of normal and lognormal
};

/// A named prompt profile: the length statistics of a public data set's inputs, in tokens.
struct Profile {
  const char* name;
  const char* like;  // the data set whose inputs it stands for
  PromptShape shape;
};

/// `short`: question-answering contexts (SQuAD paragraphs plus a question, about 128 tokens);
/// `long`: book passages (BookCorpus-style documents, about 2048 tokens). Both lognormal; the
/// spread (cv) and the clamp bounds are chosen so that at most a few percent of draws are clamped
/// (short: cv 0.5 in [16, 512]; long: cv 0.25 in [512, 3072], which leaves 1024 tokens of output
/// room in a 4096-token context).
inline const Profile kProfiles[] = {
    {"short", "SQuAD", {LenDist::lognormal, {16, 512}, 128, 0.5}},
    {"long", "BookCorpus", {LenDist::lognormal, {512, 3072}, 2048, 0.25}},
};

inline const Profile* find_profile(const std::string& name) {
  for (const Profile& p : kProfiles)
    if (name == p.name) return &p;
  return nullptr;
}

/// Checks a shape; throws std::invalid_argument naming the problem.
inline void check_shape(const PromptShape& s) {
  if (s.bounds.lo < 1 || s.bounds.hi < s.bounds.lo)
    throw std::invalid_argument("prompt length bounds need 1 <= A <= B");
  if (!(s.mean >= 1) || !std::isfinite(s.mean))
    throw std::invalid_argument("the prompt mean must be >= 1");
  if (!(s.cv > 0) || !std::isfinite(s.cv) || s.cv > 10)
    throw std::invalid_argument("--prompt-cv must be in (0, 10]");
}

/// One prompt length. `fixed` and `uniform` consume the generator exactly as bench_loadgen's
/// earlier `--prompt-len N` and `A..B` did, so a seed gives the same workload as before.
template <class Rng>
uint32_t draw_len(const PromptShape& s, Rng& rng) {
  const auto clamp = [&](double x) {
    const double r = std::round(x);
    if (!(r >= s.bounds.lo)) return s.bounds.lo;  // NaN too
    if (r >= s.bounds.hi) return s.bounds.hi;
    return static_cast<uint32_t>(r);
  };
  switch (s.dist) {
    case LenDist::fixed:
      return clamp(s.mean);
    case LenDist::uniform:
      if (s.bounds.lo == s.bounds.hi) return s.bounds.lo;
      return std::uniform_int_distribution<uint32_t>(s.bounds.lo, s.bounds.hi)(rng);
    case LenDist::normal:
      return clamp(std::normal_distribution<double>(s.mean, s.cv * s.mean)(rng));
    case LenDist::lognormal: {
      // Mean m and standard deviation cv * m: sigma^2 = ln(1 + cv^2), mu = ln(m) - sigma^2 / 2.
      const double sigma2 = std::log1p(s.cv * s.cv);
      const double mu = std::log(s.mean) - sigma2 / 2;
      return clamp(std::lognormal_distribution<double>(mu, std::sqrt(sigma2))(rng));
    }
  }
  return s.bounds.lo;
}

/// The prompt shape from bench_loadgen's flags: a --profile's shape (none: 16 tokens, fixed),
/// then --prompt-len (bounds; its mean N or the middle of A..B; without a profile N is fixed and
/// A..B uniform, as they always were), --prompt-dist, --prompt-mean and --prompt-cv over it. A
/// fixed shape sends the mean; a drawn one around N alone is kept within N/4..4N. Throws
/// std::invalid_argument naming the flag at fault.
inline PromptShape resolve_prompt(const std::string& profile, const std::optional<Range>& len,
                                  std::optional<LenDist> dist, std::optional<double> mean,
                                  std::optional<double> cv) {
  PromptShape s;
  if (!profile.empty()) {
    const Profile* p = find_profile(profile);
    if (!p) throw std::invalid_argument("--profile must be short or long, got '" + profile + "'");
    s = p->shape;
  }
  if (len) {
    s.bounds = *len;
    s.mean = 0.5 * (static_cast<double>(len->lo) + static_cast<double>(len->hi));
    if (profile.empty()) s.dist = len->lo == len->hi ? LenDist::fixed : LenDist::uniform;
  }
  if (dist) s.dist = *dist;
  if (mean) s.mean = *mean;
  if (cv) s.cv = *cv;
  if (mean && s.dist == LenDist::uniform)
    throw std::invalid_argument(
        "--prompt-mean sets fixed, normal or lognormal lengths; uniform draws on --prompt-len "
        "A..B");
  if (cv && s.dist != LenDist::normal && s.dist != LenDist::lognormal)
    throw std::invalid_argument("--prompt-cv belongs to --prompt-dist normal or lognormal");
  if (!(s.mean >= 1 && s.mean <= 1e7))
    throw std::invalid_argument("--prompt-mean must be in [1, 1e7]");
  const auto n = static_cast<uint32_t>(std::lround(s.mean));
  if (s.dist == LenDist::fixed) {
    s.bounds = {n, n};
  } else if (s.dist != LenDist::uniform && s.bounds.lo == s.bounds.hi) {
    s.bounds = {std::max<uint32_t>(1, n / 4), 4 * n};
  }
  if (s.dist != LenDist::uniform && (s.mean < s.bounds.lo || s.mean > s.bounds.hi))
    throw std::invalid_argument("the prompt mean " + std::to_string(n) +
                                " lies outside --prompt-len " + std::to_string(s.bounds.lo) + ".." +
                                std::to_string(s.bounds.hi));
  check_shape(s);
  return s;
}

/// Open-loop arrivals at `rate` jobs per second on average. burst == 1: a Poisson process
/// (exponential gaps of mean 1 / rate). burst == N > 1: bursts of N jobs sent together at the
/// instants of a Poisson process of rate / N bursts per second (a compound Poisson process: the
/// same mean rate, arrivals clumped N at a time).
class ArrivalClock {
 public:
  ArrivalClock(double rate, uint32_t burst, int64_t t0_ns)
      : burst_(std::max<uint32_t>(1, burst)),
        gap_(rate > 0 ? rate / burst_ : 1.0),
        next_(t0_ns),
        left_(burst_) {}

  /// When the next job is due (steady-clock ns).
  int64_t next_ns() const { return next_; }

  /// The due job has been sent: moves to the next one (the burst's next job, due at once, or the
  /// first job of the next burst).
  template <class Rng>
  void advance(Rng& rng) {
    if (--left_ > 0) return;
    left_ = burst_;
    next_ += static_cast<int64_t>(gap_(rng) * 1e9);
  }

 private:
  uint32_t burst_;
  std::exponential_distribution<double> gap_;
  int64_t next_;
  uint32_t left_;
};

}  // namespace sy::bench::loadgen
