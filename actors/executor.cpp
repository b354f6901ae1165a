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

// A sequence as the draft model sees it (SeqPlan::draft_model): its tokens as far as the executor
// has seen them, the draft cache's blocks, and how many of those tokens the cache holds
// (hist[0, n_cached)).
struct DraftSeq {
  std::vector<int32_t> hist;
  bool known = true;  // hist holds every token before the step's (false: a part never seen here)
  std::vector<int32_t> blocks;
  int32_t n_cached = 0;
};

struct ExecutorState {
  ExecutorSpec spec;
  std::unique_ptr<Engine> engine;  // null for the "null" backend
  // Speculation with a draft model: its engine (own KV pool), its view of each sequence, the
  // tokens a draft_model plan sequence feeds this step (drafts written in; fed_tokens) and how
  // many of each plan sequence's fed tokens are drafts.
  std::unique_ptr<Engine> draft;
  std::unordered_map<uint64_t, DraftSeq> dseqs;
  std::vector<std::vector<int32_t>> fed;
  std::vector<int32_t> fed_drafts;
  std::vector<SeqStep> dbatch;
  std::vector<size_t> drows;
  StepOutput dout;
  std::vector<int32_t> dids;
  bool draft_failed_logged = false;
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
  int64_t interrupted = 0;   // steps the engine stopped on spec.interrupt
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

// The tokens plan sequence i feeds: the plan's, or for a draft_model sequence its copy with the
// draft model's drafts written in (only those it could write).
const std::vector<int32_t>& fed_tokens(const ExecutorState& st, const SeqPlan& p, size_t i) {
  return p.draft_model ? st.fed[i] : p.tokens;
}

// SeqPlan::n_draft: samples the rows of batch entry j in order, each exactly as a decode step
// would (same sampler, same random draws, the confirmed tokens recorded before the next row), and
// stops at the first sampled token that is not the next draft. The output is then token for token
// what decoding without drafts gives, for greedy and seeded sampling alike (docs/speculation.md).
void verify_drafts(ExecutorState& st, const SeqPlan& p, size_t i, size_t j, SeqSampling& s,
                   SeqResult& r) {
  const int32_t n_vocab = st.engine->config().n_vocab;
  const std::vector<int32_t>& tokens = fed_tokens(st, p, i);
  const size_t n_fed = tokens.size();
  const int32_t d = std::min<int32_t>(st.fed_drafts[i], static_cast<int32_t>(n_fed) - 1);
  const int32_t first = static_cast<int32_t>(n_fed) - 1 - d;  // row of the last real token
  for (int32_t k = 0; k <= d; ++k) {
    st.top.clear();
    float lp = 0.0f;
    const int32_t id = s.sampler.sample(st.out.row(j, first + k), n_vocab,
                                        p.logprobs ? &st.top : nullptr, &lp, s.constraint.get());
    const size_t next = static_cast<size_t>(first + k + 1);
    if (k < d && id == tokens[next]) {
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

// The draft model's view of every sequence of the plan (SeqPlan::draft_model): its tokens up to
// the step's, kept from the tokens each plan feeds (a reset brings the part before n_past in
// draft_prior), and the draft cache cut back to what the target keeps.
void track_drafts(ExecutorState& st, const StepPlan& plan) {
  for (const SeqPlan& p : plan.seqs) {
    DraftSeq& d = st.dseqs[p.uid];
    if (p.reset) {
      d.hist = p.draft_prior;
      d.known = static_cast<int32_t>(d.hist.size()) == p.n_past;
      d.n_cached = 0;
    }
    if (!d.known || static_cast<int32_t>(d.hist.size()) < p.n_past) {
      d.known = false;
      continue;
    }
    d.hist.resize(static_cast<size_t>(p.n_past));
    d.n_cached = std::min(d.n_cached, p.n_past);
    const size_t real = p.tokens.size() - static_cast<size_t>(std::max(0, p.n_draft));
    d.hist.insert(d.hist.end(), p.tokens.begin(), p.tokens.begin() + static_cast<ptrdiff_t>(real));
  }
}

// The lowest id of the largest logit of a row (as Sampler's argmax).
int32_t argmax_row(const float* row, int32_t n_vocab) {
  int32_t best = 0;
  for (int32_t t = 1; t < n_vocab; ++t)
    if (row[t] > row[best]) best = t;
  return best;
}

// Writes the drafts of the plan's draft_model sequences into st.fed: the draft model catches up
// on the tokens its cache lacks, then decodes greedily, one batched draft step per draft
// position. A sequence it cannot draft for (tokens never seen here, its context or the draft
// pool full) feeds no drafts; a draft step that fails leaves every sequence without drafts.
void make_drafts(ExecutorState& st, const StepPlan& plan, StepResult& res) {
  Engine& e = *st.draft;
  const int32_t bs = e.block_size();
  const int32_t ctx = e.config().ctx_len;
  const int32_t n_vocab = e.config().n_vocab;
  int64_t budget = st.spec.max_batch_tokens > 0 ? st.spec.max_batch_tokens : 4096;
  struct Act {
    size_t i;
    DraftSeq* d;
    int32_t k, real, len;
  };
  std::vector<Act> act;
  int32_t k_max = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqPlan& p = plan.seqs[i];
    if (!p.draft_model || p.n_draft <= 0 || !st.failed[i].empty()) continue;
    auto it = st.dseqs.find(p.uid);
    if (it == st.dseqs.end() || !it->second.known) continue;
    DraftSeq& d = it->second;
    const int32_t len = static_cast<int32_t>(d.hist.size());
    const int32_t k = p.n_draft;
    if (ctx > 0 && len + k > ctx) continue;
    const int32_t catch_up = len - d.n_cached;
    if (catch_up <= 0 || catch_up > budget) continue;
    const size_t need = static_cast<size_t>((len + k - 1 + bs - 1) / bs);
    while (d.blocks.size() < need) {
      const auto b = e.pool().alloc();
      if (!b) break;
      d.blocks.push_back(*b);
    }
    if (d.blocks.size() < need) continue;
    budget -= catch_up;
    act.push_back({i, &d, k, static_cast<int32_t>(p.tokens.size()) - k, len});
    k_max = std::max(k_max, k);
  }
  if (act.empty()) return;
  // What the passes cost, for the batcher's choice of drafts (policy::DraftCostModel).
  const auto t0 = std::chrono::steady_clock::now();
  const auto measure = [&] {
    res.draft_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  try {
    for (int32_t j = 0; j < k_max; ++j) {
      st.dbatch.clear();
      st.drows.clear();
      for (size_t a = 0; a < act.size(); ++a) {
        if (act[a].k <= j) continue;
        DraftSeq& d = *act[a].d;
        SeqStep s;
        if (j == 0) {
          s.tokens = d.hist.data() + d.n_cached;
          s.n_tokens = act[a].len - d.n_cached;
          s.n_past = d.n_cached;
        } else {
          s.tokens = st.fed[act[a].i].data() + act[a].real + j - 1;
          s.n_tokens = 1;
          s.n_past = act[a].len + j - 1;
        }
        s.block_table = d.blocks.data();
        s.n_blocks = static_cast<int32_t>(d.blocks.size());
        st.dbatch.push_back(s);
        st.drows.push_back(a);
      }
      ++res.draft_passes;
      for (const SeqStep& x : st.dbatch) res.draft_tokens += x.n_tokens;
      const bool greedy = e.step_greedy(st.dbatch, st.dids);
      if (!greedy) e.step(st.dbatch, st.dout);
      for (size_t b = 0; b < st.drows.size(); ++b) {
        const Act& x = act[st.drows[b]];
        x.d->n_cached = x.len + j;  // (catch-up) the sequence's tokens; then each draft fed
        const int32_t id = greedy ? st.dids[b] : argmax_row(st.dout.row(b), n_vocab);
        if (id < 0 || id >= n_vocab) throw std::runtime_error("draft model: no usable logits");
        st.fed[x.i][static_cast<size_t>(x.real + j)] = id;
      }
    }
  } catch (const std::exception& ex) {
    // The draft cache past the sequences' own tokens is suspect: it is written again next time.
    for (const Act& x : act) x.d->n_cached = 0;
    if (!st.draft_failed_logged) log_line(std::string("draft model step failed: ") + ex.what());
    st.draft_failed_logged = true;
    measure();
    return;
  }
  measure();
  for (const Act& x : act) st.fed_drafts[x.i] = x.k;
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
  // A draft_model sequence feeds a copy of its tokens with the draft model's drafts written in.
  st.fed.resize(std::max(st.fed.size(), n));
  st.fed_drafts.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const SeqPlan& p = plan.seqs[i];
    if (p.draft_model) st.fed[i].assign(p.tokens.begin(), p.tokens.end());
    st.fed_drafts[i] = p.draft_model ? 0 : std::max(0, p.n_draft);
  }
  if (st.draft) {
    track_drafts(st, plan);
    make_drafts(st, plan, res);
    for (size_t i = 0; i < n; ++i)  // drafts not written: not fed
      if (plan.seqs[i].draft_model)
        st.fed[i].resize(plan.seqs[i].tokens.size() -
                         static_cast<size_t>(plan.seqs[i].n_draft - st.fed_drafts[i]));
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
      const std::vector<int32_t>& fed = fed_tokens(st, p, i);
      s.tokens = fed.data();
      s.n_tokens = static_cast<int32_t>(fed.size());
      s.n_past = p.n_past;
      s.block_table = p.block_table.data();
      s.n_blocks = static_cast<int32_t>(p.block_table.size());
      s.window = p.window;
      s.sinks = p.sinks;
      // Teacher-forced log-probabilities and drafts read every row.
      s.all_logits = !p.targets.empty() || st.fed_drafts[i] > 0;
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
      greedy = greedy && p.targets.empty() && st.fed_drafts[i] == 0;
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
      const int32_t rows_of = st.fed_drafts[i] > 0 ? st.out.count[j] : 1;
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
      if (p.draft_model) r.drafts.assign(st.fed[i].end() - st.fed_drafts[i], st.fed[i].end());
      if (st.fed_drafts[i] > 0) {
        verify_drafts(st, p, i, j, s, r);
        if (st.draft) {  // the accepted drafts are the sequence's tokens now
          DraftSeq& d = st.dseqs[p.uid];
          if (d.known) d.hist.insert(d.hist.end(), r.spec_ids.begin(), r.spec_ids.end());
        }
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
  // A detached actor builds its behavior on its own thread.
  const std::string why = enter_thread_class(st->spec.thread_name, st->spec.cpu_priority);
  if (!why.empty())
    log_line("executor: the kernel refused the " + std::string(to_string(st->spec.cpu_priority)) +
             " CPU priority (" + why + "); the executor runs at the normal one");
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
        } catch (const StepInterrupted&) {
          res.seqs.clear();
          res.interrupted = true;
          ++st->interrupted;
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
          auto it = st->dseqs.find(u);
          if (it == st->dseqs.end()) continue;
          for (int32_t b : it->second.blocks) st->draft->pool().free(b);
          st->dseqs.erase(it);
        }
      },
      [st](stats_atom) -> ExecutorStats {
        ExecutorStats s;
        s.steps = st->steps;
        s.tokens = st->tokens;
        s.samplers = static_cast<int64_t>(st->samplers.size());
        s.seq_failures = st->seq_failures;
        s.interrupted = st->interrupted;
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
    opts.on_thread_start = [name = spec.thread_name, prio = spec.cpu_priority](int i) {
      enter_thread_class(name + ".w" + std::to_string(i), prio);
    };
    // With a draft model on the GPU and no block count given, the two pools have one block
    // count: the target takes its share of the cache memory by the bytes a block holds in each
    // model (layers x KV width), and the draft model's pool gets as many blocks from what is
    // left (the rest of that share; its own weights come out of the headroom the fraction
    // leaves).
    double fraction = spec.kv_gpu_fraction, draft_fraction = spec.kv_gpu_fraction;
    if (spec.draft_model && spec.backend == Backend::cuda && spec.n_blocks <= 0) {
      const auto per_block = [](const LlamaConfig& c) {
        return static_cast<double>(c.n_layers) * c.n_kv_heads * c.head_dim;
      };
      const double t = per_block(spec.model->config()), d = per_block(spec.draft_model->config());
      if (t > 0 && d > 0) {
        fraction = spec.kv_gpu_fraction * t / (t + d);
        draft_fraction = 1.0;  // a bound only: the draft pool takes exactly the target's count
      }
    }
    st->engine = make_engine(spec.backend, spec.model, opts, std::max(spec.device, 0), fraction);
    if (spec.draft_model) {
      EngineOptions dopts = opts;
      dopts.n_blocks = spec.n_blocks > 0 ? spec.n_blocks : st->engine->pool().n_total();
      dopts.n_window_blocks = 0;
      st->draft = make_engine(spec.backend, spec.draft_model, dopts, std::max(spec.device, 0),
                              draft_fraction);
    }
  } else if (spec.backend != Backend::null) {
    throw std::invalid_argument("executor: unknown backend '" +
                                std::string(to_string(spec.backend)) +
                                "' (expected cpu, cuda or null)");
  }
  if (st->engine && spec.interrupt) st->engine->interrupt_on(spec.interrupt.get());
  if (n_blocks) *n_blocks = st->engine ? st->engine->pool().n_total() : spec.n_blocks;
  st->spec = std::move(spec);
  return sys.spawn<caf::detached>(executor_actor, std::move(st));
}

}  // namespace sy
