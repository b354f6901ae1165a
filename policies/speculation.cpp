// Speculative decoding's policy: prompt lookup, the step cost model, the choice of drafts.
#include "policies/speculation.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace sy::policy {

int32_t ngram_draft(const int32_t* tokens, int32_t n, int32_t min_n, int32_t max_n, int32_t k,
                    std::vector<int32_t>& out) {
  out.clear();
  if (k <= 0 || !tokens || n < 2) return 0;
  min_n = std::max(1, min_n);
  max_n = std::min(max_n, n - 1);
  for (int32_t g = max_n; g >= min_n; --g) {
    const int32_t* suffix = tokens + (n - g);
    // The most recent earlier occurrence: the copy a continuation most likely follows.
    for (int32_t at = n - g - 1; at >= 0; --at) {
      if (!std::equal(suffix, suffix + g, tokens + at)) continue;
      const int32_t from = at + g;  // < n: the occurrence ends before the suffix does
      const int32_t take = std::min(k, n - from);
      out.assign(tokens + from, tokens + from + take);
      return take;
    }
  }
  return 0;
}

void StepCostModel::observe(int64_t tokens, int64_t rows, double micros) {
  if (tokens <= 0 || rows < 0 || !(micros >= 0) || !std::isfinite(micros)) return;
  const double n = static_cast<double>(tokens), r = static_cast<double>(rows);
  w_ = w_ * decay_ + 1.0;
  sn_ = sn_ * decay_ + n;
  sr_ = sr_ * decay_ + r;
  snn_ = snn_ * decay_ + n * n;
  srr_ = srr_ * decay_ + r * r;
  snr_ = snr_ * decay_ + n * r;
  st_ = st_ * decay_ + micros;
  snt_ = snt_ * decay_ + n * micros;
  srt_ = srt_ * decay_ + r * micros;
  ++steps_;
}

bool StepCostModel::ready() const {
  if (steps_ < 8 || w_ <= 0) return false;
  const double mean = sn_ / w_;
  // Token counts spread by less than one token say nothing about what a token costs.
  return snn_ / w_ - mean * mean >= 1.0;
}

StepCostModel::Fit StepCostModel::fit() const {
  Fit f;
  if (!ready()) return f;
  const double mn = sn_ / w_, mr = sr_ / w_, mt = st_ / w_;
  const double vn = snn_ / w_ - mn * mn, vr = srr_ / w_ - mr * mr, cnr = snr_ / w_ - mn * mr;
  const double cnt = snt_ / w_ - mn * mt, crt = srt_ / w_ - mr * mt;
  const double det = vn * vr - cnr * cnr;
  // Two variables where rows and tokens vary apart (a correlation below 0.99 and rows that
  // spread by at least one); else tokens alone, rows riding along with them.
  if (vr >= 1.0 && det > 0.02 * vn * vr) {
    f.b = (cnt * vr - crt * cnr) / det;
    f.c = (crt * vn - cnt * cnr) / det;
    f.a = mt - f.b * mn - f.c * mr;
  } else {
    f.b = cnt / vn;
    f.c = 0;
    f.a = mt - f.b * mn;
  }
  f.ok = true;
  return f;
}

double StepCostModel::predict(int64_t tokens, int64_t rows) const {
  const Fit f = fit();
  if (!f.ok) return 0.0;
  return std::max(0.0, f.a + f.b * static_cast<double>(tokens) + f.c * static_cast<double>(rows));
}

double StepCostModel::draft_cost() const {
  const Fit f = fit();
  return f.ok ? std::max(0.0, f.b + f.c) : 0.0;
}

double StepCostModel::token_cost() const {
  const Fit f = fit();
  return f.ok ? std::max(0.0, f.b) : 0.0;
}

std::vector<int32_t> choose_drafts(const std::vector<SpecCandidate>& cands, int64_t step_tokens,
                                   int64_t rows, int64_t outputs, const StepCostModel& cost,
                                   int64_t budget, double margin, const DraftCostModel* draft) {
  std::vector<int32_t> take(cands.size(), 0);
  if (!cost.ready() || budget <= 0 || outputs <= 0) return take;
  const double b = cost.draft_cost();
  if (!(b > 0)) return take;
  double time = cost.predict(step_tokens, rows);
  if (!(time > 0)) return take;
  const bool dm = draft && draft->ready();
  const double per_pass = dm ? draft->per_pass() : 0.0, per_token = dm ? draft->per_token() : 0.0;
  double out = static_cast<double>(outputs);
  // Every (candidate, j) with its value acceptance^j; per candidate the values fall with j, so
  // taking them in falling order meets each one's drafts in order.
  struct Item {
    double value;
    size_t i;
    int32_t j;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < cands.size(); ++i) {
    const double a = std::clamp(cands[i].acceptance, 0.0, 1.0);
    double v = 1.0;
    for (int32_t j = 1; j <= cands[i].available; ++j) {
      v *= a;
      items.push_back({v, i, j});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.value > y.value; });
  std::vector<bool> stopped(cands.size(), false);
  int32_t depth = 0;  // draft passes the drafts taken so far need
  for (const Item& it : items) {
    if (budget <= 0) break;
    if (stopped[it.i]) continue;
    double c = b;
    if (dm) {
      const double fed =
          it.j == 1 ? static_cast<double>(std::max<int64_t>(1, cands[it.i].setup_tokens)) : 1.0;
      c += per_token * fed + (it.j > depth ? per_pass : 0.0);
    }
    if (it.value / c <= (1.0 + margin) * out / time) {
      stopped[it.i] = true;
      continue;
    }
    ++take[it.i];
    depth = std::max(depth, it.j);
    out += it.value;
    time += c;
    --budget;
  }
  return take;
}

void DraftCostModel::observe(int64_t passes, int64_t tokens, double micros) {
  if (passes <= 0 || tokens <= 0 || !(micros >= 0) || !std::isfinite(micros)) return;
  const double p = static_cast<double>(passes), n = static_cast<double>(tokens);
  spp_ = spp_ * decay_ + p * p;
  spn_ = spn_ * decay_ + p * n;
  snn_ = snn_ * decay_ + n * n;
  spt_ = spt_ * decay_ + p * micros;
  snt_ = snt_ * decay_ + n * micros;
  ++steps_;
}

void DraftCostModel::fit(double& p, double& q) const {
  p = q = 0.0;
  if (!ready() || !(snn_ > 0)) return;
  const double det = spp_ * snn_ - spn_ * spn_;
  // Passes and tokens that move together (a correlation of 0.99 or more) cannot be parted: the
  // tokens carry the whole cost. So do they where the two-variable fit gives a negative part.
  bool parted = false;
  if (det > 0.0199 * spp_ * snn_) {
    p = (spt_ * snn_ - snt_ * spn_) / det;
    q = (snt_ * spp_ - spt_ * spn_) / det;
    parted = p >= 0 && q >= 0;
  }
  if (!parted) {
    p = 0.0;
    q = std::max(0.0, snt_ / snn_);
  }
}

double DraftCostModel::per_pass() const {
  double p = 0, q = 0;
  fit(p, q);
  return p;
}

double DraftCostModel::per_token() const {
  double p = 0, q = 0;
  fit(p, q);
  return q;
}

int SpecGuard::bucket(int64_t outputs) {
  int b = 0;
  for (int64_t top = 1; top < outputs && b < kBuckets - 1; top *= 2) ++b;
  return b;
}

void SpecGuard::observe(int64_t outputs, bool drafted, int64_t tokens_out, double micros) {
  if (outputs <= 0 || tokens_out <= 0 || !(micros > 0) || !std::isfinite(micros)) return;
  Rate& r = (drafted ? spec_ : plain_)[bucket(outputs)];
  const double x = static_cast<double>(tokens_out) / micros;
  // The first steps set it; later ones move it a tenth of the way (about the last 10 steps).
  r.rate = r.n == 0 ? x : r.rate + 0.1 * (x - r.rate);
  ++r.n;
}

bool SpecGuard::allows(int64_t outputs) const {
  const int b = bucket(outputs);
  if (plain_[b].n < 4 || spec_[b].n < 4) return true;
  return spec_[b].rate >= plain_[b].rate;
}

double acceptance_estimate(int64_t accepted, int64_t tried, double prior, double prior_weight) {
  const double w = std::max(0.0, prior_weight);
  const double den = static_cast<double>(std::max<int64_t>(0, tried)) + w;
  if (den <= 0) return prior;
  return (static_cast<double>(std::max<int64_t>(0, accepted)) + w * prior) / den;
}

}  // namespace sy::policy
