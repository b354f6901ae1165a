// Wire protocol v1 as plain C++ structs: what clients send (submit, cancel, status, ping, control)
// and what the server answers; the floor every layer stands on. The msgpack encoding lives in
// ingress/codec.hpp; docs/protocol.md is the reference.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/error_code.hpp"
#include "core/generation.hpp"

namespace sy::wire {

/// The protocol version this code speaks (the "v" key of every message).
inline constexpr std::uint32_t kProtocolVersion = 1;

// ---- client → server ----------------------------------------------------------------------------

/// One chat message of a `messages` submit: rendered with the model's chat template.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant", ... as the template knows them
  std::string content;  ///< the message text; never parsed for control tokens
  bool operator==(const ChatMessage&) const = default;
};

/// A generation job. The job key is (tenant, id). Defaults are those of docs/protocol.md.
struct Submit {
  std::string id;      ///< client job id, unique per tenant
  std::string tenant;  ///< tenant name
  std::string token;   ///< tenant's auth token ("" when the server needs none)
  /// Prompt as text (tokenized by the server, BOS added) or as token ids (used as given).
  std::variant<std::string, std::vector<std::int32_t>> prompt;
  std::uint32_t max_tokens = 16;      ///< completion tokens to generate at most
  double temperature = 1.0;           ///< 0: greedy
  std::uint32_t top_k = 0;            ///< 0: off
  double top_p = 1.0;                 ///< 1: off
  std::optional<std::uint64_t> seed;  ///< absent: the server picks one
  std::vector<std::string> stop;      ///< stop strings (not included in the output)
  bool ignore_eos = false;            ///< keep going past end-of-sequence until max_tokens
  std::string speculative;            ///< "auto", "off"; "": the server's default
  std::string priority;               ///< priority class name; "": the server's default class
  std::uint32_t deadline_ms = 0;      ///< relative to receipt; 0: none
  bool stream = false;                ///< send `tokens` chunks as they are generated
  std::uint32_t logprobs = 0;         ///< top-N log-probabilities per generated token; 0: none
  /// In place of `prompt` (which then stays ""): the conversation, rendered by the server with
  /// the model's chat template. Exactly one of the two is sent.
  std::vector<ChatMessage> messages;
  /// A text prompt's special-token text ("<|im_start|>") becomes control tokens; false: it is
  /// plain text. Only with a text `prompt`.
  bool parse_special = false;
  /// min_p, presence/frequency/repetition penalties, repeat_last_n, logit_bias (defaults: off).
  SamplingControls controls;
  /// At most one of `grammar`, `json_schema`, `regex`, `choices` (none: free text). A
  /// json_schema sent as a map travels here as its JSON text.
  Constraint constraint;
  /// Samples of the prompt, [1, 16]: they share the prompt's KV and each has its own sampler
  /// (seed + sample index). 1: the job's `done` is the single-sample one.
  std::uint32_t n = 1;
  /// Top-N log-probabilities, N in [0, 20], for every prompt position after the first (the
  /// actual token's always); absent: none.
  std::optional<std::uint32_t> prompt_logprobs;
  /// A `score` message (type "score") travels as a Submit with `score` set: prompt (or messages),
  /// key, priority and deadline_ms; every continuation (text, appended to the prompt without
  /// BOS, or token ids) gets its summed log-probability. Empty unless `score`.
  bool score = false;
  std::vector<std::variant<std::string, std::vector<std::int32_t>>> continuations;
  /// A program (docs/programs.md) in place of `prompt`/`messages`: its steps as JSON text (the
  /// wire's `program` array, converted by the codec) and its named inputs. "" : a plain job.
  std::string program;
  std::vector<std::pair<std::string, std::string>> inputs;
  /// A W3C traceparent ("00-<trace id>-<parent span id>-<flags>"): the job's spans join that
  /// trace (docs/tracing.md). "": none.
  std::string trace;

  bool is_program() const { return !program.empty(); }
  bool prompt_is_tokens() const { return prompt.index() == 1; }
  bool has_messages() const { return !messages.empty(); }
  bool operator==(const Submit&) const = default;
};

/// Cancels a queued or running job; queued ones never run, running ones stop within one step.
struct Cancel {
  std::string id;
  std::string tenant;
  std::string token;
  bool operator==(const Cancel&) const = default;
};

/// Asks where a job is; answered by StatusReply (or Error not_found).
struct Status {
  std::string id;
  std::string tenant;
  std::string token;
  bool operator==(const Status&) const = default;
};

/// Liveness check; the server echoes `seq` in a Pong.
struct Ping {
  std::uint64_t seq = 0;
  bool operator==(const Ping&) const = default;
};

/// An operator command (request endpoint only; the server's admin token is required).
struct Control {
  std::string token;    ///< the server's admin token
  std::string command;  ///< "kv_policy" or "stats"
  std::string policy;   ///< kv_policy only: "full", "sliding_window:W" or "sinks:S:W"
  bool operator==(const Control&) const = default;
};

/// The control commands this protocol version knows.
inline constexpr std::string_view kControlCommands[] = {"kv_policy", "stats", "drain", "resume"};

/// The result of a program's `tool` step (docs/programs.md), from any client of the tenant: the
/// program (id, tenant) waiting in step `call` goes on with `content` appended.
struct ToolResult {
  std::string id;
  std::string tenant;
  std::string token;
  std::string call;     ///< the tool_call's `call` (the step's path)
  std::string content;  ///< the tool's output, appended to the program's context as plain text
  bool operator==(const ToolResult&) const = default;
};

/// Any message a client may send.
using ClientMessage = std::variant<Submit, Cancel, Status, Ping, Control, ToolResult>;

// ---- server → client ----------------------------------------------------------------------------

/// The job was journaled and queued.
struct Accepted {
  std::string id;
  std::uint32_t queue_position = 0;  ///< jobs ahead of it at acceptance, were no more to arrive
  std::string tenant = {};           ///< the job's tenant (one connection may serve several)
  bool operator==(const Accepted&) const = default;
};

/// One alternative at a generated position: a token id and its log-probability.
struct TopLogprob {
  std::int32_t id = 0;
  float logprob = 0.0f;
  bool operator==(const TopLogprob&) const = default;
};

/// Log-probabilities for one generated token.
struct TokenLogprobs {
  float logprob = 0.0f;         ///< of the chosen token
  std::vector<TopLogprob> top;  ///< the N most likely tokens, most likely first
  bool operator==(const TokenLogprobs&) const = default;
};

/// A streamed chunk of generated tokens.
struct Tokens {
  std::string id;
  std::uint32_t index = 0;  ///< position of ids[0] among the completion tokens (of its sample)
  std::vector<std::int32_t> ids;
  std::string text;                     ///< text delta these tokens add (may be "" mid-UTF-8)
  std::vector<TokenLogprobs> logprobs;  ///< one per id when logprobs > 0, else empty
  std::string tenant = {};              ///< the job's tenant
  std::uint32_t choice = 0;             ///< the sample these tokens belong to (a job with n > 1)
  std::string step = {};                ///< a program's tokens: the path of the step making them
  bool operator==(const Tokens&) const = default;
};

/// Why generation ended.
enum class FinishReason : unsigned char { stop, length, cancelled };

/// The wire name of a finish reason: "stop", "length", "cancelled".
std::string_view to_string(FinishReason r);
/// Parses a finish reason; nullopt when unknown.
std::optional<FinishReason> finish_reason_from_string(std::string_view s);

/// Token counts of a finished job.
struct Usage {
  std::uint32_t prompt_tokens = 0;
  std::uint32_t completion_tokens = 0;
  std::uint32_t cached_tokens = 0;  ///< prompt tokens whose KV came from the prefix cache
  bool operator==(const Usage&) const = default;
};

/// Where a finished job's time went, in milliseconds since receipt at the gateway.
struct Timings {
  double queue_ms = 0;  ///< receipt → first scheduled
  double ttft_ms = 0;   ///< receipt → first token
  double total_ms = 0;  ///< receipt → done
  bool operator==(const Timings&) const = default;
};

/// One sample of a job with n > 1 (Done::choices), as a single-sample `done` would carry it.
struct Choice {
  std::uint32_t index = 0;
  FinishReason finish_reason = FinishReason::stop;
  std::string text;                     ///< "" for streamed ROUTER jobs (the chunks carried it)
  std::vector<std::int32_t> ids;        ///< empty for streamed ROUTER jobs
  std::vector<TokenLogprobs> logprobs;  ///< as Done::logprobs
  bool operator==(const Choice&) const = default;
};

/// The log-probability of one prompt token given the tokens before it (Done::prompt_logprobs).
struct PromptLogprob {
  std::int32_t id = 0;          ///< the prompt's token at this position
  float logprob = 0.0f;         ///< its log-probability
  std::vector<TopLogprob> top;  ///< the N most likely tokens there, most likely first
  bool operator==(const PromptLogprob&) const = default;
};

/// One continuation's score (Done::scores of a `score` request).
struct Score {
  std::uint32_t index = 0;   ///< the continuation's index in the request
  double logprob = 0.0;      ///< summed log-probability of its tokens after the prompt
  double mean = 0.0;         ///< logprob / tokens
  std::uint32_t tokens = 0;  ///< its token count
  bool operator==(const Score&) const = default;
};

/// A program variable in a program's `done` (Done::vars): a step's output, an input, or a
/// join's list (`list` true: every branch's value in branch order).
struct Var {
  std::string name;
  std::vector<std::string> values;  ///< one value unless `list`
  bool list = false;
  bool operator==(const Var&) const = default;
};

/// A program's step finished (docs/programs.md): its path, variable name and output.
struct Step {
  std::string id;
  std::string tenant;
  std::string step;    ///< the step's path ("3", "2.1.0": indices through forks' branches)
  std::string name;    ///< its variable name ("" for a step without one)
  std::string kind;    ///< "gen", "select" or "tool"
  std::string output;  ///< the generated text, the chosen choice or the tool's result
  bool operator==(const Step&) const = default;
};

/// A program's `tool` step asks its client (or the pipeline sink) to run a tool and answer with
/// a ToolResult naming `call`.
struct ToolCall {
  std::string id;
  std::string tenant;
  std::string call;       ///< the step's path: the ToolResult names it
  std::string name;       ///< the tool's name
  std::string arguments;  ///< the arguments text (usually JSON from a constrained gen)
  bool operator==(const ToolCall&) const = default;
};

/// The last message of a job that ran (or was cancelled after it was accepted).
struct Done {
  std::string id;
  std::string tenant;  ///< lets a pipeline sink tell jobs of different tenants apart
  FinishReason finish_reason = FinishReason::stop;
  std::string text;               ///< the full completion ("" for streamed ROUTER jobs)
  std::vector<std::int32_t> ids;  ///< the full completion ids (empty for streamed ROUTER jobs)
  Usage usage;
  Timings timings;
  /// One per completion id when the job asked for logprobs and was not streamed on the request
  /// endpoint (a streamed job's chunks carried them); else empty.
  std::vector<TokenLogprobs> logprobs = {};
  std::vector<Choice> choices = {};                 ///< n > 1: one per sample, by index
  std::vector<PromptLogprob> prompt_logprobs = {};  ///< with prompt_logprobs: positions 1..
  std::vector<Score> scores = {};                   ///< a `score` request: one per continuation
  std::vector<Var> vars = {};  ///< a program: its inputs and every variable, in definition order
  std::uint32_t steps = 0;     ///< a program: the steps that ran (gen, select and tool)
  bool operator==(const Done&) const = default;
};

/// A request failed; `id`/`tenant` are "" when the message was too broken to read them.
struct Error {
  std::string id;
  std::string tenant;
  ErrorCode code = ErrorCode::internal;
  std::string message;
  std::optional<std::uint32_t> retry_after_ms;  ///< set with overloaded and rate_limited
  bool operator==(const Error&) const = default;
};

/// Answer to Ping.
struct Pong {
  std::uint64_t seq = 0;
  bool operator==(const Pong&) const = default;
};

/// Where a job is in its life.
enum class JobState : unsigned char { queued, running, done, failed, cancelled };

/// The wire name of a job state: "queued", "running", "done", "failed", "cancelled".
std::string_view to_string(JobState s);
/// Parses a job state; nullopt when unknown.
std::optional<JobState> job_state_from_string(std::string_view s);

/// Answer to Status.
struct StatusReply {
  std::string id;
  JobState state = JobState::queued;
  std::uint32_t queue_position = 0;     ///< while queued: jobs ahead of it; 0 otherwise
  std::uint32_t completion_tokens = 0;  ///< generated so far (while running too)
  std::string tenant = {};              ///< the job's tenant
  bool operator==(const StatusReply&) const = default;
};

/// Answer to Control: `result` is one JSON object as text (its fields depend on the command).
struct ControlReply {
  std::string command;
  std::string result;
  bool operator==(const ControlReply&) const = default;
};

/// Any message the server may send.
using ServerMessage =
    std::variant<Accepted, Tokens, Done, Error, Pong, StatusReply, ControlReply, Step, ToolCall>;

/// Client-provided text as every error message echoes it (the codec's and the actors' alike):
/// in single quotes, at most 64 bytes (then "..."), and every byte outside printable ASCII, and
/// the quote and backslash themselves, written as \xNN, so that a message stays short, one line
/// and unambiguous whatever the client sent.
std::string quoted(std::string_view s);

}  // namespace sy::wire
