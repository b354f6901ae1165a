// The job and what becomes of it, as every layer past the wire sees it: the admitted job, the
// requests the doors decode, the events sent back to clients and the outcome admission and the
// journal keep. Plain values (no CAF, ZeroMQ or msgpack); actors/messages.hpp makes them
// inspectable for CAF, storage/journal_codec.hpp writes them to the journal.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error_code.hpp"
#include "core/generation.hpp"
#include "core/trace.hpp"
#include "core/wire.hpp"

namespace sy {

/// Why a job's generation ended (DoneEvent::finish): the wire's finish_reason, same values.
using FinishReason = wire::FinishReason;

/// Where a job is in its life (StatusEvent::state): the wire's status_reply state, same values.
using JobState = wire::JobState;

/// How a job ended, as admission, the journal and metrics count it (JobOutcome::outcome).
enum class Outcome : uint8_t {
  done = 0,       ///< ran to its end (finish stop or length); `done` holds the result
  error = 1,      ///< failed; `code` and `error` say why
  cancelled = 2,  ///< cancelled (by its client or by shutdown); `done` has finish cancelled
};

/// Where replies for a job go: a DEALER client behind the ROUTER socket (by its identity), the
/// pipeline results socket (PUSH), the cluster node (a job fetched from NATS JetStream; the
/// identity is the node's handle of that delivery, ingress/cluster_node.hpp), or a request of
/// the HTTP door (the identity is the door's handle of that request, ingress/http_door.hpp).
struct ClientRef {
  enum Kind : uint8_t { router = 0, pipeline = 1, cluster = 2, http = 3 };
  uint8_t kind = router;
  std::string identity;  // ZeroMQ routing id (router), delivery handle (cluster, http)
  bool operator==(const ClientRef&) const = default;
};

/// A client that waits on its connection for every event of its job (accepted, streamed chunks,
/// status): a DEALER behind the ROUTER socket or a request of the HTTP door.
inline bool is_connected(const ClientRef& c) {
  return c.kind == ClientRef::router || c.kind == ClientRef::http;
}

/// A job replayed from the journal whose client was a connection has no client any more (the
/// replay empties its routing id or handle; neither door ever gives an empty one): its events go
/// nowhere.
inline bool is_orphan(const ClientRef& to) {
  return is_connected(to) && to.identity.empty();
}

/// Pipeline and cluster submits each used one PULL credit (the node fetches only what credit
/// allows): admission gives it back for a submit it answers itself, the router counts it in.
inline bool uses_pull_credit(const ClientRef& c) {
  return c.kind == ClientRef::pipeline || c.kind == ClientRef::cluster;
}

/// Speculative decoding (docs/speculation.md): `auto` drafts where the measured step cost and
/// acceptance say the drafts pay, `always` wherever prompt lookup finds any, `off` never. A job's
/// server_default is the server's `batching.speculative`.
enum class SpecMode : uint8_t { server_default = 0, auto_ = 1, off = 2, always = 3 };

/// "auto", "always", "off" (and "" for server_default); nullopt for anything else.
inline std::optional<SpecMode> parse_spec_mode(std::string_view s) {
  if (s.empty()) return SpecMode::server_default;
  if (s == "auto") return SpecMode::auto_;
  if (s == "always") return SpecMode::always;
  if (s == "off") return SpecMode::off;
  return std::nullopt;
}

/// An admitted job as the router, batchers and executors see it: prompt already tokenized and
/// checked against the context, sampling parameters validated, times in steady-clock µs.
struct Job {
  uint64_t uid = 0;  // server-unique, assigned at admission
  std::string id;    // client job id; (tenant, id) is the job key
  std::string tenant;
  ClientRef client;
  uint32_t class_index = 0;  // index into the configured priority classes
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 16;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool stream = false;
  uint32_t logprobs = 0;
  int64_t arrival_us = 0;   // receipt at the gateway
  int64_t deadline_us = 0;  // absolute; 0: none. Only bounds the wait before the job starts.
  // Crash recovery (appended): set when an executor failure re-queued the job.
  uint32_t attempt = 0;         // executor failures this job has been through
  uint32_t streamed_ids = 0;    // completion ids its client already got (not streamed again)
  uint64_t streamed_bytes = 0;  // completion text bytes its client already got
  int64_t fault_us = 0;         // when the last failure struck (recovery time is measured from it)
  // Generation options (appended): sampling controls and the output constraint.
  SamplingControls controls;
  Constraint constraint;
  // Samples, prompt log-probabilities and scoring (appended).
  uint32_t n = 1;                // samples of the prompt sharing its KV (1: a plain job)
  int32_t prompt_logprobs = -1;  // top-N per prompt position after the first; -1: none
  // A score request: the continuations' token ids, each scored after the prompt (no sampling).
  std::vector<std::vector<int32_t>> continuations;
  bool is_score() const { return !continuations.empty(); }
  // Programs (appended; docs/programs.md). A program job: `program` holds its steps (JSON text),
  // `inputs` its named inputs, `program_done` the outputs of its finished steps (path, output),
  // restored from the journal; the sampling fields above are its gen steps' defaults and the
  // prompt stays empty. A step job (a gen or select of a program, run by the router and
  // batchers like any job): `program_uid` is its program's uid and `step` the step's path.
  std::string program;
  std::vector<std::pair<std::string, std::string>> inputs;
  std::vector<std::pair<std::string, std::string>> program_done;
  uint64_t program_uid = 0;
  std::string step;
  // Speculative decoding (appended; docs/speculation.md): the job's choice, else the server's.
  SpecMode speculative = SpecMode::server_default;
  // Tracing (appended; docs/tracing.md): traced() only for a job that produces spans.
  TraceContext trace;
  // Whether its accept is in the journal (where the server has one; admission clears it for a
  // job it does not journal): its done or error then waits for its result record.
  bool journaled = true;
  bool is_program() const { return !program.empty(); }
  bool is_step() const { return program_uid != 0; }
};

/// The tokens a job may cost (quotas, fair queuing): its prompt once, then every sample's
/// max_tokens, or for a score request every continuation's tokens.
inline uint32_t job_token_cost(const Job& job) {
  uint64_t c = job.prompt.size();
  if (job.is_score())
    for (const auto& k : job.continuations) c += k.size();
  else
    c += uint64_t{job.n} * job.max_tokens;
  return c > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(c);
}

/// A client request as decoded by the gateway (submit, cancel or status), before admission.
/// Mirrors wire::Submit; `prompt_text` is used when `prompt_ids` is empty.
struct SubmitRequest {
  ClientRef client;
  std::string id, tenant, token;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  uint32_t max_tokens = 16;
  double temperature = 1.0;
  uint32_t top_k = 0;
  double top_p = 1.0;
  bool has_seed = false;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string priority;
  uint32_t deadline_ms = 0;
  bool stream = false;
  uint32_t logprobs = 0;
  int64_t arrival_us = 0;
  // A chat submit: roles[i] and contents[i] are message i, rendered by admission with the chat
  // template (prompt_text and prompt_ids then stay empty).
  std::vector<std::string> message_roles, message_contents;
  bool parse_special = false;    // prompt_text's special-token text becomes control tokens
  SamplingControls controls;     // min_p, penalties, logit bias
  Constraint constraint;         // the output's constraint (compiled and checked by admission)
  uint32_t n = 1;                // samples of the prompt
  int32_t prompt_logprobs = -1;  // top-N per prompt position after the first; -1: none
  // A score request: continuation i is cont_ids[i] when not empty, else the text cont_text[i]
  // (tokenized by admission without BOS, as text appended to the prompt).
  bool score = false;
  std::vector<std::string> cont_text;
  std::vector<std::vector<int32_t>> cont_ids;
  // A program (docs/programs.md): its steps as JSON text and its inputs; prompt fields stay empty.
  std::string program;
  std::vector<std::pair<std::string, std::string>> inputs;
  SpecMode speculative = SpecMode::server_default;  // the job's speculative decoding
  // Wire size of a request the gateway counted into its IntakeMeter (0: not counted); admission
  // counts it out when it takes the request from its mailbox.
  uint32_t metered_bytes = 0;
  // A journaled job still running when a shutdown's grace ends is left for the next start (its
  // accept has no result, so replay runs it again) instead of being cancelled: the Batch API's
  // lines, whose batch resumes after the restart and attaches to them (docs/http.md).
  bool outlive_shutdown = false;
  // Journaled where the server has a journal. False for an HTTP request without an
  // Idempotency-Key or X-Request-Id: its client can never come back for it after a restart
  // (its connection ends with the server), so it is not written (docs/http.md).
  bool journal = true;
  // The submit's W3C traceparent (`trace` on the wire, the HTTP door's `traceparent` header),
  // checked at the edge; trace_id all zero: none (docs/tracing.md).
  TraceContext trace;
};

/// A program step's output, journaled once the step finished (docs/programs.md).
struct ProgramStep {
  uint64_t uid = 0;  // the program's
  std::string path;  // the step's path
  std::string output;
};

/// A tool's result for a program waiting in a tool step (wire::ToolResult), from any client of
/// the tenant.
struct ToolResultRequest {
  ClientRef client;
  std::string id, tenant, token;
  std::string call, content;
  uint32_t metered_bytes = 0;  // as in SubmitRequest
};

/// cancel or status from a client (kind says which).
struct KeyRequest {
  enum Kind : uint8_t { cancel = 0, status = 1 };
  uint8_t kind = cancel;
  ClientRef client;
  std::string id, tenant, token;
  bool internal = false;       // raised by the server itself (client gone), not by a client
  uint32_t metered_bytes = 0;  // as in SubmitRequest
};

struct AcceptedEvent {
  ClientRef to;
  std::string id;
  uint32_t queue_position = 0;  // jobs ahead of it, were no more to arrive
  std::string tenant = {};      // every reply names its tenant (one connection may serve several)
};

/// A streamed chunk. logprobs: per id, the chosen token's logprob and its top-N (flattened:
/// top_ids/top_logprobs hold n_top entries per id).
struct TokensEvent {
  ClientRef to;
  uint64_t uid = 0;
  std::string id;
  uint32_t index = 0;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<float> logprob;
  uint32_t n_top = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::string tenant = {};
  uint32_t choice = 0;    // the sample (a job with n > 1)
  std::string step = {};  // a program's step job: the step's path
};

/// One sample of a job with n > 1, as DoneEvent carries it for a single sample.
struct ChoiceResult {
  uint32_t index = 0;
  FinishReason finish = FinishReason::stop;
  std::string text;
  std::vector<int32_t> ids;
  std::vector<float> logprob;  // flattened as in TokensEvent (n_top of the job per id)
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

/// One continuation's score: the summed log-probability of its `tokens` tokens.
struct ScoreResult {
  uint32_t index = 0;
  double logprob = 0.0;
  uint32_t tokens = 0;
};

/// The end of a job.
struct DoneEvent {
  ClientRef to;
  uint64_t uid = 0;
  std::string id, tenant;
  FinishReason finish = FinishReason::stop;
  std::string text;          // full completion
  std::vector<int32_t> ids;  // full completion ids
  uint32_t prompt_tokens = 0, completion_tokens = 0;
  uint32_t cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  double queue_ms = 0, ttft_ms = 0, total_ms = 0;
  // Full logprobs (non-streamed jobs that asked for them), flattened as in TokensEvent.
  std::vector<float> logprob;
  uint32_t n_top = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  // A job with n > 1: its samples (text, ids and logprobs above stay empty then).
  std::vector<ChoiceResult> choices;
  // prompt_logprobs: per prompt position after the first, its token, that token's logprob and
  // the top prompt_n_top (flattened).
  std::vector<int32_t> prompt_ids;
  std::vector<float> prompt_logprob;
  uint32_t prompt_n_top = 0;
  std::vector<int32_t> prompt_top_ids;
  std::vector<float> prompt_top_logprobs;
  std::vector<ScoreResult> scores;  // a score request
  // A program: its inputs and variables (wire::Var) and the steps that ran.
  std::vector<wire::Var> vars;
  uint32_t steps = 0;
  TraceContext trace;  // the job's (copied by make_done): egress ends its spans with it
};

/// A program's step finished (wire::Step).
struct StepEvent {
  ClientRef to;
  uint64_t uid = 0;  // the program's
  std::string id, tenant;
  std::string step, name, kind, output;
};

/// A program's tool step asks for a tool's result (wire::ToolCall).
struct ToolCallEvent {
  ClientRef to;
  uint64_t uid = 0;  // the program's
  std::string id, tenant;
  std::string call, name, arguments;
};

/// An error reply. retry_after_ms < 0: none.
struct ErrorEvent {
  ClientRef to;
  uint64_t uid = 0;  // 0 when the job never got one
  std::string id, tenant;
  ErrorCode code = ErrorCode::bad_request;
  std::string message;
  int64_t retry_after_ms = -1;
  TraceContext trace = {};  // the job's, when it has one (make_error_event)
};

/// Reply to a status request.
struct StatusEvent {
  ClientRef to;
  std::string id;
  JobState state = JobState::queued;
  uint32_t queue_position = 0;     // while queued: jobs ahead of it
  uint32_t completion_tokens = 0;  // generated so far, while running too
  std::string tenant = {};
};

/// How a job ended, reported to admission (quotas, dedup of job keys). `code` is set with
/// Outcome::error (and is ErrorCode::cancelled with Outcome::cancelled; its value 0,
/// bad_request, with Outcome::done). `done` holds the stored result for resubmissions.
struct JobOutcome {
  uint64_t uid = 0;
  std::string id, tenant;
  Outcome outcome = Outcome::done;
  ErrorCode code = ErrorCode::bad_request;
  uint32_t tokens_used = 0;  // prompt + completion: returned to the tenant's token bucket
  DoneEvent done;
  ErrorEvent error;
  bool program = false;  // a program's end (metrics count its latency apart from jobs')
};

/// An operator command decoded by the gateway: `command` is "kv_policy" (args: policy text in
/// parse_kv_policy's format) or "stats". Only the configured admin token may send one.
struct ControlRequest {
  ClientRef client;
  std::string token;
  std::string command;
  std::string policy;  // kv_policy: "full", "sliding_window:W", "sinks:S:W"
};

/// The answer to a ControlRequest: `result` is one JSON object (text) on success; on failure an
/// ErrorEvent is sent instead.
struct ControlEvent {
  ClientRef to;
  std::string command;
  std::string result;
};

}  // namespace sy
