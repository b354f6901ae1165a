// The wire protocol's plain parts that need a body: the names of its enums and the quoting of
// client text in error messages. No msgpack here (ingress/codec.cpp encodes); every layer links it.
#include "core/wire.hpp"

#include <cstdio>

namespace sy::wire {

std::string_view to_string(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
  }
  return "stop";
}

std::optional<FinishReason> finish_reason_from_string(std::string_view s) {
  if (s == "stop") return FinishReason::stop;
  if (s == "length") return FinishReason::length;
  if (s == "cancelled") return FinishReason::cancelled;
  return std::nullopt;
}

std::string_view to_string(JobState s) {
  switch (s) {
    case JobState::queued:
      return "queued";
    case JobState::running:
      return "running";
    case JobState::done:
      return "done";
    case JobState::failed:
      return "failed";
    case JobState::cancelled:
      return "cancelled";
  }
  return "queued";
}

std::optional<JobState> job_state_from_string(std::string_view s) {
  if (s == "queued") return JobState::queued;
  if (s == "running") return JobState::running;
  if (s == "done") return JobState::done;
  if (s == "failed") return JobState::failed;
  if (s == "cancelled") return JobState::cancelled;
  return std::nullopt;
}

std::string quoted(std::string_view s) {
  // 64 bytes: the message must stay small however large the input.
  constexpr std::size_t kMaxEcho = 64;
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < kMaxEcho; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > kMaxEcho) out += "...";
  out += "'";
  return out;
}

}  // namespace sy::wire
