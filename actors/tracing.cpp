// The spans of a traced job, from the timestamps admission, the batcher and egress keep
// (actors/tracing.hpp). Attribute names follow the OpenTelemetry GenAI conventions as vLLM
// uses them (docs/tracing.md).
#include "actors/tracing.hpp"

#include <algorithm>
#include <utility>

namespace sy {

namespace {

double seconds_between(int64_t from_us, int64_t to_us) {
  return from_us && to_us && to_us >= from_us ? static_cast<double>(to_us - from_us) / 1e6 : 0.0;
}

// The job span: arrival to `end_us`, child of the caller's span (a root without one).
Span job_span(const TraceContext& ctx, const std::string& id, int64_t end_us) {
  Span s;
  s.trace_id = ctx.trace_id;
  s.span_id = ctx.job_span;
  s.parent_id = ctx.parent_span;
  s.name = "llm_request";
  s.start_us = ctx.arrival_us;
  s.end_us = std::max(ctx.arrival_us, end_us);
  s.str("gen_ai.request.id", id);
  s.str("gen_ai.operation.name", "text_completion");
  s.num("gen_ai.request.max_tokens", ctx.max_tokens);
  s.real("gen_ai.request.temperature", ctx.temperature);
  s.real("gen_ai.request.top_p", ctx.top_p);
  return s;
}

// The delivery span (from the job's end, or now) and the job's own span, to be filled and added.
Span delivered(TraceBuffer& buf, const TraceContext& t, const std::string& id, int64_t now_us) {
  const int64_t from = t.ended_us ? t.ended_us : now_us;
  buf.add(child_span(t, "delivery", from, now_us));
  return job_span(t, id, now_us);
}

}  // namespace

void trace_admit(TraceBuffer* buf, const SubmitRequest& req, Job& job, int64_t now_us) {
  if (!buf || job.is_program()) return;
  const bool has_parent = req.trace.trace_id != TraceId{};
  if (!has_parent && !buf->sample_all()) return;
  TraceContext& t = job.trace;
  t = TraceContext{};
  if (has_parent) {
    t.trace_id = req.trace.trace_id;
    t.parent_span = req.trace.parent_span;
    t.flags = req.trace.flags;
  } else {
    t.trace_id = new_trace_id();
    t.flags = 1;  // sampled: the server chose to record it
  }
  t.job_span = new_span_id();
  t.arrival_us = job.arrival_us;
  t.admitted_us = now_us;
  t.max_tokens = job.max_tokens;
  t.temperature = job.temperature;
  t.top_p = job.top_p;
}

void trace_enqueue(TraceBuffer* buf, Job& job, bool journaled, int64_t now_us) {
  TraceContext& t = job.trace;
  if (!buf || !t.traced()) return;
  t.queued_us = now_us;
  Span a = child_span(t, "admission", t.arrival_us, t.admitted_us);
  a.str("gen_ai.request.id", job.id);
  a.str("switchyard.tenant", job.tenant);
  a.num("gen_ai.usage.prompt_tokens", static_cast<int64_t>(job.prompt.size()));
  buf->add(std::move(a));
  if (journaled) buf->add(child_span(t, "journal commit", t.admitted_us, now_us));
}

void trace_refused(TraceBuffer* buf, const TraceContext& ctx, const std::string& id,
                   const std::string& why, int64_t now_us) {
  if (!buf || !ctx.traced()) return;
  Span s = job_span(ctx, id, now_us);
  s.error = true;
  s.status_message = why;
  buf->add(std::move(s));
}

void trace_prefill(TraceBuffer* buf, const TraceContext& ctx, int64_t sent_us, int64_t done_us,
                   int32_t from, int32_t tokens) {
  if (!buf || !ctx.traced() || tokens <= 0) return;
  Span s = child_span(ctx, "prefill", sent_us, done_us);
  s.num("switchyard.prefill.position", from);
  s.num("switchyard.prefill.tokens", tokens);
  buf->add(std::move(s));
}

void trace_generated(TraceBuffer* buf, TraceContext& ctx, int64_t first_sched_us,
                     int64_t first_token_us, int64_t end_us, uint32_t completion_tokens) {
  if (!buf || !ctx.traced()) return;
  ctx.ended_us = end_us;
  if (first_sched_us) buf->add(child_span(ctx, "queue", ctx.queued_us, first_sched_us));
  if (first_token_us) {
    Span d = child_span(ctx, "decode", first_token_us, end_us);
    d.num("gen_ai.usage.completion_tokens", completion_tokens);
    buf->add(std::move(d));
  }
}

void trace_delivered(TraceBuffer* buf, const DoneEvent& d, int64_t now_us) {
  const TraceContext& t = d.trace;
  if (!buf || !t.traced()) return;
  Span s = delivered(*buf, t, d.id, now_us);
  s.num("gen_ai.usage.prompt_tokens", d.prompt_tokens);
  s.num("gen_ai.usage.input_tokens", d.prompt_tokens);
  s.num("gen_ai.usage.completion_tokens", d.completion_tokens);
  s.num("gen_ai.usage.output_tokens", d.completion_tokens);
  s.num("switchyard.usage.cached_tokens", d.cached_tokens);
  std::vector<std::string> reasons;
  if (d.choices.empty()) {
    reasons.emplace_back(wire::to_string(d.finish));
  } else {
    for (const ChoiceResult& c : d.choices) reasons.emplace_back(wire::to_string(c.finish));
  }
  s.num("gen_ai.usage.num_sequences", std::max<int64_t>(1, static_cast<int64_t>(d.choices.size())));
  s.strs("gen_ai.response.finish_reasons", std::move(reasons));
  // The timings the done message carries (usage: queue_ms, ttft_ms, total_ms), in seconds.
  s.real("gen_ai.latency.time_in_queue", d.queue_ms / 1000.0);
  s.real("gen_ai.latency.time_to_first_token", d.ttft_ms / 1000.0);
  s.real("gen_ai.latency.e2e", seconds_between(t.arrival_us, now_us));
  if (d.finish == FinishReason::cancelled) s.status_message = "cancelled";
  buf->add(std::move(s));
}

void trace_delivered(TraceBuffer* buf, const ErrorEvent& e, int64_t now_us) {
  const TraceContext& t = e.trace;
  if (!buf || !t.traced()) return;
  Span s = delivered(*buf, t, e.id, now_us);
  s.error = true;
  s.status_message = std::string(to_string(e.code)) + ": " + e.message;
  s.str("error.type", std::string(to_string(e.code)));
  buf->add(std::move(s));
}

}  // namespace sy
