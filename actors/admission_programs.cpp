// The program manager, a piece of the admission actor (docs/programs.md): it checks a program
// submit whole, walks an admitted program's steps (programs/program.hpp), sends each gen and
// select to the router as a step job of the program, journals every finished step, answers tool
// results, and ends the program as admission ends a job. It lives in admission because the walk
// needs what admission holds: the tokenizer and chat template, the key table and the journal.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "actors/admission_state.hpp"
#include "actors/constraint_support.hpp"
#include "actors/log.hpp"
#include "core/wire.hpp"
#include "model/llama.hpp"

namespace sy::admission_detail {

namespace {

using programs::Action;
using programs::Step;

/// A full class queue is polled again no faster than this: faster only burns the router's time.
constexpr int64_t kMinRetryMs = 10;

const char* kind_name(Step::Kind k) {
  switch (k) {
    case Step::Kind::text:
      return "text";
    case Step::Kind::gen:
      return "gen";
    case Step::Kind::select:
      return "select";
    case Step::Kind::fork:
      return "fork";
    case Step::Kind::join:
      return "join";
    case Step::Kind::tool:
      return "tool";
  }
  return "step";
}

const char* action_kind(Action::Kind k) {
  return k == Action::Kind::gen      ? "gen"
         : k == Action::Kind::select ? "select"
         : k == Action::Kind::tool   ? "tool"
                                     : "prefill";
}

/// "step 2.1.0 (gen 'draft')": how every error names a step.
std::string label(const std::string& path, const char* kind, const std::string& name) {
  std::string s = "step " + path + " (" + kind;
  if (!name.empty()) s += " '" + name + "'";
  return s + ")";
}

programs::GenDefaults defaults_of(const SubmitRequest& r) {
  programs::GenDefaults d;
  d.max_tokens = r.max_tokens;
  d.temperature = r.temperature;
  d.top_k = r.top_k;
  d.top_p = r.top_p;
  d.seed = r.seed;
  d.stop = r.stop;
  d.controls = r.controls;
  return d;
}

programs::GenDefaults defaults_of(const Job& j) {
  programs::GenDefaults d;
  d.max_tokens = j.max_tokens;
  d.temperature = j.temperature;
  d.top_k = static_cast<uint32_t>(std::max(0, j.top_k));
  d.top_p = j.top_p;
  d.seed = j.seed;
  d.stop = j.stop;
  d.controls = j.controls;
  return d;
}

/// What admission checks per step beyond the parser: constraints compile, controls fit the
/// vocabulary, tool steps have a door their result can come back through.
std::optional<std::string> check_steps(Self* self, const programs::Steps& steps,
                                       const ClientRef& client) {
  auto& st = self->state;
  for (const Step& s : steps) {
    const std::string at = label(s.path, kind_name(s.kind), s.name);
    if (s.kind == Step::Kind::gen) {
      if (s.gen.controls)
        if (auto bad = check_controls(self, *s.gen.controls)) return at + ": " + *bad;
      if (s.gen.max_tokens && *s.gen.max_tokens > st.cfg.max_output_tokens)
        return at + ": max_tokens " + std::to_string(*s.gen.max_tokens) + " exceeds the limit " +
               std::to_string(st.cfg.max_output_tokens);
      if (!s.gen.constraint.empty()) {
        if (!st.model)
          return at + ": a constraint needs a model's vocabulary (this server runs without one)";
        if (!st.cfg.constraints) st.cfg.constraints = make_constraint_support(*st.model);
        std::string why = check_constraint(*st.cfg.constraints, s.gen.constraint);
        if (!why.empty()) return at + ": " + why;
      }
    } else if (s.kind == Step::Kind::tool && client.kind == ClientRef::cluster) {
      return at +
             ": tool steps need the request or pipeline endpoint (a cluster node has no "
             "door for the tool's result)";
    } else if (s.kind == Step::Kind::fork) {
      for (const auto& b : s.branches)
        if (auto bad = check_steps(self, b, client)) return bad;
    }
  }
  return std::nullopt;
}

ProgramState* find(Self* self, uint64_t uid) {
  auto it = self->state.programs.find(uid);
  return it == self->state.programs.end() ? nullptr : it->second.get();
}

void arm_timer(Self* self, uint64_t uid, int64_t delay_ms) {
  self->delayed_send(self, std::chrono::milliseconds(std::max<int64_t>(1, delay_ms)),
                     tool_atom::value, uid);
}

/// Ends a program: its steps in flight are cancelled and forgotten, its PULL credit goes back,
/// and its outcome takes the path every job's end takes (journal, quota, result cache).
void end_program(Self* self, uint64_t uid, JobOutcome o) {
  auto& st = self->state;
  auto it = st.programs.find(uid);
  if (it == st.programs.end()) return;
  std::unique_ptr<ProgramState> p = std::move(it->second);
  st.programs.erase(it);
  for (uint64_t s : p->steps) {
    st.step_jobs.erase(s);
    if (st.router) self->send(st.router, cancel_atom::value, s);
  }
  // The batchers let its pinned context go (cached, no longer held).
  if (st.router && p->first_dispatched) self->send(st.router, release_atom::value, uid);
  // A pipeline or cluster program held its PULL credit while it ran (its steps did not).
  return_pull_credit(self, p->job.client);
  o.tokens_used = p->prompt_tokens + p->completion_tokens;
  o.program = true;
  finished(self, o);
}

void fail_program(Self* self, uint64_t uid, ErrorCode code, const std::string& message) {
  ProgramState* p = find(self, uid);
  if (!p) return;
  ++self->state.programs_failed;
  ErrorEvent e = make_error_event(p->job, code, message);
  JobOutcome o = make_outcome(e);
  send_out(self, std::move(e));
  end_program(self, uid, std::move(o));
}

DoneEvent program_done(Self* self, ProgramState& p, FinishReason finish) {
  DoneEvent d = make_done(p.job, finish);
  d.text = p.run.last_output();
  for (auto& v : p.run.vars()) d.vars.push_back(wire::Var{v.name, v.values, v.list});
  d.steps = p.run.steps_done();
  d.prompt_tokens = p.prompt_tokens;
  d.cached_tokens = p.cached_tokens;
  d.completion_tokens = p.completion_tokens;
  d.queue_ms = p.queue_ms;
  d.ttft_ms = p.ttft_ms;
  d.total_ms =
      p.job.arrival_us > 0 ? static_cast<double>(clock_us(self) - p.job.arrival_us) / 1000.0 : 0.0;
  return d;
}

void complete_program(Self* self, uint64_t uid) {
  ProgramState* p = find(self, uid);
  if (!p) return;
  ++self->state.programs_done;
  DoneEvent d = program_done(self, *p, FinishReason::stop);
  JobOutcome o = make_outcome(d);
  send_out(self, std::move(d));
  end_program(self, uid, std::move(o));
}

/// The tokens of a step's context, as a plain job of that text (or those messages) would have
/// them; or why there are none.
std::optional<std::string> prompt_of(Self* self, const Action& a, bool chat,
                                     std::vector<int32_t>& out) {
  auto& st = self->state;
  const LlamaModel* model = st.model.get();
  if (chat) {
    std::vector<chat::Message> msgs;
    msgs.reserve(a.turns.size());
    for (const auto& t : a.turns) msgs.push_back({t.role, t.content});
    if (auto bad = render_messages(self, msgs, out)) return bad;
  } else if (model) {
    // parse_special off: inputs and outputs are text, never control tokens.
    out = model->tokenizer().encode(a.text, true, false);
  } else {
    out.assign(a.text.begin(), a.text.end());
    for (auto& t : out) t = static_cast<unsigned char>(t);
  }
  if (out.empty()) return std::string("the context is empty");
  const std::size_t n = out.size();
  if (st.cfg.max_prompt_tokens > 0 && n > st.cfg.max_prompt_tokens)
    return "prompt has " + std::to_string(n) + " tokens, limit " +
           std::to_string(st.cfg.max_prompt_tokens);
  if (model) {
    const auto ctx = static_cast<std::size_t>(std::max(0, model->limits().ctx_len));
    if (ctx > 0 && n > ctx)
      return "prompt has " + std::to_string(n) + " tokens, limit " + std::to_string(ctx) +
             " (the model's context length)";
  }
  return std::nullopt;
}

/// The job of a gen, select or prefill action; or why it cannot run.
std::optional<std::string> step_job(Self* self, ProgramState& p, const Action& a, Job& job) {
  auto& st = self->state;
  if (auto bad = prompt_of(self, a, p.program->chat, job.prompt)) return bad;
  const Job& pj = p.job;
  job.id = pj.id;
  job.tenant = pj.tenant;
  // Only a request client hears a step's tokens; a pipeline's or cluster's steps report to
  // nobody but their program (an empty ROUTER identity is nobody's: docs/durability.md).
  job.client = pj.client.kind == ClientRef::router ? pj.client : ClientRef{ClientRef::router, ""};
  job.class_index = pj.class_index;
  job.program_uid = pj.uid;
  job.step = a.path;
  job.speculative = pj.speculative;
  job.uid = st.next_step_uid++;
  job.arrival_us = clock_us(self);
  if (!p.first_dispatched) {
    // The program's deadline bounds the wait before its first step starts, as a job's does.
    p.first_dispatched = true;
    job.deadline_us = pj.deadline_us;
    if (pj.arrival_us > 0) job.arrival_us = pj.arrival_us;
  }
  const LlamaModel* model = st.model.get();
  const std::size_t ctx =
      model ? static_cast<std::size_t>(std::max(0, model->limits().ctx_len)) : 0;
  if (a.kind == Action::Kind::gen) {
    uint32_t max_tokens = a.params.max_tokens;
    if (ctx > 0 && !st.cfg.beyond_context)
      max_tokens = static_cast<uint32_t>(
          std::min<std::size_t>(max_tokens, std::max<std::size_t>(1, ctx - job.prompt.size())));
    job.max_tokens = max_tokens;
    job.temperature = static_cast<float>(a.params.temperature);
    job.top_k = static_cast<int32_t>(std::min<uint32_t>(a.params.top_k, 1u << 30));
    job.top_p = static_cast<float>(a.params.top_p);
    job.seed = a.params.seed;
    job.stop = a.params.stop;
    job.controls = a.params.controls;
    job.constraint = a.constraint;
    job.stream = pj.stream && pj.client.kind == ClientRef::router;
    return std::nullopt;
  }
  if (a.kind == Action::Kind::prefill) {
    // One greedy token whose output is dropped: the context's blocks land in the prefix cache
    // before the fork's branches start from them.
    job.max_tokens = 1;
    job.temperature = 0.0f;
    return std::nullopt;
  }
  // select: one scoring job over every choice (greedy_first_token scores first tokens only).
  const auto method = a.step ? a.step->method : Step::token_length_normalized;
  std::size_t longest = 0;
  for (const auto& c : a.choices) {
    std::vector<int32_t> ids;
    if (model) {
      ids = model->tokenizer().encode(c, false, false);
    } else {
      for (unsigned char ch : c) ids.push_back(ch);
    }
    if (ids.empty()) return "choice " + wire::quoted(c) + " has no tokens";
    if (method == Step::greedy_first_token) ids.erase(ids.begin() + 1, ids.end());
    longest = std::max(longest, ids.size());
    job.continuations.push_back(std::move(ids));
  }
  if (ctx > 0 && job.prompt.size() + longest > ctx)
    return "prompt (" + std::to_string(job.prompt.size()) + " tokens) and its longest choice (" +
           std::to_string(longest) + " tokens) exceed the model's context length " +
           std::to_string(ctx);
  job.max_tokens = static_cast<uint32_t>(longest);
  job.temperature = 0.0f;
  return std::nullopt;
}

void send_step(Self* self, uint64_t program, Job job);

/// Starts what the walk made ready: step jobs to the router, tool calls to the client.
void advance(Self* self, uint64_t uid) {
  auto& st = self->state;
  ProgramState* p = find(self, uid);
  if (!p) return;
  for (Action& a : p->run.ready()) {
    const std::string at = label(a.path, action_kind(a.kind), a.name);
    if (a.kind == Action::Kind::tool) {
      ++st.program_tool_calls;
      const int64_t wait_ms = a.timeout_ms > 0 ? a.timeout_ms : 60'000;
      p->tools[a.path] = {clock_us(self) + wait_ms * 1000, a.name};
      ToolCallEvent t;
      t.to = p->job.client;
      t.uid = uid;
      t.id = p->job.id;
      t.tenant = p->job.tenant;
      t.call = a.path;
      t.name = a.tool;
      t.arguments = a.arguments;
      send_out(self, std::move(t));
      arm_timer(self, uid, wait_ms);
      continue;
    }
    Job job;
    if (auto bad = step_job(self, *p, a, job))
      return fail_program(self, uid, ErrorCode::bad_request, at + ": " + *bad);
    StepJob sj;
    sj.program = uid;
    sj.kind = a.kind;
    sj.path = a.path;
    sj.name = a.name;
    sj.choices = a.choices;
    if (a.step) sj.method = a.step->method;
    sj.arrival_us = job.arrival_us;
    st.step_jobs[job.uid] = std::move(sj);
    p->steps.push_back(job.uid);
    send_step(self, uid, std::move(job));
    p = find(self, uid);
    if (!p) return;
  }
  if (p->run.finished() && p->steps.empty() && p->tools.empty()) complete_program(self, uid);
}

/// A step job to the router; a full queue defers it (retried on the program's timer), as a
/// replayed job waits: the program was accepted, so its steps are not refused.
void send_step(Self* self, uint64_t program, Job job) {
  auto& st = self->state;
  if (!st.router) return fail_program(self, program, ErrorCode::internal, "no router");
  const uint64_t suid = job.uid;
  self->request(st.router, caf::infinite, enqueue_atom::value, job)
      .then(
          [self, program, suid, job](const EnqueueReply& r) mutable {
            ProgramState* p = find(self, program);
            if (!p || !self->state.step_jobs.count(suid)) return;
            if (r.result == EnqueueResult::accepted) return;
            if (r.result == EnqueueResult::full) {
              p->deferred.push_back(std::move(job));
              arm_timer(self, program, std::max<int64_t>(kMinRetryMs, r.retry_after_ms));
              return;
            }
            fail_program(self, program, ErrorCode::internal,
                         "the router does not know the program's priority class");
          },
          [self, program](caf::error& err) {
            fail_program(self, program, ErrorCode::internal,
                         "router unavailable: " + self->system().render(err));
          });
}

/// A finished step's output: journaled, told to the client, fed to the walk.
void step_output(Self* self, ProgramState& p, const std::string& path, const std::string& name,
                 const char* kind, const std::string& output) {
  auto& st = self->state;
  ++st.program_steps;
  if (st.journal && p.job.client.kind != ClientRef::cluster)
    self->send(st.journal, journal_atom::value, ProgramStep{p.job.uid, path, output});
  StepEvent e;
  e.to = p.job.client;
  e.uid = p.job.uid;
  e.id = p.job.id;
  e.tenant = p.job.tenant;
  e.step = path;
  e.name = name;
  e.kind = kind;
  e.output = output;
  send_out(self, std::move(e));
  p.run.complete(path, output);
}

}  // namespace

std::optional<std::string> build_program(Self* self, const SubmitRequest& req, Job& job,
                                         uint32_t& cost) {
  std::size_t ci = 0;
  if (auto bad = check_basics(self, req, ci)) return bad;
  if (auto bad = check_controls(self, req.controls)) return bad;
  programs::GenDefaults defaults = defaults_of(req);
  programs::Program prog;
  try {
    prog = programs::parse(req.program, req.inputs, defaults);
  } catch (const programs::ProgramError& e) {
    return std::string(e.what());
  }
  if (auto bad = check_steps(self, prog.steps, req.client)) return bad;
  job.id = req.id;
  job.tenant = req.tenant;
  job.client = req.client;
  job.class_index = static_cast<uint32_t>(ci);
  job.max_tokens = req.max_tokens;
  job.temperature = static_cast<float>(req.temperature);
  job.top_k = static_cast<int32_t>(std::min<uint32_t>(req.top_k, 1u << 30));
  job.top_p = static_cast<float>(req.top_p);
  job.stop = req.stop;
  job.stream = req.stream;
  job.controls = req.controls;
  job.program = req.program;
  job.inputs = req.inputs;
  // The quota counts what the program may generate, and its inputs at ~4 bytes a token: the
  // context's prompt tokens are recomputed from the cache, not charged again per step.
  uint64_t input_bytes = 0;
  for (const auto& [k, v] : req.inputs) input_bytes += v.size();
  const uint64_t c = prog.max_generated + input_bytes / 4 + 1;
  cost = c > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(c);
  return std::nullopt;
}

void program_start(Self* self, const std::string& key, Job job) {
  auto& st = self->state;
  const uint64_t uid = job.uid;
  programs::Program prog;
  try {
    prog = programs::parse(job.program, job.inputs, defaults_of(job));
  } catch (const programs::ProgramError& e) {
    // Checked at admission; a journal of an older version could still hold one.
    ErrorEvent ev = make_error_event(job, ErrorCode::bad_request, e.what());
    JobOutcome o = make_outcome(ev);
    send_out(self, std::move(ev));
    return_pull_credit(self, job.client);
    finished(self, o);
    return;
  }
  auto state =
      std::make_unique<ProgramState>(std::make_shared<const programs::Program>(std::move(prog)));
  state->key = key;
  const bool resumed = !job.program_done.empty();
  for (const auto& [path, output] : job.program_done) {
    state->run.restore(path, output);
    ++st.program_steps_restored;
  }
  state->job = std::move(job);
  if (resumed) ++st.programs_resumed;
  ++st.programs_started;
  if (state->job.client.kind == ClientRef::router && !state->job.client.identity.empty()) {
    AcceptedEvent a;
    a.to = state->job.client;
    a.id = state->job.id;
    a.tenant = state->job.tenant;
    send_out(self, std::move(a));
  }
  st.programs[uid] = std::move(state);
  advance(self, uid);
}

bool program_step_ended(Self* self, JobOutcome& o) {
  auto& st = self->state;
  auto it = st.step_jobs.find(o.uid);
  // A step of a program that ended already: its late end is dropped.
  if (it == st.step_jobs.end()) return o.uid >= (uint64_t{1} << 61) && o.uid < (uint64_t{1} << 62);
  StepJob sj = std::move(it->second);
  st.step_jobs.erase(it);
  ProgramState* p = find(self, sj.program);
  if (!p) return true;
  p->steps.erase(std::remove(p->steps.begin(), p->steps.end(), o.uid), p->steps.end());
  const std::string at = label(sj.path, action_kind(sj.kind), sj.name);
  if (o.outcome == Outcome::error) {
    const ErrorCode code = o.error.code != ErrorCode{} ? o.error.code : o.code;
    fail_program(self, sj.program, code, at + ": " + o.error.message);
    return true;
  }
  const DoneEvent& d = o.done;
  p->prompt_tokens += d.prompt_tokens;
  p->cached_tokens += d.cached_tokens;
  p->completion_tokens += d.completion_tokens;
  st.program_prompt_tokens += d.prompt_tokens;
  st.program_cached_tokens += d.cached_tokens;
  st.program_completion_tokens += d.completion_tokens;
  // The program's queue time is its first step's; its first token is the first step that made
  // one (a select or a prefill makes none), measured from the program's arrival.
  if (!p->timed_queue) {
    p->timed_queue = true;
    p->queue_ms = d.queue_ms;
  }
  if (!p->timed && d.ttft_ms > 0 && sj.kind == Action::Kind::gen) {
    p->timed = true;
    const int64_t first_token_us = sj.arrival_us + static_cast<int64_t>(d.ttft_ms * 1000.0);
    p->ttft_ms = p->job.arrival_us > 0
                     ? static_cast<double>(first_token_us - p->job.arrival_us) / 1000.0
                     : d.ttft_ms;
  }
  if (o.outcome == Outcome::cancelled || d.finish == FinishReason::cancelled) {
    // Cancelled under the program (shutdown): the program ends cancelled with what it has.
    ++st.programs_cancelled;
    DoneEvent done = program_done(self, *p, FinishReason::cancelled);
    JobOutcome po = make_outcome(done);
    send_out(self, std::move(done));
    end_program(self, sj.program, std::move(po));
    return true;
  }
  if (sj.kind == Action::Kind::prefill) {
    p->run.complete(sj.path, "");
  } else if (sj.kind == Action::Kind::gen) {
    step_output(self, *p, sj.path, sj.name, "gen", d.text);
  } else {
    // select: the highest mean log-probability per token (token_length_normalized), or the
    // highest first-token log-probability (greedy_first_token: each scored on its first token).
    std::size_t best = 0;
    double best_v = -INFINITY;
    for (const ScoreResult& r : d.scores) {
      const double v = sj.method == Step::greedy_first_token || r.tokens == 0
                           ? r.logprob
                           : r.logprob / static_cast<double>(r.tokens);
      if (r.index < sj.choices.size() && v > best_v) {
        best_v = v;
        best = r.index;
      }
    }
    if (sj.choices.empty()) {
      fail_program(self, sj.program, ErrorCode::internal, at + ": no choices scored");
      return true;
    }
    step_output(self, *p, sj.path, sj.name, "select", sj.choices[best]);
  }
  advance(self, sj.program);
  return true;
}

bool program_cancel(Self* self, uint64_t uid) {
  ProgramState* p = find(self, uid);
  if (!p) return false;
  ++self->state.programs_cancelled;
  DoneEvent d = program_done(self, *p, FinishReason::cancelled);
  JobOutcome o = make_outcome(d);
  send_out(self, std::move(d));
  end_program(self, uid, std::move(o));
  return true;
}

bool program_status(Self* self, uint64_t uid, StatusEvent s) {
  ProgramState* p = find(self, uid);
  if (!p) return false;
  s.state =
      p->run.steps_done() == 0 && p->prompt_tokens == 0 ? JobState::queued : JobState::running;
  s.completion_tokens = p->completion_tokens;
  send_out(self, std::move(s));
  return true;
}

void program_tool_result(Self* self, ToolResultRequest& r) {
  auto& st = self->state;
  std::string why;
  if (!authenticate(self, r.tenant, r.token, false, why)) {
    ++st.unauthorized;
    send_error(self, r.client, r.id, r.tenant, ErrorCode::unauthorized, why);
    return;
  }
  auto rec = st.records.find(job_key(r.tenant, r.id));
  ProgramState* p =
      rec != st.records.end() && rec->second.live ? find(self, rec->second.uid) : nullptr;
  if (!p || !p->tools.count(r.call)) {
    ++st.not_found;
    send_error(self, r.client, r.id, r.tenant, ErrorCode::not_found,
               "no program " + wire::quoted(r.id) + " of tenant " + wire::quoted(r.tenant) +
                   " waits for tool call " + wire::quoted(r.call));
    return;
  }
  const uint64_t uid = p->job.uid;
  const std::string name = p->tools[r.call].second;
  p->tools.erase(r.call);
  step_output(self, *p, r.call, name, "tool", r.content);
  advance(self, uid);
}

void program_timer(Self* self, uint64_t uid) {
  auto& st = self->state;
  ProgramState* p = find(self, uid);
  if (!p) return;
  const int64_t now = clock_us(self);
  for (const auto& [path, wait] : p->tools)
    if (wait.first <= now) {
      ++st.program_tool_timeouts;
      return fail_program(
          self, uid, ErrorCode::deadline_exceeded,
          label(path, "tool", wait.second) + ": no tool_result within its tool_timeout_ms");
    }
  auto deferred = std::move(p->deferred);
  p->deferred.clear();
  for (Job& j : deferred) {
    send_step(self, uid, std::move(j));
    if (!find(self, uid)) return;
  }
}

}  // namespace sy::admission_detail
