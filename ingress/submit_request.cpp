// The conversion of a decoded wire `submit` into admission's SubmitRequest (submit_request.hpp).
#include "ingress/submit_request.hpp"

namespace sy {

SubmitRequest to_request(wire::Submit&& s, ClientRef client) {
  SubmitRequest r;
  r.client = std::move(client);
  r.id = std::move(s.id);
  r.tenant = std::move(s.tenant);
  r.token = std::move(s.token);
  if (s.prompt_is_tokens()) {
    r.prompt_is_ids = true;
    r.prompt_ids = std::move(std::get<1>(s.prompt));
  } else {
    r.prompt_text = std::move(std::get<0>(s.prompt));
  }
  for (auto& m : s.messages) {
    r.message_roles.push_back(std::move(m.role));
    r.message_contents.push_back(std::move(m.content));
  }
  r.parse_special = s.parse_special;
  r.max_tokens = s.max_tokens;
  r.temperature = s.temperature;
  r.top_k = s.top_k;
  r.top_p = s.top_p;
  r.has_seed = s.seed.has_value();
  r.seed = s.seed.value_or(0);
  r.stop = std::move(s.stop);
  r.ignore_eos = s.ignore_eos;
  r.speculative = parse_spec_mode(s.speculative).value_or(SpecMode::server_default);
  r.priority = std::move(s.priority);
  r.deadline_ms = s.deadline_ms;
  // Pipeline results carry only done/error: streaming makes no sense there.
  r.stream = r.client.kind != ClientRef::pipeline && s.stream;
  r.logprobs = s.logprobs;
  r.controls = std::move(s.controls);
  r.constraint = std::move(s.constraint);
  r.n = s.n;
  r.prompt_logprobs = s.prompt_logprobs ? static_cast<int32_t>(*s.prompt_logprobs) : -1;
  r.score = s.score;
  for (auto& c : s.continuations) {
    if (auto* text = std::get_if<std::string>(&c)) {
      r.cont_text.push_back(std::move(*text));
      r.cont_ids.emplace_back();
    } else {
      r.cont_text.emplace_back();
      r.cont_ids.push_back(std::move(std::get<std::vector<int32_t>>(c)));
    }
  }
  r.program = std::move(s.program);
  r.inputs = std::move(s.inputs);
  // Checked by the codec (and the HTTP door): an invalid one never gets here.
  if (!s.trace.empty()) parse_traceparent(s.trace, r.trace);
  r.arrival_us = now_us();
  return r;
}

}  // namespace sy
