// The executor actor: turns a StepPlan into one Engine::step (or the null backend's fixed tokens)
// and samples with each sequence's own Sampler.
#include "actors/executor.hpp"

#include <caf/all.hpp>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "actors/messages.hpp"
#include "gpu/backend.hpp"
#include "gpu/engine.hpp"
#include "model/sampler.hpp"

namespace sy {

namespace {

struct ExecutorState {
  ExecutorSpec spec;
  std::unique_ptr<Engine> engine;  // null for the "null" backend
  std::unordered_map<uint64_t, Sampler> samplers;
  std::vector<SeqStep> batch;  // reused across steps: no per-step allocation once warm
  std::vector<int32_t> positions;
  StepOutput out;
  std::vector<int32_t> ids;  // step_greedy's ids
  std::vector<TokenLogprob> top;
  int64_t steps = 0, tokens = 0;
  // TEST ONLY (hang fault): promises never delivered, kept so that no reply is ever sent.
  std::vector<caf::typed_response_promise<StepResult>> held;
};

SamplingParams params_of(const SeqPlan& p) {
  SamplingParams sp;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.seed = p.seed;
  sp.n_logprobs = static_cast<int>(p.logprobs);
  return sp;
}

// The sampler of a planned sequence, made (or remade on reset) as the plan says.
Sampler& sampler_for(ExecutorState& st, const SeqPlan& p) {
  auto it = st.samplers.find(p.uid);
  if (it != st.samplers.end() && !p.reset) return it->second;
  if (it != st.samplers.end()) st.samplers.erase(it);
  return st.samplers.emplace(p.uid, Sampler(params_of(p))).first->second;
}

void fill_top(ExecutorState& st, const SeqPlan& p, SeqResult& r) {
  for (size_t k = 0; k < p.logprobs && k < st.top.size(); ++k) {
    r.top_ids.push_back(st.top[k].id);
    r.top_logprobs.push_back(st.top[k].logprob);
  }
}

void run_engine(ExecutorState& st, const StepPlan& plan, StepResult& res) {
  st.batch.clear();
  for (const SeqPlan& p : plan.seqs) {
    SeqStep s;
    s.tokens = p.tokens.data();
    s.n_tokens = static_cast<int32_t>(p.tokens.size());
    s.n_past = p.n_past;
    s.block_table = p.block_table.data();
    s.n_blocks = static_cast<int32_t>(p.block_table.size());
    s.window = p.window;
    s.sinks = p.sinks;
    st.batch.push_back(s);
  }
  // Samplers are made before the step so that bad sampling parameters fail it before any KV slot
  // is written.
  std::vector<Sampler*> samplers(plan.seqs.size(), nullptr);
  for (size_t i = 0; i < plan.seqs.size(); ++i)
    if (plan.seqs[i].sample || plan.seqs[i].reset) samplers[i] = &sampler_for(st, plan.seqs[i]);
  // Every sampled sequence greedy and without logprobs: a device backend picks the ids where
  // the logits are, so that only the ids cross to the host (the same ids as Sampler's argmax).
  bool greedy = true;
  for (const SeqPlan& p : plan.seqs)
    greedy = greedy && (!p.sample || (p.temperature <= 0.0f && p.logprobs == 0));
  if (greedy && st.engine->step_greedy(st.batch, st.ids)) {
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      if (!plan.seqs[i].sample) continue;
      SeqResult r;
      r.uid = plan.seqs[i].uid;
      r.token = st.ids[i];
      res.seqs.push_back(std::move(r));
    }
    return;
  }
  st.engine->step(st.batch, st.out);
  const int32_t n_vocab = st.engine->config().n_vocab;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqPlan& p = plan.seqs[i];
    if (!p.sample) continue;
    SeqResult r;
    r.uid = p.uid;
    st.top.clear();
    r.token =
        samplers[i]->sample(st.out.row(i), n_vocab, p.logprobs ? &st.top : nullptr, &r.logprob);
    fill_top(st, p, r);
    res.seqs.push_back(std::move(r));
  }
}

void run_null(ExecutorState& st, const StepPlan& plan, StepResult& res) {
  for (const SeqPlan& p : plan.seqs) {
    if (!p.sample) continue;
    SeqResult r;
    r.uid = p.uid;
    r.token = st.spec.null_token;
    // Placeholder logprobs of the right shape, so clients asking for them get well-formed chunks.
    for (uint32_t k = 0; k < p.logprobs; ++k) {
      r.top_ids.push_back(st.spec.null_token + static_cast<int32_t>(k));
      r.top_logprobs.push_back(k == 0 ? 0.0f : -100.0f);
    }
    res.seqs.push_back(std::move(r));
  }
}

caf::behavior executor_actor(caf::event_based_actor* self, std::shared_ptr<ExecutorState> st) {
  return {
      [self, st](step_atom, const StepPlan& plan) -> caf::result<StepResult> {
        const auto& spec = st->spec;
        if (spec.test_fault_hang_after > 0 && st->steps >= spec.test_fault_hang_after) {
          if (st->held.empty())
            log_line("TEST fault: executor hangs after " + std::to_string(st->steps) + " steps");
          st->held.push_back(self->make_response_promise<StepResult>());
          return st->held.back();
        }
        if (spec.test_fault_throw_after > 0 && st->steps >= spec.test_fault_throw_after) {
          log_line("TEST fault: executor throws after " + std::to_string(st->steps) + " steps");
          // Out of the handler on purpose: the actor terminates with an error (a crash).
          throw std::runtime_error("test fault: executor crashed after " +
                                   std::to_string(st->steps) + " steps");
        }
        StepResult res;
        res.step = plan.step;
        if (st->spec.step_delay_ms > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(st->spec.step_delay_ms));
        try {
          if (st->engine)
            run_engine(*st, plan, res);
          else
            run_null(*st, plan, res);
          ++st->steps;
          st->tokens += static_cast<int64_t>(res.seqs.size());
        } catch (const std::exception& e) {
          res.seqs.clear();
          res.error = std::string("executor step failed: ") + e.what();
        }
        return res;
      },
      [st](release_atom, const std::vector<uint64_t>& uids) {
        for (uint64_t u : uids) st->samplers.erase(u);
      },
      [st](stats_atom) -> caf::settings {
        caf::settings s;
        caf::put(s, "steps", st->steps);
        caf::put(s, "tokens", st->tokens);
        caf::put(s, "samplers", static_cast<int64_t>(st->samplers.size()));
        return s;
      },
  };
}

}  // namespace

caf::actor spawn_executor(caf::actor_system& sys, ExecutorSpec spec, int32_t* n_blocks) {
  auto st = std::make_shared<ExecutorState>();
  if (spec.backend == "cpu" || spec.backend == "cuda") {
    if (!spec.model)
      throw std::invalid_argument("executor: the " + spec.backend + " backend needs a model");
    EngineOptions opts;
    opts.n_threads = spec.threads;
    opts.block_size = spec.block_size;
    opts.n_blocks = spec.n_blocks;
    opts.max_batch_tokens = spec.max_batch_tokens;
    st->engine =
        make_engine(spec.backend, spec.model, opts, std::max(spec.device, 0), spec.kv_gpu_fraction);
  } else if (spec.backend != "null") {
    throw std::invalid_argument("executor: unknown backend '" + spec.backend +
                                "' (expected cpu, cuda or null)");
  }
  if (n_blocks) *n_blocks = st->engine ? st->engine->pool().n_total() : spec.n_blocks;
  st->spec = std::move(spec);
  return sys.spawn<caf::detached>(executor_actor, std::move(st));
}

}  // namespace sy
