// The admission actor's job ends and kept results: a job's outcome frees its quota and answers
// attached clients, the result cache answers resubmissions of ended keys, and cancel and status
// requests look keys up.
#include <algorithm>
#include <string>
#include <utility>

#include "actors/admission_state.hpp"
#include "core/wire.hpp"

namespace sy::admission_detail {

namespace {

/// The samples, prompt log-probabilities and scores of a done, as allocated.
std::size_t samples_bytes(const DoneEvent& d) {
  std::size_t n =
      d.choices.capacity() * sizeof(ChoiceResult) + d.scores.capacity() * sizeof(ScoreResult) +
      d.prompt_ids.capacity() * sizeof(int32_t) + d.prompt_logprob.capacity() * sizeof(float) +
      d.prompt_top_ids.capacity() * sizeof(int32_t) +
      d.prompt_top_logprobs.capacity() * sizeof(float);
  for (const ChoiceResult& c : d.choices)
    n += c.text.capacity() + c.ids.capacity() * sizeof(int32_t) +
         c.logprob.capacity() * sizeof(float) + c.top_ids.capacity() * sizeof(int32_t) +
         c.top_logprobs.capacity() * sizeof(float);
  return n;
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
         r.error.tenant.capacity() + r.error.message.capacity() + r.error.to.identity.capacity() +
         samples_bytes(d);
}

}  // namespace

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
  // The job's spans end with its own delivery: copies sent later (attached clients, a
  // resubmitted key) carry no trace.
  rec.done.trace = {};
  rec.error.trace = {};
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
    if (rec.live && program_cancel(self, rec.uid)) return;
    // (A cluster job is never journaled: it went to the router at once.)
    if (rec.live && st.journal && !rec.journaled && rec.pending &&
        rec.client.kind != ClientRef::cluster)
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
  if (rec.live && program_status(self, rec.uid, s)) return;
  if (!rec.live || !st.router || not_enqueued) {
    s.state = rec.live ? JobState::queued : rec.state;
    s.completion_tokens = rec.done.completion_tokens;
    send_out(self, std::move(s));
    return;
  }
  self->request(st.router, caf::infinite, status_atom::value, rec.uid)
      .then(
          [self, s, key = i->first, uid = rec.uid](const JobStatus& js) mutable {
            s.state = js.state;
            s.queue_position = js.state == JobState::queued ? js.position : 0;
            s.completion_tokens = js.completion_tokens;
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

}  // namespace sy::admission_detail
