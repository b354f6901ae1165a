// The events and the JobOutcome that end a job, built in one place for every actor that ends
// jobs (router, batchers, admission), and the actor-clock time base they stamp.
#pragma once

#include <cstdint>
#include <string>

#include "actors/messages.hpp"

namespace sy {

/// Microseconds on `self`'s actor clock (the steady clock in a running system; the test
/// coordinator's clock under caf::scheduler::test_coordinator).
int64_t clock_us(caf::local_actor* self);

/// The DoneEvent of `job` with its addressing (client, uid, id, tenant), `finish` and
/// prompt_tokens (the job's prompt length); the caller adds completion, usage and timings.
DoneEvent make_done(const Job& job, FinishReason finish);

/// An ErrorEvent addressed to `to` for job (uid, id, tenant).
ErrorEvent make_error_event(const ClientRef& to, uint64_t uid, std::string id, std::string tenant,
                            ErrorCode code, std::string message, int64_t retry_after_ms = -1);

/// An ErrorEvent addressed to `job`'s client.
ErrorEvent make_error_event(const Job& job, ErrorCode code, std::string message);

/// The JobOutcome of a job that ended with `done`: Outcome::cancelled (code
/// ErrorCode::cancelled) when its finish is cancelled, else Outcome::done. tokens_used stays 0
/// for the caller to set.
JobOutcome make_outcome(const DoneEvent& done);

/// The JobOutcome of a job that ended with `error`: Outcome::error with the error's code.
/// tokens_used stays 0 for the caller to set.
JobOutcome make_outcome(const ErrorEvent& error);

}  // namespace sy
