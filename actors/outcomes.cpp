// Builders of the events and outcomes that end a job (actors/outcomes.hpp).
#include "actors/outcomes.hpp"

#include <chrono>
#include <utility>

namespace sy {

int64_t clock_us(caf::local_actor* self) {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             self->clock().now().time_since_epoch())
      .count();
}

DoneEvent make_done(const Job& job, FinishReason finish) {
  DoneEvent d;
  d.to = job.client;
  d.uid = job.uid;
  d.id = job.id;
  d.tenant = job.tenant;
  d.finish = finish;
  d.prompt_tokens = static_cast<uint32_t>(job.prompt.size());
  d.trace = job.trace;
  return d;
}

ErrorEvent make_error_event(const ClientRef& to, uint64_t uid, std::string id, std::string tenant,
                            ErrorCode code, std::string message, int64_t retry_after_ms) {
  ErrorEvent e;
  e.to = to;
  e.uid = uid;
  e.id = std::move(id);
  e.tenant = std::move(tenant);
  e.code = code;
  e.message = std::move(message);
  e.retry_after_ms = retry_after_ms;
  return e;
}

ErrorEvent make_error_event(const Job& job, ErrorCode code, std::string message) {
  ErrorEvent e =
      make_error_event(job.client, job.uid, job.id, job.tenant, code, std::move(message));
  e.trace = job.trace;
  return e;
}

JobOutcome make_outcome(const DoneEvent& done) {
  JobOutcome o;
  o.uid = done.uid;
  o.id = done.id;
  o.tenant = done.tenant;
  const bool cancelled = done.finish == FinishReason::cancelled;
  o.outcome = cancelled ? Outcome::cancelled : Outcome::done;
  // A done job carries no error: its code keeps the field's default.
  if (cancelled) o.code = ErrorCode::cancelled;
  o.done = done;
  return o;
}

JobOutcome make_outcome(const ErrorEvent& error) {
  JobOutcome o;
  o.uid = error.uid;
  o.id = error.id;
  o.tenant = error.tenant;
  o.outcome = Outcome::error;
  o.code = error.code;
  o.error = error;
  return o;
}

}  // namespace sy
