// The executor actor: turns a StepPlan into one Engine::step (or the null backend's fixed tokens)
// and samples with each sequence's own Sampler.
#include "actors/executor.hpp"

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "actors/constraint_support.hpp"
#include "actors/messages.hpp"
#include "actors/target_logprobs.hpp"
#include "core/error_code.hpp"
#include "gpu/backend.hpp"
#include "gpu/engine.hpp"
#include "model/sampler.hpp"

namespace sy {

namespace {

// One sequence's sampling state: its sampler and, for a job with penalties or a constraint, the
// tokens recorded so far (positions [0, n_seen)) in the sampler's history and the matcher.
struct SeqSampling {
  explicit SeqSampling(const SamplingParams& p) : sampler(p) {}
  Sampler sampler;
  std::unique_ptr<SeqConstraint> constraint;  // null: free text
  bool tracks = false;                        // records the sequence's tokens
  int32_t n_prompt = 0;
  int32_t n_seen = 0;
};

struct ExecutorState {
  ExecutorSpec spec;
  std::unique_ptr<Engine> engine;  // null for the "null" backend
  std::unordered_map<uint64_t, SeqSampling> samplers;
  std::vector<SeqStep> batch;  // reused across steps: no per-step allocation once warm
  std::vector<size_t> rows;    // batch entry -> index into the plan
  std::vector<int32_t> positions;
  StepOutput out;
  std::vector<int32_t> ids;  // step_greedy's ids
  std::vector<TokenLogprob> top;
  std::vector<std::string> failed;     // per plan sequence: why it failed alone ("" if it did not)
  std::vector<ErrorCode> failed_code;  // ... and its code
  int64_t steps = 0, tokens = 0;
  int64_t seq_failures = 0;  // sequences ended alone (bad sampling state, non-finite logits)
  // TEST ONLY (test_nan_logits_token): sequences whose logits are made NaN at every sample.
  std::unordered_set<uint64_t> poisoned;
  // TEST ONLY (hang fault): promises never delivered, kept so that no reply is ever sent.
  std::vector<caf::typed_response_promise<StepResult>> held;

  // The vocabulary index and compiled constraints: the server's shared ones (spec), or made here
  // at the first constrained job.
  ConstraintSupport& constraints() {
    if (!spec.constraints) {
      if (!spec.model) throw std::invalid_argument("constraints need a model (none is loaded)");
      spec.constraints = make_constraint_support(*spec.model);
    }
    return *spec.constraints;
  }
};

SamplingParams params_of(const SeqPlan& p) {
  SamplingParams sp;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.seed = p.seed;
  sp.n_logprobs = static_cast<int>(p.logprobs);
  sp.controls = p.controls;
  return sp;
}

// Records token `id` at sequence position `pos` (once per position: a recomputed sequence feeds
// its tokens again) in the penalty history and, past the prompt, in the constraint's matcher.
void record(SeqSampling& s, int32_t pos, int32_t id) {
  if (pos < s.n_seen) return;
  s.n_seen = pos + 1;
  const bool output = pos >= s.n_prompt;
  s.sampler.accept(id, output);
  if (output && s.constraint) s.constraint->advance(id);
}

// The sampling state of a planned sequence, made (or remade on reset) as the plan says, with the
// plan's tokens recorded. Throws std::invalid_argument for parameters the sampler refuses and
// std::logic_error for a fed token the constraint does not allow.
SeqSampling& sampling_for(ExecutorState& st, const SeqPlan& p) {
  auto it = st.samplers.find(p.uid);
  if (it == st.samplers.end() || p.reset) {
    if (it != st.samplers.end()) st.samplers.erase(it);
    SeqSampling s(params_of(p));
    s.tracks = !p.prior.empty() || p.n_prompt > 0 || p.controls.any() || !p.constraint.empty();
    s.n_prompt = p.n_prompt;
    if (!p.constraint.empty()) s.constraint = make_seq_constraint(st.constraints(), p.constraint);
    it = st.samplers.emplace(p.uid, std::move(s)).first;
    for (size_t i = 0; i < p.prior.size(); ++i)
      record(it->second, static_cast<int32_t>(i), p.prior[i]);
  }
  SeqSampling& s = it->second;
  // Drafts are recorded only once confirmed (run_engine), as sampled tokens are.
  const size_t fed = p.tokens.size() - static_cast<size_t>(std::max(0, p.n_draft));
  if (s.tracks)
    for (size_t i = 0; i < fed; ++i) record(s, p.n_past + static_cast<int32_t>(i), p.tokens[i]);
  return s;
}

void fill_top(ExecutorState& st, const SeqPlan& p, SeqResult& r) {
  for (size_t k = 0; k < p.logprobs && k < st.top.size(); ++k) {
    r.top_ids.push_back(st.top[k].id);
    r.top_logprobs.push_back(st.top[k].logprob);
  }
}

// Ends plan sequence i alone: no token for it, the step goes on for the others.
void fail_seq(ExecutorState& st, size_t i, ErrorCode code, const std::string& why) {
  if (!st.failed[i].empty()) return;
  st.failed[i] = why.empty() ? std::string("unknown failure") : why;
  st.failed_code[i] = code;
  ++st.seq_failures;
}

// TEST ONLY (test_nan_logits_token): whether plan sequence `p` is one whose logits are made NaN.
bool poisoned(ExecutorState& st, const SeqPlan& p) {
  const int32_t n = st.spec.test_nan_logits_token;
  if (n < 0) return false;
  if (p.reset && std::find(p.tokens.begin(), p.tokens.end(), n) != p.tokens.end())
    st.poisoned.insert(p.uid);
  return st.poisoned.count(p.uid) > 0;
}

// SeqPlan::targets: the log-probability of each target token at its row of batch entry j (the
// step ran with all_logits for it), with the plan's top entries, into r. A row that is not
// finite ends the sequence alone, as a sampled one would.
void targets_of(ExecutorState& st, const SeqPlan& p, size_t j, size_t i, SeqResult& r) {
  const int32_t n_vocab = st.engine->config().n_vocab;
  std::vector<int32_t> scratch;
  for (size_t k = 0; k < p.targets.size(); ++k) {
    const int32_t t = p.targets[k];
    if (t < 0) continue;
    if (t >= n_vocab) {
      fail_seq(st, i, ErrorCode::internal,
               "target token id " + std::to_string(t) + " outside the vocabulary [0, " +
                   std::to_string(n_vocab) + ")");
      return;
    }
    const float lp = target_logprob(st.out.row(j, static_cast<int32_t>(k)), n_vocab, t,
                                    p.target_top, r.target_top_ids, r.target_top_logprobs, scratch);
    if (std::isnan(lp)) {
      fail_seq(st, i, ErrorCode::internal,
               "the engine gave this job no usable distribution at a prompt position (the "
               "logits are not finite); the job was stopped, the others of its step went on");
      return;
    }
    r.target_logprobs.push_back(lp);
  }
}

// SeqPlan::n_draft: samples the rows of batch entry j in order, each exactly as a decode step
// would (same sampler, same random draws, the confirmed tokens recorded before the next row), and
// stops at the first sampled token that is not the next draft. The output is then token for token
// what decoding without drafts gives, for greedy and seeded sampling alike (docs/speculation.md).
void verify_drafts(ExecutorState& st, const SeqPlan& p, size_t j, SeqSampling& s, SeqResult& r) {
  const int32_t n_vocab = st.engine->config().n_vocab;
  const size_t n_fed = p.tokens.size();
  const int32_t d = std::min<int32_t>(p.n_draft, static_cast<int32_t>(n_fed) - 1);
  const int32_t first = static_cast<int32_t>(n_fed) - 1 - d;  // row of the last real token
  for (int32_t k = 0; k <= d; ++k) {
    st.top.clear();
    float lp = 0.0f;
    const int32_t id = s.sampler.sample(st.out.row(j, first + k), n_vocab,
                                        p.logprobs ? &st.top : nullptr, &lp, s.constraint.get());
    const size_t next = static_cast<size_t>(first + k + 1);
    if (k < d && id == p.tokens[next]) {
      r.spec_ids.push_back(id);
      r.spec_logprob.push_back(lp);
      for (size_t t = 0; t < p.logprobs; ++t) {
        const bool have = t < st.top.size();
        r.spec_top_ids.push_back(have ? st.top[t].id : 0);
        r.spec_top_logprobs.push_back(have ? st.top[t].logprob : -1e30f);
      }
      if (s.tracks) record(s, p.n_past + static_cast<int32_t>(next), id);
      continue;
    }
    r.token = id;
    r.logprob = lp;
    fill_top(st, p, r);
    return;
  }
}

void run_engine(ExecutorState& st, const StepPlan& plan, StepResult& res) {
  const size_t n = plan.seqs.size();
  // Copy-on-write of the blocks forked sequences shared, before this step writes any of them.
  if (!plan.copy_from.empty()) {
    std::vector<KvBlockCopy> copies;
    for (size_t i = 0; i < plan.copy_from.size() && i < plan.copy_to.size(); ++i)
      copies.push_back({plan.copy_from[i], plan.copy_to[i],
                        i < plan.copy_window.size() && plan.copy_window[i] != 0});
    st.engine->copy_blocks(copies);
  }
  st.failed.assign(n, std::string());
  st.failed_code.assign(n, ErrorCode{});
  // Samplers are made before the step so that a sequence with bad sampling parameters is left
  // out of it before any KV slot is written. The parameters are the client's (checked at the
  // edge already; a value the sampler still refuses is the client's to change): bad_request.
  // A sequence that records its tokens (penalties, a constraint) sees every chunk it is fed.
  std::vector<SeqSampling*> samplers(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const SeqPlan& p = plan.seqs[i];
    if (!p.sample && !p.reset) {
      auto it = st.samplers.find(p.uid);
      if (it == st.samplers.end() || !it->second.tracks) continue;
    }
    try {
      samplers[i] = &sampling_for(st, p);
    } catch (const std::invalid_argument& e) {
      fail_seq(st, i, ErrorCode::bad_request, e.what());
    } catch (const std::exception& e) {
      fail_seq(st, i, ErrorCode::internal, e.what());
    }
  }
  std::vector<uint8_t> nan_rows(n, 0);
  bool any_nan = false;
  for (size_t i = 0; i < n; ++i) {
    nan_rows[i] = st.failed[i].empty() && poisoned(st, plan.seqs[i]);
    any_nan = any_nan || nan_rows[i];
  }
  // The step over the sequences left; a sequence the engine refuses alone (BadSequence, raised
  // before any KV slot is written) is failed and the step run again without it, at most once per
  // sequence. Its plan came from the batcher, not from a client: internal.
  const int32_t n_vocab = st.engine->config().n_vocab;
  std::vector<size_t>& rows = st.rows;  // rows[j]: the plan index of batch entry j
  bool greedy_done = false;
  for (;;) {
    st.batch.clear();
    rows.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!st.failed[i].empty()) continue;
      const SeqPlan& p = plan.seqs[i];
      SeqStep s;
      s.tokens = p.tokens.data();
      s.n_tokens = static_cast<int32_t>(p.tokens.size());
      s.n_past = p.n_past;
      s.block_table = p.block_table.data();
      s.n_blocks = static_cast<int32_t>(p.block_table.size());
      s.window = p.window;
      s.sinks = p.sinks;
      // Teacher-forced log-probabilities and drafts read every row.
      s.all_logits = !p.targets.empty() || p.n_draft > 0;
      if (!p.window_table.empty()) {
        s.window_table = p.window_table.data();
        s.n_window_blocks = static_cast<int32_t>(p.window_table.size());
      }
      st.batch.push_back(s);
      rows.push_back(i);
    }
    if (st.batch.empty()) break;
    // Every sampled sequence greedy and without logprobs: a device backend picks the ids where
    // the logits are, so that only the ids cross to the host (the same ids as Sampler's argmax).
    bool greedy = !any_nan;
    for (size_t i : rows) {
      const SeqPlan& p = plan.seqs[i];
      // (Bias, penalties and constraints change the logits first: those sample on the host.)
      // (every row's logits go to the host for those)
      greedy = greedy && p.targets.empty() && p.n_draft == 0;
      greedy = greedy && (!p.sample || (p.temperature <= 0.0f && p.logprobs == 0 && samplers[i] &&
                                        !samplers[i]->tracks));
    }
    try {
      if (greedy && st.engine->step_greedy(st.batch, st.ids)) {
        greedy_done = true;
      } else {
        st.engine->step(st.batch, st.out);
      }
      break;
    } catch (const BadSequence& e) {
      if (e.seq >= rows.size()) throw;
      fail_seq(st, rows[e.seq], ErrorCode::internal, e.what());
    }
  }
  // Results in plan order: a failed sequence's error, or a sampled sequence's token.
  std::vector<SeqResult> sampled(n);
  for (size_t j = 0; j < rows.size(); ++j) {
    const size_t i = rows[j];
    const SeqPlan& p = plan.seqs[i];
    if (!p.targets.empty() && !greedy_done) targets_of(st, p, j, i, sampled[i]);
    if (!p.sample || !st.failed[i].empty()) continue;
    SeqResult& r = sampled[i];
    if (greedy_done) {
      r.token = st.ids[j];
      // -1: the device found the row's logits not finite (as Sampler's SamplingError).
      if (r.token == -1)
        fail_seq(st, i, ErrorCode::internal,
                 "the engine gave this job no usable next-token distribution (sampling: the "
                 "logits are not finite: a NaN or +inf, or every logit -inf); the job was "
                 "stopped, the others of its step went on");
      else if (r.token < 0 || r.token >= n_vocab)
        fail_seq(st, i, ErrorCode::internal,
                 "the engine picked token id " + std::to_string(r.token) +
                     ", outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
      continue;
    }
    if (nan_rows[i]) {  // every row the sequence samples from
      const int32_t rows_of = p.n_draft > 0 ? st.out.count[j] : 1;
      const auto at =
          (static_cast<size_t>(st.out.offset[j]) + static_cast<size_t>(st.out.count[j] - rows_of)) *
          static_cast<size_t>(n_vocab);
      std::fill_n(st.out.logits.begin() + static_cast<ptrdiff_t>(at),
                  static_cast<size_t>(n_vocab) * static_cast<size_t>(rows_of),
                  std::numeric_limits<float>::quiet_NaN());
    }
    // What goes wrong here belongs to this sequence alone: its logits row, its sampler. Not
    // the client's doing (its parameters passed): internal, naming the cause.
    try {
      SeqSampling& s = *samplers[i];
      if (p.n_draft > 0) {
        verify_drafts(st, p, j, s, r);
        continue;
      }
      st.top.clear();
      r.token = s.sampler.sample(st.out.row(j), n_vocab, p.logprobs ? &st.top : nullptr, &r.logprob,
                                 s.constraint.get());
      fill_top(st, p, r);
    } catch (const SamplingError& e) {
      fail_seq(st, i, ErrorCode::internal,
               std::string("the engine gave this job no usable next-token distribution (") +
                   e.what() + "); the job was stopped, the others of its step went on");
    } catch (const constraints::ConstraintError& e) {
      // The client's constraint outgrew a run-time bound (max_stacks: an ambiguous grammar).
      fail_seq(st, i, ErrorCode::bad_request, std::string("constraint: ") + e.what());
    } catch (const std::exception& e) {
      fail_seq(st, i, ErrorCode::internal, std::string("sampling failed: ") + e.what());
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const SeqPlan& p = plan.seqs[i];
    if (!st.failed[i].empty()) {
      SeqResult r;
      r.uid = p.uid;
      r.code = st.failed_code[i];
      r.error = st.failed[i];
      res.seqs.push_back(std::move(r));
    } else if (p.sample || !p.targets.empty()) {
      sampled[i].uid = p.uid;
      res.seqs.push_back(std::move(sampled[i]));
    }
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

ExecutorActor::behavior_type executor_actor(ExecutorActor::pointer self,
                                            std::shared_ptr<ExecutorState> st) {
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
          for (const SeqResult& r : res.seqs)
            st->tokens += r.error.empty() && r.token >= 0  // (targets alone: no token)
                              ? 1 + static_cast<int64_t>(r.spec_ids.size())
                              : 0;
        } catch (const std::exception& e) {
          res.seqs.clear();
          res.error = std::string("executor step failed: ") + e.what();
        }
        return res;
      },
      [st](release_atom, const std::vector<uint64_t>& uids) {
        for (uint64_t u : uids) {
          st->samplers.erase(u);
          st->poisoned.erase(u);
        }
      },
      [st](stats_atom) -> ExecutorStats {
        ExecutorStats s;
        s.steps = st->steps;
        s.tokens = st->tokens;
        s.samplers = static_cast<int64_t>(st->samplers.size());
        s.seq_failures = st->seq_failures;
        return s;
      },
  };
}

}  // namespace

ExecutorActor spawn_executor(caf::actor_system& sys, ExecutorSpec spec, int32_t* n_blocks) {
  auto st = std::make_shared<ExecutorState>();
  if (spec.backend == Backend::cpu || spec.backend == Backend::cuda) {
    if (!spec.model)
      throw std::invalid_argument("executor: the " + std::string(to_string(spec.backend)) +
                                  " backend needs a model");
    EngineOptions opts;
    opts.n_threads = spec.threads;
    opts.block_size = spec.block_size;
    opts.n_blocks = spec.n_blocks;
    opts.max_batch_tokens = spec.max_batch_tokens;
    opts.kv_type = spec.kv_type;
    opts.n_window_blocks = spec.n_window_blocks;
    st->engine =
        make_engine(spec.backend, spec.model, opts, std::max(spec.device, 0), spec.kv_gpu_fraction);
  } else if (spec.backend != Backend::null) {
    throw std::invalid_argument("executor: unknown backend '" +
                                std::string(to_string(spec.backend)) +
                                "' (expected cpu, cuda or null)");
  }
  if (n_blocks) *n_blocks = st->engine ? st->engine->pool().n_total() : spec.n_blocks;
  st->spec = std::move(spec);
  return sys.spawn<caf::detached>(executor_actor, std::move(st));
}

}  // namespace sy
