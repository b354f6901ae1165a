// Printers of the actor protocol's enums for Boost.Test messages (found by argument-dependent
// lookup): each prints its name, or its number when it is out of range.
#pragma once

#include <ostream>

#include "actors/messages.hpp"

namespace sy {

inline std::ostream& operator<<(std::ostream& o, ErrorCode c) {
  if (static_cast<unsigned>(c) < detail::error_code_names.size()) return o << to_string(c);
  return o << "ErrorCode(" << static_cast<unsigned>(c) << ")";
}

inline std::ostream& operator<<(std::ostream& o, Outcome x) {
  switch (x) {
    case Outcome::done:
      return o << "done";
    case Outcome::error:
      return o << "error";
    case Outcome::cancelled:
      return o << "cancelled";
  }
  return o << "Outcome(" << static_cast<unsigned>(x) << ")";
}

inline std::ostream& operator<<(std::ostream& o, EnqueueResult x) {
  switch (x) {
    case EnqueueResult::accepted:
      return o << "accepted";
    case EnqueueResult::full:
      return o << "full";
    case EnqueueResult::unknown_class:
      return o << "unknown_class";
  }
  return o << "EnqueueResult(" << static_cast<unsigned>(x) << ")";
}

namespace wire {

inline std::ostream& operator<<(std::ostream& o, FinishReason r) {
  if (r <= FinishReason::cancelled) return o << to_string(r);
  return o << "FinishReason(" << static_cast<unsigned>(r) << ")";
}

inline std::ostream& operator<<(std::ostream& o, JobState s) {
  if (s <= JobState::cancelled) return o << to_string(s);
  return o << "JobState(" << static_cast<unsigned>(s) << ")";
}

}  // namespace wire
}  // namespace sy
