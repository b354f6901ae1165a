// The batcher actor: continuous batching with chunked prefill, paged KV block tables with a
// prefix cache, KV-cache policies as swappable behaviors, priority preemption with recomputation,
// detokenization and stop rules, credit to the router.
#include "actors/batcher.hpp"

#include <algorithm>
#include <caf/all.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "actors/messages.hpp"
#include "gpu/engine.hpp"
#include "gpu/prefix_pool.hpp"
#include "ingress/error_code.hpp"
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
  int32_t n_past = 0;            // tokens of `tokens` cached in `blocks`
  std::vector<int32_t> blocks;   // block table; -1: released (outside the policy's window)
  std::vector<int32_t> wblocks;  // the window group's block table (split cache); -1: released
  std::vector<uint64_t> hashes;  // chain hashes of the leading full blocks seen by the prefix cache
  policy::KvPolicy policy;       // the KV policy this job runs under
  int32_t cached_tokens = -1;    // prompt tokens reused from the prefix cache at first start
  bool running = false;
  bool in_step = false;     // part of the step in flight
  int32_t step_tokens = 0;  // tokens it feeds in the step in flight
  bool cancelled = false;   // cancel arrived while in the step in flight
  bool started = false;     // the executor has made its sampler
  Utf8Stream utf8;
  std::string text;    // complete characters, cut at a stop string when one matched
  size_t emitted = 0;  // bytes of `text` already final (streamed)
  size_t max_stop = 0;
  uint32_t sent_ids = 0;       // completion ids already streamed
  std::vector<float> logprob;  // per completion id (when job.logprobs > 0)
  std::vector<int32_t> top_ids;
  std::vector<float> top_lps;
  int64_t first_sched_us = 0, first_token_us = 0;
  bool recovery_reported = false;  // a re-queued job told the supervisor it runs again

  int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  int32_t remaining() const { return static_cast<int32_t>(tokens.size()) - n_past; }
  int32_t held() const {
    return static_cast<int32_t>(
        std::count_if(blocks.begin(), blocks.end(), [](int32_t b) { return b >= 0; }));
  }
  int32_t wheld() const {
    return static_cast<int32_t>(
        std::count_if(wblocks.begin(), wblocks.end(), [](int32_t b) { return b >= 0; }));
  }
  // Scheduling priority: lower is more important (class first, then earlier arrival).
  std::tuple<uint32_t, int64_t, uint64_t> key() const {
    return {job.class_index, job.arrival_us, job.uid};
  }
};

bool before(const Seq* a, const Seq* b) {
  return a->key() < b->key();
}

struct Before {
  bool operator()(const Seq* a, const Seq* b) const { return before(a, b); }
};

class Batcher : public std::enable_shared_from_this<Batcher> {
 public:
  Batcher(caf::event_based_actor* self, BatchingConfig cfg, std::shared_ptr<const LlamaModel> model,
          caf::actor executor, caf::actor router, caf::actor egress, caf::actor admission,
          int32_t n_blocks, BatcherExtras extras)
      : self_(self),
        cfg_(cfg),
        model_(std::move(model)),
        tok_(model_ ? &model_->tokenizer() : nullptr),
        executor_(std::move(executor)),
        router_(std::move(router)),
        egress_(std::move(egress)),
        admission_(std::move(admission)),
        split_(extras.window_blocks > 0),
        // Two-group models run without prefix reuse: a cached prefix would need its window
        // group's blocks too, which are given back behind the window.
        pool_(std::max<int32_t>(1, n_blocks), std::max<int32_t>(1, cfg.kv_block_size),
              cfg.prefix_cache && !split_),
        wpool_(std::max<int32_t>(1, extras.window_blocks), std::max<int32_t>(1, cfg.kv_block_size),
               false),
        bs_(std::max<int32_t>(1, cfg.kv_block_size)),
        extras_(std::move(extras)) {
    if (split_) {
      gw_ = model_ ? model_->limits().split_window() : 0;
      if (gw_ == 0)
        throw std::invalid_argument(
            "batcher: window_blocks given for a model whose layers are not of two kinds");
    }
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

  /// The behavior of the batcher under KV policy `p`: new jobs take `p`. Swapped with
  /// become/unbecome by an operator command and by the pressure watermarks.
  caf::behavior mode(policy::KvPolicy p) {
    auto b = shared_from_this();
    return {
        [b, p](run_atom, Job& job) { b->on_run(job, p); },
        [b](cancel_atom, uint64_t uid) { b->on_cancel(uid); },
        [b](status_atom, uint64_t uid) -> uint32_t { return b->generated(uid); },
        [b](stats_atom) -> caf::settings { return b->stats(); },
        [b](kvpolicy_atom, const policy::KvPolicy& np) -> std::string { return b->on_swap(np); },
        [b](retire_atom) { b->on_retire(); },
        [b](watchdog_atom) { b->on_watchdog(); },
    };
  }
  policy::KvPolicy base_policy() const { return base_; }

  void start() {
    idle_since_us_ = now_us();
    if (executor_) {
      // A crashed executor (an exception out of its handler, a kill) shows up as a down message;
      // a hung one only through the step watchdog.
      self_->monitor(executor_);
      // The executor belongs to its batcher: whatever ends the batcher (retirement, failure,
      // shutdown) ends the executor too, so no executor outlives the pair.
      self_->attach_functor(
          [exec = executor_] { caf::anon_send_exit(exec, caf::exit_reason::user_shutdown); });
      auto b = shared_from_this();
      self_->set_down_handler([b](caf::down_msg& dm) {
        if (dm.source == b->executor_.address())
          b->on_executor_failure("executor down: " + b->self_->system().render(dm.reason),
                                 now_us());
      });
    }
    if (router_)
      self_->send(router_, credit_atom::value, caf::actor_cast<caf::actor>(self_),
                  static_cast<uint32_t>(cfg_.max_sequences));
  }

  void on_run(Job& job, const policy::KvPolicy& pol) {
    if (seqs_.count(job.uid)) return;  // a duplicate dispatch: the job is already here
    if (dead_) {
      // Dispatched before the router learnt that this pair failed: straight back, no attempt
      // counted (it never ran here).
      if (router_) self_->send(router_, requeue_atom::value, std::vector<Job>{std::move(job)});
      return;
    }
    idle_since_us_ = 0;
    auto s = std::make_unique<Seq>();
    // A job takes the policy in force when it reaches the batcher; under pressure a `full` one
    // takes the pressure policy (the behavior on top is the pressure one then, so p says so).
    s->policy = pol;
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

  /// Completion tokens generated so far for `uid` (a status request); 0 when it is not here.
  uint32_t generated(uint64_t uid) const {
    auto it = seqs_.find(uid);
    return it == seqs_.end() ? 0 : static_cast<uint32_t>(std::max(0, it->second->n_generated()));
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
    caf::put(s, "blocks_used", static_cast<int64_t>(pool_.n_held()));
    caf::put(s, "blocks_free", static_cast<int64_t>(pool_.n_free()));
    caf::put(s, "blocks_total", static_cast<int64_t>(pool_.n_total()));
    caf::put(s, "blocks_cached", static_cast<int64_t>(pool_.n_cached()));
    caf::put(s, "blocks_used_peak", blocks_peak_);
    caf::put(s, "window_blocks_used", static_cast<int64_t>(split_ ? wpool_.n_held() : 0));
    caf::put(s, "window_blocks_free", static_cast<int64_t>(split_ ? wpool_.n_free() : 0));
    caf::put(s, "window_blocks_total", static_cast<int64_t>(split_ ? wpool_.n_total() : 0));
    caf::put(s, "window_blocks_used_peak", wblocks_peak_);
    caf::put(s, "fed_tokens", fed_);
    caf::put(s, "prefix_hit_blocks", prefix_blocks_);
    caf::put(s, "prefix_hit_tokens", prefix_tokens_);
    caf::put(s, "prefix_evictions", pool_.evictions());
    caf::put(s, "kv_policy", policy::to_string(pressure_ ? *pressure_policy_ : base_));
    caf::put(s, "kv_base_policy", policy::to_string(base_));
    caf::put(s, "policy_swaps", swaps_);
    caf::put(s, "pressure_swaps", pressure_swaps_);
    caf::put(s, "pressure", static_cast<int64_t>(pressure_ ? 1 : 0));
    caf::put(s, "preemptions", preemptions_);
    caf::put(s, "steps", steps_);
    caf::put(s, "tokens", tokens_);
    caf::put(s, "finished", finished_);
    caf::put(s, "ongoing", static_cast<int64_t>(seqs_.size()));
    caf::put(s, "idle_since_us", seqs_.empty() ? idle_since_us_ : int64_t{0});
    caf::put(s, "retiring", static_cast<int64_t>(retiring_ ? 1 : 0));
    caf::put(s, "executor_failures", static_cast<int64_t>(dead_ ? 1 : 0));
    caf::put(s, "requeued", requeued_);
    caf::put(s, "seq_failures", seq_failures_);
    return s;
  }

  /// Retirement (scale down): no more credit; the router is told to stop dispatching here; the
  /// jobs already here finish; then the batcher exits (its supervisor stops the executor).
  void on_retire() {
    if (retiring_ || dead_) return;
    retiring_ = true;
    leave();
  }

  void on_watchdog() {
    watchdog_armed_ = false;
    if (dead_ || !in_flight_) return;
    const int64_t limit_us = cfg_.step_timeout_ms * 1000;
    const int64_t age = now_us() - step_sent_us_;
    if (age >= limit_us) {
      on_executor_failure(
          "no step result within " + std::to_string(cfg_.step_timeout_ms) + " ms (hung executor)",
          step_sent_us_);
      return;
    }
    arm_watchdog(limit_us - age);
  }

  /// The executor crashed or hung: every job here goes back to the router (at the front of its
  /// class) to run elsewhere from scratch, except those past their retry limit (engine_dead) and
  /// those cancelled meanwhile; the supervisor is told; the batcher leaves.
  void on_executor_failure(const std::string& why, int64_t fault_us) {
    if (dead_) return;
    dead_ = true;
    in_flight_ = false;
    planned_.clear();
    const int64_t detected = now_us();
    std::vector<Seq*> all;
    for (auto& [uid, sp] : seqs_) all.push_back(sp.get());
    std::sort(all.begin(), all.end(), before);
    std::vector<Job> back;
    uint32_t failed = 0;
    for (Seq* s : all) {
      s->in_step = false;
      s->step_tokens = 0;
      if (s->cancelled) {
        finish(*s, finish_cancelled);
        continue;
      }
      Job j = s->job;
      // Only a job that reached the failed executor used up an attempt.
      if (s->started) ++j.attempt;
      if (j.stream && j.client.kind == ClientRef::router) {
        j.streamed_ids = std::max(j.streamed_ids, s->sent_ids);
        j.streamed_bytes = std::max<uint64_t>(j.streamed_bytes, s->emitted);
      }
      j.fault_us = fault_us;
      if (j.attempt > cfg_.max_job_retries) {
        fail(*s, ErrorCode::engine_dead,
             "executor failed " + std::to_string(j.attempt) + " times while running the job (" +
                 why + ")");
        ++failed;
        continue;
      }
      back.push_back(std::move(j));
      drop(*s);
    }
    requeued_ += static_cast<int64_t>(back.size());
    log_line("batcher " + std::to_string(extras_.pair) + ": " + why + ": " +
             std::to_string(back.size()) + " jobs re-queued, " + std::to_string(failed) +
             " failed");
    PairFailure f;
    f.pair = extras_.pair;
    f.why = why;
    f.fault_us = fault_us;
    f.detected_us = detected;
    f.requeued = static_cast<uint32_t>(back.size());
    f.failed = failed;
    if (router_ && !back.empty()) self_->send(router_, requeue_atom::value, std::move(back));
    if (extras_.supervisor) self_->send(extras_.supervisor, failed_atom::value, std::move(f));
    // A hung executor still holds its step; stop it (a crashed one is gone already).
    if (executor_) self_->send_exit(executor_, caf::exit_reason::kill);
    released_.clear();  // nothing to release on a dead executor
    credit_ = 0;
    leave();
  }

 private:
  // Why a job can never run here ("" when it can).
  std::string check(const Seq& s) const {
    if (s.tokens.empty()) return "empty prompt";
    if (model_) {
      const int32_t n_vocab = model_->limits().n_vocab;
      for (int32_t id : s.tokens)
        if (id < 0 || id >= n_vocab)
          return "prompt token id " + std::to_string(id) + " outside the vocabulary [0, " +
                 std::to_string(n_vocab) + ")";
    }
    // The last sampled token is never fed back: the cache holds at most prompt + max - 1.
    const int64_t slots = int64_t{s.n_prompt} + std::max<uint32_t>(1, s.job.max_tokens) - 1;
    const int64_t need = policy::max_blocks_held(s.policy, slots, cfg_.prefill_chunk, bs_);
    if (need > pool_.n_total())
      return "prompt (" + std::to_string(s.n_prompt) + " tokens) + max_tokens (" +
             std::to_string(s.job.max_tokens) + ") needs " + std::to_string(need) +
             " KV blocks, the executor has " + std::to_string(pool_.n_total());
    if (split_) {
      const int64_t wneed = policy::max_blocks_held(wpolicy(s), slots, cfg_.prefill_chunk, bs_);
      if (wneed > wpool_.n_total())
        return "prompt (" + std::to_string(s.n_prompt) + " tokens) + max_tokens (" +
               std::to_string(s.job.max_tokens) + ") needs " + std::to_string(wneed) +
               " KV blocks of the window group, the executor has " +
               std::to_string(wpool_.n_total());
    }
    return "";
  }

  static void insert_sorted(std::vector<Seq*>& v, Seq* s) {
    v.insert(std::upper_bound(v.begin(), v.end(), s, before), s);
  }
  static void erase_from(std::vector<Seq*>& v, Seq* s) {
    auto it = std::find(v.begin(), v.end(), s);
    if (it != v.end()) v.erase(it);
  }

  // The policy of the window group's layers for s (split cache only).
  policy::KvPolicy wpolicy(const Seq& s) const { return policy::layer_policy(s.policy, gw_); }

  void free_blocks(Seq& s) {
    for (int32_t b : s.blocks)
      if (b >= 0) pool_.release(b);
    s.blocks.clear();
    for (int32_t b : s.wblocks)
      if (b >= 0) wpool_.release(b);
    s.wblocks.clear();
    s.hashes.clear();
    s.n_past = 0;
  }

  // Gives back the blocks the sequence's policy no longer lets any later token see; in the
  // window group, those behind the windowed layers' window.
  void trim(Seq& s) {
    trim_table(s.blocks, pool_, s.policy, s.n_past);
    if (split_) trim_table(s.wblocks, wpool_, wpolicy(s), s.n_past);
  }
  void trim_table(std::vector<int32_t>& table, PrefixBlockPool& pool, const policy::KvPolicy& p,
                  int32_t n_past) {
    const policy::BlockRange r = policy::released_block_range(p, n_past, bs_);
    const int64_t end = std::min<int64_t>(r.end, static_cast<int64_t>(table.size()));
    for (int64_t b = r.begin; b < end; ++b) {
      int32_t& id = table[static_cast<size_t>(b)];
      if (id >= 0) pool.release(id);
      id = -1;
    }
  }
  // Whether the window group lacks a block its policy needs: after a switch to a pressure policy
  // with sinks narrower than the layers' window, the sink blocks given back under the layers'
  // own window are needed again. The sequence is then recomputed.
  bool window_blocks_lost(const Seq& s) const {
    if (!split_) return false;
    const policy::BlockRange r = policy::released_block_range(wpolicy(s), s.n_past, bs_);
    for (size_t b = 0; b < s.wblocks.size(); ++b) {
      const int64_t i = static_cast<int64_t>(b);
      if (s.wblocks[b] < 0 && (i < r.begin || i >= r.end)) return true;
    }
    return false;
  }

  // Starts a sequence without blocks from the longest cached prefix of its tokens (at least its
  // last token is left to compute, for the logits). Only blocks inside the policy's
  // full-attention horizon are shared: beyond it their content depends on the policy.
  void reuse_prefix(Seq& s) {
    if (!s.blocks.empty()) return;
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const int64_t max_blocks =
        std::min((n - 1) / bs_, policy::full_attention_horizon(s.policy) / bs_);
    int32_t found = 0;
    if (max_blocks > 0)
      found = pool_.acquire_prefix(s.tokens.data(), n, max_blocks, s.blocks, s.hashes);
    s.n_past = found * bs_;
    blocks_peak_ = std::max<int64_t>(blocks_peak_, pool_.n_held());
    trim(s);
  }

  // Publishes the sequence's newly completed blocks to the prefix cache.
  void publish_blocks(Seq& s) {
    const int64_t horizon = policy::full_attention_horizon(s.policy);
    for (;;) {
      const int64_t b = static_cast<int64_t>(s.hashes.size());
      const int64_t end = (b + 1) * bs_;
      if (end > s.n_past || end > horizon || b >= static_cast<int64_t>(s.blocks.size())) return;
      const uint64_t parent = b ? s.hashes.back() : 0;
      const int32_t* toks = s.tokens.data() + b * bs_;
      const uint64_t h = pool_.block_hash(parent, toks);
      const int32_t id = s.blocks[static_cast<size_t>(b)];
      if (id >= 0) pool_.publish(id, h, parent, toks);
      s.hashes.push_back(h);
    }
  }

  // Why policy `p` cannot be used here ("" when it can).
  std::string refuse(const policy::KvPolicy& p) const {
    if (p.kind != policy::KvPolicy::full && p.window < 1) return "the window must be at least 1";
    if (p.kind == policy::KvPolicy::sinks && model_ &&
        int64_t{p.n_sinks} + p.window > model_->limits().ctx_len)
      return "sinks + window (" + std::to_string(int64_t{p.n_sinks} + p.window) +
             ") exceed the model context (" + std::to_string(model_->limits().ctx_len) + ")";
    return "";
  }

  // An operator's swap: the normal policy becomes `np`, for jobs that arrive from now on.
  std::string on_swap(const policy::KvPolicy& np) {
    if (const std::string why = refuse(np); !why.empty()) return why;
    if (pressure_) {
      // Keep the pressure behavior on top of the new normal one.
      self_->unbecome();
      self_->become(mode(np));
      self_->become(caf::keep_behavior, mode(*pressure_policy_));
    } else {
      self_->become(mode(np));
    }
    log_line("batcher: kv policy " + policy::to_string(base_) + " -> " + policy::to_string(np) +
             " (command)");
    base_ = np;
    ++swaps_;
    // Pairs the supervisor starts later take the operator's choice too.
    if (extras_.supervisor) self_->send(extras_.supervisor, kvpolicy_atom::value, np);
    return "";
  }

  // Checks KV usage against the watermarks and swaps to or from the pressure policy.
  void check_pressure() {
    if (!pressure_policy_) return;
    const double usage = static_cast<double>(pool_.n_held()) / pool_.n_total();
    const policy::Watermarks w{cfg_.kv_high_watermark, cfg_.kv_low_watermark};
    const bool next = policy::next_pressure_state(pressure_, usage, w);
    if (next == pressure_) return;
    pressure_ = next;
    ++swaps_;
    ++pressure_swaps_;
    if (pressure_) {
      self_->become(caf::keep_behavior, mode(*pressure_policy_));
      // Running and waiting `full` jobs move onto the pressure policy: dropping what falls
      // outside its window is how the memory comes back. Windowed jobs keep their own window.
      for (auto& [uid, sp] : seqs_) {
        Seq& s = *sp;
        if (s.policy.kind != policy::KvPolicy::full) continue;
        s.policy = *pressure_policy_;
        if (!s.in_step) trim(s);
      }
    } else {
      self_->unbecome();
    }
    log_line("batcher: kv usage " + std::to_string(static_cast<int>(usage * 100)) +
             "%: " + (pressure_ ? "pressure policy " : "back to ") +
             policy::to_string(pressure_ ? *pressure_policy_ : base_));
  }

  // Takes a sequence out of the batch: blocks freed, recomputed from its tokens when resumed.
  void preempt(Seq& s) {
    if (!s.blocks.empty()) ++preemptions_;
    free_blocks(s);
    if (s.in_step) {  // planned in the step being built: take it out again
      erase_from(planned_, &s);
      budget_ += s.step_tokens;
      fed_ -= s.step_tokens;
      s.in_step = false;
      s.step_tokens = 0;
    }
    s.running = false;
    erase_from(running_, &s);
    waiting_.insert(&s);
  }

  // Removes a job that goes elsewhere (re-queued): no outcome, no credit.
  void drop(Seq& s) {
    free_blocks(s);
    erase_from(running_, &s);
    if (!s.running) waiting_.erase(&s);
    erase_from(planned_, &s);
    seqs_.erase(s.job.uid);  // destroys s
  }

  // Tells the router to dispatch nothing more here; exits once it answered and the work is done.
  void leave() {
    if (leaving_) return;
    leaving_ = true;
    if (!router_) {
      router_ack_ = true;
      maybe_quit();
      return;
    }
    self_->request(router_, caf::infinite, retire_atom::value, caf::actor_cast<caf::actor>(self_))
        .then([this](uint32_t) { router_left(); }, [this](caf::error&) { router_left(); });
  }

  void router_left() {
    router_ack_ = true;
    maybe_quit();
  }

  void maybe_quit() {
    if (!router_ack_ || !(dead_ || (retiring_ && seqs_.empty()))) return;
    flush_notices();
    self_->quit();
  }

  // Removes an ended job everywhere and returns its credit.
  void retire(Seq& s) {
    free_blocks(s);
    erase_from(running_, &s);
    if (!s.running) waiting_.erase(&s);
    erase_from(planned_, &s);
    if (s.started) released_.push_back(s.job.uid);
    ended_.push_back(s.job.uid);
    ++credit_;
    ++finished_;
    seqs_.erase(s.job.uid);  // destroys s
    if (seqs_.empty()) {
      idle_since_us_ = now_us();
      if (retiring_) maybe_quit();
    }
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
    d.cached_tokens = static_cast<uint32_t>(std::max(0, s.cached_tokens));
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
    // A job re-run after an executor failure regenerates, identically (greedy or seeded), what its
    // client already got: that part is not sent again.
    const size_t from = std::max<size_t>(s.emitted, std::min<uint64_t>(s.job.streamed_bytes, upto));
    TokensEvent t;
    t.text.assign(s.text, from, upto - from);
    s.emitted = upto;
    if (id >= 0 && s.sent_ids < s.job.streamed_ids) {
      ++s.sent_ids;
      id = -1;
    }
    if (id < 0 && t.text.empty()) return;
    t.to = s.job.client;
    t.uid = s.job.uid;
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
    const bool full = model_ && policy::bounded_by_context(s.policy) &&
                      static_cast<int64_t>(s.tokens.size()) >= model_->limits().ctx_len;
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
    trim(s);
    if (window_blocks_lost(s)) {
      ++preemptions_;
      free_blocks(s);  // recomputed from its tokens, in chunks of n from slot 0
    }
    const size_t need = static_cast<size_t>((s.n_past + n + bs_ - 1) / bs_);
    while (s.blocks.size() < need || (split_ && s.wblocks.size() < need)) {
      const bool full_group = s.blocks.size() < need;
      PrefixBlockPool& pool = full_group ? pool_ : wpool_;
      if (std::optional<int32_t> b = pool.alloc()) {
        (full_group ? s.blocks : s.wblocks).push_back(*b);
        if (full_group) {
          blocks_peak_ = std::max<int64_t>(blocks_peak_, pool_.n_held());
        } else {
          wblocks_peak_ = std::max<int64_t>(wblocks_peak_, wpool_.n_held());
        }
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
    fed_ += n;
    budget_ -= n;
    planned_.push_back(&s);
    return true;
  }

  // Moves waiting jobs into the batch, most important first. A job starts when its whole
  // recomputation fits in the free blocks (one that would have to evict others at once is better
  // left waiting), making room by preempting less important running sequences; an empty batch
  // takes it regardless, since check() guaranteed it fits alone.
  void admit() {
    int64_t promised = 0;   // blocks the jobs admitted in this round will take when planned
    int64_t wpromised = 0;  // the same in the window group
    // A job needs room in both groups.
    int64_t need = 0, wneed = 0;
    auto short_of_room = [&] {
      return need > pool_.n_free() - promised || wneed > wpool_.n_free() - wpromised;
    };
    while (!waiting_.empty()) {
      Seq* s = *waiting_.begin();
      reuse_prefix(*s);
      const int64_t n_tok = static_cast<int64_t>(s->tokens.size());
      need = std::max<int64_t>(
          0, policy::max_blocks_held(s->policy, n_tok, cfg_.prefill_chunk, bs_) - s->held());
      wneed = split_ ? std::max<int64_t>(
                           0, policy::max_blocks_held(wpolicy(*s), n_tok, cfg_.prefill_chunk, bs_) -
                                  s->wheld())
                     : 0;
      while (!running_.empty() && before(s, running_.back()) &&
             (running_.size() >= cfg_.max_sequences || short_of_room()))
        preempt(*running_.back());  // goes to waiting_ behind s
      if (running_.size() >= cfg_.max_sequences || (!running_.empty() && short_of_room())) {
        free_blocks(*s);  // its shared prefix stays cached for when it starts
        break;
      }
      waiting_.erase(waiting_.begin());
      // Counted when the job starts (an attempt that had to wait gave its blocks back).
      if (s->cached_tokens < 0) s->cached_tokens = std::min(s->n_past, s->n_prompt);
      prefix_tokens_ += s->n_past;
      prefix_blocks_ += s->n_past / bs_;
      s->running = true;
      insert_sorted(running_, s);
      promised += need;
      wpromised += wneed;
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
      if (split_) p.window_table = s->wblocks;
      p.sample = s->n_past + s->step_tokens == static_cast<int32_t>(s->tokens.size());
      p.reset = !s->started;
      s->started = true;
      p.temperature = s->job.temperature;
      p.top_k = s->job.top_k;
      p.top_p = s->job.top_p;
      p.seed = s->job.seed;
      p.logprobs = s->job.logprobs;
      p.window = policy::step_window(s->policy);
      p.sinks = policy::step_sinks(s->policy);
      if (!s->first_sched_us) s->first_sched_us = now;
      if (s->job.fault_us > 0 && !s->recovery_reported) {
        s->recovery_reported = true;
        if (extras_.supervisor)
          self_->send(extras_.supervisor, recovered_atom::value, s->job.fault_us, now);
      }
      plan.seqs.push_back(std::move(p));
    }
    in_flight_ = true;
    step_sent_us_ = now;
    if (cfg_.step_timeout_ms > 0) arm_watchdog(cfg_.step_timeout_ms * 1000);
    self_->request(executor_, caf::infinite, step_atom::value, std::move(plan))
        .then([this](StepResult& r) { on_result(r); },
              [this](caf::error& err) {
                on_executor_failure("executor unreachable: " + self_->system().render(err),
                                    now_us());
              });
  }

  // One pending watchdog timer at most (not one per step): it re-arms itself for the step in
  // flight when it fires early.
  void arm_watchdog(int64_t after_us) {
    if (watchdog_armed_) return;
    watchdog_armed_ = true;
    self_->delayed_send(self_, std::chrono::microseconds(std::max<int64_t>(1, after_us)),
                        watchdog_atom::value);
  }

  void on_result(StepResult& r) {
    // TEST ONLY (--test-fault-batcher-throw-after): the batcher itself crashes, so its jobs can
    // only be recovered by the router's records of what it dispatched here.
    if (extras_.test_fault_throw_after > 0 && ++fault_steps_ >= extras_.test_fault_throw_after)
      throw std::runtime_error("TEST ONLY fault: batcher throws after " +
                               std::to_string(extras_.test_fault_throw_after) + " steps");
    if (dead_) return;  // a late answer of an executor already given up on
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
        auto it = sampled.find(s->job.uid);
        if (it != sampled.end() && !it->second->error.empty()) {
          // This sequence failed alone (its sampling state, its logits): it ends here and the
          // others go on. Its blocks of this step are not published: what they hold is suspect.
          s->step_tokens = 0;
          if (s->cancelled) {
            finish(*s, finish_cancelled);
            continue;
          }
          ++seq_failures_;
          const uint8_t c = it->second->code;
          const ErrorCode code = c <= static_cast<uint8_t>(ErrorCode::internal)
                                     ? static_cast<ErrorCode>(c)
                                     : ErrorCode::internal;
          log_line("batcher " + std::to_string(extras_.pair) + ": job uid " +
                   std::to_string(s->job.uid) + " failed alone (" + std::string(to_string(code)) +
                   "): " + it->second->error);
          fail(*s, code, it->second->error);
          continue;
        }
        s->n_past += s->step_tokens;
        s->step_tokens = 0;
        publish_blocks(*s);
        trim(*s);
        if (s->cancelled) {
          finish(*s, finish_cancelled);
          continue;
        }
        if (it != sampled.end()) accept(*s, *it->second);
      }
    }
    check_pressure();
    schedule();
  }

  // Sends the batched sampler releases and credit grants.
  void flush_notices() {
    if (dead_ || retiring_) credit_ = 0;  // a leaving batcher takes no new work
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
      self_->send(router_, credit_atom::value, caf::actor_cast<caf::actor>(self_), credit_);
    }
    credit_ = 0;
  }

  caf::event_based_actor* self_;
  BatchingConfig cfg_;
  std::shared_ptr<const LlamaModel> model_;
  const Tokenizer* tok_;
  caf::actor executor_, router_, egress_, admission_;
  bool split_;             // the executor keeps the windowed layers' K/V in a pool of their own
  int32_t gw_ = 0;         // ... with this window (ModelLimits::split_window)
  PrefixBlockPool pool_;   // the full-attention group's blocks (every layer's with one group)
  PrefixBlockPool wpool_;  // the window group's (split_ only; one unused block otherwise)
  int32_t bs_;
  policy::KvPolicy base_;                            // the normal policy (operator's choice)
  std::optional<policy::KvPolicy> pressure_policy_;  // swapped in above the high watermark
  bool pressure_ = false;                            // the pressure behavior is on top
  int64_t swaps_ = 0, pressure_swaps_ = 0, blocks_peak_ = 0, prefix_tokens_ = 0, prefix_blocks_ = 0;
  int64_t wblocks_peak_ = 0;
  int64_t fed_ = 0;  // tokens sent to the engine (prefill and decode), recomputation included
  std::unordered_map<uint64_t, std::unique_ptr<Seq>> seqs_;
  // Jobs ended since the last flush: the router forgets them (it keeps every dispatched job
  // until then, to run again should this batcher go down).
  std::vector<uint64_t> ended_;
  int32_t fault_steps_ = 0;         // steps seen, for the test-only fault
  std::vector<Seq*> running_;       // sorted by Seq::key
  std::set<Seq*, Before> waiting_;  // preempted jobs resume before later arrivals
  std::vector<Seq*> planned_;       // the step being built, then the step in flight
  int64_t budget_ = 0;              // tokens left in the step being built
  bool in_flight_ = false;
  std::vector<uint64_t> released_;
  uint32_t credit_ = 0;
  int64_t preemptions_ = 0, steps_ = 0, tokens_ = 0, finished_ = 0;
  BatcherExtras extras_;
  int64_t idle_since_us_ = 0;  // when the last job ended (0 while jobs are here)
  int64_t step_sent_us_ = 0;   // when the step in flight was sent (watchdog)
  bool watchdog_armed_ = false;
  bool dead_ = false;        // the executor failed; everything went back to the router
  bool retiring_ = false;    // scale down: finish, take nothing new, exit
  bool leaving_ = false;     // asked the router to stop dispatching here
  bool router_ack_ = false;  // ... and it answered
  int64_t requeued_ = 0;
  int64_t seq_failures_ = 0;  // jobs the executor failed alone (the rest of their step went on)
};

caf::behavior batcher_actor(caf::event_based_actor* self, std::shared_ptr<Batcher> b) {
  (void)self;
  b->start();
  return b->mode(b->base_policy());
}

}  // namespace

caf::actor spawn_batcher(caf::actor_system& sys, BatchingConfig cfg,
                         std::shared_ptr<const LlamaModel> model, caf::actor executor,
                         caf::actor router, caf::actor egress, caf::actor admission,
                         int32_t n_blocks) {
  return spawn_batcher(sys, std::move(cfg), std::move(model), std::move(executor),
                       std::move(router), std::move(egress), std::move(admission), n_blocks,
                       BatcherExtras{});
}

caf::actor spawn_batcher(caf::actor_system& sys, BatchingConfig cfg,
                         std::shared_ptr<const LlamaModel> model, caf::actor executor,
                         caf::actor router, caf::actor egress, caf::actor admission,
                         int32_t n_blocks, BatcherExtras extras) {
  return sys.spawn([=](caf::event_based_actor* self) {
    auto b = std::make_shared<Batcher>(self, cfg, model, executor, router, egress, admission,
                                       n_blocks, extras);
    return batcher_actor(self, std::move(b));
  });
}

}  // namespace sy
