// The batcher's groups: several samples of one prompt (Job::n > 1) and score requests. The job's
// own sequence prefills the shared prompt, then forks one member per sample or continuation whose
// block tables share its KV (copy-on-write for the partly filled block); the members end into it.
#include <algorithm>
#include <string>

#include "actors/batcher_core.hpp"

namespace sy::batcher_detail {

// Marks what a new job asks beyond one plain sequence: a group, prompt log-probabilities.
void Batcher::start_group(Seq& s) {
  const Job& j = s.job;
  if (j.prompt_logprobs >= 0) {
    s.lp_from = 1;
    s.lp_to = s.n_prompt;
    s.lp_n_top = static_cast<uint32_t>(j.prompt_logprobs);
  }
  if (j.n <= 1 && !j.is_score()) return;
  // The leader feeds every prompt token but the last: each member feeds that one itself, so its
  // first token comes from its own sampler (or, scoring, its first continuation token's row).
  s.grouped = true;
  s.samples = false;
  s.hold_last = true;
}

void Batcher::fork_group(Seq& g) {
  g.forked = true;
  erase_from(running_, &g);
  if (!g.running) waiting_.erase(&g);
  g.running = false;
  if (g.started) released_.push_back(g.job.uid);  // the leader sampled nothing: its state goes
  g.started = false;
  const bool score = g.job.is_score();
  const uint32_t count =
      score ? static_cast<uint32_t>(g.job.continuations.size()) : std::max<uint32_t>(1, g.job.n);
  g.choices.resize(score ? 0 : count);
  g.scores.resize(score ? count : 0);
  g.members.clear();
  for (uint32_t i = 0; i < count; ++i) {
    auto m = std::make_unique<Seq>();
    m->job = g.job;
    m->job.uid = next_member_uid_++;
    m->job.seed = g.job.seed + i;  // a fixed seed makes every sample reproducible on its own
    m->job.n = 1;
    m->job.prompt_logprobs = -1;
    m->job.continuations.clear();
    m->leader = &g;
    m->choice = i;
    m->tokens = g.tokens;
    m->n_prompt = g.n_prompt;
    if (score) {
      const std::vector<int32_t>& c = g.job.continuations[i];
      m->tokens.insert(m->tokens.end(), c.begin(), c.end());
      m->n_prompt = static_cast<int32_t>(m->tokens.size());
      m->samples = false;
      m->hold_last = true;
      m->lp_from = g.n_prompt;
      m->lp_to = m->n_prompt;
    }
    m->kv = kv_.fork(g.kv);
    m->text = StopMatcher(g.job.stop);
    m->cached_tokens = 0;
    m->first_sched_us = g.first_sched_us;
    g.members.push_back(m.get());
    seqs_.emplace(m->job.uid, std::move(m));
  }
  forked_ += count;
  kv_.free(g.kv);
  // The leader's references are gone: the last member to reach the shared partly filled block
  // finds it its own and writes in place; the others copy it first.
  for (Seq* m : g.members) {
    kv_.copy_on_write(m->kv, m->kv.n_past, pending_copies_);
    if (m->kv.blocks.empty() && m->kv.wblocks.empty()) {
      m->kv.n_past = 0;
      waiting_.insert(m);
    } else {
      m->running = true;
      insert_sorted(running_, m);
    }
  }
}

// Removes a member everywhere, without a word to anyone (its leader decides what the job says).
void Batcher::remove_member(Seq& m) {
  Seq& g = *m.leader;
  kv_.free(m.kv);
  erase_from(running_, &m);
  if (!m.running) waiting_.erase(&m);
  erase_from(planned_, &m);
  if (m.started) released_.push_back(m.job.uid);
  erase_from(g.members, &m);
  seqs_.erase(m.job.uid);  // destroys m
}

void Batcher::drop_members(Seq& g) {
  const std::vector<Seq*> ms = g.members;
  for (Seq* m : ms) remove_member(*m);
}

// A member is done: its sample (score) goes into its leader; the last one ends the job.
void Batcher::end_member(Seq& m, FinishReason why) {
  Seq& g = *m.leader;
  if (why == FinishReason::cancelled) g.group_cancelled = true;
  if (m.first_token_us && (!g.first_token_us || m.first_token_us < g.first_token_us))
    g.first_token_us = m.first_token_us;
  if (g.job.is_score()) {
    ScoreResult& r = g.scores[m.choice];
    r.index = m.choice;
    r.tokens = static_cast<uint32_t>(m.lp_to - m.lp_from);
    r.logprob = 0.0;
    for (float x : m.lp) r.logprob += x;
    g.member_tokens += r.tokens;
  } else {
    ChoiceResult& c = g.choices[m.choice];
    c.index = m.choice;
    c.finish = why;
    c.text = m.text.text().substr(0, m.emitted);
    c.ids.assign(m.tokens.begin() + m.n_prompt, m.tokens.end());
    c.logprob = m.logprob;
    c.top_ids = m.top_ids;
    c.top_logprobs = m.top_lps;
    g.member_tokens += std::max(0, m.n_generated());
  }
  remove_member(m);
  if (!g.members.empty()) return;
  FinishReason f = FinishReason::stop;
  if (g.group_cancelled) {
    f = FinishReason::cancelled;
  } else {
    for (const ChoiceResult& c : g.choices)
      if (c.finish == FinishReason::length) f = FinishReason::length;
  }
  finish(g, f);
}

// Cancels a forked group: members outside the step end now, those in it when it returns.
void Batcher::cancel_group(Seq& g) {
  g.group_cancelled = true;
  const std::vector<Seq*> ms = g.members;
  for (Seq* m : ms) {
    if (m->in_step)
      m->cancelled = true;
    else
      end_member(*m, FinishReason::cancelled);  // the last one ends the job
  }
}

// The group's part of its job's DoneEvent: the samples (or scores) and the counts over them.
void Batcher::group_done(Seq& g, DoneEvent& d) const {
  d.text.clear();
  d.ids.clear();
  d.logprob.clear();
  d.top_ids.clear();
  d.top_logprobs.clear();
  d.completion_tokens = static_cast<uint32_t>(g.member_tokens);
  d.choices = g.choices;
  d.scores = g.scores;
  if (!g.job.is_score()) d.n_top = g.job.logprobs;
}

}  // namespace sy::batcher_detail
