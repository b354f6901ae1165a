// The journal actor and the journal's replay (see journal.hpp and docs/durability.md): accept,
// result and delivered records (storage/journal_codec) over storage/journal_file.
#include "actors/journal.hpp"

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "actors/log.hpp"
#include "core/thread_class.hpp"
#include "storage/journal_codec.hpp"
#include "storage/journal_file.hpp"
#include "storage/journal_replay.hpp"

namespace sy {
namespace {

// Wall-clock microseconds since the epoch: the time base of deadlines kept across restarts.
int64_t wall_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The clocks a replay and an accept record read: this process's steady clock and the wall clock.
ReplayClock clock_now() {
  return {now_us(), wall_now_us()};
}

}  // namespace

std::string encode_accept(const Job& j) {
  return encode_accept(j, clock_now());
}

std::string encode_result(const JobOutcome& o) {
  return journal::encode_result(o);
}

std::string encode_delivered(uint64_t uid) {
  return journal::encode_delivered(uid);
}

void replay_records(const std::vector<std::string>& records, std::size_t keep_results,
                    JournalReplay& out, std::vector<std::string>& compacted) {
  replay_records(records, keep_results, out, compacted, clock_now());
}

std::shared_ptr<JournalFile> open_journal(const JournalConfig& cfg, std::size_t keep_results,
                                          JournalReplay& out) {
  return open_journal(cfg, keep_results, out, clock_now());
}

namespace {

using Terminal = std::variant<DoneEvent, ErrorEvent>;

/// A job whose accept record is in the journal and whose result is not.
struct LiveJob {
  std::string record;  // its accept record, for compaction
  ClientRef client;
  std::vector<std::string> steps;  // a program's step records, for compaction
};

/// A result kept for compaction (the same ones admission keeps for resubmissions).
struct KeptResult {
  std::string record;
  bool pipeline = false;
  bool delivered = false;
  bool done = false;
};

/// An accept record written and waiting for the group commit, with the admission waiting on it.
struct PendingAck {
  uint64_t uid = 0;
  caf::typed_response_promise<uint8_t> rp;
};

/// A result record and its job: written and waiting for the group commit, or not yet written.
struct PendingResult {
  uint64_t uid = 0;
  std::string record;
};

// The two self-timers besides the group commit ((tick_atom) alone).
constexpr uint8_t kMarksTick = 1, kRetryTick = 2;

// While the journal cannot write, held results are tried again this often: soon after space
// comes back they leave, and each try costs one refused write of one record.
constexpr int64_t kRetryMs = 200;

// After a failed compaction the next try waits this long: it rewrites every live record, which
// on a nearly full disk would fail again and again at that cost. Appends still go on meanwhile.
constexpr int64_t kCompactRetryUs = 30'000'000;

struct JournalState {
  JournalConfig cfg;
  FsyncPolicy policy = FsyncPolicy::batch;
  std::shared_ptr<JournalFile> file;
  EgressActor egress;
  std::size_t keep = 0;
  std::unordered_map<uint64_t, LiveJob> live;
  std::unordered_set<uint64_t> ending;                       // result not yet durable
  std::unordered_map<uint64_t, std::vector<Terminal>> held;  // terminal events awaiting commit
  std::vector<PendingAck> acks;                              // waiting for the group commit
  std::vector<PendingResult> committing;                     // results waiting for it
  // Results the file refused (disk full), oldest first: retried every kRetryMs, their done/error
  // held meanwhile. Bounded by the live jobs: no job is accepted while the journal fails.
  std::deque<PendingResult> unwritten;
  bool commit_armed = false, marks_armed = false, retry_armed = false;
  bool steps_unsynced = false;  // step records appended since the last group commit
  std::deque<std::pair<int64_t, uint64_t>> forwarded;  // pipeline results handed to egress
  std::unordered_map<uint64_t, KeptResult> kept;
  std::deque<uint64_t> kept_order;
  std::size_t kept_done = 0;
  std::size_t kept_bytes = 0;  // records in `kept`, bounded by cfg.keep_result_bytes
  // The failing state: from a refused write to the next good one (logged at both ends).
  bool failing = false, compact_failing = false;
  int64_t failing_since_us = 0, compact_retry_at_us = 0;
  uint64_t failing_writes = 0;  // refused writes in the current failing period
  int last_errno = 0;           // why the last write was refused
  uint64_t accepted = 0, results = 0, dropped = 0, redelivered = 0, marks = 0, compactions = 0,
           replayed_pending = 0, replayed_results = 0, write_errors = 0, refused = 0;

  static inline const char* name = "sy.journal";
};

using Self = JournalActor::stateful_base<JournalState>;

void forward(Self* self, auto ev) {
  if (is_orphan(ev.to)) {
    ++self->state.dropped;
    return;
  }
  self->send(self->state.egress, out_atom::value, std::move(ev));
}

// What a kept result costs: its record and about this much for the map node and order slot.
std::size_t kept_size(const KeptResult& r) {
  return r.record.capacity() + 96;
}

void remember(Self* self, uint64_t uid, KeptResult r) {
  auto& st = self->state;
  if (r.done) ++st.kept_done;
  st.kept_bytes += kept_size(r);
  KeptResult& slot = st.kept[uid];
  if (!slot.record.empty()) {
    st.kept_bytes -= kept_size(slot);
    if (slot.done) --st.kept_done;
  }
  slot = std::move(r);
  st.kept_order.push_back(uid);
  // Oldest first, like admission's result cache (by count and by bytes); undelivered pipeline
  // results stay until marked.
  while ((st.kept_done > st.keep || st.kept_bytes > st.cfg.keep_result_bytes) &&
         !st.kept_order.empty()) {
    uint64_t old = st.kept_order.front();
    auto it = st.kept.find(old);
    if (it != st.kept.end() && it->second.pipeline && !it->second.delivered) break;
    st.kept_order.pop_front();
    if (it != st.kept.end()) {
      if (it->second.done) --st.kept_done;
      st.kept_bytes -= kept_size(it->second);
      st.kept.erase(it);
    }
  }
}

// The job's result is durable: its held events go out, and it is no longer live.
void release(Self* self, uint64_t uid) {
  auto& st = self->state;
  st.ending.erase(uid);
  if (auto h = st.held.find(uid); h != st.held.end()) {
    auto events = std::move(h->second);
    st.held.erase(h);
    for (auto& ev : events) std::visit([&](auto& e) { forward(self, std::move(e)); }, ev);
  }
  if (auto k = st.kept.find(uid); k != st.kept.end() && k->second.pipeline)
    st.forwarded.emplace_back(now_us(), uid);
}

void arm_marks(Self* self);

// The refusal admission turns into `unavailable`: the reason without the path (clients read it).
caf::error refusal(int code) {
  return make_error(ErrorCode::unavailable, std::string(std::strerror(code)));
}

// A refused write: counted every time, logged when the journal starts failing (not once per
// write: a full disk refuses every write until it has room again).
void write_failed(Self* self, const std::exception& e) {
  auto& st = self->state;
  ++st.write_errors;
  ++st.failing_writes;
  auto* we = dynamic_cast<const JournalWriteError*>(&e);
  st.last_errno = we ? we->code : EIO;
  if (st.failing) return;
  st.failing = true;
  st.failing_since_us = now_us();
  log::error(std::string("ERROR: ") + e.what() +
             "; new jobs are refused (unavailable) and finished jobs' results are held until "
             "the journal can be written again");
}

// A good write: ends a failing period (logged once, with how long it lasted).
void write_ok(Self* self) {
  auto& st = self->state;
  if (!st.failing) return;
  st.failing = false;
  log::info("journal " + st.file->path() + " is written again after " +
            std::to_string(st.failing_writes) + " refused writes in " +
            std::to_string((now_us() - st.failing_since_us) / 1000) + " ms");
  st.failing_writes = 0;
}

// Appends one record and hands it to the OS (and to the disk with fsync always). With fsync
// batch and a healthy file the record stays in the file's buffer: the group commit writes the
// whole group with one write before its fdatasync, so a group costs two system calls instead of
// one per record, and a refused write then fails the group as a refused sync does. False when
// the file refused it: the file then holds nothing of it (JournalFile cuts a refused write back).
bool put(Self* self, const std::string& rec) {
  auto& st = self->state;
  if (rec.size() > JournalFile::kMaxRecordBytes) {
    // Never writable, whatever the disk: counted, but no failing period (other records go on).
    ++st.write_errors;
    st.last_errno = EFBIG;
    return false;
  }
  try {
    st.file->append(rec);
    if (st.policy == FsyncPolicy::always)
      st.file->sync();
    else if (st.policy == FsyncPolicy::never || st.failing)
      st.file->flush();  // while failing, each record is tried (and refused) on its own
  } catch (const std::exception& e) {
    write_failed(self, e);
    return false;
  }
  write_ok(self);
  return true;
}

void arm_commit(Self* self) {
  auto& st = self->state;
  if (st.commit_armed) return;
  st.commit_armed = true;
  // batch_ms 0: commit once the records already in the mailbox are written (the tick queues
  // behind them), so a group is whatever arrived during the last fsync: one record at low load,
  // many at high load, with no timer to wait out.
  if (st.cfg.batch_ms <= 0)
    self->send(self, tick_atom::value);
  else
    self->delayed_send(self, std::chrono::milliseconds(st.cfg.batch_ms), tick_atom::value);
}

void arm_retry(Self* self) {
  auto& st = self->state;
  if (st.retry_armed || st.unwritten.empty()) return;
  st.retry_armed = true;
  self->delayed_send(self, std::chrono::milliseconds(kRetryMs), tick_atom::value, kRetryTick);
}

void arm_marks(Self* self);

// A result record is in the file: durable now (always, never) or at the next group commit.
void result_written(Self* self, PendingResult r) {
  auto& st = self->state;
  if (st.policy == FsyncPolicy::batch) {
    st.committing.push_back(std::move(r));
    arm_commit(self);
    return;
  }
  release(self, r.uid);
  arm_marks(self);
}

// Writes the held results the file refused before, oldest first, until one is refused again.
void retry_unwritten(Self* self) {
  auto& st = self->state;
  while (!st.unwritten.empty() && put(self, st.unwritten.front().record)) {
    PendingResult r = std::move(st.unwritten.front());
    st.unwritten.pop_front();
    result_written(self, std::move(r));
  }
  arm_retry(self);
}

// The group commit: one fdatasync for everything appended since the last one.
void commit(Self* self) {
  auto& st = self->state;
  if (st.acks.empty() && st.committing.empty() && !st.steps_unsynced) return;
  st.steps_unsynced = false;
  auto acks = std::move(st.acks);
  st.acks.clear();
  auto results = std::move(st.committing);
  st.committing.clear();
  try {
    st.file->sync();
  } catch (const std::exception& e) {
    write_failed(self, e);
    // The file was cut back to the last good sync: these accepts are refused and gone, and these
    // results are written again (their done/error stay held until then).
    for (auto& a : acks) {
      st.live.erase(a.uid);
      ++st.refused;
      a.rp.deliver(refusal(st.last_errno));
    }
    for (auto it = results.rbegin(); it != results.rend(); ++it)
      st.unwritten.push_front(std::move(*it));
    arm_retry(self);
    return;
  }
  st.accepted += acks.size();
  for (auto& a : acks) a.rp.deliver(uint8_t{0});
  for (auto& r : results) release(self, r.uid);
  arm_marks(self);
}

void compact_if_due(Self* self) {
  auto& st = self->state;
  if (!st.acks.empty() || !st.committing.empty() || !st.unwritten.empty() || st.failing) return;
  if (now_us() < st.compact_retry_at_us) return;
  const uint64_t size = st.file->size();
  if (size < static_cast<uint64_t>(st.cfg.compact_bytes)) return;
  uint64_t needed = 0;
  for (auto& [uid, j] : st.live) {
    needed += j.record.size() + 8;
    for (const auto& r : j.steps) needed += r.size() + 8;
  }
  for (auto& [uid, r] : st.kept) needed += r.record.size() + 8;
  // Only when most of the file is dead: rewriting costs as much as the live part.
  if (needed * 2 > size) return;
  std::vector<std::pair<uint64_t, const std::string*>> accepts;
  for (auto& [uid, j] : st.live) accepts.emplace_back(uid, &j.record);
  std::sort(accepts.begin(), accepts.end());
  std::vector<std::string> records;
  for (auto& [uid, r] : accepts) {
    records.push_back(*r);
    for (const auto& s : st.live[uid].steps) records.push_back(s);
  }
  for (auto uid : st.kept_order) {
    auto it = st.kept.find(uid);
    if (it == st.kept.end()) continue;
    records.push_back(it->second.record);
    if (it->second.delivered) records.push_back(encode_delivered(uid));
  }
  try {
    st.file->rewrite(records);
    ++st.compactions;
    if (st.compact_failing) log::info("journal " + st.file->path() + " compacted again");
    st.compact_failing = false;
  } catch (const std::exception& e) {
    // The old file is intact (rename is atomic) and appends go on; PATH.tmp was removed.
    ++st.write_errors;
    st.compact_retry_at_us = now_us() + kCompactRetryUs;
    if (!st.compact_failing)
      log::warn(std::string("WARNING: journal compaction failed: ") + e.what() +
                "; the journal keeps growing, next try in " +
                std::to_string(kCompactRetryUs / 1'000'000) + " s");
    st.compact_failing = true;
  }
}

// Marks pipeline results delivered once they left egress long enough ago (config), so that a
// restart does not send them again; then compacts when due.
void write_marks(Self* self) {
  auto& st = self->state;
  const int64_t due = now_us() - st.cfg.delivered_lag_ms * 1000;
  bool wrote = false;
  while (!st.forwarded.empty() && st.forwarded.front().first <= due) {
    uint64_t uid = st.forwarded.front().second;
    st.forwarded.pop_front();
    // While the journal fails a mark is not even tried: a lost mark only means one more delivery
    // after a crash (compaction writes the marks it knows).
    if (!st.failing) {
      st.file->append(encode_delivered(uid));
      wrote = true;
      ++st.marks;
    }
    if (auto k = st.kept.find(uid); k != st.kept.end()) k->second.delivered = true;
  }
  // No fsync: a lost mark only means one more delivery after a crash. With a group waiting for
  // its commit (fsync batch) the file's buffer holds the group's records too: the marks go out
  // with the group's one write, since a refused write here would take the group's records with
  // it while their commit is still to come.
  if (wrote && st.acks.empty() && st.committing.empty()) {
    try {
      st.file->flush();
      write_ok(self);
    } catch (const std::exception& e) {
      write_failed(self, e);
    }
  }
  compact_if_due(self);
}

void arm_marks(Self* self) {
  auto& st = self->state;
  if (st.marks_armed || st.forwarded.empty()) return;
  if (st.cfg.delivered_lag_ms <= 0) return write_marks(self);
  st.marks_armed = true;
  // A quarter of the lag keeps marks at most 25% late while waking rarely.
  auto every = std::max<int64_t>(50, st.cfg.delivered_lag_ms / 4);
  self->delayed_send(self, std::chrono::milliseconds(every), tick_atom::value, kMarksTick);
}

caf::result<uint8_t> accept(Self* self, const Job& job) {
  auto& st = self->state;
  // Held results go first: they are older, their clients wait, and while they cannot be written
  // the disk still has no room, so the job is refused without another try.
  retry_unwritten(self);
  std::string rec = encode_accept(job);
  if (!st.unwritten.empty() || !put(self, rec)) {
    ++st.refused;
    return refusal(st.last_errno);
  }
  st.live[job.uid] = LiveJob{std::move(rec), job.client, {}};
  if (st.policy != FsyncPolicy::batch) {
    ++st.accepted;
    return uint8_t{0};
  }
  auto rp = self->make_response_promise<uint8_t>();
  st.acks.push_back(PendingAck{job.uid, rp});
  arm_commit(self);
  return rp;
}

// A program's finished step: appended (no reply; durable with the next group commit). A record
// that cannot be written only means the step runs again after a crash.
void step(Self* self, const ProgramStep& s) {
  auto& st = self->state;
  auto it = st.live.find(s.uid);
  if (it == st.live.end()) return;  // not journaled, or already ended
  std::string rec = journal::encode_step(s);
  if (!st.unwritten.empty() || !put(self, rec)) return;
  it->second.steps.push_back(std::move(rec));
  if (st.policy == FsyncPolicy::batch) {
    st.steps_unsynced = true;
    arm_commit(self);
  }
}

void end(Self* self, const JobOutcome& o) {
  auto& st = self->state;
  auto it = st.live.find(o.uid);
  if (it == st.live.end()) return;  // not journaled, or a second report
  st.live.erase(it);
  KeptResult k;
  k.record = encode_result(o);
  k.pipeline = reply_client(o).kind == ClientRef::pipeline;
  k.done = o.outcome == Outcome::done;
  PendingResult r{o.uid, k.record};
  if (k.done || k.pipeline) remember(self, o.uid, std::move(k));
  ++st.results;
  // Its done/error wait until this record is durable, however long the disk stays full: they
  // promise that a restart will not run the job again.
  st.ending.insert(o.uid);
  if (r.record.size() > JournalFile::kMaxRecordBytes) {
    // Cannot be framed at all (far above any context-sized result): holding it would hold it
    // forever, so it goes out undurable, and a restart runs the job again.
    ++st.write_errors;
    log::warn("WARNING: journal: result of job " + std::to_string(o.uid) + " is " +
              std::to_string(r.record.size()) +
              " bytes, beyond the record limit; delivered unjournaled");
    release(self, o.uid);
    return arm_marks(self);
  }
  if (st.unwritten.empty() && put(self, r.record)) return result_written(self, std::move(r));
  st.unwritten.push_back(std::move(r));
  arm_retry(self);
}

// A done/error of a journaled job waits for the job's result record; anything else goes on.
void terminal(Self* self, Terminal ev, uint64_t uid) {
  auto& st = self->state;
  if (uid != 0 && (st.live.count(uid) || st.ending.count(uid))) {
    st.held[uid].push_back(std::move(ev));
    return;
  }
  std::visit([&](auto& e) { forward(self, std::move(e)); }, ev);
}

JournalStats stats(Self* self) {
  auto& st = self->state;
  JournalStats s;
  auto n = [](auto v) { return static_cast<int64_t>(v); };
  s.accepted = n(st.accepted);
  s.results = n(st.results);
  s.syncs = n(st.file->syncs());
  s.live = n(st.live.size());
  s.held = n(st.held.size());
  s.dropped = n(st.dropped);
  s.redelivered = n(st.redelivered);
  s.delivered_marks = n(st.marks);
  s.compactions = n(st.compactions);
  s.bytes = n(st.file->size());
  s.replayed_pending = n(st.replayed_pending);
  s.replayed_results = n(st.replayed_results);
  s.write_errors = n(st.write_errors);
  s.failing = st.failing ? 1 : 0;
  s.refused = n(st.refused);
  s.unwritten = n(st.unwritten.size());
  return s;
}

JournalActor::behavior_type journal_actor(Self* self, JournalConfig cfg,
                                          std::shared_ptr<JournalFile> file, JournalReplay replay,
                                          std::size_t keep, EgressActor egress) {
  // A detached actor builds its behavior on its own thread; the journal's stays normal: a
  // journaled request waits for it (docs/architecture.md, Threads and cores).
  enter_thread_class("sy.journal", CpuPriority::normal);
  auto& st = self->state;
  st.policy = parse_fsync_policy(cfg.fsync).value_or(FsyncPolicy::batch);
  st.cfg = std::move(cfg);
  st.file = std::move(file);
  st.egress = egress;
  st.keep = keep;
  st.replayed_pending = replay.pending.size();
  st.replayed_results = replay.results.size();
  for (auto& j : replay.pending) st.live[j.uid] = LiveJob{encode_accept(j), j.client, {}};
  // The compacted file holds exactly these results (in this order): mirror it for compaction.
  std::unordered_set<uint64_t> redeliver;
  for (auto& o : replay.redeliver) redeliver.insert(o.uid);
  std::vector<const JobOutcome*> all;
  for (auto& o : replay.results) all.push_back(&o);
  for (auto& o : replay.redeliver)
    if (o.outcome != Outcome::done) all.push_back(&o);
  std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->uid < b->uid; });
  for (auto* o : all) {
    KeptResult k;
    k.record = encode_result(*o);
    k.pipeline = reply_client(*o).kind == ClientRef::pipeline;
    k.delivered = !redeliver.count(o->uid);
    k.done = o->outcome == Outcome::done;
    remember(self, o->uid, std::move(k));
  }
  // Results that may not have reached their sink before the restart: once more (at least once).
  for (auto& o : replay.redeliver) {
    if (o.outcome == Outcome::error) {
      self->send(egress, out_atom::value, o.error);
    } else {
      self->send(egress, out_atom::value, o.done);
    }
    st.forwarded.emplace_back(now_us(), o.uid);
    ++st.redelivered;
  }
  arm_marks(self);
  return {
      [self](journal_atom, const Job& job) { return accept(self, job); },
      [self](journal_atom, const JobOutcome& o) { end(self, o); },
      [self](journal_atom, const ProgramStep& s) { step(self, s); },
      [self](out_atom, StepEvent& e) { forward(self, std::move(e)); },
      [self](out_atom, ToolCallEvent& e) { forward(self, std::move(e)); },
      [self](out_atom, DoneEvent& e) {
        auto uid = e.uid;
        terminal(self, Terminal{std::move(e)}, uid);
      },
      [self](out_atom, ErrorEvent& e) {
        auto uid = e.uid;
        terminal(self, Terminal{std::move(e)}, uid);
      },
      [self](out_atom, TokensEvent& e) { forward(self, std::move(e)); },
      [self](out_atom, AcceptedEvent& e) { forward(self, std::move(e)); },
      [self](out_atom, StatusEvent& e) { forward(self, std::move(e)); },
      [self](out_atom, ControlEvent& e) {
        self->send(self->state.egress, out_atom::value, std::move(e));
      },
      [self](pull_atom, uint32_t n) { self->send(self->state.egress, pull_atom::value, n); },
      [self](tick_atom) {
        self->state.commit_armed = false;
        commit(self);
      },
      [self](tick_atom, uint8_t which) {
        if (which == kRetryTick) {
          self->state.retry_armed = false;
          retry_unwritten(self);
          return;
        }
        self->state.marks_armed = false;
        write_marks(self);
        arm_marks(self);
      },
      [self](stats_atom) { return stats(self); },
  };
}

}  // namespace

JournalActor spawn_journal(caf::actor_system& sys, JournalConfig cfg,
                           std::shared_ptr<JournalFile> file, const JournalReplay& replay,
                           std::size_t keep_results, EgressActor egress, bool own_thread) {
  if (own_thread)
    return sys.spawn<caf::detached>(journal_actor, std::move(cfg), std::move(file), replay,
                                    keep_results, std::move(egress));
  return sys.spawn(journal_actor, std::move(cfg), std::move(file), replay, keep_results,
                   std::move(egress));
}

}  // namespace sy
