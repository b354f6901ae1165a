// The admission actor: authentication, quotas, job-key deduplication, prompt checks, and the
// hand-off of admitted jobs to the router (see admission.hpp for the protocol).
#include "actors/admission.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <iostream>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>

#include "actors/journal.hpp"
#include "actors/log.hpp"
#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "actors/router.hpp"
#include "ingress/codec.hpp"
#include "ingress/error_code.hpp"
#include "model/chat_template.hpp"
#include "model/llama.hpp"
#include "policies/quota.hpp"
#include "policies/retry.hpp"

namespace sy {

bool tokens_equal(std::string_view a, std::string_view b) {
  // Every byte position up to the longer length is visited and differences are OR-ed, so the
  // time does not reveal the length of a matching prefix.
  const std::size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

struct TenantState {
  std::string token;
  double weight = 1.0;
  policy::TenantQuota quota;
  bool configured = false;  // false: a name met in open-tenant mode, forgotten when idle
  // While it has no job in flight (unknown tenants only): its place in AdmissionState::idle,
  // and since when it is idle.
  bool idle = false;
  std::list<std::string>::iterator idle_at{};
  int64_t idle_since_ms = 0;
};

/// One job key: live (pending at the router, queued or running) or ended (kept for resubmission
/// and status until evicted).
struct Record {
  uint64_t uid = 0;
  bool live = true;
  bool pending = true;  // the router has not answered the enqueue yet
  JobState state = JobState::queued;
  ClientRef client;
  std::vector<ClientRef> attached;  // later submitters of the same key
  uint32_t charged = 0;             // tokens taken from the tenant's bucket
  std::string tenant;
  uint32_t class_index = 0;     // for the metrics actor's per-class counts
  bool journaled = false;       // its accept record is durable: its end must be journaled too
  bool cancel_pending = false;  // cancelled while being journaled: cancel once enqueued
  DoneEvent done;
  ErrorEvent error;
};

/// An ended key in the result cache's eviction order, with what its record was counted as.
struct Ended {
  std::string key;
  uint64_t uid = 0;
  std::size_t bytes = 0;
};

struct AdmissionState {
  AdmissionConfig cfg;
  std::vector<policy::PriorityClass> classes;
  std::size_t default_class = 0;
  std::shared_ptr<const LlamaModel> model;
  // The chat template for `messages` submits, or why there is none usable (chat_error).
  std::shared_ptr<const chat::ChatTemplate> chat;
  std::shared_ptr<const chat::PromptTokenizer> chat_tokens;  // for the model's vocabulary
  std::string chat_error;
  caf::actor router, egress;
  caf::actor observer;     // the metrics actor (observe_atom): a copy of every JobOutcome
  caf::actor journal;      // null: no journal
  std::deque<Job> replay;  // journaled jobs of the previous run, not yet back in the router
  bool replay_busy = false;
  uint64_t replayed = 0, restored = 0;
  std::unordered_map<std::string, TenantState> tenants;
  std::list<std::string> idle;  // unknown tenants without a job in flight, longest idle first
  uint64_t tenants_forgotten = 0;
  bool anonymous = false;
  std::unordered_map<std::string, Record> records;  // by job key
  std::unordered_map<uint64_t, std::string> live;   // uid -> job key
  std::deque<Ended> ended;                          // eviction order, oldest first
  std::size_t ended_bytes = 0;                      // sum of ended[].bytes
  std::optional<policy::DrainRate> drain;
  policy::RetryConfig retry;
  uint64_t next_uid = 1;
  bool draining = false;
  bool operator_drain = false;  // draining by `ctl drain` (else: shutdown)
  uint64_t submitted = 0, admitted = 0, unauthorized = 0, rate_limited = 0, overloaded = 0,
           bad_request = 0, deduplicated = 0, attached = 0, finished = 0, not_found = 0,
           unavailable = 0;

  static inline const char* name = "sy.admission";
};

using Self = caf::stateful_actor<AdmissionState>;

// The tenant's length first, so that no (tenant, id) pair can collide with another.
std::string job_key(const std::string& tenant, const std::string& id) {
  return std::to_string(tenant.size()) + ':' + tenant + id;
}

void send_out(Self* self, auto ev) {
  if (self->state.egress) self->send(self->state.egress, out_atom::value, std::move(ev));
}

void send_error(Self* self, const ClientRef& to, const std::string& id, const std::string& tenant,
                ErrorCode code, std::string message, int64_t retry_after_ms = -1,
                uint64_t uid = 0) {
  send_out(self, make_error_event(to, uid, id, tenant, code, std::move(message), retry_after_ms));
}

/// A request the gateway counted into the intake meter has left the mailbox.
void taken_from_mailbox(Self* self, uint32_t metered_bytes) {
  if (metered_bytes > 0 && self->state.cfg.intake) self->state.cfg.intake->take(metered_bytes);
}

/// A pipeline submit answered here never reaches the router: give its PULL credit back.
void return_pull_credit(Self* self, const ClientRef& c) {
  if (c.kind == ClientRef::pipeline && self->state.router)
    self->send(self->state.router, pull_atom::value, uint32_t{1});
}

/// The tenant if known and the token matches, else nullptr and the reason in `why`.
TenantState* authenticate(Self* self, const std::string& tenant, const std::string& token,
                          bool internal, std::string& why) {
  auto& st = self->state;
  auto i = st.tenants.find(tenant);
  if (i == st.tenants.end()) {
    if (!st.anonymous) {
      why = "unknown tenant " + wire::quoted(tenant);
      return nullptr;
    }
    // Anonymous mode: every tenant name is its own unlimited tenant of weight 1.
    auto now_ms = clock_us(self) / 1000;
    i = st.tenants.emplace(tenant, TenantState{"", 1.0, policy::TenantQuota(0, 0, 0, now_ms)})
            .first;
  }
  if (!internal && !i->second.token.empty() && !tokens_equal(i->second.token, token)) {
    why = "wrong token for tenant " + wire::quoted(tenant);
    return nullptr;
  }
  return &i->second;
}

/// Forgets idle unknown tenants: those idle for cfg.tenant_idle_ms, and the longest idle beyond
/// cfg.max_idle_tenants. One whose token bucket is still refilling is kept (forgetting it would
/// hand it a full bucket early); unknown tenants have unlimited buckets, so this is for safety.
void forget_idle_tenants(Self* self, int64_t now_ms) {
  auto& st = self->state;
  std::size_t refilling = 0;  // moved to the back this time: each is looked at once at most
  while (!st.idle.empty()) {
    auto t = st.tenants.find(st.idle.front());
    if (t == st.tenants.end()) {  // cannot happen: every entry of `idle` names a tenant
      st.idle.pop_front();
      continue;
    }
    TenantState& ts = t->second;
    const bool over = st.idle.size() > st.cfg.max_idle_tenants;
    if (!over && now_ms - ts.idle_since_ms < st.cfg.tenant_idle_ms) break;  // the rest are younger
    auto& b = ts.quota.bucket();
    if (!b.unlimited() && b.level(now_ms) < b.burst()) {
      // Look again once it could be full; meanwhile the next one may go.
      st.idle.splice(st.idle.end(), st.idle, ts.idle_at);
      ts.idle_since_ms = now_ms;
      if (!over || ++refilling >= st.idle.size()) break;
      continue;
    }
    st.idle.pop_front();
    st.tenants.erase(t);
    ++st.tenants_forgotten;
  }
}

/// Called after anything that may have changed whether an unknown tenant has jobs in flight:
/// one without any joins the end of the idle list (or moves there: it was just used), one with
/// some leaves it. Then the idle ones due are forgotten.
void settle_tenant(Self* self, const std::string& name) {
  auto& st = self->state;
  const int64_t now_ms = clock_us(self) / 1000;
  auto t = st.tenants.find(name);
  if (t != st.tenants.end() && !t->second.configured) {
    TenantState& ts = t->second;
    if (ts.idle) st.idle.erase(ts.idle_at);
    ts.idle = ts.quota.in_flight().current() == 0;
    if (ts.idle) {
      ts.idle_at = st.idle.insert(st.idle.end(), name);
      ts.idle_since_ms = now_ms;
    }
  }
  forget_idle_tenants(self, now_ms);
}

/// What an ended record costs the result cache: its strings and arrays as allocated, the key
/// (held twice: the map and the eviction order) and a fixed share for the structures around it.
std::size_t record_bytes(const std::string& key, const Record& r) {
  // Hash node, bucket pointer and deque slot: about this much besides sizeof(Record).
  constexpr std::size_t kOverhead = 96;
  const DoneEvent& d = r.done;
  return sizeof(Record) + kOverhead + 2 * key.capacity() + r.tenant.capacity() +
         r.client.identity.capacity() + d.id.capacity() + d.tenant.capacity() +
         d.to.identity.capacity() + d.text.capacity() + d.ids.capacity() * sizeof(int32_t) +
         d.logprob.capacity() * sizeof(float) + d.top_ids.capacity() * sizeof(int32_t) +
         d.top_logprobs.capacity() * sizeof(float) + r.error.id.capacity() +
         r.error.tenant.capacity() + r.error.message.capacity() + r.error.to.identity.capacity();
}

/// Puts an ended record into the result cache's eviction order; trims its arrays to their size
/// first (they grew token by token), so that what is counted is what is held.
void remember_ended(Self* self, std::string key, uint64_t uid, Record& rec) {
  auto& st = self->state;
  rec.done.text.shrink_to_fit();
  rec.done.ids.shrink_to_fit();
  rec.done.logprob.shrink_to_fit();
  rec.done.top_ids.shrink_to_fit();
  rec.done.top_logprobs.shrink_to_fit();
  const std::size_t bytes = record_bytes(key, rec);
  st.ended_bytes += bytes;
  st.ended.push_back(Ended{std::move(key), uid, bytes});
}

/// Forgets ended keys beyond the configured cache size, in count and in bytes, oldest first.
void evict(Self* self) {
  auto& st = self->state;
  while (!st.ended.empty() &&
         (st.ended.size() > st.cfg.result_cache || st.ended_bytes > st.cfg.result_cache_bytes)) {
    Ended e = std::move(st.ended.front());
    st.ended.pop_front();
    st.ended_bytes -= e.bytes;
    auto i = st.records.find(e.key);
    if (i != st.records.end() && !i->second.live && i->second.uid == e.uid) st.records.erase(i);
  }
}

/// Turns the request into a Job, or returns the bad_request message.
std::optional<std::string> build_job(Self* self, const SubmitRequest& req, Job& job) {
  auto& st = self->state;
  std::size_t ci = st.default_class;
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
  const LlamaModel* model = st.model.get();
  if (!req.message_roles.empty()) {
    if (req.message_roles.size() != req.message_contents.size())
      return std::string("messages: every message needs a role and a content");
    if (!model) return std::string("messages need a model with a chat template (none is loaded)");
    if (!st.chat) return st.chat_error;
    std::vector<chat::Message> msgs;
    msgs.reserve(req.message_roles.size());
    for (std::size_t i = 0; i < req.message_roles.size(); ++i)
      msgs.push_back({req.message_roles[i], req.message_contents[i]});
    const Tokenizer& tok = model->tokenizer();
    chat::RenderOptions opts;
    if (tok.bos() >= 0) opts.bos_token = tok.token_text(tok.bos());
    if (tok.eos() >= 0) opts.eos_token = tok.token_text(tok.eos());
    try {
      job.prompt = (*st.chat_tokens)(st.chat->render(msgs, opts));
    } catch (const chat::TemplateRaised& e) {
      return "the chat template refused the messages: " + wire::quoted(e.what());
    } catch (const chat::TemplateError& e) {
      return std::string("the chat template cannot render these messages: ") + e.what();
    } catch (const std::exception& e) {  // a renderer bug must not take the server down
      return std::string("the chat template cannot render these messages: ") + e.what();
    }
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
  job.stream = req.stream;
  job.logprobs = req.logprobs;
  return std::nullopt;
}

/// The router refused or failed a job that admission counted: undo the quota and the record,
/// tell every client waiting on the key.
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

/// Hands an admitted job to the router; its "full" answer undoes the admission.
void enqueue(Self* self, const std::string& key, Job job) {
  auto& st = self->state;
  const uint64_t uid = job.uid;
  bool cancel = false;
  if (auto i = st.records.find(key); i != st.records.end() && i->second.uid == uid) {
    cancel = i->second.cancel_pending;
    i->second.cancel_pending = false;
  }
  self->request(st.router, caf::infinite, enqueue_atom::value, std::move(job))
      .then(
          [self, key, uid](const EnqueueReply& r) {
            auto& s = self->state;
            if (r.result == EnqueueResult::accepted) {
              auto i = s.records.find(key);
              if (i != s.records.end() && i->second.uid == uid) i->second.pending = false;
              return;
            }
            if (r.result == EnqueueResult::full) {
              ++s.overloaded;
              drop_pending(self, key, uid, ErrorCode::overloaded,
                           "the priority class queue is full", r.retry_after_ms);
            } else {
              drop_pending(self, key, uid, ErrorCode::internal,
                           "the router does not know the job's priority class", -1);
            }
          },
          [self, key, uid](caf::error& err) {
            drop_pending(self, key, uid, ErrorCode::internal,
                         "router unavailable: " + self->system().render(err), -1);
          });
  // Cancelled while it was being journaled: the cancel reaches the router after the job.
  if (cancel) self->send(st.router, cancel_atom::value, uid);
}

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
      if (req.client.kind == ClientRef::router) {
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
  Job job;
  if (auto bad = build_job(self, req, job)) {
    ++st.bad_request;
    send_error(self, req.client, req.id, req.tenant, ErrorCode::bad_request, *bad);
    return return_pull_credit(self, req.client);
  }
  const int64_t now_us = clock_us(self);
  const int64_t now_ms = now_us / 1000;
  const auto cost = static_cast<uint32_t>(job.prompt.size() + job.max_tokens);
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
  Record rec;
  rec.uid = job.uid;
  rec.client = req.client;
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
  if (st.journal) return journal_then_enqueue(self, key, std::move(job));
  enqueue(self, key, std::move(job));
}

void finished(Self* self, JobOutcome& o) {
  auto& st = self->state;
  auto l = st.live.find(o.uid);
  if (l == st.live.end()) return;  // already ended (e.g. a duplicate report)
  std::string key = std::move(l->second);
  st.live.erase(l);
  auto i = st.records.find(key);
  if (i == st.records.end()) return;
  Record& rec = i->second;
  ++st.finished;
  // The result is journaled before anything about it is sent (the journal holds the replies).
  if (st.journal && rec.journaled) self->send(st.journal, journal_atom::value, o);
  auto now_ms = clock_us(self) / 1000;
  st.drain->on_completed(1, now_ms);
  auto t = st.tenants.find(rec.tenant);
  if (t != st.tenants.end())
    t->second.quota.finish(rec.charged - std::min(o.tokens_used, rec.charged), now_ms);
  settle_tenant(self, rec.tenant);
  if (st.observer) {
    // Metrics need counts and timings only, not the completion itself.
    JobOutcome m = o;
    m.done.text.clear();
    m.done.ids.clear();
    m.done.logprob.clear();
    m.done.top_ids.clear();
    m.done.top_logprobs.clear();
    std::string cls = rec.class_index < st.classes.size() ? st.classes[rec.class_index].name : "";
    self->send(st.observer, finished_atom::value, std::move(m), std::move(cls));
  }
  rec.live = false;
  rec.pending = false;
  rec.state = o.outcome == Outcome::done        ? JobState::done
              : o.outcome == Outcome::cancelled ? JobState::cancelled
                                                : JobState::failed;
  rec.done = std::move(o.done);
  rec.error = std::move(o.error);
  // An outcome whose ErrorEvent was left at its default code takes the outcome's code.
  if (rec.state == JobState::failed && rec.error.code == ErrorCode{} && o.code != ErrorCode{})
    rec.error.code = o.code;
  for (auto& c : rec.attached) {
    if (rec.state == JobState::failed) {
      ErrorEvent e = rec.error;
      e.to = c;
      send_out(self, std::move(e));
    } else {
      DoneEvent d = rec.done;
      d.to = c;
      send_out(self, std::move(d));
    }
  }
  rec.attached.clear();
  remember_ended(self, std::move(key), o.uid, rec);
  evict(self);
}

void key_request(Self* self, KeyRequest& k) {
  auto& st = self->state;
  std::string why;
  if (!authenticate(self, k.tenant, k.token, k.internal, why)) {
    ++st.unauthorized;
    // An internal request (the client is gone) has nobody to answer.
    if (!k.internal) send_error(self, k.client, k.id, k.tenant, ErrorCode::unauthorized, why);
    return;
  }
  // The key includes the caller's tenant: nobody can reach another tenant's jobs.
  auto i = st.records.find(job_key(k.tenant, k.id));
  if (i == st.records.end()) {
    ++st.not_found;
    if (!k.internal)
      send_error(self, k.client, k.id, k.tenant, ErrorCode::not_found,
                 "no job " + wire::quoted(k.id) + " for tenant " + wire::quoted(k.tenant));
    return;
  }
  Record& rec = i->second;
  if (k.kind == KeyRequest::cancel) {
    if (rec.live && st.journal && !rec.journaled && rec.pending)
      rec.cancel_pending = true;  // not at the router yet: enqueue() sends it after the job
    else if (rec.live && st.router)
      self->send(st.router, cancel_atom::value, rec.uid);
    return;
  }
  StatusEvent s;
  s.to = k.client;
  s.id = k.id;
  s.tenant = k.tenant;
  // Still being journaled: not at the router yet, so queued with nothing known ahead of it.
  const bool not_enqueued = rec.live && st.journal && !rec.journaled;
  if (!rec.live || !st.router || not_enqueued) {
    s.state = rec.live ? JobState::queued : rec.state;
    s.completion_tokens = rec.done.completion_tokens;
    send_out(self, std::move(s));
    return;
  }
  self->request(st.router, caf::infinite, status_atom::value, rec.uid)
      .then(
          [self, s, key = i->first, uid = rec.uid](JobState state, uint32_t position,
                                                   uint32_t generated) mutable {
            s.state = state;
            s.queue_position = state == JobState::queued ? position : 0;
            s.completion_tokens = generated;
            // The job may have ended while the router answered (its end reaches admission before
            // the router's reply): then its stored state is the truth, not "running".
            auto r = self->state.records.find(key);
            if (r != self->state.records.end() && r->second.uid == uid && !r->second.live) {
              s.state = r->second.state;
              s.queue_position = 0;
              s.completion_tokens = r->second.done.completion_tokens;
            }
            send_out(self, std::move(s));
          },
          [self, s](caf::error&) mutable { send_out(self, std::move(s)); });
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
  return s;
}

/// Enqueues the previous run's journaled jobs one at a time: a full queue is retried after its
/// retry_after_ms instead of failing a job that was already accepted.
void replay_next(Self* self) {
  auto& st = self->state;
  if (st.replay_busy || st.replay.empty() || !st.router) return;
  st.replay_busy = true;
  const Job& job = st.replay.front();
  const uint64_t uid = job.uid;
  const std::string key = job_key(job.tenant, job.id);
  self->request(st.router, caf::infinite, enqueue_atom::value, job)
      .then(
          [self, key, uid](const EnqueueReply& r) {
            auto& s = self->state;
            s.replay_busy = false;
            if (r.result == EnqueueResult::full) {
              // Polling a full queue faster than every 10 ms would only burn the router's time.
              auto wait = std::chrono::milliseconds(std::max<int64_t>(10, r.retry_after_ms));
              self->delayed_send(self, wait, tick_atom::value);
              return;
            }
            s.replay.pop_front();
            if (r.result == EnqueueResult::accepted) {
              ++s.replayed;
              auto i = s.records.find(key);
              if (i != s.records.end() && i->second.uid == uid) i->second.pending = false;
            } else {
              drop_pending(self, key, uid, ErrorCode::internal,
                           "the router does not know the replayed job's priority class", -1);
            }
            replay_next(self);
          },
          [self, key, uid](caf::error& err) {
            auto& s = self->state;
            s.replay_busy = false;
            s.replay.pop_front();
            drop_pending(self, key, uid, ErrorCode::internal,
                         "router unavailable: " + self->system().render(err), -1);
            replay_next(self);
          });
}

/// Takes over what the journal held at start (see spawn_admission with a journal).
void restore(Self* self, const JournalReplay& replay) {
  auto& st = self->state;
  st.next_uid = std::max(st.next_uid, replay.next_uid);
  for (const auto& o : replay.results) {
    Record rec;
    rec.uid = o.uid;
    rec.live = false;
    rec.pending = false;
    rec.state = JobState::done;
    rec.client = o.done.to;
    rec.tenant = o.tenant;
    rec.done = o.done;
    rec.journaled = true;
    std::string key = job_key(o.tenant, o.id);
    Record& kept = st.records[key] = std::move(rec);
    remember_ended(self, std::move(key), o.uid, kept);
    ++st.restored;
  }
  evict(self);
  for (const auto& job : replay.pending) {
    Record rec;
    rec.uid = job.uid;
    rec.client = job.client;
    rec.tenant = job.tenant;
    rec.class_index = job.class_index;
    rec.done.id = job.id;
    rec.journaled = true;
    std::string key = job_key(job.tenant, job.id);
    st.records[key] = std::move(rec);
    st.live[job.uid] = key;
    st.replay.push_back(job);
  }
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

caf::behavior admission_actor(Self* self, AdmissionConfig cfg,
                              std::vector<policy::PriorityClass> classes, std::size_t default_class,
                              std::shared_ptr<const LlamaModel> model, caf::actor router,
                              caf::actor egress, caf::actor journal,
                              std::shared_ptr<const JournalReplay> replay) {
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
    self->send(router, connect_atom::value, caf::actor_cast<caf::actor>(self), std::move(w));
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
      [self](finished_atom, JobOutcome& o) { finished(self, o); },
      [self](drain_atom) {
        self->state.draining = true;
        self->state.operator_drain = false;
      },
      // `switchyard ctl drain` / `resume`: no new work while on; queued and running jobs finish.
      [self](drain_atom, bool on) {
        self->state.draining = on;
        self->state.operator_drain = on;
      },
      [self](observe_atom, caf::actor& observer) { self->state.observer = std::move(observer); },
      // Shutdown after the grace period (server/server.cpp): every live job is cancelled, so
      // queued ones never run and running ones end within a step with done finish=cancelled.
      [self](cancel_atom, drain_atom) {
        for (auto& [uid, key] : self->state.live)
          if (self->state.router) self->send(self->state.router, cancel_atom::value, uid);
      },
      [self](stats_atom) { return stats(self); },
  };
}

}  // namespace

namespace {
caf::actor spawn_admission_impl(caf::actor_system& sys, AdmissionConfig cfg,
                                std::vector<policy::PriorityClass> classes,
                                std::string default_class, std::shared_ptr<const LlamaModel> model,
                                caf::actor router, caf::actor egress, caf::actor journal,
                                std::shared_ptr<const JournalReplay> replay);
}  // namespace

caf::actor spawn_admission(caf::actor_system& sys, AdmissionConfig cfg,
                           std::vector<policy::PriorityClass> classes, std::string default_class,
                           std::shared_ptr<const LlamaModel> model, caf::actor router,
                           caf::actor egress) {
  return spawn_admission_impl(sys, std::move(cfg), std::move(classes), std::move(default_class),
                              std::move(model), std::move(router), std::move(egress), caf::actor{},
                              nullptr);
}

caf::actor spawn_admission(caf::actor_system& sys, AdmissionConfig cfg,
                           std::vector<policy::PriorityClass> classes, std::string default_class,
                           std::shared_ptr<const LlamaModel> model, caf::actor router,
                           caf::actor egress, caf::actor journal, const JournalReplay& replay) {
  return spawn_admission_impl(sys, std::move(cfg), std::move(classes), std::move(default_class),
                              std::move(model), std::move(router), std::move(egress),
                              std::move(journal), std::make_shared<const JournalReplay>(replay));
}

namespace {
caf::actor spawn_admission_impl(caf::actor_system& sys, AdmissionConfig cfg,
                                std::vector<policy::PriorityClass> classes,
                                std::string default_class, std::shared_ptr<const LlamaModel> model,
                                caf::actor router, caf::actor egress, caf::actor journal,
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
