// The spans of a traced job (docs/tracing.md), derived from the timestamps its actors already
// keep: each function appends finished spans to the server's TraceBuffer (core/trace.hpp) and
// does nothing for a job that is not traced or where tracing is off (`buf` null).
#pragma once

#include <cstdint>
#include <string>

#include "core/job.hpp"
#include "core/trace.hpp"

namespace sy {

/// Gives an admitted job its trace: the submit's traceparent, or a new trace where the buffer
/// samples every job; a fresh job span id either way. Programs are not traced.
void trace_admit(TraceBuffer* buf, const SubmitRequest& req, Job& job, int64_t now_us);

/// The job goes to the router now: its `admission` span (arrival to the decision) and, when it
/// was journaled, its `journal commit` span (the decision to the durable accept record).
void trace_enqueue(TraceBuffer* buf, Job& job, bool journaled, int64_t now_us);

/// The job ended before it reached a batcher (the router refused it): its job span, as failed.
void trace_refused(TraceBuffer* buf, const TraceContext& ctx, const std::string& id,
                   const std::string& why, int64_t now_us);

/// One engine step that fed `tokens` prompt tokens of the job from position `from`: a `prefill`
/// span over the step (sent to result).
void trace_prefill(TraceBuffer* buf, const TraceContext& ctx, int64_t sent_us, int64_t done_us,
                   int32_t from, int32_t tokens);

/// The batcher ends the job at `end_us`: its `queue` span (handed to the router to its first
/// scheduled step) and `decode` span (first token to end), with `completion_tokens`.
void trace_generated(TraceBuffer* buf, TraceContext& ctx, int64_t first_sched_us,
                     int64_t first_token_us, int64_t end_us, uint32_t completion_tokens);

/// The job's last message leaves egress at `now_us`: its `delivery` span (the batcher's end to
/// now: the result record's commit where there is a journal, the encoding) and the job span with
/// the gen_ai.* attributes.
void trace_delivered(TraceBuffer* buf, const DoneEvent& d, int64_t now_us);
void trace_delivered(TraceBuffer* buf, const ErrorEvent& e, int64_t now_us);

}  // namespace sy
