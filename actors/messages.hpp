// The typed message protocol between Switchyard's actors (admission, router, batcher, executor,
// egress) and the doors. The job's own types live on the floor below (core/job.hpp); here they
// become inspectable for CAF, beside the actors' own messages. Every type is a plain value (no
// pointers, no handles) so that it can cross CAF's network layer as well;
// register_message_types() adds them all to an actor_system_config. Nothing here sees msgpack or
// ZeroMQ.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/stats.hpp"
#include "core/error_code.hpp"
#include "core/job.hpp"
#include "core/wire.hpp"
#include "policies/kv_policy.hpp"

namespace sy {

// ---- result enums (each travels as its uint8_t value: CAF 0.17 serializes an enum through its
// underlying type; Outcome, FinishReason and JobState are in core/job.hpp) ----

/// The router's verdict on an enqueued job (EnqueueReply::result).
enum class EnqueueResult : uint8_t {
  accepted = 0,       ///< queued (or already queued under this uid)
  full = 1,           ///< the class queue is full: retry after EnqueueReply::retry_after_ms
  unknown_class = 2,  ///< the job's class_index names no configured class
};

// ---- the error enum across actors (core/error_code.hpp) as a CAF error category ----

/// The category atom of a caf::error that carries a sy::ErrorCode.
inline constexpr caf::atom_value kErrorCategory = caf::atom("switchyard");

/// A caf::error carrying `code` (and `context` as its message, when not empty). CAF 0.17 treats
/// error code 0 as "no error", so the category stores the enum's value + 1; error_code_of() undoes
/// that. Found by ADL, so `caf::error e = ErrorCode::unavailable;` and `err == ErrorCode::x` work.
caf::error make_error(ErrorCode code);
caf::error make_error(ErrorCode code, std::string context);

/// The sy::ErrorCode a caf::error carries; nullopt for none or for another category (CAF's own
/// sec codes, exit reasons).
std::optional<ErrorCode> error_code_of(const caf::error& err);

/// Renders an error of kErrorCategory: its wire name, then the context text in parentheses
/// ("unavailable (No space left on device)"). Registered by register_message_types(), so that
/// actor_system::render() gives the same text.
std::string render_error_code(uint8_t code, caf::atom_value category, const caf::message& context);

namespace policy {
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvPolicy& x) {
  return f(caf::meta::type_name("KvPolicy"), x.kind, x.window, x.n_sinks);
}
}  // namespace policy

// ---- atoms (CAF 0.17: at most 10 characters), every one of the protocol. Who sends which to
// whom, with what: actors/protocol.hpp. ----
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using enqueue_atom = caf::atom_constant<caf::atom("enqueue")>;
using credit_atom = caf::atom_constant<caf::atom("credit")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using finished_atom = caf::atom_constant<caf::atom("finished")>;
using out_atom = caf::atom_constant<caf::atom("out")>;
using pull_atom = caf::atom_constant<caf::atom("pull")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using kvpolicy_atom = caf::atom_constant<caf::atom("kvpolicy")>;
using control_atom = caf::atom_constant<caf::atom("control")>;
using connect_atom = caf::atom_constant<caf::atom("connect")>;
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using observe_atom = caf::atom_constant<caf::atom("observe")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using requeue_atom = caf::atom_constant<caf::atom("requeue")>;
using retire_atom = caf::atom_constant<caf::atom("retire")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using recovered_atom = caf::atom_constant<caf::atom("recovered")>;
using watchdog_atom = caf::atom_constant<caf::atom("watchdog")>;
using scale_atom = caf::atom_constant<caf::atom("scale")>;
using journal_atom = caf::atom_constant<caf::atom("journal")>;
using tool_atom = caf::atom_constant<caf::atom("tool")>;

// ---- the job and the requests of core/job.hpp, inspectable ----

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ClientRef& x) {
  return f(caf::meta::type_name("ClientRef"), x.kind, x.identity);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingControls& x) {
  return f(caf::meta::type_name("SamplingControls"), x.min_p, x.presence_penalty,
           x.frequency_penalty, x.repetition_penalty, x.repeat_last_n, x.logit_bias);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Constraint& x) {
  return f(caf::meta::type_name("Constraint"), x.kind, x.source, x.options);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Job& x) {
  return f(caf::meta::type_name("Job"), x.uid, x.id, x.tenant, x.client, x.class_index, x.prompt,
           x.max_tokens, x.temperature, x.top_k, x.top_p, x.seed, x.stop, x.ignore_eos, x.stream,
           x.logprobs, x.arrival_us, x.deadline_us, x.attempt, x.streamed_ids, x.streamed_bytes,
           x.fault_us, x.controls, x.constraint, x.n, x.prompt_logprobs, x.continuations, x.program,
           x.inputs, x.program_done, x.program_uid, x.step, x.speculative, x.journaled);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SubmitRequest& x) {
  return f(caf::meta::type_name("SubmitRequest"), x.client, x.id, x.tenant, x.token, x.prompt_text,
           x.prompt_ids, x.prompt_is_ids, x.max_tokens, x.temperature, x.top_k, x.top_p, x.has_seed,
           x.seed, x.stop, x.ignore_eos, x.priority, x.deadline_ms, x.stream, x.logprobs,
           x.arrival_us, x.message_roles, x.message_contents, x.parse_special, x.metered_bytes,
           x.controls, x.constraint, x.n, x.prompt_logprobs, x.score, x.cont_text, x.cont_ids,
           x.program, x.inputs, x.outlive_shutdown, x.speculative);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ProgramStep& x) {
  return f(caf::meta::type_name("ProgramStep"), x.uid, x.path, x.output);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ToolResultRequest& x) {
  return f(caf::meta::type_name("ToolResultRequest"), x.client, x.id, x.tenant, x.token, x.call,
           x.content, x.metered_bytes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KeyRequest& x) {
  return f(caf::meta::type_name("KeyRequest"), x.kind, x.client, x.id, x.tenant, x.token,
           x.internal, x.metered_bytes);
}

// ---- executor protocol: one model step ----

/// One sequence's part of a step, as the batcher plans it. The batcher owns the block table.
struct SeqPlan {
  uint64_t uid = 0;
  std::vector<int32_t> tokens;       // new tokens (prefill chunk or the last sampled token)
  int32_t n_past = 0;                // tokens already cached for this sequence
  std::vector<int32_t> block_table;  // covers n_past + tokens.size() slots
  bool sample = false;               // sample a token after this chunk (last prefill chunk/decode)
  bool reset = false;                // (re)start the sequence's sampler state (new or recomputed)
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint32_t logprobs = 0;
  int32_t window = 0;  // SeqStep::window: 0 full attention, > 0 the last `window` slots
  int32_t sinks = 0;   // SeqStep::sinks: leading slots that stay visible (StreamingLLM)
  // SeqStep::window_table: the window group's block table where the executor's engine splits
  // its KV cache into two layer groups; empty otherwise.
  std::vector<int32_t> window_table;
  // With reset, for a job with penalties or a constraint: how many of its tokens are prompt
  // (the rest were generated), and its tokens before n_past, which this plan does not feed (a
  // prefix-cache hit, or a recomputed sequence's cached part), so that the executor rebuilds the
  // penalty history and the constraint's state from every token of the sequence.
  int32_t n_prompt = 0;
  std::vector<int32_t> prior;
  SamplingControls controls;  // with reset
  Constraint constraint;      // with reset
  // Teacher-forced log-probabilities (prompt_logprobs, scoring): targets[i] >= 0 asks for the
  // log-probability of that token at the row of tokens[i] (the token that follows it in the
  // sequence), with the top `target_top` tokens there; -1 asks nothing. Needs every row's logits.
  std::vector<int32_t> targets;
  uint32_t target_top = 0;
  // Speculation (docs/speculation.md): the last n_draft of `tokens` are drafts, not yet part of
  // the sequence. The executor samples the row of tokens[0] and, while the token it samples is
  // the next draft, the row of that draft too; the drafts it so confirms come back in
  // SeqResult::spec_ids, the first token it sampled that is not a draft (or the one after the
  // last draft) in SeqResult::token. Needs every row's logits; sample is true.
  int32_t n_draft = 0;
  // With n_draft > 0: the executor's draft model writes the drafts (the last n_draft of
  // `tokens` only hold their KV slots), or feeds fewer where it cannot draft for this sequence
  // (SeqResult::drafts says what it fed).
  bool draft_model = false;
  // With reset, on an executor with a draft model: the sequence's tokens before n_past, so that
  // the draft model's own cache can be rebuilt from every token of the sequence.
  std::vector<int32_t> draft_prior;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SeqPlan& x) {
  return f(caf::meta::type_name("SeqPlan"), x.uid, x.tokens, x.n_past, x.block_table, x.sample,
           x.reset, x.temperature, x.top_k, x.top_p, x.seed, x.logprobs, x.window, x.sinks,
           x.window_table, x.n_prompt, x.prior, x.controls, x.constraint, x.targets, x.target_top,
           x.n_draft, x.draft_model, x.draft_prior);
}

struct StepPlan {
  uint64_t step = 0;
  std::vector<SeqPlan> seqs;
  // KV blocks to copy before the step (copy-on-write of a shared, partly filled block when
  // samples of one prompt fork): block copy_from[i] into copy_to[i], of the window group's pool
  // where copy_window[i] is 1.
  std::vector<int32_t> copy_from, copy_to;
  std::vector<uint8_t> copy_window;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepPlan& x) {
  return f(caf::meta::type_name("StepPlan"), x.step, x.seqs, x.copy_from, x.copy_to, x.copy_window);
}

/// A sampled token (only for SeqPlans with sample = true), with logprobs when asked; or, with
/// `error` set, the failure of this one sequence (bad sampling parameters, non-finite logits),
/// for any SeqPlan: the step went on for the others, and the batcher ends this job alone.
struct SeqResult {
  uint64_t uid = 0;
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  ErrorCode code = ErrorCode::bad_request;  // with `error`: the code the job ends with
  std::string error = {};                   // non-empty: this sequence failed (no token)
  // SeqPlan::targets: one log-probability per target asked, in order, and target_top top
  // entries each. A sequence with targets gets a SeqResult even when it does not sample
  // (token -1 then).
  std::vector<float> target_logprobs = {};
  std::vector<int32_t> target_top_ids = {};
  std::vector<float> target_top_logprobs = {};
  // SeqPlan::n_draft: the drafts confirmed, in order, before `token`, each with its logprob and
  // its `logprobs` top entries (as token's), sampled exactly as `token` is.
  std::vector<int32_t> spec_ids = {};
  std::vector<float> spec_logprob = {};
  std::vector<int32_t> spec_top_ids = {};
  std::vector<float> spec_top_logprobs = {};
  // SeqPlan::draft_model: the drafts the draft model wrote and the step fed (fewer than
  // n_draft, or none, where it could not draft for this sequence).
  std::vector<int32_t> drafts = {};
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SeqResult& x) {
  return f(caf::meta::type_name("SeqResult"), x.uid, x.token, x.logprob, x.top_ids, x.top_logprobs,
           x.code, x.error, x.target_logprobs, x.target_top_ids, x.target_top_logprobs, x.spec_ids,
           x.spec_logprob, x.spec_top_ids, x.spec_top_logprobs, x.drafts);
}

struct StepResult {
  uint64_t step = 0;
  std::vector<SeqResult> seqs;
  std::string error;  // non-empty: the whole step failed (the batcher fails all its jobs)
  // The draft model's share of the step (SeqPlan::draft_model): its batched passes, the tokens
  // they fed (catch-ups included) and the microseconds they took; 0 when it did not run.
  int32_t draft_passes = 0;
  int64_t draft_tokens = 0;
  double draft_us = 0.0;
  // The batcher asked for the step to stop (ExecutorSpec::interrupt) and the engine stopped it
  // inside its layers: no seqs, nothing sampled; the batcher plans its tokens again.
  bool interrupted = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepResult& x) {
  return f(caf::meta::type_name("StepResult"), x.step, x.seqs, x.error, x.draft_passes,
           x.draft_tokens, x.draft_us, x.interrupted);
}

// ---- outbound events (to the egress actor, which encodes them for the gateway) and the job's
// outcome, of core/job.hpp, inspectable ----

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AcceptedEvent& x) {
  return f(caf::meta::type_name("AcceptedEvent"), x.to, x.id, x.queue_position, x.tenant);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokensEvent& x) {
  return f(caf::meta::type_name("TokensEvent"), x.to, x.uid, x.id, x.index, x.ids, x.text,
           x.logprob, x.n_top, x.top_ids, x.top_logprobs, x.tenant, x.choice, x.step);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChoiceResult& x) {
  return f(caf::meta::type_name("ChoiceResult"), x.index, x.finish, x.text, x.ids, x.logprob,
           x.top_ids, x.top_logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScoreResult& x) {
  return f(caf::meta::type_name("ScoreResult"), x.index, x.logprob, x.tokens);
}

namespace wire {  // found by argument-dependent lookup for wire::Var
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Var& x) {
  return f(caf::meta::type_name("Var"), x.name, x.values, x.list);
}
}  // namespace wire

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DoneEvent& x) {
  return f(caf::meta::type_name("DoneEvent"), x.to, x.uid, x.id, x.tenant, x.finish, x.text, x.ids,
           x.prompt_tokens, x.completion_tokens, x.cached_tokens, x.queue_ms, x.ttft_ms, x.total_ms,
           x.logprob, x.n_top, x.top_ids, x.top_logprobs, x.choices, x.prompt_ids, x.prompt_logprob,
           x.prompt_n_top, x.prompt_top_ids, x.prompt_top_logprobs, x.scores, x.vars, x.steps);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepEvent& x) {
  return f(caf::meta::type_name("StepEvent"), x.to, x.uid, x.id, x.tenant, x.step, x.name, x.kind,
           x.output);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ToolCallEvent& x) {
  return f(caf::meta::type_name("ToolCallEvent"), x.to, x.uid, x.id, x.tenant, x.call, x.name,
           x.arguments);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ErrorEvent& x) {
  return f(caf::meta::type_name("ErrorEvent"), x.to, x.uid, x.id, x.tenant, x.code, x.message,
           x.retry_after_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StatusEvent& x) {
  return f(caf::meta::type_name("StatusEvent"), x.to, x.id, x.state, x.queue_position,
           x.completion_tokens, x.tenant);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobOutcome& x) {
  return f(caf::meta::type_name("JobOutcome"), x.uid, x.id, x.tenant, x.outcome, x.code,
           x.tokens_used, x.done, x.error, x.program);
}

/// The router's answer to (enqueue_atom, Job): `position` is the jobs ahead of it (accepted),
/// `retry_after_ms` the hint with EnqueueResult::full (else -1).
struct EnqueueReply {
  EnqueueResult result = EnqueueResult::accepted;
  uint32_t position = 0;
  int64_t retry_after_ms = -1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EnqueueReply& x) {
  return f(caf::meta::type_name("EnqueueReply"), x.result, x.position, x.retry_after_ms);
}

/// The router's answer to (status_atom, uid): where the job is. queued: `position` jobs ahead of
/// it (were no more to arrive); running (also for a job the router does not know):
/// `completion_tokens` generated so far, as its batcher reports them.
struct JobStatus {
  JobState state = JobState::queued;
  uint32_t position = 0;
  uint32_t completion_tokens = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobStatus& x) {
  return f(caf::meta::type_name("JobStatus"), x.state, x.position, x.completion_tokens);
}

/// Adds every type above to a CAF config (both nodes of a distributed deployment need it).
void register_message_types(caf::actor_system_config& cfg);

/// Steady-clock microseconds, the time base of every *_us field.
int64_t now_us();

/// Writes one log line ("switchyard: " + text + newline) to stderr in a single write, so lines
/// of concurrent actors never interleave with each other or with the machine-read lines that the
/// serve command prints on stdout.
void log_line(const std::string& text);

}  // namespace sy

// Which actor takes which of these messages, and what it answers: actors/protocol.hpp.

// ---- router <-> admission wiring ----
namespace sy {

/// Wiring: (connect_atom, caf::actor admission, TenantWeights) tells the router its admission
/// actor and the tenants' fair-share weights (spawn_admission sends it; the two actors form a cycle).

/// Tenant weights for the router's fair queuing; a tenant not listed weighs 1.
struct TenantWeights {
  std::vector<std::string> names;
  std::vector<double> weights;  // parallel to names, each > 0
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TenantWeights& x) {
  return f(caf::meta::type_name("TenantWeights"), x.names, x.weights);
}

}  // namespace sy

// ---- control plane (operator commands over the request endpoint; core/job.hpp) ----
namespace sy {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ControlRequest& x) {
  return f(caf::meta::type_name("ControlRequest"), x.client, x.token, x.command, x.policy);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ControlEvent& x) {
  return f(caf::meta::type_name("ControlEvent"), x.to, x.command, x.result);
}

}  // namespace sy

// ---- elasticity and crash recovery (actors/supervisor.hpp) ----
namespace sy {

/// What a batcher reports to its supervisor when its executor failed (before it exits).
struct PairFailure {
  uint64_t pair = 0;        // the supervisor's id of the batcher+executor pair
  std::string why;          // "executor down: ...", "no step result within N ms", ...
  int64_t fault_us = 0;     // when the fault struck (a hung step: when it was sent)
  int64_t detected_us = 0;  // when the batcher noticed
  uint32_t requeued = 0;    // jobs sent back to the router
  uint32_t failed = 0;      // jobs past their retry limit: ended with engine_dead
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PairFailure& x) {
  return f(caf::meta::type_name("PairFailure"), x.pair, x.why, x.fault_us, x.detected_us,
           x.requeued, x.failed);
}

}  // namespace sy

// ---- urgent messages ----
namespace sy {

/// Whether the messages of a job of class `class_index` travel as CAF's high-priority messages:
/// those of the most important class (0). An actor's mailbox hands them out before its normal
/// messages, so an interactive job's submit, dispatch and tokens do not wait in a mailbox behind
/// a batch's wave of them (docs/architecture.md, "Urgent messages").
inline bool urgent_class(uint32_t class_index) {
  return class_index == 0;
}

/// self->send(dest, xs...), as a high-priority message when `urgent`.
template <class Self, class Dest, class... Ts>
void send_urgent_if(Self* self, bool urgent, const Dest& dest, Ts&&... xs) {
  if (urgent)
    self->template send<caf::message_priority::high>(dest, std::forward<Ts>(xs)...);
  else
    self->send(dest, std::forward<Ts>(xs)...);
}

}  // namespace sy
