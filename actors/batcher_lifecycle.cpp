// The batcher's life beyond single steps: KV policy swaps (operator commands and pressure
// watermarks), scale down, executor failure (crash, failed request, hung step via the watchdog)
// with its jobs handed back to the router, and leaving once the router let go.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "actors/batcher_core.hpp"
#include "model/llama.hpp"

namespace sy::batcher_detail {

// Why policy `p` cannot be used here ("" when it can).
std::string Batcher::refuse(const policy::KvPolicy& p) const {
  if (p.kind != policy::KvPolicy::full && p.window < 1) return "the window must be at least 1";
  if (p.kind == policy::KvPolicy::sinks && model_ &&
      int64_t{p.n_sinks} + p.window > model_->limits().ctx_len)
    return "sinks + window (" + std::to_string(int64_t{p.n_sinks} + p.window) +
           ") exceed the model context (" + std::to_string(model_->limits().ctx_len) + ")";
  return "";
}

// An operator's swap: the normal policy becomes `np`, for jobs that arrive from now on.
std::string Batcher::on_swap(const policy::KvPolicy& np) {
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
void Batcher::check_pressure() {
  if (!pressure_policy_) return;
  const PrefixBlockPool& pool = kv_.pool();
  const double usage = static_cast<double>(pool.n_held()) / pool.n_total();
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
      if (s.kv.policy.kind != policy::KvPolicy::full) continue;
      s.kv.policy = *pressure_policy_;
      if (!s.in_step) kv_.trim(s.kv);
    }
  } else {
    self_->unbecome();
  }
  log_line("batcher: kv usage " + std::to_string(static_cast<int>(usage * 100)) +
           "%: " + (pressure_ ? "pressure policy " : "back to ") +
           policy::to_string(pressure_ ? *pressure_policy_ : base_));
}

// Scale down (retire_atom): no more credit; the router is told to stop dispatching here; the
// jobs already here finish; then the batcher exits (its executor with it).
void Batcher::on_scale_down() {
  if (life_ != Lifecycle::serving) return;
  life_ = Lifecycle::scaling_down;
  leave();
}

void Batcher::on_watchdog() {
  watchdog_armed_ = false;
  if (life_ == Lifecycle::failed || !step_sent_us_) return;
  const int64_t limit_us = cfg_.step_timeout_ms * 1000;
  const int64_t age = now() - *step_sent_us_;
  if (age >= limit_us) {
    on_executor_failure(
        "no step result within " + std::to_string(cfg_.step_timeout_ms) + " ms (hung executor)",
        *step_sent_us_);
    return;
  }
  arm_watchdog(limit_us - age);
}

// One pending watchdog timer at most (not one per step): it re-arms itself for the step in
// flight when it fires early.
void Batcher::arm_watchdog(int64_t after_us) {
  if (watchdog_armed_) return;
  watchdog_armed_ = true;
  self_->delayed_send(self_, std::chrono::microseconds(std::max<int64_t>(1, after_us)),
                      watchdog_atom::value);
}

// The executor crashed or hung: every job here goes back to the router (at the front of its
// class) to run elsewhere from scratch, except those past their retry limit (engine_dead) and
// those cancelled meanwhile; the supervisor is told; the batcher leaves.
void Batcher::on_executor_failure(const std::string& why, int64_t fault_us) {
  if (life_ == Lifecycle::failed) return;
  const bool was_serving = life_ == Lifecycle::serving;  // else the router was told already
  life_ = Lifecycle::failed;
  step_sent_us_.reset();
  planned_.clear();
  const int64_t detected = now();
  for (auto& [uid, sp] : seqs_) drop_drafts(*sp);  // the step in flight is lost with its drafts
  std::vector<Seq*> all;
  // Jobs only: a group's members go with their leader (which runs the group again from its
  // prompt; their chunks are not tracked apart, so a streamed group starts its chunks again).
  for (auto& [uid, sp] : seqs_)
    if (!sp->leader) all.push_back(sp.get());
  std::sort(all.begin(), all.end(), before);
  std::vector<Job> back;
  uint32_t failed = 0;
  for (Seq* s : all) {
    s->in_step = false;
    s->step_tokens = 0;
    if (s->cancelled) {
      finish(*s, FinishReason::cancelled);
      continue;
    }
    Job j = s->job;
    // Only a job that reached the failed executor used up an attempt.
    if (s->started || s->forked) ++j.attempt;
    if (j.stream && j.client.kind != ClientRef::pipeline) {
      j.streamed_ids = std::max(j.streamed_ids, s->sent_ids);
      j.streamed_bytes = std::max<uint64_t>(j.streamed_bytes, s->emitted);
    }
    j.fault_us = fault_us;
    if (j.attempt > cfg_.max_job_retries) {
      fail(*s, ErrorCode::engine_dead,
           "executor failed " + std::to_string(j.attempt) + " times while running the job (" + why +
               ")");
      ++failed;
      continue;
    }
    back.push_back(std::move(j));
    drop(*s);
  }
  requeued_ += static_cast<int64_t>(back.size());
  log_line("batcher " + std::to_string(extras_.pair) + ": " + why + ": " +
           std::to_string(back.size()) + " jobs re-queued, " + std::to_string(failed) + " failed");
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
  if (was_serving) leave();
}

// Tells the router to dispatch nothing more here; exits once it answered and the work is done.
// Called once, on the move out of `serving`.
void Batcher::leave() {
  if (!router_) {
    router_released_ = true;
    maybe_quit();
    return;
  }
  self_->request(router_, caf::infinite, retire_atom::value, BatcherActor(self_))
      .then([this](uint32_t) { router_left(); }, [this](caf::error&) { router_left(); });
}

void Batcher::router_left() {
  router_released_ = true;
  maybe_quit();
}

void Batcher::maybe_quit() {
  if (!router_released_) return;
  if (!(life_ == Lifecycle::failed || (life_ == Lifecycle::scaling_down && seqs_.empty()))) return;
  flush_notices();
  self_->quit();
}

}  // namespace sy::batcher_detail
