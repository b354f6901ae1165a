// A batcher (and usually a real CPU executor) in a real actor system, with a scoped actor
// standing in for the router, egress and admission: shared by the batcher and KV-policy tests.
#pragma once

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "actors/batcher.hpp"
#include "actors/executor.hpp"
#include "actors/messages.hpp"
#include "model/llama.hpp"
#include "tests/support/stand_in.hpp"

namespace sy::test {

inline const std::string kModels = SY_MODELS_DIR;
// Generous: a lost message shows up as a failure, never as a hang. Not a timing assertion.
inline constexpr auto kWait = std::chrono::seconds(60);

inline caf::actor_system_config& config() {
  static caf::actor_system_config cfg = [] {
    caf::actor_system_config c;
    register_message_types(c);
    return c;
  }();
  return cfg;
}

inline std::shared_ptr<LlamaModel> stories() {
  static std::shared_ptr<LlamaModel> m = LlamaModel::load(kModels + "/stories260K.gguf");
  return m;
}

// What the stand-in router/egress/admission saw for one job.
struct Seen {
  std::vector<int32_t> stream_ids;                      // choice 0's (a plain job's)
  std::string stream_text;                              // choice 0's
  std::map<uint32_t, std::vector<int32_t>> choice_ids;  // every choice's streamed ids
  std::map<uint32_t, std::string> choice_text;
  bool contiguous = true;
  uint32_t stream_n_top = 0;
  bool stream_logprob_shape = true;  // every chunk: one logprob and n_top alternatives per id
  int dones = 0, errors = 0, outcomes = 0;
  DoneEvent done;
  ErrorEvent error;
  JobOutcome outcome;
};

// One test's actors: a system, a scoped actor standing in for router, egress and admission.
struct Rig {
  caf::actor_system sys{config()};
  caf::scoped_actor sink{sys};
  ExecutorActor executor;
  BatcherActor batcher;
  std::shared_ptr<LlamaModel> model = stories();  // the batcher's and a cpu executor's model
  std::map<uint64_t, Seen> seen;
  uint64_t credit = 0;
  int credit_msgs = 0;
  uint64_t next_uid = 1;
  // > 0: the executor's and batcher's window-group KV blocks (a model with two kinds of layers)
  int32_t window_blocks = 0;
  bool draft_model = false;  // the executor of start() has a draft model
  // Set: the pair's flag for stopping the step in flight (BatcherExtras::interrupt; start()
  // gives it to the executor too).
  std::shared_ptr<std::atomic<bool>> interrupt;

  void start(BatchingConfig bc, int32_t n_blocks, ExecutorSpec spec, bool with_model = true) {
    if (spec.model) spec.model = model;
    spec.n_blocks = n_blocks;
    spec.n_window_blocks = window_blocks;
    spec.block_size = bc.kv_block_size;
    draft_model = spec.draft_model != nullptr;
    spec.interrupt = interrupt;
    executor = spawn_executor(sys, spec);
    start_with(bc, n_blocks, executor, with_model);
  }
  /// With a stand-in executor (a scoped actor that answers the steps itself).
  void start_with(BatchingConfig bc, int32_t n_blocks, const caf::actor& exec, bool with_model) {
    start_with(bc, n_blocks, test::stand_in<ExecutorActor>(exec), with_model);
  }
  void start_with(BatchingConfig bc, int32_t n_blocks, ExecutorActor exec, bool with_model) {
    BatcherExtras extras;
    extras.window_blocks = window_blocks;
    extras.draft_model = draft_model;
    extras.interrupt = interrupt;
    batcher = spawn_batcher(sys, bc, with_model ? model : nullptr, exec,
                            test::stand_in<RouterActor>(sink), test::stand_in<EgressActor>(sink),
                            test::stand_in<AdmissionActor>(sink), n_blocks, extras);
  }
  ~Rig() {
    if (batcher) caf::anon_send_exit(batcher, caf::exit_reason::user_shutdown);
    if (executor) caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
  }

  Job job(std::vector<int32_t> prompt, uint32_t max_tokens, bool stream) {
    Job j;
    j.uid = next_uid++;
    j.id = std::to_string(j.uid);
    j.id.insert(0, "job");
    j.tenant.assign(1, 't');  // (a literal assignment trips a GCC 12 -Wrestrict false positive)
    j.prompt = std::move(prompt);
    j.max_tokens = max_tokens;
    j.temperature = 0.0f;
    j.stream = stream;
    j.arrival_us = now_us();
    return j;
  }
  uint64_t submit(const Job& j) {
    sink->send(batcher, run_atom::value, j);
    return j.uid;
  }

  // Handles one message; false on timeout.
  bool receive_one(caf::duration timeout = caf::duration{kWait}) {
    bool ok = true;
    sink->receive(
        [&](credit_atom, const BatcherActor&, uint32_t n) {
          credit += n;
          ++credit_msgs;
        },
        [&](out_atom, const TokensEvent& t) {
          Seen& s = seen[t.uid];
          std::vector<int32_t>& ids = s.choice_ids[t.choice];
          if (t.index != ids.size()) s.contiguous = false;
          ids.insert(ids.end(), t.ids.begin(), t.ids.end());
          s.choice_text[t.choice] += t.text;
          if (t.choice == 0) {
            s.stream_ids.insert(s.stream_ids.end(), t.ids.begin(), t.ids.end());
            s.stream_text += t.text;
          }
          s.stream_n_top = t.n_top;
          if (t.logprob.size() != (t.n_top ? t.ids.size() : 0) ||
              t.top_ids.size() != t.n_top * t.ids.size() ||
              t.top_logprobs.size() != t.top_ids.size())
            s.stream_logprob_shape = false;
        },
        [&](out_atom, const DoneEvent& d) {
          seen[d.uid].done = d;
          ++seen[d.uid].dones;
        },
        [&](out_atom, const ErrorEvent& e) {
          seen[e.uid].error = e;
          ++seen[e.uid].errors;
        },
        [&](finished_atom, const JobOutcome& o) {
          seen[o.uid].outcome = o;
          ++seen[o.uid].outcomes;
        },
        caf::after(timeout) >> [&] { ok = false; });
    return ok;
  }
  // Handles what is already in the mailbox (e.g. credit sent after a job's last event); a stats
  // round trip first makes sure the batcher's earlier sends have arrived.
  void drain() {
    stats(batcher);
    while (receive_one(caf::duration{std::chrono::milliseconds(1)})) {
    }
  }
  bool ended(uint64_t uid) {
    auto it = seen.find(uid);
    return it != seen.end() && it->second.outcomes > 0 && it->second.dones + it->second.errors > 0;
  }
  // Receives until every job in `uids` has its terminal event and outcome. One receive can
  // handle more than one message (a blocking actor's mailbox hands out a normal and an urgent
  // message in one round: the batcher sends the most important class's events urgent), so every
  // pending job is checked each time, not only the last one named.
  void wait_all(const std::vector<uint64_t>& uids) {
    std::set<uint64_t> pending;
    for (uint64_t u : uids)
      if (!ended(u)) pending.insert(u);
    while (!pending.empty()) {
      BOOST_REQUIRE_MESSAGE(receive_one(), "timed out waiting for jobs to end");
      for (auto it = pending.begin(); it != pending.end();)
        it = ended(*it) ? pending.erase(it) : std::next(it);
    }
  }
  /// The stats record of `a` (a batcher's by default; ExecutorStats for the executor).
  template <class R = BatcherStats>
  R stats(const auto& a) {
    R out;
    sink->request(a, kWait, stats_atom::value)
        .receive([&](R& s) { out = std::move(s); },
                 [&](caf::error& e) { BOOST_FAIL("stats failed: " + sys.render(e)); });
    return out;
  }
};

inline ExecutorSpec cpu_spec() {
  ExecutorSpec e;
  e.backend = Backend::cpu;
  e.model = stories();
  e.threads = 1;  // the test machine's cores are shared
  return e;
}

}  // namespace sy::test
