// The batcher actor's shell: its messages, the scheduling round (a snapshot for
// policy::plan_step, whose actions it applies to the KV manager), the step sent to the executor
// and its result. Job text and ends are in batcher_jobs.cpp, the lifecycle in batcher_lifecycle.cpp.
#include "actors/batcher.hpp"

#include <algorithm>
#include <caf/all.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/batcher_core.hpp"
#include "gpu/engine.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"

namespace sy {

int32_t kv_blocks_for(const BatchingConfig& cfg, int64_t kv_bytes_per_token) {
  const int64_t per_token = kv_bytes_per_token > 0 ? kv_bytes_per_token : 4096;
  const int64_t per_block = per_token * std::max<int32_t>(1, cfg.kv_block_size);
  const int64_t mb = cfg.kv_memory_mb > 0 ? cfg.kv_memory_mb : kDefaultKvMemoryMb;
  const int64_t n = mb * 1024 * 1024 / per_block;
  // Block ids are int32 on the engine side.
  return static_cast<int32_t>(std::clamp<int64_t>(n, 1, INT32_MAX));
}

KvPools kv_pools_for(const BatchingConfig& cfg, const ModelLimits& lim, bool split) {
  const int32_t w = lim.split_window();
  if (!split || w == 0) return {kv_blocks_for(cfg, lim.kv_bytes_per_token(cfg.kv_dtype)), 0};
  const int64_t bs = std::max<int32_t>(1, cfg.kv_block_size);
  const int64_t mem = (cfg.kv_memory_mb > 0 ? cfg.kv_memory_mb : kDefaultKvMemoryMb) * 1024 * 1024;
  const int64_t full_block = lim.kv_bytes_per_token_full(cfg.kv_dtype) * bs;
  const int64_t win_block = lim.kv_bytes_per_token_window(cfg.kv_dtype) * bs;
  const policy::KvPolicy win{policy::KvPolicy::sliding_window, w, 0};
  const int64_t per_seq =
      policy::max_blocks_held(win, std::max<int32_t>(1, lim.ctx_len),
                              std::max<uint32_t>(1, cfg.prefill_chunk), static_cast<int32_t>(bs));
  const int64_t wanted = per_seq * std::max<uint32_t>(1, cfg.max_sequences);
  // At most half of the memory: the window group's need is bounded, the full group's grows with
  // every token, so the full group is the one that runs out first.
  const int64_t n_win = std::clamp<int64_t>(std::min(wanted, mem / 2 / win_block), 1, INT32_MAX);
  const int64_t n_full = std::clamp<int64_t>((mem - n_win * win_block) / full_block, 1, INT32_MAX);
  return {static_cast<int32_t>(n_full), static_cast<int32_t>(n_win)};
}

namespace batcher_detail {

namespace {
// The KV manager's pools: the window group only for a model whose layers are of two kinds.
int32_t layer_window_of(const LlamaModel* model, int32_t window_blocks) {
  return window_blocks > 0 && model ? model->limits().split_window() : 0;
}
}  // namespace

Batcher::Batcher(BatcherActor::pointer self, BatchingConfig cfg,
                 std::shared_ptr<const LlamaModel> model, ExecutorActor executor,
                 RouterActor router, EgressActor egress, AdmissionActor admission, int32_t n_blocks,
                 BatcherExtras extras)
    : self_(self),
      cfg_(cfg),
      model_(std::move(model)),
      tok_(model_ ? &model_->tokenizer() : nullptr),
      executor_(std::move(executor)),
      router_(std::move(router)),
      egress_(std::move(egress)),
      direct_(extras.direct_egress ? extras.direct_egress : egress_),
      admission_(std::move(admission)),
      kv_(n_blocks, extras.window_blocks, cfg.kv_block_size, cfg.prefix_cache,
          layer_window_of(model_.get(), extras.window_blocks)),
      bs_(std::max<int32_t>(1, cfg.kv_block_size)),
      extras_(std::move(extras)) {
  // Zero limits would stall every job forever: each step moves at least one token.
  cfg_.max_sequences = std::max<uint32_t>(1, cfg_.max_sequences);
  cfg_.step_token_budget = std::max<uint32_t>(1, cfg_.step_token_budget);
  cfg_.prefill_chunk = std::max<uint32_t>(1, cfg_.prefill_chunk);
  // The normal policy: the configured one, else the window the model was trained with, else
  // full. Config values were checked at load; a bad one here is a programming error.
  if (!cfg_.kv_policy.empty()) {
    std::string why;
    auto p = policy::parse_kv_policy(cfg_.kv_policy, &why);
    if (!p) throw std::invalid_argument("batcher: kv_policy: " + why);
    base_ = *p;
  } else if (model_ && model_->limits().sliding_window > 0) {
    base_ = {policy::KvPolicy::sliding_window, model_->limits().sliding_window, 0};
  }
  if (!cfg_.kv_pressure_policy.empty()) {
    std::string why;
    auto p = policy::parse_kv_policy(cfg_.kv_pressure_policy, &why);
    if (!p) throw std::invalid_argument("batcher: kv_pressure_policy: " + why);
    pressure_policy_ = *p;
  }
  if (const std::string why = refuse(base_); !why.empty())
    throw std::invalid_argument("batcher: kv_policy " + policy::to_string(base_) + ": " + why);
  if (pressure_policy_) {
    if (const std::string why = refuse(*pressure_policy_); !why.empty())
      throw std::invalid_argument("batcher: kv_pressure_policy " +
                                  policy::to_string(*pressure_policy_) + ": " + why);
  }
}

BatcherActor::behavior_type Batcher::mode(policy::KvPolicy p) {
  auto b = shared_from_this();
  return {
      [b, p](run_atom, Job& job) { b->on_run(job, p); },
      [b](cancel_atom, uint64_t uid) { b->on_cancel(uid); },
      [b](release_atom, uint64_t program) { b->unpin(program); },
      [b](status_atom, uint64_t uid) -> uint32_t { return b->generated(uid); },
      [b](stats_atom) -> BatcherStats { return b->stats(); },
      [b](kvpolicy_atom, const policy::KvPolicy& np) -> std::string { return b->on_swap(np); },
      [b](retire_atom) { b->on_scale_down(); },
      [b](watchdog_atom) { b->on_watchdog(); },
  };
}

int64_t Batcher::now() const {
  return clock_us(self_);
}

Seq* Batcher::find(uint64_t uid) {
  auto it = seqs_.find(uid);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Batcher::start() {
  idle_since_us_ = now();
  if (executor_) {
    // A crashed executor (an exception out of its handler, a kill) shows up as a down message;
    // a hung one only through the step watchdog.
    self_->monitor(executor_);
    // The executor belongs to its batcher: whatever ends the batcher (scale down, failure,
    // shutdown) ends the executor too, so no executor outlives the pair.
    self_->attach_functor(
        [exec = executor_] { caf::anon_send_exit(exec, caf::exit_reason::user_shutdown); });
    auto b = shared_from_this();
    self_->set_down_handler([b](caf::down_msg& dm) {
      if (dm.source == b->executor_.address())
        b->on_executor_failure("executor down: " + b->self_->system().render(dm.reason), b->now());
    });
  }
  if (router_)
    self_->send(router_, credit_atom::value, BatcherActor(self_),
                static_cast<uint32_t>(cfg_.max_sequences));
}

void Batcher::on_run(Job& job, const policy::KvPolicy& pol) {
  if (seqs_.count(job.uid)) return;  // a duplicate dispatch: the job is already here
  if (life_ == Lifecycle::failed) {
    // Dispatched before the router learnt that this pair failed: straight back, no attempt
    // counted (it never ran here).
    if (router_) self_->send(router_, requeue_atom::value, std::vector<Job>{std::move(job)});
    return;
  }
  idle_since_us_ = 0;
  // For pacing (pace): when a job of this class last arrived. Class indices are small (the
  // configured priority classes); a larger one is not paced for.
  if (job.class_index < 256) {
    if (class_seen_us_.size() <= job.class_index) class_seen_us_.resize(job.class_index + 1, 0);
    class_seen_us_[job.class_index] = now();
  }
  auto s = std::make_unique<Seq>();
  // A job takes the policy in force when it reaches the batcher; under pressure a `full` one
  // takes the pressure policy (the behavior on top is the pressure one then, so p says so).
  s->kv.policy = pol;
  s->n_prompt = static_cast<int32_t>(job.prompt.size());
  s->tokens = job.prompt;
  s->text = StopMatcher(job.stop);
  s->job = std::move(job);
  Seq* p = s.get();
  seqs_.emplace(p->job.uid, std::move(s));
  start_group(*p);
  if (const std::string why = check(*p); !why.empty()) {
    fail(*p, ErrorCode::bad_request, why);
  } else if (p->grouped && p->feed_end() == 0) {
    fork_group(*p);  // a one-token prompt: nothing to share, each member feeds it itself
  } else {
    waiting_.insert(p);
    maybe_interrupt(*p);
  }
  schedule();
}

// By uid: ending one member of a group may end its group's other members of this step.
std::vector<uint64_t> Batcher::take_step_members() {
  std::vector<uint64_t> members;
  for (Seq* s : planned_) members.push_back(s->job.uid);
  planned_.clear();
  return members;
}

void Batcher::maybe_interrupt(const Seq& s) {
  if (!extras_.interrupt || !cfg_.urgent_interrupt || !cfg_.urgent_prefill) return;
  if (!step_sent_us_ || step_drafted_ || extras_.interrupt->load(std::memory_order_relaxed)) return;
  // Only where urgent prefill (plan_step 3.) would then run the job's prompt in a step of its
  // own: neither the step in flight nor the one before it was such a step (never two in a row),
  // the job is more important than every sequence of the step in flight, and that step feeds
  // more tokens than the job's first chunk.
  if (last_step_urgent_ || urgent_before_ || s.job.class_index >= step_top_class_) return;
  if (step_fed_ <= std::min<int64_t>(s.feed_end(), cfg_.prefill_chunk)) return;
  extras_.interrupt->store(true, std::memory_order_relaxed);
}

void Batcher::on_interrupted() {
  ++interrupts_;
  step_sent_us_.reset();
  last_step_urgent_ = urgent_before_;  // the stopped step does not count as the batch's turn
  for (uint64_t uid : take_step_members()) {
    Seq* s = find(uid);
    if (!s) continue;
    s->in_step = false;
    s->step_tokens = 0;  // n_past stays: the same tokens go to the same slots again
    if (s->cancelled) finish(*s, FinishReason::cancelled);
  }
  check_pressure();
  schedule();
}

uint32_t Batcher::generated(uint64_t uid) const {
  auto it = seqs_.find(uid);
  if (it == seqs_.end()) return 0;
  const Seq& s = *it->second;
  if (!s.grouped) return static_cast<uint32_t>(std::max(0, s.n_generated()));
  int64_t n = s.member_tokens;
  for (const Seq* m : s.members) n += m->samples ? std::max(0, m->n_generated()) : 0;
  return static_cast<uint32_t>(n);
}

void Batcher::on_cancel(uint64_t uid) {
  Seq* s = find(uid);
  if (!s || s->leader) return;  // ended already, or never here; members end with their job
  if (s->forked)
    cancel_group(*s);
  else if (s->in_step)
    s->cancelled = true;  // ends when the step in flight returns
  else
    finish(*s, FinishReason::cancelled);
  flush_notices();
  schedule();
}

BatcherStats Batcher::stats() const {
  const PrefixBlockPool& pool = kv_.pool();
  const PrefixBlockPool& wpool = kv_.window_pool();
  const bool split = kv_.split();
  BatcherStats s;
  auto n = [](auto v) { return static_cast<int64_t>(v); };
  s.running = n(running_.size());
  s.waiting = n(waiting_.size());
  s.blocks_used = n(pool.n_held());
  s.blocks_free = n(pool.n_free());
  s.blocks_total = n(pool.n_total());
  s.blocks_cached = n(pool.n_cached());
  s.blocks_pinned = n(pinned_blocks_);
  s.blocks_used_peak = kv_.peak();
  s.window_blocks_used = n(split ? wpool.n_held() : 0);
  s.window_blocks_free = n(split ? wpool.n_free() : 0);
  s.window_blocks_total = n(split ? wpool.n_total() : 0);
  s.window_blocks_used_peak = kv_.window_peak();
  s.fed_tokens = fed_;
  s.prefix_hit_blocks = prefix_blocks_;
  s.prefix_hit_tokens = prefix_tokens_;
  s.prefix_evictions = n(pool.evictions());
  s.kv_policy = policy::to_string(pressure_ ? *pressure_policy_ : base_);
  s.kv_base_policy = policy::to_string(base_);
  s.policy_swaps = swaps_;
  s.pressure_swaps = pressure_swaps_;
  s.pressure = n(pressure_ ? 1 : 0);
  s.preemptions = preemptions_;
  s.steps = steps_;
  s.tokens = tokens_;
  s.finished = finished_;
  s.ongoing = n(seqs_.size());
  s.idle_since_us = seqs_.empty() ? idle_since_us_ : int64_t{0};
  s.retiring = n(life_ == Lifecycle::scaling_down ? 1 : 0);
  s.executor_failures = n(life_ == Lifecycle::failed ? 1 : 0);
  s.requeued = requeued_;
  s.seq_failures = seq_failures_;
  s.prompt_fed_tokens = prompt_fed_;
  s.forked_seqs = forked_;
  s.kv_block_copies = block_copies_;
  s.spec_draft_tokens = spec_drafted_;
  s.spec_accepted_tokens = spec_accepted_;
  s.spec_seq_steps = spec_seq_steps_;
  s.spec_steps = spec_steps_;
  s.steps_done = steps_done_;
  s.step_us = step_us_;
  s.steps_interrupted = interrupts_;
  return s;
}

std::string Batcher::check(const Seq& s) const {
  if (s.tokens.empty()) return "empty prompt";
  if (model_) {
    const int32_t n_vocab = model_->limits().n_vocab;
    for (int32_t id : s.tokens)
      if (id < 0 || id >= n_vocab)
        return "prompt token id " + std::to_string(id) + " outside the vocabulary [0, " +
               std::to_string(n_vocab) + ")";
  }
  return kv_.check_fits(s.n_prompt, s.job.max_tokens, s.kv.policy, cfg_.prefill_chunk);
}

policy::PlanSeq Batcher::plan_seq_of(const Seq& s) const {
  policy::PlanSeq p;
  p.uid = s.job.uid;
  p.class_index = s.job.class_index;
  p.arrival_us = s.job.arrival_us;
  p.n_tokens = s.feed_end();
  p.n_cached = s.kv.n_past;
  p.table = static_cast<int32_t>(s.kv.blocks.size());
  p.wtable = static_cast<int32_t>(s.kv.wblocks.size());
  for (int32_t b : s.kv.blocks)
    if (b >= 0) p.blocks.push_back(b);
  p.wheld = s.kv.wheld();
  p.lost_window = kv_.window_blocks_lost(s.kv);
  p.max_blocks = kv_.max_blocks(s.kv, p.n_tokens, cfg_.prefill_chunk);
  p.max_wblocks = kv_.max_window_blocks(s.kv, p.n_tokens, cfg_.prefill_chunk);
  return p;
}

void Batcher::pace(policy::PlanInput& in) const {
  if (cfg_.priority_pacing_ms <= 0 || !(cfg_.priority_pacing > 0)) return;
  const int64_t t = now(), window = int64_t{cfg_.priority_pacing_ms} * 1000;
  for (size_t c = 0; c < class_seen_us_.size(); ++c) {
    if (class_seen_us_[c] == 0 || t - class_seen_us_[c] > window) continue;
    // The most important active class paces the others: their prompt tokens in a step cost at
    // most priority_pacing of a decode step of everyone running, by the measured step cost.
    const auto n = static_cast<int64_t>(running_.size());
    const double per_token = step_cost_.token_cost();
    int64_t tokens = kPaceMinTokens;
    if (per_token > 0)
      tokens = std::max(tokens, static_cast<int64_t>(cfg_.priority_pacing *
                                                     step_cost_.predict(n, n) / per_token));
    in.pace_class = static_cast<uint32_t>(c);
    in.pace_prefill = tokens;
    return;
  }
}

// The snapshot for one round. Prefix lookups (hashing) only where admission can use them: the
// waiting jobs it can reach (each one it passes starts, so at most max_sequences + 1 of them),
// and the running ones it may preempt (one may start again in the same round).
policy::PlanOutput Batcher::plan_round() {
  // Programs' pinned contexts give way when jobs wait and the pool runs low (below a quarter
  // free): they are recomputed (or found cached) when their programs go on.
  if (!pins_.empty() && !waiting_.empty() && kv_.pool().n_free() < kv_.pool().n_total() / 4)
    trim_pins(0);
  policy::PlanInput in;
  in.free_blocks = kv_.pool().n_free();
  in.free_wblocks = kv_.split() ? kv_.window_pool().n_free() : 0;
  in.split = kv_.split();
  in.block_size = bs_;
  in.step_token_budget = cfg_.step_token_budget;
  in.max_sequences = cfg_.max_sequences;
  in.prefill_chunk = cfg_.prefill_chunk;
  in.urgent_prefill = cfg_.urgent_prefill;
  in.last_step_urgent = last_step_urgent_;
  pace(in);
  in.running.reserve(running_.size());
  for (Seq* s : running_) {
    kv_.trim(s->kv);  // up to date already; the snapshot must not count a releasable block
    in.running.push_back(plan_seq_of(*s));
    // Only a sequence less important than some waiting job can be preempted by admission.
    if (!waiting_.empty() && before(*waiting_.begin(), s)) in.running.back().prefix = peek(*s);
  }
  size_t reach = static_cast<size_t>(cfg_.max_sequences) + 1;
  for (Seq* s : waiting_) {
    in.waiting.push_back(plan_seq_of(*s));
    if (reach > 0) {
      --reach;
      in.waiting.back().prefix = peek(*s);
    }
  }
  return policy::plan_step(in);
}

// A sequence that still wants log-probabilities of positions takes nothing from the prefix cache:
// the cached blocks would skip the rows those come from. One that holds its last token back
// (a group's leader, a scorer) looks up only what it feeds.
void Batcher::reuse(Seq& s) {
  if (s.wants_lp()) return;
  if (!s.hold_last) return kv_.reuse_prefix(s.kv, s.tokens);
  const std::vector<int32_t> fed(s.tokens.begin(), s.tokens.begin() + s.feed_end());
  kv_.reuse_prefix(s.kv, fed);
}

std::vector<int32_t> Batcher::peek(const Seq& s) const {
  if (s.wants_lp()) return {};
  if (!s.hold_last) return kv_.peek_prefix(s.kv, s.tokens);
  const std::vector<int32_t> fed(s.tokens.begin(), s.tokens.begin() + s.feed_end());
  return kv_.peek_prefix(s.kv, fed);
}

// The log-probabilities a step of `s` can give: the row of slot t is the distribution of the
// token at position t + 1.
void Batcher::fill_targets(const Seq& s, SeqPlan& p) const {
  if (!s.wants_lp()) return;
  const int32_t next = s.lp_from + static_cast<int32_t>(s.lp.size());
  bool any = false;
  p.targets.assign(p.tokens.size(), -1);
  for (size_t j = 0; j < p.tokens.size(); ++j) {
    const int32_t q = p.n_past + static_cast<int32_t>(j) + 1;
    if (q < next || q >= s.lp_to) continue;
    p.targets[j] = s.tokens[static_cast<size_t>(q)];
    any = true;
  }
  if (!any) p.targets.clear();
  p.target_top = s.lp_n_top;
}

// Takes the log-probabilities a step of `s` over slots [from_slot, from_slot + n_fed) returned,
// in the order fill_targets asked for them (fewer from an executor without them: padded).
void Batcher::take_targets(Seq& s, const SeqResult& r, int32_t from_slot, int32_t n_fed) {
  size_t k = 0;
  for (int32_t j = 0; j < n_fed; ++j) {
    const int32_t q = from_slot + j + 1;
    if (q != s.lp_from + static_cast<int32_t>(s.lp.size()) || q >= s.lp_to) continue;
    const bool have = k < r.target_logprobs.size();
    s.lp.push_back(have ? r.target_logprobs[k] : 0.0f);
    for (uint32_t t = 0; t < s.lp_n_top; ++t) {
      const size_t at = k * s.lp_n_top + t;
      const bool top = at < r.target_top_ids.size() && at < r.target_top_logprobs.size();
      s.lp_top_ids.push_back(top ? r.target_top_ids[at] : 0);
      s.lp_top.push_back(top ? r.target_top_logprobs[at] : -1e30f);
    }
    ++k;
  }
}

void Batcher::admit(Seq& s) {
  reuse(s);
  waiting_.erase(&s);
  // Counted when the job starts (an attempt that had to wait gave its blocks back).
  if (s.cached_tokens < 0) s.cached_tokens = std::min(s.kv.n_past, s.n_prompt);
  prefix_tokens_ += s.kv.n_past;
  prefix_blocks_ += s.kv.n_past / bs_;
  s.running = true;
  insert_sorted(running_, &s);
}

// Takes a sequence out of the batch: blocks freed, recomputed from its tokens when resumed.
void Batcher::preempt(Seq& s) {
  trim_pins(0);  // pinned program contexts go before a running sequence loses its blocks
  if (!s.kv.blocks.empty()) ++preemptions_;
  kv_.free(s.kv);
  if (s.in_step) {  // planned in the step being built: take it out again
    erase_from(planned_, &s);
    fed_ -= s.step_tokens;
    s.in_step = false;
    s.step_tokens = 0;
  }
  s.running = false;
  erase_from(running_, &s);
  waiting_.insert(&s);
}

bool Batcher::apply(const policy::PlanAction& a) {
  Seq* found = find(a.uid);
  if (!found) return true;  // ended by an earlier action (a sample failing ends its group)
  Seq& s = *found;
  switch (a.kind) {
    case policy::PlanAction::admit:
      admit(s);
      break;
    case policy::PlanAction::wait:
      reuse(s);
      kv_.free(s.kv);  // its shared prefix stays cached for when it starts
      break;
    case policy::PlanAction::preempt:
      preempt(s);
      break;
    case policy::PlanAction::recompute:
      ++preemptions_;
      kv_.free(s.kv);  // recomputed from its tokens, in chunks from slot 0
      break;
    case policy::PlanAction::alloc:
      for (int32_t k = 0; k < a.tokens; ++k) {
        if (kv_.grow(s.kv, a.window)) continue;
        // The plan counted a block that is not there (its model of the pools is off): the
        // sequence waits and the round is planned again from the pools as they are.
        log_line("batcher " + std::to_string(extras_.pair) +
                 ": step plan out of step with the KV "
                 "pool (uid " +
                 std::to_string(s.job.uid) + "); planned again");
        preempt(s);
        return false;
      }
      break;
    case policy::PlanAction::plan:
      s.in_step = true;
      s.step_tokens = a.tokens;
      fed_ += a.tokens;
      planned_.push_back(&s);
      break;
    case policy::PlanAction::fail:
      fail(s, ErrorCode::bad_request, "sequence does not fit in the KV pool");
      break;
  }
  return true;
}

// Plans and sends the next step unless one is in flight or there is nothing to do.
void Batcher::schedule() {
  flush_notices();
  if (step_sent_us_) return;
  int64_t budget_left = 0;
  for (;;) {
    const size_t jobs = seqs_.size();
    planned_.clear();
    const policy::PlanOutput plan = plan_round();
    bool applied = true;
    for (const policy::PlanAction& a : plan.actions)
      if (!(applied = apply(a))) break;
    if (!applied) {
      for (Seq* s : planned_) {  // keeps the blocks it got; planned again
        s->in_step = false;
        fed_ -= s->step_tokens;
        s->step_tokens = 0;
      }
      continue;
    }
    if (running_.empty()) return;
    flush_notices();
    if (!planned_.empty()) {
      urgent_before_ = last_step_urgent_;
      last_step_urgent_ = plan.urgent;
      budget_left = plan.budget_left;
      break;
    }
    // Nothing planned: only when planning failed jobs (the first running sequence is always
    // planned otherwise); try again with the ones left, so that nothing stalls.
    if (seqs_.size() == jobs) return;
  }
  speculate(budget_left);
  send_step();
}

void Batcher::send_step() {
  StepPlan plan;
  plan.step = ++steps_;
  for (const KvBlockCopyPlan& c : pending_copies_) {
    plan.copy_from.push_back(c.src);
    plan.copy_to.push_back(c.dst);
    plan.copy_window.push_back(c.window ? 1 : 0);
  }
  block_copies_ += static_cast<int64_t>(pending_copies_.size());
  pending_copies_.clear();
  plan.seqs.reserve(planned_.size());
  const int64_t t = now();
  step_fed_ = step_rows_ = step_outputs_ = step_accepted_ = 0;
  step_drafted_ = false;
  step_pure_ = true;
  step_top_class_ = UINT32_MAX;
  for (Seq* s : planned_) {
    step_top_class_ = std::min(step_top_class_, s->job.class_index);
    step_fed_ += s->step_tokens;
    step_rows_ += logit_rows(*s);
    const bool samples = s->samples_in_step();
    step_outputs_ += samples ? 1 : 0;
    step_drafted_ = step_drafted_ || s->n_draft > 0;
    step_pure_ = step_pure_ && samples && s->step_tokens == 1 + s->n_draft;
    SeqPlan p;
    p.uid = s->job.uid;
    const auto from = s->tokens.begin() + s->kv.n_past;
    p.tokens.assign(from, from + s->step_tokens);
    p.n_past = s->kv.n_past;
    p.block_table = s->kv.blocks;
    if (kv_.split()) p.window_table = s->kv.wblocks;
    p.sample = samples;
    p.n_draft = s->n_draft;
    p.draft_model = extras_.draft_model && s->n_draft > 0;
    prompt_fed_ += std::max(0, std::min(s->kv.n_past + s->step_tokens, s->n_prompt) - s->kv.n_past);
    p.reset = !s->started;
    s->started = true;
    if (p.reset && extras_.draft_model && s->kv.n_past > 0)
      p.draft_prior.assign(s->tokens.begin(), s->tokens.begin() + s->kv.n_past);
    p.temperature = s->job.temperature;
    p.top_k = s->job.top_k;
    p.top_p = s->job.top_p;
    p.seed = s->job.seed;
    p.logprobs = s->job.logprobs;
    if (p.reset && (s->job.controls.any() || !s->job.constraint.empty())) {
      p.n_prompt = s->n_prompt;
      p.prior.assign(s->tokens.begin(), s->tokens.begin() + s->kv.n_past);
      p.controls = s->job.controls;
      p.constraint = s->job.constraint;
    }
    fill_targets(*s, p);
    p.window = policy::step_window(s->kv.policy);
    p.sinks = policy::step_sinks(s->kv.policy);
    if (!s->first_sched_us) s->first_sched_us = t;
    if (s->job.fault_us > 0 && !s->recovery_reported) {
      s->recovery_reported = true;
      if (extras_.supervisor)
        self_->send(extras_.supervisor, recovered_atom::value, s->job.fault_us, t);
    }
    plan.seqs.push_back(std::move(p));
  }
  step_sent_us_ = t;
  if (cfg_.step_timeout_ms > 0) arm_watchdog(cfg_.step_timeout_ms * 1000);
  self_->request(executor_, caf::infinite, step_atom::value, std::move(plan))
      .then([this](StepResult& r) { on_result(r); },
            [this](caf::error& err) {
              on_executor_failure("executor unreachable: " + self_->system().render(err), now());
            });
}

void Batcher::on_result(StepResult& r) {
  // TEST ONLY (--test-fault-batcher-throw-after): the batcher itself crashes, so its jobs can
  // only be recovered by the router's records of what it dispatched here.
  if (extras_.test_fault_throw_after > 0 && ++fault_steps_ >= extras_.test_fault_throw_after)
    throw std::runtime_error("TEST ONLY fault: batcher throws after " +
                             std::to_string(extras_.test_fault_throw_after) + " steps");
  if (life_ == Lifecycle::failed) return;  // a late answer of an executor already given up on
  // Lowered before the next step is sent, which it must not stop (only the batcher writes it).
  if (extras_.interrupt) extras_.interrupt->store(false, std::memory_order_relaxed);
  if (r.interrupted) return on_interrupted();
  // The step's measured cost, for speculation's choice (test-only step delays left out).
  const int64_t took = step_sent_us_ ? now() - *step_sent_us_ : 0;
  const bool timed = step_sent_us_ && cfg_.step_delay_ms <= 0;
  const double step_us = timed ? static_cast<double>(took) : 0.0;
  if (step_sent_us_) {
    ++steps_done_;
    step_us_ += took;
  }
  // The target's step apart from the draft model's passes, which have a model of their own.
  if (timed) step_cost_.observe(step_fed_, step_rows_, std::max(0.0, step_us - r.draft_us));
  if (timed && r.draft_passes > 0) draft_cost_.observe(r.draft_passes, r.draft_tokens, r.draft_us);
  if (cfg_.traces && step_sent_us_) trace_prefills(*step_sent_us_);
  step_sent_us_.reset();
  const std::vector<uint64_t> members = take_step_members();
  if (!r.error.empty()) {
    for (uint64_t uid : members) {
      Seq* s = find(uid);
      if (!s) continue;
      s->in_step = false;
      drop_drafts(*s);
      fail(*s, ErrorCode::engine_dead, r.error);
    }
  } else {
    std::unordered_map<uint64_t, const SeqResult*> sampled;
    for (const SeqResult& x : r.seqs) sampled.emplace(x.uid, &x);
    for (uint64_t uid : members) {
      Seq* s = find(uid);
      if (!s) continue;
      s->in_step = false;
      const bool drafted = s->n_draft > 0;
      drop_drafts(*s);  // what verification accepted of them comes back in the result
      auto it = sampled.find(s->job.uid);
      if (it != sampled.end() && !it->second->error.empty()) {
        // This sequence failed alone (its sampling state, its logits): it ends here and the
        // others go on. Its blocks of this step are not published: what they hold is suspect.
        s->step_tokens = 0;
        if (s->cancelled) {
          finish(*s, FinishReason::cancelled);
          continue;
        }
        ++seq_failures_;
        const ErrorCode c = it->second->code;
        const ErrorCode code = c <= ErrorCode::internal ? c : ErrorCode::internal;
        log_line("batcher " + std::to_string(extras_.pair) + ": job uid " +
                 std::to_string(s->job.uid) + " failed alone (" + std::string(to_string(code)) +
                 "): " + it->second->error);
        fail(*s, code, it->second->error);
        continue;
      }
      const int32_t from_slot = s->kv.n_past;
      const int32_t n_fed = s->step_tokens;
      s->kv.n_past += s->step_tokens;
      s->step_tokens = 0;
      kv_.publish(s->kv, s->tokens);
      kv_.trim(s->kv);
      if (it != sampled.end() && s->wants_lp()) take_targets(*s, *it->second, from_slot, n_fed);
      if (s->cancelled) {
        finish(*s, FinishReason::cancelled);
        continue;
      }
      if (!s->samples) {
        if (s->kv.n_past < s->feed_end()) continue;
        if (s->leader)
          end_member(*s, FinishReason::stop);  // a continuation scored
        else
          fork_group(*s);  // the shared prompt is in: the samples start
        continue;
      }
      if (it == sampled.end() || s->kv.n_past != s->feed_end()) continue;
      if (drafted)
        accept_spec(*s, *it->second,  // s may end inside
                    extras_.draft_model ? it->second->drafts : std::vector<int32_t>(s->drafts));
      else
        accept(*s, *it->second);
    }
  }
  if (timed && step_pure_ && r.error.empty())
    spec_guard_.observe(step_outputs_, step_drafted_, step_outputs_ + step_accepted_, step_us);
  check_pressure();
  schedule();
}

// Sends the batched sampler releases and credit grants.
void Batcher::flush_notices() {
  if (life_ != Lifecycle::serving) credit_ = 0;  // a leaving batcher takes no new work
  if (!released_.empty()) {
    self_->send(executor_, release_atom::value, std::move(released_));
    released_.clear();
  }
  // Before the credit, so the router has forgotten these jobs when it dispatches against it.
  if (!ended_.empty()) {
    if (router_) self_->send(router_, finished_atom::value, std::move(ended_));
    ended_.clear();
  }
  if (credit_ > 0 && router_) {
    self_->send(router_, credit_atom::value, BatcherActor(self_), credit_);
  }
  credit_ = 0;
}

BatcherActor::behavior_type batcher_actor(BatcherActor::pointer self, std::shared_ptr<Batcher> b) {
  (void)self;
  b->start();
  return b->mode(b->base_policy());
}

}  // namespace batcher_detail

BatcherActor spawn_batcher(caf::actor_system& sys, BatchingConfig cfg,
                           std::shared_ptr<const LlamaModel> model, ExecutorActor executor,
                           RouterActor router, EgressActor egress, AdmissionActor admission,
                           int32_t n_blocks) {
  return spawn_batcher(sys, std::move(cfg), std::move(model), std::move(executor),
                       std::move(router), std::move(egress), std::move(admission), n_blocks,
                       BatcherExtras{});
}

BatcherActor spawn_batcher(caf::actor_system& sys, BatchingConfig cfg,
                           std::shared_ptr<const LlamaModel> model, ExecutorActor executor,
                           RouterActor router, EgressActor egress, AdmissionActor admission,
                           int32_t n_blocks, BatcherExtras extras) {
  return sys.spawn([=](BatcherActor::pointer self) {
    auto b = std::make_shared<batcher_detail::Batcher>(self, cfg, model, executor, router, egress,
                                                       admission, n_blocks, extras);
    return batcher_detail::batcher_actor(self, std::move(b));
  });
}

}  // namespace sy
