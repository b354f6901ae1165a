// The egress actor: outbound events -> wire structs -> msgpack bytes -> the gateway's outbox.
#include "ingress/egress.hpp"

#include <algorithm>
#include <caf/all.hpp>

#include "actors/outcomes.hpp"
#include "actors/tracing.hpp"
#include "ingress/codec.hpp"
#include "model/unicode_cats.hpp"

namespace sy {
namespace {

// Unflattens per-token logprobs: logprob[i] is token i's own, and top_ids/top_logprobs hold
// n_top entries per token.
std::vector<wire::TokenLogprobs> unflatten(const std::vector<float>& logprob, uint32_t n_top,
                                           const std::vector<int32_t>& top_ids,
                                           const std::vector<float>& top_logprobs) {
  std::vector<wire::TokenLogprobs> out(logprob.size());
  for (size_t i = 0; i < logprob.size(); ++i) {
    out[i].logprob = logprob[i];
    for (uint32_t k = 0; k < n_top; ++k) {
      size_t j = i * n_top + k;
      if (j >= top_ids.size() || j >= top_logprobs.size()) break;
      out[i].top.push_back({top_ids[j], top_logprobs[j]});
    }
  }
  return out;
}

OutMessage make(const ClientRef& to, const std::string& id, const std::string& tenant,
                bool terminal, const wire::ServerMessage& m) {
  return OutMessage{to, id, tenant, terminal, wire::encode_server(m)};
}

}  // namespace

OutMessage encode_event(const AcceptedEvent& e) {
  return make(e.to, e.id, e.tenant, false, wire::Accepted{e.id, e.queue_position, e.tenant});
}

OutMessage encode_event(const TokensEvent& e) {
  wire::Tokens t;
  t.id = e.id;
  t.index = e.index;
  t.ids = e.ids;
  t.text = sanitize_utf8(e.text);  // wire text is a msgpack str: always valid UTF-8
  t.logprobs = unflatten(e.logprob, e.n_top, e.top_ids, e.top_logprobs);
  t.tenant = e.tenant;
  t.choice = e.choice;
  t.step = e.step;
  return make(e.to, e.id, e.tenant, false, t);
}

OutMessage encode_event(const DoneEvent& e) {
  wire::Done d;
  d.id = e.id;
  d.tenant = e.tenant;
  d.finish_reason = e.finish <= FinishReason::cancelled ? e.finish : FinishReason::stop;
  d.text = sanitize_utf8(e.text);
  d.ids = e.ids;
  d.usage = {e.prompt_tokens, e.completion_tokens, e.cached_tokens};
  d.timings = {e.queue_ms, e.ttft_ms, e.total_ms};
  // Present only for jobs that asked for logprobs and were not streamed (the batcher clears
  // them for a streamed job on the request endpoint: its chunks carried them).
  d.logprobs = unflatten(e.logprob, e.n_top, e.top_ids, e.top_logprobs);
  for (const ChoiceResult& c : e.choices) {
    wire::Choice w;
    w.index = c.index;
    w.finish_reason = c.finish <= FinishReason::cancelled ? c.finish : FinishReason::stop;
    w.text = sanitize_utf8(c.text);
    w.ids = c.ids;
    w.logprobs = unflatten(c.logprob, e.n_top, c.top_ids, c.top_logprobs);
    d.choices.push_back(std::move(w));
  }
  const std::vector<wire::TokenLogprobs> plp =
      unflatten(e.prompt_logprob, e.prompt_n_top, e.prompt_top_ids, e.prompt_top_logprobs);
  for (size_t i = 0; i < plp.size(); ++i) {
    wire::PromptLogprob p;
    p.id = i < e.prompt_ids.size() ? e.prompt_ids[i] : 0;
    p.logprob = plp[i].logprob;
    p.top = plp[i].top;
    d.prompt_logprobs.push_back(std::move(p));
  }
  for (const ScoreResult& r : e.scores)
    d.scores.push_back(
        {r.index, r.logprob, r.tokens ? r.logprob / static_cast<double>(r.tokens) : 0.0, r.tokens});
  d.vars = e.vars;
  for (wire::Var& v : d.vars)
    for (std::string& x : v.values) x = sanitize_utf8(x);
  d.steps = e.steps;
  return make(e.to, e.id, e.tenant, true, d);
}

OutMessage encode_event(const ErrorEvent& e) {
  wire::Error w;
  w.id = e.id;
  w.tenant = e.tenant;
  // An out-of-range code is a bug upstream; say so rather than send an unknown name.
  w.code = e.code <= ErrorCode::internal ? e.code : ErrorCode::internal;
  w.message = sanitize_utf8(e.message);
  if (e.retry_after_ms >= 0)
    w.retry_after_ms = static_cast<uint32_t>(std::min<int64_t>(e.retry_after_ms, UINT32_MAX));
  return make(e.to, e.id, e.tenant, true, w);
}

OutMessage encode_event(const StatusEvent& e) {
  wire::StatusReply s;
  s.id = e.id;
  s.state = e.state <= JobState::cancelled ? e.state : JobState::queued;
  s.queue_position = e.queue_position;
  s.completion_tokens = e.completion_tokens;
  s.tenant = e.tenant;
  return make(e.to, e.id, e.tenant, false, s);
}

OutMessage encode_event(const StepEvent& e) {
  return make(e.to, e.id, e.tenant, false,
              wire::Step{e.id, e.tenant, e.step, e.name, e.kind, sanitize_utf8(e.output)});
}

OutMessage encode_event(const ToolCallEvent& e) {
  OutMessage m = make(e.to, e.id, e.tenant, false,
                      wire::ToolCall{e.id, e.tenant, e.call, e.name, sanitize_utf8(e.arguments)});
  m.to_sink = true;
  return m;
}

OutMessage encode_event(const ControlEvent& e) {
  // Not terminal: a control reply belongs to no job, so the gateway has nothing to forget.
  return make(e.to, "", "", false, wire::ControlReply{e.command, sanitize_utf8(e.result)});
}

EgressActor spawn_egress(caf::actor_system& sys, std::shared_ptr<Outbox> outbox,
                         std::shared_ptr<TraceBuffer> traces) {
  return sys.spawn([outbox, traces](EgressActor::pointer self) -> EgressActor::behavior_type {
    // The results socket carries only done and error: other events for pipeline jobs are dropped.
    auto to_router = [](const ClientRef& c) { return is_connected(c); };
    return {
        [=](out_atom, const AcceptedEvent& e) {
          if (to_router(e.to)) outbox->post(encode_event(e));
        },
        [=](out_atom, const TokensEvent& e) {
          // A cluster job's chunks go to its reply subject (the node drops them when none).
          if (to_router(e.to) || e.to.kind == ClientRef::cluster) outbox->post(encode_event(e));
        },
        [=](out_atom, const DoneEvent& e) {
          outbox->post(encode_event(e));
          if (traces && e.trace.traced()) trace_delivered(traces.get(), e, clock_us(self));
        },
        [=](out_atom, const ErrorEvent& e) {
          outbox->post(encode_event(e));
          if (traces && e.trace.traced()) trace_delivered(traces.get(), e, clock_us(self));
        },
        [=](out_atom, const StatusEvent& e) {
          if (to_router(e.to)) outbox->post(encode_event(e));
        },
        [=](out_atom, const ControlEvent& e) {
          if (to_router(e.to)) outbox->post(encode_event(e));
        },
        // Step events go to request clients only; a tool call also to the pipeline's sink,
        // whose tool worker answers it on the request endpoint (docs/programs.md).
        [=](out_atom, const StepEvent& e) {
          if (to_router(e.to)) outbox->post(encode_event(e));
        },
        [=](out_atom, const ToolCallEvent& e) {
          if (to_router(e.to) || e.to.kind == ClientRef::pipeline) outbox->post(encode_event(e));
        },
        [=](pull_atom, uint32_t n) { outbox->add_pull_credit(n); },
    };
  });
}

}  // namespace sy
