// The batcher actor: continuous batching with chunked prefill, paged KV block tables, priority
// preemption with recomputation, detokenization and stop rules, credit to the router.
#include "actors/batcher.hpp"

#include <algorithm>
#include <caf/all.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "actors/messages.hpp"
#include "gpu/engine.hpp"
#include "ingress/error_code.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"

namespace sy {

int64_t kv_bytes_per_token(const LlamaConfig& cfg) {
  // K and V (2), f32 (4 bytes), per layer and KV head.
  return int64_t{cfg.n_layers} * cfg.n_kv_heads * cfg.head_dim * 2 * 4;
}

int32_t kv_blocks_for(const BatchingConfig& cfg, const LlamaConfig* model) {
  const int64_t per_token = model ? std::max<int64_t>(1, kv_bytes_per_token(*model)) : 4096;
  const int64_t per_block = per_token * std::max<int32_t>(1, cfg.kv_block_size);
  const int64_t n = cfg.kv_memory_mb * 1024 * 1024 / per_block;
  // Block ids are int32 on the engine side.
  return static_cast<int32_t>(std::clamp<int64_t>(n, 1, INT32_MAX));
}

namespace {

double ms_between(int64_t from_us, int64_t to_us) {
  return from_us && to_us ? static_cast<double>(to_us - from_us) / 1000.0 : 0.0;
}

// Earliest start of a stop string in `text` that ends at or after `from` (earlier matches were
// searched when that text arrived), or npos.
size_t find_stop(const std::string& text, size_t from, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;  // an empty stop string would end every job at once: ignored
    const size_t start = from + 1 >= s.size() ? from + 1 - s.size() : 0;
    best = std::min(best, text.find(s, start));
  }
  return best;
}

// Bytes at the end of `text` that begin some stop string: a later token may complete the match,
// so they are not streamed yet.
size_t held_back(const std::string& text, const std::vector<std::string>& stops, size_t max_stop) {
  if (max_stop < 2) return 0;
  for (size_t k = std::min(text.size(), max_stop - 1); k > 0; --k) {
    const std::string_view tail(text.data() + text.size() - k, k);
    for (const std::string& s : stops)
      if (s.size() > k && std::string_view(s).substr(0, k) == tail) return k;
  }
  return 0;
}

enum Finish : uint8_t { finish_stop = 0, finish_length = 1, finish_cancelled = 2 };

// One job inside the batcher.
struct Seq {
  Job job;
  std::vector<int32_t> tokens;  // prompt + generated: what the KV cache must hold to go on
  int32_t n_prompt = 0;
  int32_t n_past = 0;           // tokens of `tokens` cached in `blocks`
  std::vector<int32_t> blocks;  // block table
  bool running = false;
  bool in_step = false;         // part of the step in flight
  int32_t step_tokens = 0;      // tokens it feeds in the step in flight
  bool cancelled = false;       // cancel arrived while in the step in flight
  bool started = false;         // the executor has made its sampler
  Utf8Stream utf8;
  std::string text;             // complete characters, cut at a stop string when one matched
  size_t emitted = 0;           // bytes of `text` already final (streamed)
  size_t max_stop = 0;
  uint32_t sent_ids = 0;        // completion ids already streamed
  std::vector<float> logprob;   // per completion id (when job.logprobs > 0)
  std::vector<int32_t> top_ids;
  std::vector<float> top_lps;
  int64_t first_sched_us = 0, first_token_us = 0;

  int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  int32_t remaining() const { return static_cast<int32_t>(tokens.size()) - n_past; }
  // Scheduling priority: lower is more important (class first, then earlier arrival).
  std::tuple<uint32_t, int64_t, uint64_t> key() const {
    return {job.class_index, job.arrival_us, job.uid};
  }
};

bool before(const Seq* a, const Seq* b) { return a->key() < b->key(); }

struct Before {
  bool operator()(const Seq* a, const Seq* b) const { return before(a, b); }
};

class Batcher {
 public:
  Batcher(caf::event_based_actor* self, BatchingConfig cfg,
          std::shared_ptr<const LlamaModel> model, caf::actor executor, caf::actor router,
          caf::actor egress, caf::actor admission, int32_t n_blocks)
      : self_(self),
        cfg_(cfg),
        model_(std::move(model)),
        tok_(model_ ? &model_->tokenizer() : nullptr),
        executor_(std::move(executor)),
        router_(std::move(router)),
        egress_(std::move(egress)),
        admission_(std::move(admission)),
        pool_(std::max<int32_t>(1, n_blocks)),
        bs_(std::max<int32_t>(1, cfg.kv_block_size)) {
    // Zero limits would stall every job forever: each step moves at least one token.
    cfg_.max_sequences = std::max<uint32_t>(1, cfg_.max_sequences);
    cfg_.step_token_budget = std::max<uint32_t>(1, cfg_.step_token_budget);
    cfg_.prefill_chunk = std::max<uint32_t>(1, cfg_.prefill_chunk);
  }

  void start() {
    if (router_)
      self_->send(router_, credit_atom::value, caf::actor_cast<caf::actor>(self_),
                  static_cast<uint32_t>(cfg_.max_sequences));
  }

  void on_run(Job& job) {
    if (seqs_.count(job.uid)) return;  // a duplicate dispatch: the job is already here
    auto s = std::make_unique<Seq>();
    s->n_prompt = static_cast<int32_t>(job.prompt.size());
    s->tokens = job.prompt;
    for (const auto& st : job.stop) s->max_stop = std::max(s->max_stop, st.size());
    s->job = std::move(job);
    Seq* p = s.get();
    seqs_.emplace(p->job.uid, std::move(s));
    if (const std::string why = check(*p); !why.empty()) {
      fail(*p, ErrorCode::bad_request, why);
    } else {
      waiting_.insert(p);
    }
    schedule();
  }

  void on_cancel(uint64_t uid) {
    auto it = seqs_.find(uid);
    if (it == seqs_.end()) return;  // ended already, or never here
    Seq& s = *it->second;
    if (s.in_step)
      s.cancelled = true;  // ends when the step in flight returns
    else
      finish(s, finish_cancelled);
    flush_notices();
    schedule();
  }

  caf::settings stats() const {
    caf::settings s;
    caf::put(s, "running", static_cast<int64_t>(running_.size()));
    caf::put(s, "waiting", static_cast<int64_t>(waiting_.size()));
    caf::put(s, "blocks_used", static_cast<int64_t>(pool_.n_used()));
    caf::put(s, "blocks_free", static_cast<int64_t>(pool_.n_free()));
    caf::put(s, "blocks_total", static_cast<int64_t>(pool_.n_total()));
    caf::put(s, "preemptions", preemptions_);
    caf::put(s, "steps", steps_);
    caf::put(s, "tokens", tokens_);
    caf::put(s, "finished", finished_);
    return s;
  }

 private:
  // Why a job can never run here ("" when it can).
  std::string check(const Seq& s) const {
    if (s.tokens.empty()) return "empty prompt";
    if (model_) {
      const int32_t n_vocab = model_->config().n_vocab;
      for (int32_t id : s.tokens)
        if (id < 0 || id >= n_vocab)
          return "prompt token id " + std::to_string(id) + " outside the vocabulary [0, " +
                 std::to_string(n_vocab) + ")";
    }
    // The last sampled token is never fed back: the cache holds at most prompt + max - 1.
    const int64_t slots = int64_t{s.n_prompt} + std::max<uint32_t>(1, s.job.max_tokens) - 1;
    const int64_t need = (slots + bs_ - 1) / bs_;
    if (need > pool_.n_total())
      return "prompt (" + std::to_string(s.n_prompt) + " tokens) + max_tokens (" +
             std::to_string(s.job.max_tokens) + ") needs " + std::to_string(need) +
             " KV blocks, the executor has " + std::to_string(pool_.n_total());
    return "";
  }

  static void insert_sorted(std::vector<Seq*>& v, Seq* s) {
    v.insert(std::upper_bound(v.begin(), v.end(), s, before), s);
  }
  static void erase_from(std::vector<Seq*>& v, Seq* s) {
    auto it = std::find(v.begin(), v.end(), s);
    if (it != v.end()) v.erase(it);
  }

  void free_blocks(Seq& s) {
    for (int32_t b : s.blocks) pool_.free(b);
    s.blocks.clear();
    s.n_past = 0;
  }

  // Takes a sequence out of the batch: blocks freed, recomputed from its tokens when resumed.
  void preempt(Seq& s) {
    if (!s.blocks.empty()) ++preemptions_;
    free_blocks(s);
    if (s.in_step) {  // planned in the step being built: take it out again
      erase_from(planned_, &s);
      budget_ += s.step_tokens;
      s.in_step = false;
      s.step_tokens = 0;
    }
    s.running = false;
    erase_from(running_, &s);
    waiting_.insert(&s);
  }

  // Removes an ended job everywhere and returns its credit.
  void retire(Seq& s) {
    free_blocks(s);
    erase_from(running_, &s);
    if (!s.running) waiting_.erase(&s);
    erase_from(planned_, &s);
    if (s.started) released_.push_back(s.job.uid);
    ++credit_;
    ++finished_;
    seqs_.erase(s.job.uid);  // destroys s
  }

  DoneEvent done_event(Seq& s, uint8_t finish) {
    DoneEvent d;
    d.to = s.job.client;
    d.uid = s.job.uid;
    d.id = s.job.id;
    d.tenant = s.job.tenant;
    d.finish = finish;
    d.text = s.text.substr(0, s.emitted);
    d.ids.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
    d.prompt_tokens = static_cast<uint32_t>(s.n_prompt);
    d.completion_tokens = static_cast<uint32_t>(s.n_generated());
    const int64_t now = now_us();
    d.queue_ms = ms_between(s.job.arrival_us, s.first_sched_us);
    d.ttft_ms = ms_between(s.job.arrival_us, s.first_token_us);
    d.total_ms = ms_between(s.job.arrival_us, now);
    if (s.job.logprobs > 0) {
      d.logprob = s.logprob;
      d.n_top = s.job.logprobs;
      d.top_ids = s.top_ids;
      d.top_logprobs = s.top_lps;
    }
    return d;
  }

  void finish(Seq& s, uint8_t finish) {
    DoneEvent d = done_event(s, finish);
    JobOutcome o;
    o.uid = s.job.uid;
    o.id = s.job.id;
    o.tenant = s.job.tenant;
    o.outcome = finish == finish_cancelled ? 2 : 0;
    o.code = finish == finish_cancelled ? static_cast<uint8_t>(ErrorCode::cancelled) : 0;
    o.tokens_used = d.prompt_tokens + d.completion_tokens;
    o.done = d;
    if (s.job.stream && s.job.client.kind == ClientRef::router) {
      // The chunks carried the completion (docs/protocol.md: `done` of a streamed job on the
      // request endpoint has empty text and no ids); logprobs went with the chunks too.
      d.text.clear();
      d.ids.clear();
      d.logprob.clear();
      d.n_top = 0;
      d.top_ids.clear();
      d.top_logprobs.clear();
    }
    if (egress_) self_->send(egress_, out_atom::value, std::move(d));
    if (admission_) self_->send(admission_, finished_atom::value, std::move(o));
    retire(s);
  }

  void fail(Seq& s, ErrorCode code, const std::string& message) {
    ErrorEvent e;
    e.to = s.job.client;
    e.uid = s.job.uid;
    e.id = s.job.id;
    e.tenant = s.job.tenant;
    e.code = static_cast<uint8_t>(code);
    e.message = message;
    JobOutcome o;
    o.uid = s.job.uid;
    o.id = s.job.id;
    o.tenant = s.job.tenant;
    o.outcome = 1;
    o.code = e.code;
    o.tokens_used = static_cast<uint32_t>(s.tokens.size());
    o.error = e;
    if (egress_) self_->send(egress_, out_atom::value, std::move(e));
    if (admission_) self_->send(admission_, finished_atom::value, std::move(o));
    retire(s);
  }

  // Streams the text of `s` up to `upto` (and the id `id` when >= 0), for streamed jobs.
  void emit(Seq& s, int32_t id, size_t upto) {
    upto = std::max(upto, s.emitted);
    if (!s.job.stream || s.job.client.kind != ClientRef::router) {
      s.emitted = upto;
      return;
    }
    TokensEvent t;
    t.text.assign(s.text, s.emitted, upto - s.emitted);
    s.emitted = upto;
    if (id < 0 && t.text.empty()) return;
    t.to = s.job.client;
    t.uid = s.job.uid;
    t.id = s.job.id;
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
    if (egress_) self_->send(egress_, out_atom::value, std::move(t));
  }

  // A sampled token for `s`: appended, detokenized, checked against the stop rules.
  void accept(Seq& s, const SeqResult& r) {
    if (!s.first_token_us) s.first_token_us = now_us();
    const Job& job = s.job;
    if (!job.ignore_eos && tok_ && tok_->is_eog(r.token)) {
      const size_t old = s.text.size();
      s.text += s.utf8.flush();
      const size_t cut = find_stop(s.text, old, job.stop);
      if (cut != std::string::npos) s.text.resize(std::max(cut, s.emitted));
      emit(s, -1, s.text.size());
      finish(s, finish_stop);
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
    const size_t old = s.text.size();
    if (tok_) s.text += s.utf8.push(tok_->token_to_piece(r.token));
    const bool last = s.n_generated() >= static_cast<int32_t>(job.max_tokens);
    // The cache cannot take the next token past the model context: end as if by length.
    const bool full = model_ && static_cast<int64_t>(s.tokens.size()) >= model_->config().ctx_len;
    if (last || full) s.text += s.utf8.flush();
    const size_t cut = find_stop(s.text, old, job.stop);
    if (cut != std::string::npos) {
      s.text.resize(std::max(cut, s.emitted));  // held-back text makes cut >= emitted
      emit(s, r.token, s.text.size());
      finish(s, finish_stop);
    } else if (last || full) {
      emit(s, r.token, s.text.size());
      finish(s, finish_length);
    } else {
      emit(s, r.token, s.text.size() - held_back(s.text, job.stop, s.max_stop));
    }
  }

  // Gives `s` blocks for `n` more tokens and plans it, preempting the least important running
  // sequence while the pool is dry. False when `s` itself was preempted or failed.
  bool plan_seq(Seq& s, int32_t n) {
    const size_t need = static_cast<size_t>((s.n_past + n + bs_ - 1) / bs_);
    while (s.blocks.size() < need) {
      if (std::optional<int32_t> b = pool_.alloc()) {
        s.blocks.push_back(*b);
        continue;
      }
      Seq* victim = running_.back();  // running_ is sorted: the last is the least important
      if (victim == &s) {
        if (running_.size() == 1) {  // alone and still does not fit: check() should prevent it
          fail(s, ErrorCode::bad_request, "sequence does not fit in the KV pool");
          return false;
        }
        preempt(s);
        return false;
      }
      preempt(*victim);
    }
    s.in_step = true;
    s.step_tokens = n;
    budget_ -= n;
    planned_.push_back(&s);
    return true;
  }

  // Moves waiting jobs into the batch, most important first. A job starts when its whole
  // recomputation fits in the free blocks (one that would have to evict others at once is better
  // left waiting), making room by preempting less important running sequences; an empty batch
  // takes it regardless, since check() guaranteed it fits alone.
  void admit() {
    int64_t promised = 0;  // blocks the jobs admitted in this round will take when planned
    auto room = [&] { return pool_.n_free() - promised; };
    while (!waiting_.empty()) {
      Seq* s = *waiting_.begin();
      const int32_t need = (static_cast<int32_t>(s->tokens.size()) + bs_ - 1) / bs_;
      while (!running_.empty() && before(s, running_.back()) &&
             (running_.size() >= cfg_.max_sequences || need > room()))
        preempt(*running_.back());  // goes to waiting_ behind s
      if (running_.size() >= cfg_.max_sequences) break;
      if (!running_.empty() && need > room()) break;
      waiting_.erase(waiting_.begin());
      s->running = true;
      insert_sorted(running_, s);
      promised += need;
    }
  }

  // Plans the running sequences into planned_: decodes first (one token each, latency-bound),
  // then prefill chunks, each pass in priority order, within the step's token budget.
  void plan_step() {
    planned_.clear();
    budget_ = static_cast<int64_t>(cfg_.step_token_budget);
    // A snapshot: planning may preempt or fail sequences.
    std::vector<uint64_t> order;
    order.reserve(running_.size());
    for (Seq* s : running_) order.push_back(s->job.uid);
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t uid : order) {
        if (budget_ <= 0) break;
        auto it = seqs_.find(uid);
        if (it == seqs_.end()) continue;
        Seq& s = *it->second;
        if (!s.running || s.in_step) continue;
        const int32_t rem = s.remaining();
        if ((pass == 0) != (rem == 1)) continue;
        const int32_t n = static_cast<int32_t>(
            std::min<int64_t>({rem, static_cast<int64_t>(cfg_.prefill_chunk), budget_}));
        plan_seq(s, n);
      }
    }
  }

  // Plans and sends the next step unless one is in flight or there is nothing to do.
  void schedule() {
    flush_notices();
    if (in_flight_) return;
    for (;;) {
      admit();
      if (running_.empty()) return;
      const size_t jobs = seqs_.size();
      plan_step();
      flush_notices();
      if (!planned_.empty()) break;
      // Nothing planned: only when planning failed jobs (the first running sequence is always
      // planned otherwise); try again with the ones left, so that nothing stalls.
      if (seqs_.size() == jobs) return;
    }

    StepPlan plan;
    plan.step = ++steps_;
    plan.seqs.reserve(planned_.size());
    const int64_t now = now_us();
    for (Seq* s : planned_) {
      SeqPlan p;
      p.uid = s->job.uid;
      const auto from = s->tokens.begin() + s->n_past;
      p.tokens.assign(from, from + s->step_tokens);
      p.n_past = s->n_past;
      p.block_table = s->blocks;
      p.sample = s->n_past + s->step_tokens == static_cast<int32_t>(s->tokens.size());
      p.reset = !s->started;
      s->started = true;
      p.temperature = s->job.temperature;
      p.top_k = s->job.top_k;
      p.top_p = s->job.top_p;
      p.seed = s->job.seed;
      p.logprobs = s->job.logprobs;
      if (!s->first_sched_us) s->first_sched_us = now;
      plan.seqs.push_back(std::move(p));
    }
    in_flight_ = true;
    self_->request(executor_, caf::infinite, step_atom::value, std::move(plan))
        .then([this](StepResult& r) { on_result(r); },
              [this](caf::error& err) {
                StepResult r;
                r.error = "executor unreachable: " + self_->system().render(err);
                on_result(r);
              });
  }

  void on_result(StepResult& r) {
    in_flight_ = false;
    std::vector<Seq*> members;
    members.swap(planned_);
    if (!r.error.empty()) {
      for (Seq* s : members) {
        s->in_step = false;
        fail(*s, ErrorCode::engine_dead, r.error);
      }
    } else {
      std::unordered_map<uint64_t, const SeqResult*> sampled;
      for (const SeqResult& x : r.seqs) sampled.emplace(x.uid, &x);
      for (Seq* s : members) {
        s->in_step = false;
        s->n_past += s->step_tokens;
        s->step_tokens = 0;
        if (s->cancelled) {
          finish(*s, finish_cancelled);
          continue;
        }
        auto it = sampled.find(s->job.uid);
        if (it != sampled.end()) accept(*s, *it->second);
      }
    }
    schedule();
  }

  // Sends the batched sampler releases and credit grants.
  void flush_notices() {
    if (!released_.empty()) {
      self_->send(executor_, release_atom::value, std::move(released_));
      released_.clear();
    }
    if (credit_ > 0 && router_) {
      self_->send(router_, credit_atom::value, caf::actor_cast<caf::actor>(self_), credit_);
    }
    credit_ = 0;
  }

  caf::event_based_actor* self_;
  BatchingConfig cfg_;
  std::shared_ptr<const LlamaModel> model_;
  const Tokenizer* tok_;
  caf::actor executor_, router_, egress_, admission_;
  BlockPool pool_;
  int32_t bs_;
  std::unordered_map<uint64_t, std::unique_ptr<Seq>> seqs_;
  std::vector<Seq*> running_;  // sorted by Seq::key
  std::set<Seq*, Before> waiting_;  // preempted jobs resume before later arrivals
  std::vector<Seq*> planned_;  // the step being built, then the step in flight
  int64_t budget_ = 0;         // tokens left in the step being built
  bool in_flight_ = false;
  std::vector<uint64_t> released_;
  uint32_t credit_ = 0;
  int64_t preemptions_ = 0, steps_ = 0, tokens_ = 0, finished_ = 0;
};

caf::behavior batcher_actor(caf::event_based_actor* self, std::shared_ptr<Batcher> b) {
  (void)self;
  b->start();
  return {
      [b](run_atom, Job& job) { b->on_run(job); },
      [b](cancel_atom, uint64_t uid) { b->on_cancel(uid); },
      [b](stats_atom) -> caf::settings { return b->stats(); },
  };
}

}  // namespace

caf::actor spawn_batcher(caf::actor_system& sys, BatchingConfig cfg,
                         std::shared_ptr<const LlamaModel> model, caf::actor executor,
                         caf::actor router, caf::actor egress, caf::actor admission,
                         int32_t n_blocks) {
  return sys.spawn([=](caf::event_based_actor* self) {
    auto b = std::make_shared<Batcher>(self, cfg, model, executor, router, egress, admission,
                                       n_blocks);
    return batcher_actor(self, std::move(b));
  });
}

}  // namespace sy
