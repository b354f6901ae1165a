// The OpenAI-compatible HTTP API as plain code (docs/http.md): a request body (JSON) of
// /v1/completions or /v1/chat/completions becomes the wire submits admission takes, and the
// jobs' results become OpenAI's response bodies and stream chunks. No sockets and no actors here:
// the HTTP door (ingress/http_door.hpp) and the batch runner (ingress/http_batch.hpp) call it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error_code.hpp"
#include "core/wire.hpp"
#include "ingress/codec.hpp"

namespace sy::openai {

/// The two generation endpoints.
enum class Endpoint : uint8_t { completions, chat_completions };

/// "/v1/completions" or "/v1/chat/completions".
std::string_view endpoint_path(Endpoint e);
/// The endpoint a path names; nullopt for any other path.
std::optional<Endpoint> endpoint_from_path(std::string_view path);

/// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with its HTTP
/// status. `param` "" is written as null; `retry_after_ms` >= 0 adds Retry-After headers.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
  int64_t retry_after_ms = -1;
};

/// The body of an error response: {"error": {...}} (param null when empty, code null when empty).
std::string error_body(const ApiError& e);

/// An error reply of the server (admission, router, batcher) in OpenAI's shape: bad_request 400,
/// unauthorized 401, not_found 404, rate_limited and overloaded 429 (retry_after_ms kept),
/// unavailable 503, deadline_exceeded 504, engine_dead and internal 500, cancelled 499.
ApiError from_wire_error(const wire::Error& e);

/// What the request parser needs to know about the server.
struct ParseContext {
  /// The names the model answers to (the first is the one /v1/models lists and responses name);
  /// a request naming another model is a 404 (code "model_not_found"); no `model`: the first.
  std::vector<std::string> models;
  /// The edge limits (prompt bytes and tokens, stop strings, logprobs, logit_bias entries,
  /// id bytes ...): the same that bound a ZeroMQ submit.
  wire::DecodeLimits limits;
  /// max_tokens when a chat request names none (admission lowers it to the room the context
  /// leaves); a completions request without one gets OpenAI's default, 16.
  uint32_t chat_default_max_tokens = 4096;
  /// The priority classes in rank order (index 0 runs first): `priority` as an integer picks
  /// the class at that index (vLLM's convention: lower runs earlier), as a string names one.
  std::vector<std::string> classes;
};

/// Prompts of one completions request at most: each becomes a job admitted on its own, so the
/// bound keeps one HTTP request to about one batch of work (and one response body); a longer
/// list is refused with 400 and belongs to the Batch API (ingress/http_batch.hpp).
inline constexpr std::size_t kMaxPrompts = 64;

/// A parsed generation request: one wire submit per prompt (a completions request with a list
/// of prompts has several; they share every field but the prompt), each without id, tenant
/// and token (the door sets them), and how the response is to be written.
struct Request {
  Endpoint endpoint = Endpoint::completions;
  std::string model;               ///< the model the response names
  std::vector<wire::Submit> jobs;  ///< one per prompt, in the request's order
  uint32_t n = 1;                  ///< samples per prompt (every job's n)
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  /// Chat: `logprobs` true; then `top_logprobs` alternatives per token (0..20).
  bool chat_logprobs = false;
  uint32_t top_logprobs = 0;
  /// Completions: `logprobs` N (0..5 in OpenAI, up to limits.max_logprobs here); -1 absent.
  int32_t completion_logprobs = -1;
  bool echo = false;  ///< completions: the prompt text in front of each choice's text
  std::string user;   ///< the `user` field ("" absent): the tenant in open-tenant mode
  /// `priority` as sent: a class name, or an integer converted to its class (see ParseContext);
  /// "" absent. Also copied into every job.
  std::string priority;
  /// Top-level fields this server does not know, in the request's order (the door logs each
  /// name once per process): they are ignored, as vLLM and llama.cpp ignore them. The options of
  /// vLLM's `structured_outputs` other than its constraint appear as "structured_outputs.<key>".
  std::vector<std::string> ignored;
};

/// Parses and checks one request body. Every failure is a 400 (invalid_request_error) naming the
/// field in `param` and in the message ("'temperature' must be a number"), or a 404 for an
/// unknown model. The checks of the wire codec apply too (each job is run through it), so a
/// value the ZeroMQ door refuses is refused here with the same words.
std::variant<Request, ApiError> parse_request(Endpoint endpoint, std::string_view body,
                                              const ParseContext& ctx);

/// A token id's text as the tokenizer spells it (for logprobs' `token`, `top_logprobs` keys and
/// `bytes`); the door passes the model's vocabulary.
using TokenText = std::function<std::string(int32_t)>;

/// The result of one job of a request (as its `done` carried it, text and ids included even
/// when the job streamed), in the request's job order.
struct JobResult {
  wire::Done done;
  std::string prompt_text;  ///< for echo: the prompt as text ("" for token-id prompts)
};

/// The non-streamed response body: a `text_completion` or `chat.completion` object with one
/// choice per (job, sample), index = job * n + sample, finish_reason "stop" or "length"
/// (cancelled: "abort", as vLLM names it), logprobs as the request asked, and usage summed over
/// the jobs (prompt_tokens_details.cached_tokens included).
std::string response_body(const Request& req, const std::string& response_id, int64_t created,
                          const std::vector<JobResult>& results, const TokenText& token_text);

/// One stream chunk's JSON (without the SSE framing): the `tokens` event `t` of job `job`, as a
/// `text_completion` or `chat.completion.chunk` choice delta, index job * n + t.choice. `first`
/// adds delta.role "assistant" (chat); logprobs as the request asked. `text_offset`: the code
/// points of the choice's text before this chunk (completions logprobs' text_offset starts there).
std::string chunk_json(const Request& req, const std::string& response_id, int64_t created,
                       uint32_t job, const wire::Tokens& t, bool first, const TokenText& token_text,
                       uint32_t text_offset = 0);

/// The chunk that ends one choice: an empty delta (chat) or text "" (completions) with its
/// finish_reason. `first` as in chunk_json (a choice that generated nothing still gets its role).
std::string finish_chunk_json(const Request& req, const std::string& response_id, int64_t created,
                              uint32_t choice_index, wire::FinishReason finish, bool first);

/// The usage chunk (stream_options.include_usage): empty choices and the summed usage.
std::string usage_chunk_json(const Request& req, const std::string& response_id, int64_t created,
                             const std::vector<wire::Usage>& usage);

/// One Server-Sent Event carrying `json`: "data: " + json + "\n\n".
std::string sse_event(std::string_view json);
/// The stream's last event: "data: [DONE]\n\n".
std::string_view sse_done();

/// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created",
/// "owned_by": "switchyard", "max_model_len"}]}.
std::string models_body(const std::vector<std::string>& models, int64_t created,
                        uint32_t max_model_len);

}  // namespace sy::openai
