// Speculative decoding in the batcher (docs/speculation.md): drafts by prompt lookup (or slots for
// the executor's draft model to write them into) for the decoding sequences of a planned step, fed only where the measured cost of a step and the
// measured acceptance say that they pay, and the verified result taken back token by token.
#include <algorithm>
#include <string>
#include <vector>

#include "actors/batcher_core.hpp"
#include "model/llama.hpp"

namespace sy::batcher_detail {

namespace {
// A sequence's acceptance estimate starts at the batcher's running one, which weighs as much as
// this many verified draft positions of its own.
constexpr double kPriorWeight = 4.0;
// Drafts must beat the step's tokens per microsecond by this factor: the cost model is a fit, and
// a draft that only breaks even is not worth the risk of slowing the step.
constexpr double kMargin = 0.10;
// The running acceptance estimate: each verification's positions, older ones decaying.
constexpr double kPriorDecay = 0.98;
// One step in this many does the opposite of what the guard says (see speculate()).
constexpr int64_t kExplore = 32;
}  // namespace

SpecMode Batcher::spec_mode(const Seq& s) const {
  return s.job.speculative == SpecMode::server_default ? cfg_.speculative : s.job.speculative;
}

bool Batcher::may_speculate(const Seq& s) const {
  const SpecMode m = spec_mode(s);
  const bool on = m == SpecMode::auto_ || m == SpecMode::always;
  return on && s.samples && !s.hold_last && !s.wants_lp() && s.n_draft == 0 && !s.cancelled;
}

// After the round's plan was applied: drafts for the planned decodes that pay for themselves,
// appended to their tokens and fed in the same step. Their KV slots come from free blocks only:
// a draft never takes a block another sequence needs, nor preempts one.
void Batcher::speculate(int64_t budget_left) {
  if (planned_.empty() || !model_ || kv_.split() || cfg_.spec_max_draft <= 0) return;
  std::vector<policy::SpecCandidate> cands;
  std::vector<Seq*> who;
  int64_t n_tokens = 0, rows = 0, outputs = 0;
  for (const Seq* s : planned_) {
    n_tokens += s->step_tokens;
    rows += logit_rows(*s);
    outputs += s->samples_in_step() ? 1 : 0;
  }
  // The least acceptance at which an `auto` sequence's first draft token would pay in this step
  // (above 1: none can): sequences below it are not even looked up.
  double least = 2.0;
  const double draft_cost = step_cost_.draft_cost(), now = step_cost_.predict(n_tokens, rows);
  if (draft_cost > 0 && now > 0)
    least = (1.0 + kMargin) * static_cast<double>(outputs) * draft_cost / now;
  // Where drafting steps measured fewer tokens a microsecond than steps without at this batch
  // size, `auto` sits out. One step in kExplore does the other thing (drafts where the guard
  // says no, none where it says yes), so that both measures stay current.
  // With a draft model an exploring step that drafts where the guard says no would make the draft
  // model catch up on whole contexts it has not seen: there it only explores the other way.
  bool allowed = spec_guard_.allows(outputs);
  if (++guard_steps_ % kExplore == 0 && (allowed || !extras_.draft_model)) allowed = !allowed;
  if (!allowed) least = 2.0;
  const int64_t ctx = model_->limits().ctx_len;
  for (Seq* s : planned_) {
    if (!s->samples_in_step() || s->step_tokens != 1 || !may_speculate(*s)) continue;
    const double alpha =
        policy::acceptance_estimate(s->spec_accepted, s->spec_tried, spec_prior_, kPriorWeight);
    if (spec_mode(*s) != SpecMode::always && alpha <= least) continue;
    // Never past the job's max_tokens (the last token sampled comes on top of the drafts), the
    // context, or a prefill chunk's length.
    int64_t cap = std::min<int64_t>(cfg_.spec_max_draft,
                                    static_cast<int64_t>(s->job.max_tokens) - s->n_generated() - 1);
    if (policy::bounded_by_context(s->kv.policy))
      cap = std::min<int64_t>(cap, ctx - static_cast<int64_t>(s->tokens.size()) - 1);
    cap = std::min<int64_t>(cap, static_cast<int64_t>(cfg_.prefill_chunk) - 1);
    if (cap <= 0) continue;
    int32_t n = 0;
    if (extras_.draft_model) {
      // The executor's draft model writes the drafts into the slots fed for them: here they
      // hold the last token until then.
      n = static_cast<int32_t>(cap);
      s->drafts.assign(static_cast<size_t>(n), s->tokens.back());
    } else {
      n = policy::ngram_draft(s->tokens.data(), static_cast<int32_t>(s->tokens.size()),
                              cfg_.spec_ngram_min, cfg_.spec_ngram_max, static_cast<int32_t>(cap),
                              scratch_draft_);
      if (n <= 0) continue;
      s->drafts.assign(scratch_draft_.begin(), scratch_draft_.end());
    }
    // With a draft model: the tokens its cache lacks, fed before this sequence's first draft.
    const int64_t setup =
        extras_.draft_model
            ? std::max<int64_t>(1, static_cast<int64_t>(s->tokens.size()) - s->draft_seen)
            : 0;
    cands.push_back({n, alpha, setup});
    who.push_back(s);
  }
  if (cands.empty()) return;
  // `always` sequences feed what lookup found, within the step's budget; `auto` ones what pays
  // on top of that.
  std::vector<int32_t> take(cands.size(), 0);
  for (size_t i = 0; i < who.size(); ++i) {
    if (spec_mode(*who[i]) != SpecMode::always) continue;
    take[i] = static_cast<int32_t>(std::min<int64_t>(cands[i].available, budget_left));
    budget_left -= take[i];
    n_tokens += take[i];
    rows += take[i];
    cands[i].available = 0;
  }
  const std::vector<int32_t> chosen =
      policy::choose_drafts(cands, n_tokens, rows, outputs, step_cost_, budget_left, kMargin,
                            extras_.draft_model ? &draft_cost_ : nullptr);
  for (size_t i = 0; i < take.size(); ++i) take[i] += chosen[i];
  bool any = false;
  for (size_t i = 0; i < who.size(); ++i) {
    Seq& s = *who[i];
    int32_t d = take[i];
    if (d <= 0) continue;
    const int32_t need = (s.kv.n_past + 1 + d + bs_ - 1) / bs_;
    while (static_cast<int32_t>(s.kv.blocks.size()) < need && kv_.grow(s.kv, false)) {
    }
    d = std::min(d, static_cast<int32_t>(s.kv.blocks.size()) * bs_ - s.kv.n_past - 1);
    if (d <= 0) continue;
    s.drafts.resize(static_cast<size_t>(d));
    s.tokens.insert(s.tokens.end(), s.drafts.begin(), s.drafts.end());
    s.n_draft = d;
    s.step_tokens += d;
    fed_ += d;
    spec_drafted_ += d;
    ++spec_seq_steps_;
    any = true;
  }
  if (any) ++spec_steps_;
}

// The logit rows the engine computes for a planned sequence: every fed token's where the executor
// reads them all (drafts, prompt log-probabilities), else its last one.
int64_t Batcher::logit_rows(const Seq& s) const {
  return s.n_draft > 0 || s.wants_lp() ? s.step_tokens : 1;
}

// Takes the drafts of the step in flight off the sequence's tokens (s.drafts keeps them).
void Batcher::drop_drafts(Seq& s) {
  if (s.n_draft <= 0) return;
  s.tokens.resize(s.tokens.size() - static_cast<size_t>(s.n_draft));
  s.step_tokens = std::max(0, s.step_tokens - s.n_draft);
  s.n_draft = 0;
}

// The verified result of a sequence that fed `drafts` after its last token (whose KV slot the
// caller has counted): the accepted drafts, each taken as a sampled token would be (text, stop
// rules, streaming), their KV slots already written; then the token sampled after them.
void Batcher::accept_spec(Seq& s, const SeqResult& r, const std::vector<int32_t>& drafts) {
  // (The draft model may have fed fewer drafts than the slots planned for them.)
  if (extras_.draft_model && s.drafts.size() > drafts.size())
    spec_drafted_ -= static_cast<int64_t>(s.drafts.size() - drafts.size());
  size_t m = 0;
  while (m < r.spec_ids.size() && m < drafts.size() && r.spec_ids[m] == drafts[m]) ++m;
  // The draft model fed the sequence's tokens and its drafts but the last; the executor cuts its
  // cache back to the accepted ones.
  if (extras_.draft_model && !drafts.empty())
    s.draft_seen = static_cast<int64_t>(s.tokens.size() + std::min(m, drafts.size() - 1));
  spec_accepted_ += static_cast<int64_t>(m);
  step_accepted_ += static_cast<int64_t>(m);
  const int64_t tried = static_cast<int64_t>(std::min(m + 1, drafts.size()));
  s.spec_tried += tried;
  s.spec_accepted += static_cast<int64_t>(m);
  spec_acc_w_ = spec_acc_w_ * kPriorDecay + static_cast<double>(m);
  spec_try_w_ = spec_try_w_ * kPriorDecay + static_cast<double>(tried);
  if (spec_try_w_ > 0) spec_prior_ = spec_acc_w_ / spec_try_w_;
  const uint64_t uid = s.job.uid;
  const uint32_t n_top = s.job.logprobs;
  Seq* p = &s;
  for (size_t k = 0; k < m; ++k) {
    SeqResult one;
    one.token = drafts[k];
    one.logprob = k < r.spec_logprob.size() ? r.spec_logprob[k] : 0.0f;
    for (uint32_t t = 0; t < n_top; ++t) {
      const size_t at = k * n_top + t;
      if (at >= r.spec_top_ids.size() || at >= r.spec_top_logprobs.size()) break;
      one.top_ids.push_back(r.spec_top_ids[at]);
      one.top_logprobs.push_back(r.spec_top_logprobs[at]);
    }
    accept(*p, one);
    p = find(uid);
    if (!p) return;  // it ended there (end of generation, a stop string, max_tokens)
    ++p->kv.n_past;  // the draft's KV slot was written by the step
  }
  kv_.publish(p->kv, p->tokens);
  kv_.trim(p->kv);
  accept(*p, r);
}

}  // namespace sy::batcher_detail
