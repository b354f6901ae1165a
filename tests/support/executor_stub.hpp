// A stand-in executor for actor tests on the test scheduler: it finishes, fails, throws or holds
// each step as the test says, sampling one fixed token, and answers held steps on a cue.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "actors/messages.hpp"

namespace sy::test {

/// The test's cue to the stand-in executor: answer the steps it holds.
using answer_atom = caf::atom_constant<caf::atom("answer")>;

/// What the stand-in executor does with a step.
enum class ExecMode { finish, fail_step, throw_step, hang };

/// One stand-in's orders and what it saw; the actors run on the test thread, so plain fields do.
struct StubExecutor {
  ExecMode mode = ExecMode::finish;
  int32_t token = 7;                        // sampled for every sequence that samples
  std::vector<StepPlan> steps;              // as the executor got them
  std::vector<uint64_t> released;           // sampler releases
  std::vector<caf::response_promise> hung;  // steps that never get an answer
};

/// The result of `plan` with `token` sampled for every sequence that samples.
inline StepResult sampled(const StepPlan& plan, int32_t token) {
  StepResult r;
  r.step = plan.step;
  for (const SeqPlan& p : plan.seqs) {
    if (!p.sample) continue;
    SeqResult s;
    s.uid = p.uid;
    s.token = token;
    r.seqs.push_back(s);
  }
  return r;
}

/// Spawns the stand-in (untyped, so that it also takes answer_atom; hand it to the actor under
/// test as stand_in<ExecutorActor>). `rec` must outlive it.
inline caf::actor spawn_executor_stub(caf::actor_system& sys, StubExecutor* rec) {
  return sys.spawn([rec](caf::event_based_actor* self) -> caf::behavior {
    return {
        [rec, self](step_atom, StepPlan& plan) -> caf::result<StepResult> {
          rec->steps.push_back(plan);
          switch (rec->mode) {
            case ExecMode::throw_step:
              throw std::runtime_error("stand-in executor fault");
            case ExecMode::hang:
              rec->hung.push_back(self->make_response_promise());
              return caf::delegated<StepResult>{};
            case ExecMode::fail_step: {
              StepResult r;
              r.step = plan.step;
              r.error = "device lost";
              return r;
            }
            case ExecMode::finish:
              break;
          }
          return sampled(plan, rec->token);
        },
        [rec](release_atom, std::vector<uint64_t>& uids) {
          rec->released.insert(rec->released.end(), uids.begin(), uids.end());
        },
        [](stats_atom) { return ExecutorStats{}; },
        // The cue to answer the held steps now (a promise is delivered from inside its actor).
        [rec](answer_atom) {
          for (size_t i = 0; i < rec->hung.size(); ++i)
            rec->hung[i].deliver(
                sampled(rec->steps[rec->steps.size() - rec->hung.size() + i], rec->token));
          rec->hung.clear();
        },
    };
  });
}

}  // namespace sy::test
