// The admission actor's journal replay: the previous run's ended results come back into the
// result cache, and its pending jobs go back to the router under their old uids.
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "actors/admission_state.hpp"
#include "actors/journal.hpp"

namespace sy::admission_detail {

void replay_next(Self* self) {
  auto& st = self->state;
  if (st.replay_busy || st.replay.empty() || !st.router) return;
  // Programs resume here, from their journaled steps; their step jobs meet the router's queues.
  while (!st.replay.empty() && st.replay.front().is_program()) {
    Job p = std::move(st.replay.front());
    st.replay.pop_front();
    ++st.replayed;
    const std::string key = job_key(p.tenant, p.id);
    enqueue(self, key, std::move(p));
  }
  if (st.replay.empty()) return;
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

}  // namespace sy::admission_detail
