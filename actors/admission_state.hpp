// The admission actor's state and helpers, shared by its pieces: admission.cpp (the behavior, the
// submit path and the hand-off to the router), admission_tenants.cpp (authentication and the
// open-tenant table), admission_results.cpp (job ends, the result cache, cancel and status of a
// key) and admission_replay.cpp (the journal's jobs of the previous run). Internal to actors/.
#pragma once

#include <caf/all.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/admission.hpp"
#include "actors/messages.hpp"
#include "actors/outcomes.hpp"
#include "actors/protocol.hpp"
#include "core/error_code.hpp"
#include "model/chat_template.hpp"
#include "policies/quota.hpp"
#include "policies/retry.hpp"
#include "programs/program.hpp"

namespace sy::admission_detail {

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
  bool outlive_shutdown = false;  // SubmitRequest::outlive_shutdown
  DoneEvent done;
  ErrorEvent error;
};

/// An ended key in the result cache's eviction order, with what its record was counted as.
struct Ended {
  std::string key;
  uint64_t uid = 0;
  std::size_t bytes = 0;
};

/// A step job of a running program: what it runs for the walk.
struct StepJob {
  uint64_t program = 0;  // the program's uid
  programs::Action::Kind kind = programs::Action::Kind::gen;
  std::string path, name;
  std::vector<std::string> choices;  // select
  programs::Step::Method method = programs::Step::token_length_normalized;
  int64_t arrival_us = 0;  // the step job's arrival (its queue and first-token times count from it)
};

/// A program the manager runs (admission_programs.cpp): its job, its walk, its steps in flight.
struct ProgramState {
  Job job;  // the program job: key, client, class, the gen defaults, program_done
  std::string key;
  std::shared_ptr<const programs::Program> program;
  programs::Run run;
  std::vector<uint64_t> steps;  // step jobs in flight (uids)
  std::deque<Job> deferred;     // step jobs a full queue refused, retried
  // Tool waits: path -> (deadline in steady µs, the step's variable name).
  std::map<std::string, std::pair<int64_t, std::string>> tools;
  bool first_dispatched = false;  // the first step job went out (carries the deadline)
  bool timed_queue = false;       // queue_ms taken from the first step's done
  bool timed = false;             // ttft_ms taken from the first gen that made a token
  bool timer_armed = false;
  uint32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double queue_ms = 0, ttft_ms = 0;
  explicit ProgramState(std::shared_ptr<const programs::Program> p) : program(p), run(p) {}
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
  RouterActor router;
  EgressActor egress;
  MetricsActor observer;   // the metrics actor (observe_atom): a copy of every JobOutcome
  JournalActor journal;    // null: no journal
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
  // Programs (admission_programs.cpp): the running ones by uid, and their step jobs by uid. Step
  // uids live far above job uids (which the journal keeps and replays) and are never journaled.
  std::unordered_map<uint64_t, std::unique_ptr<ProgramState>> programs;
  std::unordered_map<uint64_t, StepJob> step_jobs;
  uint64_t next_step_uid = uint64_t{1} << 61;  // below the batchers' sample uids (2^62 up)
  uint64_t programs_started = 0, programs_resumed = 0, programs_done = 0, programs_failed = 0,
           programs_cancelled = 0, program_steps = 0, program_steps_restored = 0,
           program_prompt_tokens = 0, program_cached_tokens = 0, program_completion_tokens = 0,
           program_tool_calls = 0, program_tool_timeouts = 0;
  bool draining = false;
  bool operator_drain = false;  // draining by `ctl drain` (else: shutdown)
  uint64_t submitted = 0, admitted = 0, unauthorized = 0, rate_limited = 0, overloaded = 0,
           bad_request = 0, deduplicated = 0, attached = 0, finished = 0, not_found = 0,
           unavailable = 0;

  static inline const char* name = "sy.admission";
};

using Self = AdmissionActor::stateful_base<AdmissionState>;

// The tenant's length first, so that no (tenant, id) pair can collide with another.
std::string job_key(const std::string& tenant, const std::string& id);

inline void send_out(Self* self, auto ev) {
  if (self->state.egress) self->send(self->state.egress, out_atom::value, std::move(ev));
}

inline void send_error(Self* self, const ClientRef& to, const std::string& id,
                       const std::string& tenant, ErrorCode code, std::string message,
                       int64_t retry_after_ms = -1, uint64_t uid = 0) {
  send_out(self, make_error_event(to, uid, id, tenant, code, std::move(message), retry_after_ms));
}

/// A pipeline submit answered here never reaches the router: give its PULL credit back.
void return_pull_credit(Self* self, const ClientRef& c);

/// The tenant if known and the token matches, else nullptr and the reason in `why`.
TenantState* authenticate(Self* self, const std::string& tenant, const std::string& token,
                          bool internal, std::string& why);

/// Called after anything that may have changed whether an unknown tenant has jobs in flight:
/// one without any joins the end of the idle list (or moves there: it was just used), one with
/// some leaves it. Then the idle ones due are forgotten.
void settle_tenant(Self* self, const std::string& name);

/// Puts an ended record into the result cache's eviction order; trims its arrays to their size
/// first (they grew token by token), so that what is counted is what is held.
void remember_ended(Self* self, std::string key, uint64_t uid, Record& rec);

/// Forgets ended keys beyond the configured cache size, in count and in bytes, oldest first.
void evict(Self* self);

/// The router refused or failed a job that admission counted: undo the quota and the record,
/// tell every client waiting on the key.
void drop_pending(Self* self, const std::string& key, uint64_t uid, ErrorCode code,
                  const std::string& message, int64_t retry_after_ms);

/// A job ended (finished_atom): frees the tenant's quota, journals the end, stores the result for
/// resubmissions and answers attached clients.
void finished(Self* self, JobOutcome& o);

/// A cancel or status request for a job key (k.kind says which).
void key_request(Self* self, KeyRequest& k);

/// Enqueues the previous run's journaled jobs one at a time: a full queue is retried after its
/// retry_after_ms instead of failing a job that was already accepted.
void replay_next(Self* self);

/// Takes over what the journal held at start (see spawn_admission with a journal).
void restore(Self* self, const JournalReplay& replay);

/// Hands an admitted job to the router (a program to the program manager).
void enqueue(Self* self, const std::string& key, Job job);

/// A chat conversation rendered with the model's template and tokenized, or why it cannot be.
std::optional<std::string> render_messages(Self* self, const std::vector<chat::Message>& msgs,
                                           std::vector<int32_t>& out);

/// A job's or program's priority class (its index in `ci`), max_tokens, temperature and top_p,
/// checked; the bad_request message otherwise.
std::optional<std::string> check_basics(Self* self, const SubmitRequest& req, std::size_t& ci);

/// The sampling controls of a request, checked (ranges, logit_bias ids against the vocabulary).
std::optional<std::string> check_controls(Self* self, const SamplingControls& c);

// ---- the program manager (admission_programs.cpp, docs/programs.md) ----

/// Checks a program submit and fills the program job (its steps, inputs and gen defaults);
/// `cost` is what it may take from the tenant's token bucket. Returns the bad_request message.
std::optional<std::string> build_program(Self* self, const SubmitRequest& req, Job& job,
                                         uint32_t& cost);
/// Starts an admitted (journaled, or replayed) program: `accepted`, then its first steps.
void program_start(Self* self, const std::string& key, Job job);
/// A job's end: true when it was a program's step job (then handled here).
bool program_step_ended(Self* self, JobOutcome& o);
/// Cancels a running program by its uid; false when no program has it.
bool program_cancel(Self* self, uint64_t uid);
/// A status request for a program: true when `uid` is one (answered here).
bool program_status(Self* self, uint64_t uid, StatusEvent s);
/// A tool's result from a client.
void program_tool_result(Self* self, ToolResultRequest& r);
/// A program's timer: tool waits past their time, step jobs a full queue refused.
void program_timer(Self* self, uint64_t uid);

}  // namespace sy::admission_detail
