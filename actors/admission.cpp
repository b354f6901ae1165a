// The admission actor: authentication, quotas, job-key deduplication, prompt checks, and the
// hand-off of admitted jobs to the router (see admission.hpp for the protocol).
// Its state and the other pieces: admission_state.hpp.
#include "actors/admission.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "actors/admission_state.hpp"
#include "actors/constraint_support.hpp"
#include "actors/journal.hpp"
#include "actors/log.hpp"
#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "actors/router.hpp"
#include "actors/tracing.hpp"
#include "core/error_code.hpp"
#include "core/wire.hpp"
#include "model/chat_template.hpp"
#include "model/llama.hpp"
#include "policies/quota.hpp"
#include "policies/retry.hpp"

namespace sy {

namespace admission_detail {

std::string job_key(const std::string& tenant, const std::string& id) {
  return std::to_string(tenant.size()) + ':' + tenant + id;
}

void return_pull_credit(Self* self, const ClientRef& c) {
  if (uses_pull_credit(c) && self->state.router)
    self->send(self->state.router, pull_atom::value, uint32_t{1});
}

void drop_pending(Self* self, const std::string& key, uint64_t uid, ErrorCode code,
                  const std::string& message, int64_t retry_after_ms) {
  auto& st = self->state;
  auto i = st.records.find(key);
  if (i == st.records.end() || i->second.uid != uid || !i->second.live) return;
  Record rec = std::move(i->second);
  st.records.erase(i);
  st.live.erase(uid);
  if (st.journal && rec.journaled) {
    // Journaled, so its end is too (before the error leaves: the journal holds it until then).
    JobOutcome o =
        make_outcome(make_error_event(rec.client, uid, rec.done.id, rec.tenant, code, message));
    self->send(st.journal, journal_atom::value, std::move(o));
  }
  auto t = st.tenants.find(rec.tenant);
  if (t != st.tenants.end()) t->second.quota.finish(rec.charged, clock_us(self) / 1000);
  settle_tenant(self, rec.tenant);
  send_error(self, rec.client, rec.done.id, rec.tenant, code, message, retry_after_ms, uid);
  for (auto& c : rec.attached)
    send_error(self, c, rec.done.id, rec.tenant, code, message, retry_after_ms, uid);
}

std::optional<std::string> check_basics(Self* self, const SubmitRequest& req, std::size_t& ci) {
  auto& st = self->state;
  ci = st.default_class;
  if (!req.priority.empty()) {
    auto it = std::find_if(st.classes.begin(), st.classes.end(),
                           [&](const policy::PriorityClass& c) { return c.name == req.priority; });
    if (it == st.classes.end()) return "unknown priority class " + wire::quoted(req.priority);
    ci = static_cast<std::size_t>(it - st.classes.begin());
  }
  if (req.max_tokens == 0) return std::string("max_tokens must be at least 1");
  if (req.max_tokens > st.cfg.max_output_tokens)
    return "max_tokens " + std::to_string(req.max_tokens) + " exceeds the limit " +
           std::to_string(st.cfg.max_output_tokens);
  if (!(req.temperature >= 0) || !std::isfinite(req.temperature))
    return std::string("temperature must be a finite number >= 0");
  if (!(req.top_p > 0 && req.top_p <= 1)) return std::string("top_p must be in (0, 1]");
  return std::nullopt;
}

std::optional<std::string> check_controls(Self* self, const SamplingControls& c) {
  if (!(c.min_p >= 0.0f && c.min_p <= 1.0f)) return std::string("min_p must be in [0, 1]");
  if (!(c.presence_penalty >= -2.0f && c.presence_penalty <= 2.0f))
    return std::string("presence_penalty must be in [-2, 2]");
  if (!(c.frequency_penalty >= -2.0f && c.frequency_penalty <= 2.0f))
    return std::string("frequency_penalty must be in [-2, 2]");
  if (!(c.repetition_penalty > 0.0f && c.repetition_penalty <= 10.0f))
    return std::string("repetition_penalty must be in (0, 10]");
  if (c.repeat_last_n < -1) return std::string("repeat_last_n must be >= -1");
  const LlamaModel* model = self->state.model.get();
  const int32_t n_vocab = model ? model->limits().n_vocab : 0;
  for (const auto& [id, bias] : c.logit_bias) {
    if (id < 0 || (n_vocab > 0 && id >= n_vocab))
      return "logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
             std::to_string(n_vocab) + ")";
    if (!(bias >= -100.0f && bias <= 100.0f))
      return "logit_bias of token " + std::to_string(id) + " must be in [-100, 100]";
  }
  return std::nullopt;
}

std::optional<std::string> render_messages(Self* self, const std::vector<chat::Message>& msgs,
                                           std::vector<int32_t>& out) {
  auto& st = self->state;
  const LlamaModel* model = st.model.get();
  if (!model) return std::string("messages need a model with a chat template (none is loaded)");
  if (!st.chat) return st.chat_error;
  const Tokenizer& tok = model->tokenizer();
  chat::RenderOptions opts;
  if (tok.bos() >= 0) opts.bos_token = tok.token_text(tok.bos());
  if (tok.eos() >= 0) opts.eos_token = tok.token_text(tok.eos());
  try {
    out = (*st.chat_tokens)(st.chat->render(msgs, opts));
  } catch (const chat::TemplateRaised& e) {
    return "the chat template refused the messages: " + wire::quoted(e.what());
  } catch (const chat::TemplateError& e) {
    return std::string("the chat template cannot render these messages: ") + e.what();
  } catch (const std::exception& e) {  // a renderer bug must not take the server down
    return std::string("the chat template cannot render these messages: ") + e.what();
  }
  return std::nullopt;
}

}  // namespace admission_detail

namespace {

using namespace admission_detail;

/// A request the gateway counted into the intake meter has left the mailbox.
void taken_from_mailbox(Self* self, uint32_t metered_bytes) {
  if (metered_bytes > 0 && self->state.cfg.intake) self->state.cfg.intake->take(metered_bytes);
}

/// The sampling controls and the constraint of a request, checked against the model: the edge
/// checked their ranges and sizes; the token ids and the constraint's meaning need the vocabulary.
std::optional<std::string> check_generation(Self* self, const SubmitRequest& req) {
  auto& st = self->state;
  if (auto bad = check_controls(self, req.controls)) return bad;
  const LlamaModel* model = st.model.get();
  if (req.constraint.empty()) return std::nullopt;
  if (req.ignore_eos)
    return std::string(
        "ignore_eos and a constraint exclude each other: the constraint decides "
        "where the output may end");
  if (!model)
    return std::string(constraint_kind_name(req.constraint.kind)) +
           ": a constraint needs a model's vocabulary (this server runs without a model)";
  if (!st.cfg.constraints) st.cfg.constraints = make_constraint_support(*model);
  std::string why = check_constraint(*st.cfg.constraints, req.constraint);
  if (why.empty()) return std::nullopt;
  return why;
}

/// Several samples, prompt log-probabilities and a score request's continuations: checked
/// (the edge checked their ranges already; these hold for requests that came another way) and
/// copied into `job`, continuation text tokenized without BOS as text appended to the prompt.
std::optional<std::string> build_samples(Self* self, const SubmitRequest& req, Job& job) {
  auto& st = self->state;
  if (req.n < 1 || req.n > 16) return "n " + std::to_string(req.n) + " out of range [1, 16]";
  if (req.prompt_logprobs < -1 || req.prompt_logprobs > 20)
    return "prompt_logprobs " + std::to_string(req.prompt_logprobs) + " out of range [0, 20]";
  job.n = req.n;
  job.prompt_logprobs = req.prompt_logprobs;
  if (!req.score) return std::nullopt;
  if (req.cont_text.empty() || req.cont_text.size() > 64 ||
      req.cont_ids.size() != req.cont_text.size())
    return std::string("continuations must have 1 to 64 entries");
  const LlamaModel* model = st.model.get();
  const int32_t n_vocab = model ? model->limits().n_vocab : 0;
  std::size_t longest = 0;
  for (std::size_t i = 0; i < req.cont_text.size(); ++i) {
    std::vector<int32_t> ids = req.cont_ids[i];
    if (ids.empty()) {
      // No BOS: the text continues the prompt. An SPM vocabulary still puts its dummy-prefix
      // space in front, as at the start of any text (docs/protocol.md, `score`).
      if (model)
        ids = model->tokenizer().encode(req.cont_text[i], false, false);
      else
        for (unsigned char c : req.cont_text[i]) ids.push_back(c);
    }
    if (ids.empty()) return "continuation at index " + std::to_string(i) + " has no tokens";
    for (int32_t id : ids)
      if (id < 0 || (n_vocab > 0 && id >= n_vocab))
        return "continuation at index " + std::to_string(i) + ": token id " + std::to_string(id) +
               " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")";
    longest = std::max(longest, ids.size());
    job.continuations.push_back(std::move(ids));
  }
  const std::size_t ctx =
      model ? static_cast<std::size_t>(std::max(0, model->limits().ctx_len)) : 0;
  if (ctx > 0 && job.prompt.size() + longest > ctx)
    return "prompt (" + std::to_string(job.prompt.size()) +
           " tokens) and its longest continuation (" + std::to_string(longest) +
           " tokens) exceed the model's context length " + std::to_string(ctx);
  // Nothing is generated: max_tokens stands for the tokens a continuation adds (the batcher's
  // fit check) and the quota counts them all.
  job.max_tokens = static_cast<uint32_t>(longest);
  job.temperature = 0.0f;
  job.logprobs = 0;
  job.stream = false;
  job.stop.clear();
  return std::nullopt;
}

/// Turns the request into a Job, or returns the bad_request message.
std::optional<std::string> build_job(Self* self, const SubmitRequest& req, Job& job) {
  auto& st = self->state;
  std::size_t ci = 0;
  if (auto bad = check_basics(self, req, ci)) return bad;
  const LlamaModel* model = st.model.get();
  if (!req.message_roles.empty()) {
    if (req.message_roles.size() != req.message_contents.size())
      return std::string("messages: every message needs a role and a content");
    std::vector<chat::Message> msgs;
    msgs.reserve(req.message_roles.size());
    for (std::size_t i = 0; i < req.message_roles.size(); ++i)
      msgs.push_back({req.message_roles[i], req.message_contents[i]});
    if (auto bad = render_messages(self, msgs, job.prompt)) return bad;
  } else if (req.prompt_is_ids || !req.prompt_ids.empty()) {
    int n_vocab = model ? model->limits().n_vocab : 0;
    for (auto id : req.prompt_ids)
      if (id < 0 || (n_vocab > 0 && id >= n_vocab))
        return "prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
               std::to_string(n_vocab) + ")";
    job.prompt = req.prompt_ids;
  } else if (model) {
    job.prompt = model->tokenizer().encode(req.prompt_text, true, req.parse_special);
  } else {
    job.prompt.reserve(req.prompt_text.size());
    for (unsigned char c : req.prompt_text) job.prompt.push_back(c);
  }
  if (job.prompt.empty()) return std::string("prompt is empty");
  const std::size_t n = job.prompt.size();
  if (st.cfg.max_prompt_tokens > 0 && n > st.cfg.max_prompt_tokens)
    return "prompt has " + std::to_string(n) + " tokens, limit " +
           std::to_string(st.cfg.max_prompt_tokens);
  uint32_t max_tokens = req.max_tokens;
  if (model) {
    const std::size_t ctx = static_cast<std::size_t>(std::max(0, model->limits().ctx_len));
    if (ctx > 0 && n > ctx) {
      return "prompt has " + std::to_string(n) + " tokens, limit " + std::to_string(ctx) +
             " (the model's context length)";
    }
    // Under a policy whose positions stay inside the cache (sinks) generation may run past the
    // context. Otherwise the whole sequence must fit in it: max_tokens is lowered to the room the
    // prompt leaves, as vLLM and llama-server do, and a job that uses it all ends with finish
    // reason "length" (the batcher ends a sequence at the context anyway). A prompt that fills
    // the context still gets its one token: the last prompt position predicts it.
    if (ctx > 0 && !st.cfg.beyond_context)
      max_tokens = static_cast<uint32_t>(
          std::min<std::size_t>(max_tokens, std::max<std::size_t>(1, ctx - n)));
  }
  job.id = req.id;
  job.tenant = req.tenant;
  job.client = req.client;
  job.class_index = static_cast<uint32_t>(ci);
  job.max_tokens = max_tokens;
  job.temperature = static_cast<float>(req.temperature);
  job.top_k = static_cast<int32_t>(std::min<uint32_t>(req.top_k, 1u << 30));
  job.top_p = static_cast<float>(req.top_p);
  job.stop = req.stop;
  job.ignore_eos = req.ignore_eos;
  job.speculative = req.speculative;
  job.stream = req.stream;
  job.logprobs = req.logprobs;
  if (auto bad = check_generation(self, req)) return bad;
  job.controls = req.controls;
  job.constraint = req.constraint;
  if (auto bad = build_samples(self, req, job)) return bad;
  return std::nullopt;
}

}  // namespace

namespace admission_detail {

/// Hands an admitted job to the router; its "full" answer undoes the admission. A program goes to
/// the program manager instead, which sends its steps to the router.
void enqueue(Self* self, const std::string& key, Job job) {
  auto& st = self->state;
  const uint64_t uid = job.uid;
  bool cancel = false, journaled = false;
  if (auto i = st.records.find(key); i != st.records.end() && i->second.uid == uid) {
    cancel = i->second.cancel_pending;
    i->second.cancel_pending = false;
    journaled = i->second.journaled;
    if (job.is_program()) i->second.pending = false;
  }
  if (job.is_program()) {
    program_start(self, key, std::move(job));
    if (cancel) program_cancel(self, uid);
    return;
  }
  trace_enqueue(st.cfg.traces.get(), job, journaled, clock_us(self));
  // A refused job's span needs its id (copied only for a traced job).
  std::string traced_id = job.trace.traced() ? job.id : std::string();
  const TraceContext tc = job.trace;
  auto on_reply = [self, key, uid, tc, id = std::move(traced_id)](const EnqueueReply& r) {
    auto& s = self->state;
    if (r.result == EnqueueResult::accepted) {
      auto i = s.records.find(key);
      if (i != s.records.end() && i->second.uid == uid) i->second.pending = false;
      return;
    }
    trace_refused(s.cfg.traces.get(), tc, id,
                  r.result == EnqueueResult::full ? "overloaded" : "internal", clock_us(self));
    if (r.result == EnqueueResult::full) {
      ++s.overloaded;
      drop_pending(self, key, uid, ErrorCode::overloaded, "the priority class queue is full",
                   r.retry_after_ms);
    } else {
      drop_pending(self, key, uid, ErrorCode::internal,
                   "the router does not know the job's priority class", -1);
    }
  };
  auto on_error = [self, key, uid](caf::error& err) {
    drop_pending(self, key, uid, ErrorCode::internal,
                 "router unavailable: " + self->system().render(err), -1);
  };
  // The most important class's job goes ahead of the router's normal messages (messages.hpp).
  if (urgent_class(job.class_index))
    self->request<caf::message_priority::high>(st.router, caf::infinite, enqueue_atom::value,
                                               std::move(job))
        .then(std::move(on_reply), std::move(on_error));
  else
    self->request(st.router, caf::infinite, enqueue_atom::value, std::move(job))
        .then(std::move(on_reply), std::move(on_error));
  // Cancelled while it was being journaled: the cancel reaches the router after the job.
  if (cancel) self->send(st.router, cancel_atom::value, uid);
}

}  // namespace admission_detail

namespace {

/// The retry hint of a job refused because the journal cannot write: the journal tries its held
/// writes every 200 ms, and a full disk usually takes an operator seconds to free, so a client
/// coming back sooner than a second would mostly be refused again.
constexpr int64_t kJournalRetryAfterMs = 1000;

/// Journals an admitted job, then enqueues it: a job is accepted only once it is durable.
void journal_then_enqueue(Self* self, const std::string& key, Job job) {
  auto& st = self->state;
  const uint64_t uid = job.uid;
  self->request(st.journal, caf::infinite, journal_atom::value, job)
      .then(
          [self, key, job](uint8_t) {
            auto i = self->state.records.find(key);
            if (i == self->state.records.end() || i->second.uid != job.uid) return;
            i->second.journaled = true;
            enqueue(self, key, job);
          },
          [self, key, uid, client = job.client](caf::error& err) {
            // The journal could not write the job (disk full, I/O error: it answers
            // ErrorCode::unavailable): never accepted, so it leaves no trace and never runs.
            // Worth retrying (here once there is room, or on another server); the reason is the
            // errno's text, never the server's paths. A journal that is gone (any other error)
            // gets the same answer.
            std::string why = "no journal";
            if (err.context().match_elements<std::string>())
              why = err.context().get_as<std::string>(0);
            ++self->state.unavailable;
            drop_pending(self, key, uid, error_code_of(err).value_or(ErrorCode::unavailable),
                         "the server cannot write its journal (" + why +
                             "): the job was not accepted; retry later or on another server",
                         kJournalRetryAfterMs);
            // Never reached the router: the PULL credit it used goes back, or the pipeline input
            // would stop for good once failures had used up the window.
            return_pull_credit(self, client);
          });
}

void submit(Self* self, SubmitRequest& req) {
  auto& st = self->state;
  ++st.submitted;
  if (st.draining) {
    ++st.unavailable;
    send_error(self, req.client, req.id, req.tenant, ErrorCode::unavailable,
               st.operator_drain ? "the server is draining (operator command `drain`): submit "
                                   "to another server or retry after it resumes"
                                 : "the server is shutting down");
    return return_pull_credit(self, req.client);
  }
  std::string why;
  TenantState* tenant = authenticate(self, req.tenant, req.token, false, why);
  if (!tenant) {
    ++st.unauthorized;
    send_error(self, req.client, req.id, req.tenant, ErrorCode::unauthorized, why);
    return return_pull_credit(self, req.client);
  }
  const std::string key = job_key(req.tenant, req.id);
  if (auto i = st.records.find(key); i != st.records.end()) {
    Record& rec = i->second;
    // The request's own parameters are ignored from here on: the key names the job.
    if (rec.live) {
      // Attach: the job's one terminal message goes to this client too, as for a job that is
      // not streamed (full text and ids), whatever its own `stream`; never a second run.
      ++st.deduplicated;
      ++st.attached;
      if (!(req.client == rec.client) &&
          std::find(rec.attached.begin(), rec.attached.end(), req.client) == rec.attached.end())
        rec.attached.push_back(req.client);
      if (is_connected(req.client)) {
        AcceptedEvent a;
        a.to = req.client;
        a.id = req.id;
        a.tenant = req.tenant;
        send_out(self, std::move(a));
      }
      return return_pull_credit(self, req.client);
    }
    // Ended: its stored outcome, without an `accepted` (done, cancelled ones included, or the
    // error a failed one ended with), for as long as the key is remembered. A job key runs at
    // most once; running it again needs a new id.
    ++st.deduplicated;
    if (rec.state == JobState::failed) {
      ErrorEvent e = rec.error;
      e.to = req.client;
      if (e.id.empty()) e.id = req.id;
      if (e.tenant.empty()) e.tenant = req.tenant;
      send_out(self, std::move(e));
    } else {
      DoneEvent d = rec.done;
      d.to = req.client;
      send_out(self, std::move(d));
    }
    return return_pull_credit(self, req.client);
  }
  if (!req.program.empty() && st.programs.size() >= st.cfg.max_programs) {
    // Each running program holds its walk here: beyond the bound it waits at the client. A
    // program takes seconds, so a second is the retry hint's order.
    ++st.overloaded;
    send_error(self, req.client, req.id, req.tenant, ErrorCode::overloaded,
               "the server runs " + std::to_string(st.programs.size()) +
                   " programs, its limit (admission.max_programs)",
               1000);
    return return_pull_credit(self, req.client);
  }
  Job job;
  uint32_t cost = 0;
  if (auto bad =
          req.program.empty() ? build_job(self, req, job) : build_program(self, req, job, cost)) {
    ++st.bad_request;
    send_error(self, req.client, req.id, req.tenant, ErrorCode::bad_request, *bad);
    return return_pull_credit(self, req.client);
  }
  const int64_t now_us = clock_us(self);
  const int64_t now_ms = now_us / 1000;
  if (!job.is_program()) cost = job_token_cost(job);
  auto verdict = tenant->quota.admit(cost, now_ms);
  if (verdict.verdict != policy::QuotaDecision::admit) {
    ++st.rate_limited;
    std::string msg;
    int64_t retry = 0;
    if (verdict.verdict == policy::QuotaDecision::too_many_in_flight) {
      msg = "tenant " + wire::quoted(req.tenant) + " has " +
            std::to_string(tenant->quota.in_flight().current()) + " jobs in flight (limit " +
            std::to_string(tenant->quota.in_flight().limit()) + ")";
      // One of the tenant's jobs must end first: about one completion at the measured rate.
      retry = policy::retry_after_ms(1, st.drain->jobs_per_s(now_ms), st.retry);
    } else {
      msg = "tenant " + wire::quoted(req.tenant) + " is over its token-rate quota (" +
            std::to_string(cost) + " tokens asked)";
      retry = std::max<int64_t>(1, verdict.retry_after_ms);
    }
    send_error(self, req.client, req.id, req.tenant, ErrorCode::rate_limited, msg, retry);
    return return_pull_credit(self, req.client);
  }
  job.uid = st.next_uid++;
  job.arrival_us = req.arrival_us > 0 ? req.arrival_us : now_us;
  job.deadline_us = req.deadline_ms > 0 ? job.arrival_us + int64_t{req.deadline_ms} * 1000 : 0;
  job.seed = req.has_seed ? req.seed : job.uid;  // unseeded jobs still differ from each other
  trace_admit(st.cfg.traces.get(), req, job, now_us);
  Record rec;
  rec.uid = job.uid;
  rec.client = req.client;
  rec.outlive_shutdown = req.outlive_shutdown;
  rec.charged = cost;
  rec.tenant = req.tenant;
  rec.class_index = job.class_index;
  rec.done.id = req.id;  // kept for error replies before the job ends
  st.records[key] = std::move(rec);
  st.live[job.uid] = key;
  ++st.admitted;
  if (!st.router) {
    drop_pending(self, key, job.uid, ErrorCode::internal, "no router", -1);
    return;
  }
  // Cluster jobs are not journaled: JetStream holds them until their result is stored
  // (docs/durability.md); nor are HTTP requests no client can come back for (journal false).
  if (st.journal && req.journal && job.client.kind != ClientRef::cluster)
    return journal_then_enqueue(self, key, std::move(job));
  job.journaled = false;
  enqueue(self, key, std::move(job));
}

AdmissionStats stats(Self* self) {
  auto& st = self->state;
  AdmissionStats s;
  auto n = [](auto v) { return static_cast<int64_t>(v); };
  s.submitted = n(st.submitted);
  s.admitted = n(st.admitted);
  s.unauthorized = n(st.unauthorized);
  s.rate_limited = n(st.rate_limited);
  s.overloaded = n(st.overloaded);
  s.bad_request = n(st.bad_request);
  s.deduplicated = n(st.deduplicated);
  s.attached = n(st.attached);
  s.finished = n(st.finished);
  s.not_found = n(st.not_found);
  s.unavailable = n(st.unavailable);
  s.draining = st.draining ? 1 : 0;
  s.active = n(st.live.size());
  s.remembered = n(st.records.size());
  s.remembered_bytes = n(st.ended_bytes);
  s.tenants = n(st.tenants.size());
  s.tenants_idle = n(st.idle.size());
  s.tenants_forgotten = n(st.tenants_forgotten);
  s.replayed = n(st.replayed);
  s.restored = n(st.restored);
  s.programs_started = n(st.programs_started);
  s.programs_resumed = n(st.programs_resumed);
  s.programs_done = n(st.programs_done);
  s.programs_failed = n(st.programs_failed);
  s.programs_cancelled = n(st.programs_cancelled);
  s.programs_active = n(st.programs.size());
  s.program_steps = n(st.program_steps);
  s.program_steps_restored = n(st.program_steps_restored);
  s.program_prompt_tokens = n(st.program_prompt_tokens);
  s.program_cached_tokens = n(st.program_cached_tokens);
  s.program_completion_tokens = n(st.program_completion_tokens);
  s.program_tool_calls = n(st.program_tool_calls);
  s.program_tool_timeouts = n(st.program_tool_timeouts);
  return s;
}

// Parses the chat template once: the configured override, else the model file's. A template
// that cannot be parsed leaves the server serving `prompt` jobs; `messages` jobs get chat_error,
// which is also logged here, once.
void load_chat_template(AdmissionState& st) {
  if (!st.model) return;
  std::string text = st.cfg.chat_template;
  std::string from = st.cfg.chat_template_source.empty() ? std::string("--chat-template")
                                                         : "'" + st.cfg.chat_template_source + "'";
  if (text.empty()) {
    if (auto t = st.model->file().get_string("tokenizer.chat_template")) text = *t;
    from = "the model file's tokenizer.chat_template";
    if (text.empty()) {
      st.chat_error =
          "the model has no chat template (no tokenizer.chat_template in the file): send "
          "'prompt', or start the server with --chat-template NAME|FILE";
      return;
    }
  }
  try {
    st.chat = std::make_shared<const chat::ChatTemplate>(text);
    st.chat_tokens = std::make_shared<const chat::PromptTokenizer>(st.model->tokenizer());
  } catch (const std::exception& e) {  // TemplateError; anything else is a renderer bug
    st.chat_error = "the chat template (" + from + ") cannot be used: " + e.what();
    log::warn(st.chat_error + "; jobs with 'messages' get bad_request, 'prompt' jobs are served");
  }
}

AdmissionActor::behavior_type admission_actor(
    Self* self, AdmissionConfig cfg, std::vector<policy::PriorityClass> classes,
    std::size_t default_class, std::shared_ptr<const LlamaModel> model, RouterActor router,
    EgressActor egress, JournalActor journal, std::shared_ptr<const JournalReplay> replay) {
  auto& st = self->state;
  auto now_ms = clock_us(self) / 1000;
  st.anonymous = cfg.tenants.empty() && cfg.allow_anonymous;
  for (auto& t : cfg.tenants)
    st.tenants.emplace(t.name, TenantState{t.token, t.weight,
                                           policy::TenantQuota(t.tokens_per_second, t.burst_tokens,
                                                               t.max_in_flight, now_ms),
                                           true});
  // The router learns of admission from admission itself, before any job: messages from one
  // sender arrive in order, so no enqueue (a replayed job's, in the init below) can overtake
  // this, and a job the router ends early (a replayed job whose deadline passed) is reported.
  if (router) {
    TenantWeights w;
    for (auto& t : cfg.tenants) {
      w.names.push_back(t.name);
      w.weights.push_back(t.weight);
    }
    self->send(router, connect_atom::value, AdmissionActor(self), std::move(w));
  }
  st.cfg = std::move(cfg);
  st.classes = std::move(classes);
  st.default_class = default_class;
  st.model = std::move(model);
  load_chat_template(st);
  st.router = std::move(router);
  st.egress = std::move(egress);
  st.drain.emplace(now_ms, st.retry);
  st.journal = std::move(journal);
  if (replay) {
    restore(self, *replay);
    if (!st.replay.empty()) self->send(self, tick_atom::value);
  }
  return {
      [self](tick_atom) { replay_next(self); },
      [self](submit_atom, SubmitRequest& req) {
        if (self->state.cfg.test_stall_ms > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(self->state.cfg.test_stall_ms));
        taken_from_mailbox(self, req.metered_bytes);
        const std::string tenant = req.tenant;
        submit(self, req);
        settle_tenant(self, tenant);
      },
      // The atom decides what is asked, whatever `kind` says.
      [self](cancel_atom, KeyRequest& k) {
        taken_from_mailbox(self, k.metered_bytes);
        k.kind = KeyRequest::cancel;
        key_request(self, k);
        settle_tenant(self, k.tenant);
      },
      [self](status_atom, KeyRequest& k) {
        taken_from_mailbox(self, k.metered_bytes);
        k.kind = KeyRequest::status;
        key_request(self, k);
        settle_tenant(self, k.tenant);
      },
      [self](finished_atom, JobOutcome& o) {
        if (!program_step_ended(self, o)) finished(self, o);
      },
      [self](tool_atom, ToolResultRequest& r) {
        taken_from_mailbox(self, r.metered_bytes);
        program_tool_result(self, r);
        settle_tenant(self, r.tenant);
      },
      [self](tool_atom, uint64_t uid) { program_timer(self, uid); },
      [self](drain_atom) {
        self->state.draining = true;
        self->state.operator_drain = false;
      },
      // `switchyard ctl drain` / `resume`: no new work while on; queued and running jobs finish.
      [self](drain_atom, bool on) {
        self->state.draining = on;
        self->state.operator_drain = on;
      },
      [self](observe_atom, MetricsActor& observer) { self->state.observer = std::move(observer); },
      // Shutdown after the grace period (server/server.cpp): every live job is cancelled, so
      // queued ones never run and running ones end within a step with done finish=cancelled.
      [self](cancel_atom, drain_atom) {
        std::vector<uint64_t> uids;
        for (auto& [uid, key] : self->state.live) {
          // A journaled job that asked to outlive the shutdown stays unfinished in the journal:
          // the next start runs it again (SubmitRequest::outlive_shutdown).
          auto r = self->state.records.find(key);
          if (r != self->state.records.end() && r->second.outlive_shutdown && r->second.journaled)
            continue;
          uids.push_back(uid);
        }
        for (uint64_t uid : uids)
          if (!program_cancel(self, uid) && self->state.router)
            self->send(self->state.router, cancel_atom::value, uid);
      },
      [self](stats_atom) { return stats(self); },
  };
}

}  // namespace

namespace {
AdmissionActor spawn_admission_impl(caf::actor_system& sys, AdmissionConfig cfg,
                                    std::vector<policy::PriorityClass> classes,
                                    std::string default_class,
                                    std::shared_ptr<const LlamaModel> model, RouterActor router,
                                    EgressActor egress, JournalActor journal,
                                    std::shared_ptr<const JournalReplay> replay);
}  // namespace

AdmissionActor spawn_admission(caf::actor_system& sys, AdmissionConfig cfg,
                               std::vector<policy::PriorityClass> classes,
                               std::string default_class, std::shared_ptr<const LlamaModel> model,
                               RouterActor router, EgressActor egress) {
  return spawn_admission_impl(sys, std::move(cfg), std::move(classes), std::move(default_class),
                              std::move(model), std::move(router), std::move(egress),
                              JournalActor{}, nullptr);
}

AdmissionActor spawn_admission(caf::actor_system& sys, AdmissionConfig cfg,
                               std::vector<policy::PriorityClass> classes,
                               std::string default_class, std::shared_ptr<const LlamaModel> model,
                               RouterActor router, EgressActor egress, JournalActor journal,
                               const JournalReplay& replay) {
  return spawn_admission_impl(sys, std::move(cfg), std::move(classes), std::move(default_class),
                              std::move(model), std::move(router), std::move(egress),
                              std::move(journal), std::make_shared<const JournalReplay>(replay));
}

namespace {
AdmissionActor spawn_admission_impl(caf::actor_system& sys, AdmissionConfig cfg,
                                    std::vector<policy::PriorityClass> classes,
                                    std::string default_class,
                                    std::shared_ptr<const LlamaModel> model, RouterActor router,
                                    EgressActor egress, JournalActor journal,
                                    std::shared_ptr<const JournalReplay> replay) {
  classes = effective_classes(std::move(classes));
  std::size_t def = 0;
  if (!default_class.empty()) {
    auto it = std::find_if(classes.begin(), classes.end(),
                           [&](const policy::PriorityClass& c) { return c.name == default_class; });
    if (it == classes.end())
      throw std::invalid_argument("default class '" + default_class + "' is not a priority class");
    def = static_cast<std::size_t>(it - classes.begin());
  }
  return sys.spawn(admission_actor, std::move(cfg), std::move(classes), def, std::move(model),
                   router, std::move(egress), std::move(journal), std::move(replay));
}
}  // namespace

}  // namespace sy
