// The wire codec: msgpack bytes ⇄ the structs of core/wire.hpp, with hard limits at the edge.
// msgpack stays inside codec.cpp; callers see only structs, strings and DecodeError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "core/wire.hpp"

namespace sy::wire {

/// Limits applied while decoding. The defaults suit a server whose model context is 4096 tokens;
/// the gateway sets max_prompt_tokens from the loaded model.
struct DecodeLimits {
  /// Whole message; the gateway also sets ZMQ_MAXMSGSIZE to this so larger frames never arrive.
  std::size_t max_message_bytes = 1u << 20;
  /// Container nesting; v1 messages nest at most 5 deep (tokens → logprobs → entry → top → pair)
  /// outside a json_schema sent as a map, which may nest as deep as this allows (deeper schemas
  /// travel as JSON text).
  std::size_t max_depth = 32;
  /// Elements of any one array; above max_prompt_tokens so an oversized prompt is named as such.
  std::size_t max_array = 1u << 17;
  /// Entries of any one map: a logit_bias map has up to max_logit_bias of them; other maps far
  /// fewer (a submit has at most 31 keys).
  std::size_t max_map = 1024;
  /// Bytes of any one str/bin/ext value.
  std::size_t max_string_bytes = 1u << 20;

  std::size_t max_prompt_tokens = 4096;       ///< model context length
  std::size_t max_prompt_bytes = 256u << 10;  ///< prompt text (or all messages' text)
  /// Entries of `messages`: 1024 turns is far beyond a conversation that fits a context.
  std::size_t max_messages = 1024;
  std::uint32_t max_new_tokens = 4096;  ///< upper end of max_tokens
  std::size_t max_stop = 16;            ///< stop strings per job
  std::size_t max_stop_bytes = 256;     ///< bytes per stop string
  std::uint32_t max_logprobs = 20;      ///< upper end of logprobs
  std::size_t max_logit_bias = 1024;    ///< entries of logit_bias (OpenAI's bound)
  /// Bytes of a constraint's text (grammar, regex, a json_schema's JSON text, all choices);
  /// constraints/error.hpp's Limits bound what it compiles to.
  std::size_t max_constraint_bytes = 64u << 10;
  std::size_t max_choices = 1024;              ///< entries of `choices`
  std::uint32_t max_deadline_ms = 86'400'000;  ///< one day: longer is a mistake, not a deadline
  std::size_t max_id_bytes = 128;              ///< job id
  std::size_t max_name_bytes = 64;             ///< tenant and priority class names
  std::size_t max_token_bytes = 256;           ///< auth token
};

/// Why a message was refused. `id` and `tenant` are filled when they could be read, so the error
/// reply can name the job.
struct DecodeError {
  ErrorCode code = ErrorCode::bad_request;
  std::string message;
  std::string id;
  std::string tenant;
  bool operator==(const DecodeError&) const = default;
};

/// Decodes one client message (server side). Never throws; every failure is a DecodeError whose
/// message names the problem ("missing field 'tenant'", "bad msgpack: truncated", ...).
std::variant<ClientMessage, DecodeError> decode_client(const void* data, std::size_t size,
                                                       const DecodeLimits& limits = {});

/// Decodes one server message (client side), under the same limits. Never throws.
std::variant<ServerMessage, DecodeError> decode_server(const void* data, std::size_t size,
                                                       const DecodeLimits& limits = {});

/// Encodes a server message; optional fields at their default value are left out.
std::string encode_server(const ServerMessage& m);

/// Encodes a client message; optional fields at their default value are left out.
std::string encode_client(const ClientMessage& m);

/// Converts a decode failure into the error reply the server sends for it.
inline Error to_error(const DecodeError& e) {
  return Error{e.id, e.tenant, e.code, e.message, std::nullopt};
}

}  // namespace sy::wire
