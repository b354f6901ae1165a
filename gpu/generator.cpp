// The batch generation driver: every step feeds each unfinished sequence either its next prompt
// chunk or its last sampled token, samples where a prompt is complete, and applies stop rules.
#include "gpu/generator.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "constraints/filter.hpp"
#include "model/stop_matcher.hpp"
#include "model/tokenizer.hpp"

namespace sy {

namespace {

// One request in flight.
struct Seq {
  size_t index = 0;  // into reqs / results
  const GenRequest* req = nullptr;
  GenResult* res = nullptr;
  Sampler sampler;
  std::vector<int32_t> blocks;  // block table, grown as n_past advances
  int32_t n_past = 0;           // tokens already in the KV cache
  int32_t next = 0;             // sampled token to feed in the next decode step
  int32_t step_tokens = 0;      // tokens fed in the current step
  bool done = false;
  StopMatcher text;    // complete characters so far, cut at a stop string when one is found
  size_t emitted = 0;  // bytes of the text already passed to the callback
  std::unique_ptr<constraints::MatcherFilter> filter;  // the request's constraint, if any

  Seq(size_t i, const GenRequest& r, GenResult& out)
      : index(i), req(&r), res(&out), sampler(r.sampling), text(r.stop) {
    for (int32_t id : r.prompt) sampler.accept(id, false);
    if (r.constraint)
      filter = std::make_unique<constraints::MatcherFilter>(constraints::Matcher(r.constraint));
  }
};

// Returns every block a sequence holds to the pool.
void release(BlockPool& pool, Seq& s) {
  for (int32_t b : s.blocks) pool.free(b);
  s.blocks.clear();
}

std::string where(size_t i) {
  return "generate: request " + std::to_string(i) + ": ";
}

}  // namespace

std::vector<GenResult> generate(Engine& engine, const std::vector<GenRequest>& reqs,
                                const GenOptions& opt, const TokenCallback& on_token) {
  const LlamaConfig& cfg = engine.config();
  const Tokenizer& tok = engine.model().tokenizer();
  const int32_t bs = engine.block_size();
  BlockPool& pool = engine.pool();
  if (opt.prefill_chunk < 1)
    throw std::invalid_argument("generate: prefill_chunk must be >= 1, got " +
                                std::to_string(opt.prefill_chunk));

  // Check every request before running any, so a bad one costs nothing.
  int64_t worst_blocks = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenRequest& r = reqs[i];
    if (r.prompt.empty()) throw std::invalid_argument(where(i) + "empty prompt");
    if (r.max_tokens < 1)
      throw std::invalid_argument(where(i) + "max_tokens must be >= 1, got " +
                                  std::to_string(r.max_tokens));
    for (int32_t id : r.prompt)
      if (id < 0 || id >= cfg.n_vocab)
        throw std::invalid_argument(where(i) + "prompt token id " + std::to_string(id) +
                                    " outside the vocabulary [0, " + std::to_string(cfg.n_vocab) +
                                    ")");
    if (r.constraint && r.ignore_eos)
      throw std::invalid_argument(where(i) +
                                  "ignore_eos and a constraint exclude each other: the "
                                  "constraint decides where the output may end");
    const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
    if (total > cfg.ctx_len)
      throw std::invalid_argument(where(i) + "prompt (" + std::to_string(r.prompt.size()) +
                                  " tokens) + max_tokens (" + std::to_string(r.max_tokens) +
                                  ") = " + std::to_string(total) +
                                  " exceeds the model context of " + std::to_string(cfg.ctx_len));
    // The last sampled token is never fed back, so the cache holds at most total - 1 tokens.
    worst_blocks += (total - 1 + bs - 1) / bs;
  }

  std::vector<GenResult> results(reqs.size());
  std::vector<Seq> seqs;
  seqs.reserve(reqs.size());  // Seq addresses stay fixed
  for (size_t i = 0; i < reqs.size(); ++i) {
    try {
      seqs.emplace_back(i, reqs[i], results[i]);  // Sampler validates the sampling parameters
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where(i) + e.what());
    }
    results[i].prompt_tokens = static_cast<int>(reqs[i].prompt.size());
  }

  // No preemption here: admit the batch only if it fits at its longest, so it never stalls.
  if (worst_blocks > pool.n_free())
    throw std::runtime_error("out of KV blocks: " + std::to_string(reqs.size()) +
                             " requests need up to " + std::to_string(worst_blocks) +
                             " blocks of " + std::to_string(bs) + " tokens, the pool has " +
                             std::to_string(pool.n_free()) + " free of " +
                             std::to_string(pool.n_total()));

  // Blocks go back to the pool however this function leaves.
  struct Guard {
    BlockPool& pool;
    std::vector<Seq>& seqs;
    ~Guard() {
      for (auto& s : seqs) release(pool, s);
    }
  } guard{pool, seqs};

  auto emit = [&](Seq& s, int32_t token, size_t upto) {
    upto = std::max(upto, s.emitted);
    std::string_view delta(s.text.text().data() + s.emitted, upto - s.emitted);
    s.emitted = upto;
    if (on_token) on_token(s.index, token, delta);
  };
  auto finish = [&](Seq& s, const char* reason) {
    s.res->text = s.text.text();
    s.res->finish_reason = reason;
    s.done = true;
    release(pool, s);
  };

  // Appends a sampled token and applies the stop rules.
  std::vector<TokenLogprob> top;
  auto accept = [&](Seq& s, int32_t id, float lp) {
    const GenRequest& r = *s.req;
    GenResult& res = *s.res;
    s.sampler.accept(id, true);
    if (s.filter) s.filter->advance(id);
    if (!r.ignore_eos && tok.is_eog(id)) {
      s.text.end(s.emitted);
      if (s.text.text().size() > s.emitted) emit(s, -1, s.text.text().size());
      finish(s, "stop");
      return;
    }
    res.tokens.push_back(id);
    res.token_logprob.push_back(lp);
    res.logprobs.push_back(top);
    s.next = id;
    const bool last = static_cast<int>(res.tokens.size()) >= r.max_tokens;
    if (s.text.push(tok.token_to_piece(id), last, s.emitted)) {
      emit(s, id, s.text.text().size());
      finish(s, "stop");
    } else if (last) {
      emit(s, id, s.text.text().size());
      finish(s, "length");
    } else {
      emit(s, id, s.text.stable());
    }
  };

  std::vector<SeqStep> batch;
  std::vector<Seq*> members;
  StepOutput out;
  for (;;) {
    batch.clear();
    members.clear();
    for (auto& s : seqs) {
      if (s.done) continue;
      const auto& prompt = s.req->prompt;
      const int32_t n_prompt = static_cast<int32_t>(prompt.size());
      SeqStep st;
      if (s.n_past < n_prompt) {
        st.tokens = prompt.data() + s.n_past;
        st.n_tokens = std::min<int32_t>(opt.prefill_chunk, n_prompt - s.n_past);
      } else {
        st.tokens = &s.next;
        st.n_tokens = 1;
      }
      const size_t need = static_cast<size_t>((s.n_past + st.n_tokens + bs - 1) / bs);
      while (s.blocks.size() < need) {
        const std::optional<int32_t> b = pool.alloc();
        // Reachable only if someone else takes blocks from the pool while this runs.
        if (!b)
          throw std::runtime_error("out of KV blocks: the pool ran dry during generation (" +
                                   std::to_string(pool.n_total()) + " blocks in all)");
        s.blocks.push_back(*b);
      }
      st.n_past = s.n_past;
      st.block_table = s.blocks.data();
      st.n_blocks = static_cast<int32_t>(s.blocks.size());
      s.step_tokens = st.n_tokens;
      batch.push_back(st);
      members.push_back(&s);
    }
    if (batch.empty()) break;

    engine.step(batch, out);

    for (size_t j = 0; j < members.size(); ++j) {
      Seq& s = *members[j];
      s.n_past += s.step_tokens;
      if (s.n_past < static_cast<int32_t>(s.req->prompt.size())) continue;  // prompt not done
      float lp = 0.0f;
      const int32_t id = s.sampler.sample(out.row(j), cfg.n_vocab, &top, &lp, s.filter.get());
      accept(s, id, lp);
    }
  }
  return results;
}

}  // namespace sy
