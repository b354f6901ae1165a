// The batcher actor's state and handlers, shared by its pieces: batcher.cpp (messages, the
// scheduling round through policy::plan_step, step results), batcher_jobs.cpp (detokenizing,
// stop rules, streaming, a job's end) and batcher_lifecycle.cpp (KV policy swaps, scale down,
// executor failure and the watchdog). Internal to actors/.
#pragma once

#include <caf/all.hpp>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "actors/batcher.hpp"
#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "core/error_code.hpp"
#include "gpu/kv_manager.hpp"
#include "model/stop_matcher.hpp"
#include "policies/kv_policy.hpp"
#include "policies/speculation.hpp"
#include "policies/step_planner.hpp"

namespace sy {

class Tokenizer;

namespace batcher_detail {

/// Where the batcher is in its life. It only moves forward: serving -> scaling_down (finish the
/// jobs here, take no new ones) or -> failed (the executor is gone, the jobs went back to the
/// router); from either it exits once the router acknowledged that it dispatches nothing more.
enum class Lifecycle : uint8_t { serving, scaling_down, failed };

/// One job inside the batcher.
struct Seq {
  Job job;
  std::vector<int32_t> tokens;  // prompt + generated: what the KV cache must hold to go on
  int32_t n_prompt = 0;
  KvTables kv;                 // block tables, tokens cached, KV policy
  int32_t cached_tokens = -1;  // prompt tokens reused from the prefix cache at first start
  bool running = false;
  bool in_step = false;        // part of the step in flight
  int32_t step_tokens = 0;     // tokens it feeds in the step in flight
  bool cancelled = false;      // cancel arrived while in the step in flight
  bool started = false;        // the executor has made its sampler
  StopMatcher text;            // complete characters, cut at a stop string when one matched
  size_t emitted = 0;          // bytes of the text already final (streamed)
  uint32_t sent_ids = 0;       // completion ids already streamed
  std::vector<float> logprob;  // per completion id (when job.logprobs > 0)
  std::vector<int32_t> top_ids;
  std::vector<float> top_lps;
  int64_t first_sched_us = 0, first_token_us = 0;
  bool recovery_reported = false;  // a re-queued job told the supervisor it runs again
  // Samples of one prompt (Job::n > 1) and score requests: the job's own Seq leads the group.
  // It prefills the prompt but its last token, then forks one member per sample (continuation)
  // whose tables share its blocks; each member feeds the last prompt token itself (its first
  // token is its own sampler's) and ends into the leader, which ends the job with them all.
  Seq* leader = nullptr;              // a member: its group's leader
  uint32_t choice = 0;                // a member: its sample (continuation) index
  bool grouped = false;               // the leader of a group
  bool forked = false;                // a leader whose members run
  bool group_cancelled = false;       // a leader: the job was cancelled
  std::vector<Seq*> members;          // a forked leader: members not ended yet
  std::vector<ChoiceResult> choices;  // a leader: its samples, as they end
  std::vector<ScoreResult> scores;    // a leader of a score request
  int64_t member_tokens = 0;          // a leader: tokens its members generated (scored)
  bool samples = true;     // samples a token after its last fed token (not a leader or scorer)
  bool hold_last = false;  // its last token is not fed (a leader; a score member)
  // Teacher-forced log-probabilities of positions [lp_from, lp_to) of `tokens` (prompt_logprobs;
  // a score member's continuation); lp* hold those computed so far, from lp_from on.
  int32_t lp_from = 0, lp_to = 0;
  uint32_t lp_n_top = 0;
  std::vector<float> lp;
  std::vector<int32_t> lp_top_ids;
  std::vector<float> lp_top;
  // Speculation (batcher_spec.cpp): the drafts of the step in flight, appended to `tokens` and
  // fed after its last token; taken off again when the step returns. Its verified draft
  // positions so far, and how many of those were accepted.
  int32_t n_draft = 0;
  std::vector<int32_t> drafts;
  int64_t spec_tried = 0, spec_accepted = 0;
  // With a draft model: how many of `tokens` its cache holds, as far as the batcher can tell
  // (the executor's own view decides; this prices the catch-up of the sequence's next draft).
  int64_t draft_seen = 0;

  int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  /// Tokens the KV cache must hold to go on: every token, but the last where it is held back.
  int32_t feed_end() const { return static_cast<int32_t>(tokens.size()) - (hold_last ? 1 : 0); }
  int32_t remaining() const { return feed_end() - kv.n_past; }
  /// Whether the step being built (step_tokens from kv.n_past) ends with a token sampled for it.
  bool samples_in_step() const { return samples && kv.n_past + step_tokens == feed_end(); }
  /// Positions whose log-probability is still to come.
  bool wants_lp() const { return lp_from + static_cast<int32_t>(lp.size()) < lp_to; }
  /// The job this sequence serves (a member's is its leader's).
  const Job& owner() const { return leader ? leader->job : job; }
  // Scheduling priority: lower is more important (class first, then earlier arrival).
  std::tuple<uint32_t, int64_t, uint64_t> key() const {
    return {job.class_index, job.arrival_us, job.uid};
  }
};

inline bool before(const Seq* a, const Seq* b) {
  return a->key() < b->key();
}
struct Before {
  bool operator()(const Seq* a, const Seq* b) const { return before(a, b); }
};

class Batcher : public std::enable_shared_from_this<Batcher> {
 public:
  Batcher(BatcherActor::pointer self, BatchingConfig cfg, std::shared_ptr<const LlamaModel> model,
          ExecutorActor executor, RouterActor router, EgressActor egress, AdmissionActor admission,
          int32_t n_blocks, BatcherExtras extras);

  /// The behavior of the batcher under KV policy `p`: new jobs take `p`. Swapped with
  /// become/unbecome by an operator command and by the pressure watermarks.
  BatcherActor::behavior_type mode(policy::KvPolicy p);
  policy::KvPolicy base_policy() const { return base_; }
  void start();

 private:
  // batcher.cpp: messages, scheduling, results.
  void on_run(Job& job, const policy::KvPolicy& pol);
  uint32_t generated(uint64_t uid) const;
  void on_cancel(uint64_t uid);
  BatcherStats stats() const;
  std::string check(const Seq& s) const;
  void schedule();
  policy::PlanOutput plan_round();
  // Sets the round's pacing (plan_step 4.) from the classes' last arrivals and the step cost.
  void pace(policy::PlanInput& in) const;
  // Asks the executor to stop the step in flight when waiting job s would otherwise wait for it
  // and then run in a short urgent step (BatchingConfig::urgent_interrupt).
  void maybe_interrupt(const Seq& s);
  // The answer to a stopped step: its sequences feed the same tokens again.
  void on_interrupted();
  // The uids of the step in flight's sequences, which it forgets (planned_ cleared).
  std::vector<uint64_t> take_step_members();
  // Paced classes feed at least this many prompt tokens a step: progress while the step cost is
  // not yet measured (or a fit says a token costs nothing), one KV block of the default size.
  static constexpr int64_t kPaceMinTokens = 16;
  policy::PlanSeq plan_seq_of(const Seq& s) const;
  bool apply(const policy::PlanAction& a);  // false: the round must be planned again
  void admit(Seq& s);
  void reuse(Seq& s);
  std::vector<int32_t> peek(const Seq& s) const;
  void fill_targets(const Seq& s, SeqPlan& p) const;
  void take_targets(Seq& s, const SeqResult& r, int32_t from_slot, int32_t n_fed);
  void preempt(Seq& s);
  void send_step();
  void on_result(StepResult& r);
  void flush_notices();
  Seq* find(uint64_t uid);

  // batcher_spec.cpp: speculative decoding.
  SpecMode spec_mode(const Seq& s) const;
  bool may_speculate(const Seq& s) const;
  void speculate(int64_t budget_left);
  void drop_drafts(Seq& s);
  int64_t logit_rows(const Seq& s) const;
  void accept_spec(Seq& s, const SeqResult& r, const std::vector<int32_t>& drafts);
  int64_t now() const;

  // batcher_jobs.cpp: a job's text and its end.
  void accept(Seq& s, const SeqResult& r);
  void emit(Seq& s, int32_t id, size_t upto);
  // Where a job's done or error goes: through egress_ (the journal, where there is one, holds it
  // until the job's result is durable) for a journaled job, straight to egress for one that is
  // not.
  const EgressActor& end_to(const Job& job) const { return job.journaled ? egress_ : direct_; }
  DoneEvent done_event(Seq& s, FinishReason finish);
  void finish(Seq& s, FinishReason finish);
  void fail(Seq& s, ErrorCode code, const std::string& message);
  void end_job(Seq& s);
  void drop(Seq& s);
  void trace_prefills(int64_t sent_us);  // docs/tracing.md
  // batcher_samples.cpp: groups of samples and score requests.
  void start_group(Seq& s);
  void fork_group(Seq& g);
  void end_member(Seq& m, FinishReason finish);
  void remove_member(Seq& m);
  void drop_members(Seq& g);
  void cancel_group(Seq& g);
  void group_done(Seq& g, DoneEvent& d) const;

  // batcher_jobs.cpp: programs' contexts kept between their steps (docs/programs.md).
  void pin(Seq& s);
  void unpin(uint64_t program);
  void trim_pins(int64_t max_blocks);

  // batcher_lifecycle.cpp: policies, scale down, failure.
  std::string refuse(const policy::KvPolicy& p) const;
  std::string on_swap(const policy::KvPolicy& np);
  void check_pressure();
  void on_scale_down();
  void on_watchdog();
  void arm_watchdog(int64_t after_us);
  void on_executor_failure(const std::string& why, int64_t fault_us);
  void leave();
  void router_left();
  void maybe_quit();

  static void insert_sorted(std::vector<Seq*>& v, Seq* s) {
    v.insert(std::upper_bound(v.begin(), v.end(), s, before), s);
  }
  static void erase_from(std::vector<Seq*>& v, Seq* s) {
    auto it = std::find(v.begin(), v.end(), s);
    if (it != v.end()) v.erase(it);
  }

  BatcherActor::pointer self_;
  BatchingConfig cfg_;
  std::shared_ptr<const LlamaModel> model_;
  const Tokenizer* tok_;
  ExecutorActor executor_;
  RouterActor router_;
  EgressActor egress_;
  // The egress actor itself (BatcherExtras::direct_egress), else egress_: a streamed chunk or a
  // job that is not journaled never waits behind the journal's fsync.
  EgressActor direct_;
  AdmissionActor admission_;
  KvManager kv_;  // block tables over the executor's pools, prefix cache
  int32_t bs_;
  policy::KvPolicy base_;                            // the normal policy (operator's choice)
  std::optional<policy::KvPolicy> pressure_policy_;  // swapped in above the high watermark
  bool pressure_ = false;                            // the pressure behavior is on top
  int64_t swaps_ = 0, pressure_swaps_ = 0, prefix_tokens_ = 0, prefix_blocks_ = 0;
  int64_t fed_ = 0;  // tokens sent to the engine (prefill and decode), recomputation included
  std::unordered_map<uint64_t, std::unique_ptr<Seq>> seqs_;
  // Jobs ended since the last flush: the router forgets them (it keeps every dispatched job
  // until then, to run again should this batcher go down).
  std::vector<uint64_t> ended_;
  int32_t fault_steps_ = 0;         // steps seen, for the test-only fault
  std::vector<Seq*> running_;       // sorted by Seq::key
  std::set<Seq*, Before> waiting_;  // preempted jobs resume before later arrivals
  std::vector<Seq*> planned_;       // the step being built, then the step in flight
  std::vector<uint64_t> released_;
  uint32_t credit_ = 0;
  int64_t preemptions_ = 0, steps_ = 0, tokens_ = 0, finished_ = 0;
  BatcherExtras extras_;
  int64_t idle_since_us_ = 0;            // when the last job ended (0 while jobs are here)
  std::optional<int64_t> step_sent_us_;  // the step in flight: when it was sent (watchdog)
  bool last_step_urgent_ = false;        // it left less important classes out (plan_step 3.)
  std::vector<int64_t> class_seen_us_;   // by class index: when a job of it last arrived (pace)
  bool watchdog_armed_ = false;          // one pending watchdog timer at most
  Lifecycle life_ = Lifecycle::serving;
  bool router_released_ = false;  // the router acknowledged that it dispatches nothing more here
  int64_t requeued_ = 0;
  int64_t seq_failures_ = 0;  // jobs the executor failed alone (the rest of their step went on)
  // Forked members get uids of their own (the executor's samplers and the planner key by uid),
  // far above admission's job uids so that the two never meet.
  uint64_t next_member_uid_ = uint64_t{1} << 62;
  std::vector<KvBlockCopyPlan> pending_copies_;  // copy-on-write for the next step
  // A program's context stays referenced between its steps: the tables of its latest step jobs
  // (one per branch it runs), oldest first, until the program ends (release_atom) or the pool
  // needs the blocks. `blocks` counts each table's blocks (shared ones more than once).
  struct Pin {
    uint64_t program = 0;
    KvTables kv;
    int64_t blocks = 0;
  };
  std::deque<Pin> pins_;
  int64_t pinned_blocks_ = 0;
  int64_t prompt_fed_ = 0, forked_ = 0, block_copies_ = 0;
  // Speculation: the measured cost of a step by its tokens, the running acceptance estimate of a
  // draft token, the counters, and the tokens of the step in flight.
  policy::StepCostModel step_cost_;
  policy::DraftCostModel draft_cost_;  // the draft model's passes (extras_.draft_model)
  double spec_prior_ = 0.5;
  double spec_acc_w_ = 1.0, spec_try_w_ = 2.0;  // its decayed sums (a start of 1 in 2)
  int64_t spec_drafted_ = 0, spec_accepted_ = 0, spec_seq_steps_ = 0, spec_steps_ = 0;
  int64_t steps_done_ = 0, step_us_ = 0;  // engine steps that came back, and their time
  // Interrupting the step in flight for a more important job (maybe_interrupt): the most
  // important class in it, last_step_urgent_ before it was planned, and the steps the engine
  // stopped. Whether the flag is up is the flag itself (extras_.interrupt).
  uint32_t step_top_class_ = UINT32_MAX;
  bool urgent_before_ = false;
  int64_t interrupts_ = 0;
  int64_t step_fed_ = 0, step_rows_ = 0;
  // The step in flight for the guard: its sampling sequences, whether any fed drafts, whether it
  // was a pure decode step (no prompt chunk), and the drafts accepted when it returned.
  policy::SpecGuard spec_guard_;
  int64_t step_outputs_ = 0, step_accepted_ = 0, guard_steps_ = 0;
  bool step_drafted_ = false, step_pure_ = false;
  std::vector<int32_t> scratch_draft_;
};

}  // namespace batcher_detail
}  // namespace sy
