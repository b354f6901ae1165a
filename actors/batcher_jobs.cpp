// The batcher's jobs as tokens arrive: detokenizing through the stop matcher, streaming chunks,
// and a job's end (done, error, or dropped to run elsewhere) with its credit and outcome.
#include <algorithm>
#include <string>

#include "actors/batcher_core.hpp"
#include "actors/tracing.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"

namespace sy::batcher_detail {

namespace {
double ms_between(int64_t from_us, int64_t to_us) {
  return from_us && to_us ? static_cast<double>(to_us - from_us) / 1000.0 : 0.0;
}
}  // namespace

// Removes a job that goes elsewhere (re-queued): no outcome, no credit.
void Batcher::drop(Seq& s) {
  drop_members(s);
  kv_.free(s.kv);
  erase_from(running_, &s);
  if (!s.running) waiting_.erase(&s);
  erase_from(planned_, &s);
  seqs_.erase(s.job.uid);  // destroys s
}

// Removes an ended job everywhere and returns its credit.
void Batcher::end_job(Seq& s) {
  drop_members(s);
  kv_.free(s.kv);
  erase_from(running_, &s);
  if (!s.running) waiting_.erase(&s);
  erase_from(planned_, &s);
  if (s.started) released_.push_back(s.job.uid);
  ended_.push_back(s.job.uid);
  ++credit_;
  ++finished_;
  seqs_.erase(s.job.uid);  // destroys s
  if (seqs_.empty()) {
    idle_since_us_ = now();
    if (life_ == Lifecycle::scaling_down) maybe_quit();
  }
}

DoneEvent Batcher::done_event(Seq& s, FinishReason finish) {
  DoneEvent d = make_done(s.job, finish);
  d.text = s.text.text().substr(0, s.emitted);
  d.ids.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
  d.prompt_tokens = static_cast<uint32_t>(s.n_prompt);
  d.cached_tokens = static_cast<uint32_t>(std::max(0, s.cached_tokens));
  d.completion_tokens = static_cast<uint32_t>(s.n_generated());
  const int64_t t = now();
  d.queue_ms = ms_between(s.job.arrival_us, s.first_sched_us);
  d.ttft_ms = ms_between(s.job.arrival_us, s.first_token_us);
  d.total_ms = ms_between(s.job.arrival_us, t);
  if (s.job.logprobs > 0) {
    d.logprob = s.logprob;
    d.n_top = s.job.logprobs;
    d.top_ids = s.top_ids;
    d.top_logprobs = s.top_lps;
  }
  if (s.job.prompt_logprobs >= 0 && s.lp_to > s.lp_from) {
    d.prompt_ids.assign(s.tokens.begin() + s.lp_from,
                        s.tokens.begin() + s.lp_from + static_cast<int32_t>(s.lp.size()));
    d.prompt_logprob = s.lp;
    d.prompt_n_top = s.lp_n_top;
    d.prompt_top_ids = s.lp_top_ids;
    d.prompt_top_logprobs = s.lp_top;
  }
  if (s.grouped) group_done(s, d);
  return d;
}

// A program's step job ended: its tables stay referenced for the program's next step (the prefix
// cache alone would let them be evicted while the program waits for a tool or a sibling branch).
// A table whose blocks a newer one of the program covers (its chain of block hashes a prefix of
// the newer one's) is let go; a program keeps at most kMaxPinsPerProgram (a fork's branches).
void Batcher::pin(Seq& s) {
  // A fork's branches at most (docs/programs.md: 16): each keeps its context.
  constexpr std::size_t kMaxPinsPerProgram = 16;
  const uint64_t program = s.job.program_uid;
  std::size_t of_program = 0;
  for (auto it = pins_.begin(); it != pins_.end();) {
    const auto& h = it->kv.hashes;
    const bool covered = it->program == program && h.size() <= s.kv.hashes.size() &&
                         std::equal(h.begin(), h.end(), s.kv.hashes.begin());
    if (covered) {
      pinned_blocks_ -= it->blocks;
      kv_.free(it->kv);
      it = pins_.erase(it);
      continue;
    }
    if (it->program == program) ++of_program;
    ++it;
  }
  if (of_program >= kMaxPinsPerProgram) {
    auto oldest = std::find_if(pins_.begin(), pins_.end(),
                               [&](const Pin& p) { return p.program == program; });
    pinned_blocks_ -= oldest->blocks;
    kv_.free(oldest->kv);
    pins_.erase(oldest);
  }
  Pin p;
  p.program = program;
  p.blocks = s.kv.held() + s.kv.wheld();
  p.kv = std::move(s.kv);
  s.kv = KvTables{};
  pinned_blocks_ += p.blocks;
  pins_.push_back(std::move(p));
  // Pins never hold more than a quarter of the pool: the rest is for running sequences and the
  // prefix cache; the oldest go first.
  trim_pins(kv_.pool().n_total() / 4);
}

void Batcher::unpin(uint64_t program) {
  for (auto it = pins_.begin(); it != pins_.end();) {
    if (it->program != program) {
      ++it;
      continue;
    }
    pinned_blocks_ -= it->blocks;
    kv_.free(it->kv);  // published blocks stay cached for prefix reuse until evicted
    it = pins_.erase(it);
  }
}

void Batcher::trim_pins(int64_t max_blocks) {
  while (!pins_.empty() && pinned_blocks_ > max_blocks) {
    pinned_blocks_ -= pins_.front().blocks;
    kv_.free(pins_.front().kv);
    pins_.pop_front();
  }
}

void Batcher::finish(Seq& s, FinishReason finish) {
  if (s.leader) return end_member(s, finish);
  if (s.job.is_step() && !s.grouped && finish != FinishReason::cancelled) pin(s);
  trace_generated(cfg_.traces.get(), s.job.trace, s.first_sched_us, s.first_token_us, now(),
                  static_cast<uint32_t>(std::max(0, s.n_generated())));
  DoneEvent d = done_event(s, finish);
  JobOutcome o = make_outcome(d);
  o.tokens_used = d.prompt_tokens + d.completion_tokens;
  if (s.job.stream && is_connected(s.job.client)) {
    // The chunks carried the completion (docs/protocol.md: `done` of a streamed job on the
    // request endpoint has empty text and no ids); logprobs went with the chunks too.
    d.text.clear();
    d.ids.clear();
    d.logprob.clear();
    d.n_top = 0;
    d.top_ids.clear();
    d.top_logprobs.clear();
    for (ChoiceResult& c : d.choices) {
      c.text.clear();
      c.ids.clear();
      c.logprob.clear();
      c.top_ids.clear();
      c.top_logprobs.clear();
    }
  }
  // A program's step job ends in its program (admission), which answers the client.
  if (egress_ && !s.job.is_step())
    send_urgent_if(self_, urgent_class(s.job.class_index), end_to(s.job), out_atom::value,
                   std::move(d));
  if (admission_) self_->send(admission_, finished_atom::value, std::move(o));
  end_job(s);
}

void Batcher::fail(Seq& s, ErrorCode code, const std::string& message) {
  if (s.leader) return fail(*s.leader, code, message);  // one sample failing fails its job
  trace_generated(cfg_.traces.get(), s.job.trace, s.first_sched_us, s.first_token_us, now(),
                  static_cast<uint32_t>(std::max(0, s.n_generated())));
  ErrorEvent e = make_error_event(s.job, code, message);
  JobOutcome o = make_outcome(e);
  o.tokens_used = static_cast<uint32_t>(s.tokens.size());
  if (egress_ && !s.job.is_step())
    send_urgent_if(self_, urgent_class(s.job.class_index), end_to(s.job), out_atom::value,
                   std::move(e));
  if (admission_) self_->send(admission_, finished_atom::value, std::move(o));
  end_job(s);
}

// Streams the text of `s` up to `upto` (and the id `id` when >= 0), for streamed jobs.
void Batcher::emit(Seq& s, int32_t id, size_t upto) {
  upto = std::max(upto, s.emitted);
  if (!s.job.stream || s.job.client.kind == ClientRef::pipeline) {
    s.emitted = upto;
    return;
  }
  // A job re-run after an executor failure regenerates, identically (greedy or seeded), what its
  // client already got: that part is not sent again.
  const size_t from = std::max<size_t>(s.emitted, std::min<uint64_t>(s.job.streamed_bytes, upto));
  TokensEvent t;
  t.text.assign(s.text.text(), from, upto - from);
  s.emitted = upto;
  if (id >= 0 && s.sent_ids < s.job.streamed_ids) {
    ++s.sent_ids;
    id = -1;
  }
  if (id < 0 && t.text.empty()) return;
  t.to = s.job.client;
  t.uid = s.owner().uid;
  t.choice = s.choice;
  t.step = s.job.step;
  t.id = s.job.id;
  t.tenant = s.job.tenant;
  t.index = s.sent_ids;
  if (id >= 0) {
    t.ids.push_back(id);
    ++s.sent_ids;
    if (s.job.logprobs > 0) {
      t.n_top = s.job.logprobs;
      t.logprob.push_back(s.logprob.back());
      t.top_ids.assign(s.top_ids.end() - s.job.logprobs, s.top_ids.end());
      t.top_logprobs.assign(s.top_lps.end() - s.job.logprobs, s.top_lps.end());
    }
  }
  // A chunk needs no journal record: it goes straight to egress where the journal stands in
  // front of it (but nowhere for a replayed job whose connection is gone, as the journal drops
  // that job's other events).
  if (egress_ && !(extras_.direct_egress && is_orphan(t.to)))
    send_urgent_if(self_, urgent_class(s.job.class_index), direct_, out_atom::value, std::move(t));
}

// The step in flight (sent at `sent_us`) came back: a `prefill` span for each traced sequence
// that fed prompt tokens in it (docs/tracing.md). Called before the results are applied, while
// kv.n_past and step_tokens still describe the step.
void Batcher::trace_prefills(int64_t sent_us) {
  int64_t t = 0;  // read once, and only for a step with a traced prompt chunk
  for (const Seq* s : planned_) {
    if (!s->job.trace.traced() || s->kv.n_past >= s->n_prompt) continue;
    if (t == 0) t = now();
    const int32_t n = std::min(s->kv.n_past + s->step_tokens, s->n_prompt) - s->kv.n_past;
    trace_prefill(cfg_.traces.get(), s->job.trace, sent_us, t, s->kv.n_past, n);
  }
}

// A sampled token for `s`: appended, detokenized, checked against the stop rules.
void Batcher::accept(Seq& s, const SeqResult& r) {
  if (!s.first_token_us) s.first_token_us = now();
  const Job& job = s.job;
  if (!job.ignore_eos && tok_ && tok_->is_eog(r.token)) {
    s.text.end(s.emitted);
    emit(s, -1, s.text.text().size());
    finish(s, FinishReason::stop);
    return;
  }
  s.tokens.push_back(r.token);
  ++tokens_;
  if (job.logprobs > 0) {
    s.logprob.push_back(r.logprob);
    for (uint32_t k = 0; k < job.logprobs; ++k) {
      // Padding keeps n_top entries per id if the executor returned fewer.
      const bool have = k < r.top_ids.size() && k < r.top_logprobs.size();
      s.top_ids.push_back(have ? r.top_ids[k] : 0);
      s.top_lps.push_back(have ? r.top_logprobs[k] : -1e30f);
    }
  }
  const bool last = s.n_generated() >= static_cast<int32_t>(job.max_tokens);
  // The cache cannot take the next token past the model context: end as if by length.
  const bool full = model_ && policy::bounded_by_context(s.kv.policy) &&
                    static_cast<int64_t>(s.tokens.size()) >= model_->limits().ctx_len;
  const std::string piece = tok_ ? tok_->token_to_piece(r.token) : std::string();
  if (s.text.push(piece, last || full, s.emitted)) {
    emit(s, r.token, s.text.text().size());
    finish(s, FinishReason::stop);
  } else if (last || full) {
    emit(s, r.token, s.text.text().size());
    finish(s, FinishReason::length);
  } else {
    emit(s, r.token, s.text.stable());
  }
}

}  // namespace sy::batcher_detail
