// The one error enum of Switchyard: the values that cross actor boundaries and the wire ("code" of
// an `error` message). Header-only, no dependencies: every layer shares it (core/, the floor).
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace sy {

/// Why a request failed. The wire spelling of each value is its to_string() name.
enum class ErrorCode : unsigned char {
  bad_request,        ///< malformed message, wrong field type, missing field, value out of range
  unauthorized,       ///< unknown tenant or wrong token
  rate_limited,       ///< the tenant's own quota (token rate, jobs in flight); retry_after_ms given
  overloaded,         ///< the priority class queue is full; retry_after_ms given
  deadline_exceeded,  ///< deadline_ms or the class queue timeout passed before the job ran
  cancelled,          ///< cancelled by the client or by shutdown
  not_found,          ///< cancel/status for a job key the server does not know
  engine_dead,        ///< the executor running the job died and the job could not be re-queued
  unavailable,        ///< the server is shutting down and takes no new work
  internal,           ///< a bug: anything not covered above
};

namespace detail {
// Indexed by the enum's value; keep in the enum's order.
inline constexpr std::array<std::string_view, 10> error_code_names = {
    "bad_request", "unauthorized", "rate_limited", "overloaded",  "deadline_exceeded",
    "cancelled",   "not_found",    "engine_dead",  "unavailable", "internal",
};
}  // namespace detail

/// The wire name of a code, e.g. "overloaded".
constexpr std::string_view to_string(ErrorCode c) {
  return detail::error_code_names[static_cast<unsigned>(c)];
}

/// Parses a wire name; nullopt for a name this version does not know.
constexpr std::optional<ErrorCode> error_code_from_string(std::string_view s) {
  for (unsigned i = 0; i < detail::error_code_names.size(); ++i)
    if (detail::error_code_names[i] == s) return static_cast<ErrorCode>(i);
  return std::nullopt;
}

}  // namespace sy
