// plan_step: one scheduling round of a batcher simulated on block counts and prefix block ids.
#include "policies/step_planner.hpp"

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>

namespace sy::policy {

namespace {

// A sequence during the round.
struct Sim {
  const PlanSeq* in = nullptr;
  int32_t n_past = 0;
  int32_t table = 0, wtable = 0, wheld = 0;
  std::vector<int32_t> blocks;
  bool lost_window = false;
  bool running = false;
  bool in_step = false;
  int32_t step_tokens = 0;

  std::tuple<uint32_t, int64_t, uint64_t> key() const {
    return {in->class_index, in->arrival_us, in->uid};
  }
};

bool before(const Sim* a, const Sim* b) {
  return a->key() < b->key();
}
struct Before {
  bool operator()(const Sim* a, const Sim* b) const { return before(a, b); }
};

class Round {
 public:
  explicit Round(const PlanInput& in)
      : in_(in),
        free_(in.free_blocks),
        wfree_(in.free_wblocks),
        bs_(std::max<int32_t>(1, in.block_size)),
        max_seqs_(std::max<uint32_t>(1, in.max_sequences)),
        chunk_(std::max<int64_t>(1, in.prefill_chunk)) {
    sims_.reserve(in.running.size() + in.waiting.size());
    for (const PlanSeq& p : in.running) {
      Sim& s = sims_.emplace_back();
      s.in = &p;
      s.n_past = p.n_cached;
      s.table = p.table;
      s.wtable = p.wtable;
      s.wheld = p.wheld;
      s.blocks = p.blocks;
      s.lost_window = p.lost_window;
      s.running = true;
    }
    // Reference counts of the pool's blocks as the sequences hold them (only sequences do).
    int32_t max_id = -1;
    for (const PlanSeq& p : in.running)
      for (int32_t id : p.blocks) max_id = std::max(max_id, id);
    for (const auto* list : {&in.running, &in.waiting})
      for (const PlanSeq& p : *list)
        for (int32_t id : p.prefix) max_id = std::max(max_id, id);
    refs_.assign(static_cast<size_t>(max_id + 1), 0);
    for (const PlanSeq& p : in.running)
      for (int32_t id : p.blocks) ++refs_[static_cast<size_t>(id)];
    for (const PlanSeq& p : in.waiting) {
      Sim& s = sims_.emplace_back();
      s.in = &p;
    }
    for (Sim& s : sims_) {
      if (s.running)
        running_.push_back(&s);
      else
        waiting_.insert(&s);
    }
    std::sort(running_.begin(), running_.end(), before);
  }

  PlanOutput run() {
    admit();
    plan();
    for (Sim* s : planned_) out_.step.push_back({s->in->uid, s->step_tokens});
    out_.budget_left = budget_;
    return std::move(out_);
  }

 private:
  void act(PlanAction::Kind k, const Sim& s, int32_t tokens = 0, bool window = false) {
    out_.actions.push_back({k, s.in->uid, tokens, window});
  }

  // Fresh blocks of this round (negative ids) are private: they come back at once.
  void release(int32_t id) {
    if (id < 0 || --refs_[static_cast<size_t>(id)] == 0) ++free_;
  }

  void free_blocks(Sim& s) {
    for (int32_t id : s.blocks) release(id);
    s.blocks.clear();
    wfree_ += s.wheld;
    s.wheld = 0;
    s.table = s.wtable = 0;
    s.n_past = 0;
    s.lost_window = false;
  }

  // A job without blocks starts from its cached prefix; a cached (unreferenced) block becomes
  // held, so one fewer can be handed out.
  void reuse_prefix(Sim& s) {
    if (!s.blocks.empty()) return;
    for (int32_t id : s.in->prefix) {
      if (refs_[static_cast<size_t>(id)]++ == 0) --free_;
      s.blocks.push_back(id);
    }
    s.table = static_cast<int32_t>(s.blocks.size());
    s.n_past = s.table * bs_;
  }

  void preempt(Sim& s) {
    act(PlanAction::preempt, s);
    out_.preempted.push_back(s.in->uid);
    free_blocks(s);
    if (s.in_step) {
      planned_.erase(std::find(planned_.begin(), planned_.end(), &s));
      budget_ += s.step_tokens;
      s.in_step = false;
      s.step_tokens = 0;
    }
    s.running = false;
    running_.erase(std::find(running_.begin(), running_.end(), &s));
    waiting_.insert(&s);
  }

  void admit() {
    int64_t promised = 0, wpromised = 0;
    int64_t need = 0, wneed = 0;
    auto short_of_room = [&] { return need > free_ - promised || wneed > wfree_ - wpromised; };
    while (!waiting_.empty()) {
      Sim* s = *waiting_.begin();
      reuse_prefix(*s);
      need = std::max<int64_t>(0, s->in->max_blocks - static_cast<int64_t>(s->blocks.size()));
      wneed = in_.split ? std::max<int64_t>(0, s->in->max_wblocks - s->wheld) : 0;
      while (!running_.empty() && before(s, running_.back()) &&
             (running_.size() >= max_seqs_ || short_of_room()))
        preempt(*running_.back());
      if (running_.size() >= max_seqs_ || (!running_.empty() && short_of_room())) {
        act(PlanAction::wait, *s);
        free_blocks(*s);  // its shared prefix stays cached for when it starts
        break;
      }
      waiting_.erase(waiting_.begin());
      s->running = true;
      running_.insert(std::upper_bound(running_.begin(), running_.end(), s, before), s);
      act(PlanAction::admit, *s);
      out_.admitted.push_back(s->in->uid);
      promised += need;
      wpromised += wneed;
    }
  }

  // Allocation runs are merged into one alloc action per group between other actions.
  void note_alloc(const Sim& s, bool window) {
    if (!out_.actions.empty()) {
      PlanAction& last = out_.actions.back();
      if (last.kind == PlanAction::alloc && last.uid == s.in->uid && last.window == window) {
        ++last.tokens;
        return;
      }
    }
    act(PlanAction::alloc, s, 1, window);
  }

  void plan_seq(Sim& s, int32_t n) {
    if (s.lost_window) {
      act(PlanAction::recompute, s);
      free_blocks(s);  // recomputed from its tokens, in chunks of n from slot 0
    }
    const int32_t need = (s.n_past + n + bs_ - 1) / bs_;
    while (s.table < need || (in_.split && s.wtable < need)) {
      const bool full_group = s.table < need;
      int32_t& avail = full_group ? free_ : wfree_;
      if (avail > 0) {
        --avail;
        if (full_group) {
          s.blocks.push_back(fresh_--);  // below every real id
          ++s.table;
        } else {
          ++s.wheld;
          ++s.wtable;
        }
        note_alloc(s, !full_group);
        continue;
      }
      Sim* victim = running_.back();  // the least important
      if (victim == &s) {
        if (running_.size() == 1) {
          act(PlanAction::fail, s);
          out_.failed.push_back(s.in->uid);
          free_blocks(s);
          s.running = false;
          running_.clear();
          return;
        }
        preempt(s);
        return;
      }
      preempt(*victim);
    }
    s.in_step = true;
    s.step_tokens = n;
    budget_ -= n;
    planned_.push_back(&s);
    act(PlanAction::plan, s, n);
  }

  // The least important class a step plans: all of them, or (3.) the class of the most important
  // sequence with a prompt to feed, where the less important ones would bring more tokens.
  uint32_t cutoff() const {
    constexpr uint32_t kAll = UINT32_MAX;
    if (!in_.urgent_prefill || in_.last_step_urgent) return kAll;
    uint32_t top = kAll;
    for (const Sim* s : running_)
      if (s->in->n_tokens - s->n_past > 1) top = std::min(top, s->in->class_index);
    if (top == kAll) return kAll;
    int64_t kept = 0, left_out = 0;
    for (const Sim* s : running_) {
      const int64_t rem = s->in->n_tokens - s->n_past;
      (s->in->class_index <= top ? kept : left_out) += std::min<int64_t>(rem, chunk_);
    }
    return left_out > kept ? top : kAll;
  }

  void plan() {
    budget_ = std::max<int64_t>(1, in_.step_token_budget);
    const uint32_t last_class = cutoff();
    out_.urgent = last_class != UINT32_MAX;
    const std::vector<Sim*> order = running_;  // planning may preempt or fail sequences
    int64_t paced_left = std::max<int64_t>(0, in_.pace_prefill);  // (4.)
    for (int pass = 0; pass < 2; ++pass) {
      for (Sim* s : order) {
        if (budget_ <= 0) break;
        if (!s->running || s->in_step || s->in->class_index > last_class) continue;
        const int32_t rem = s->in->n_tokens - s->n_past;
        if ((pass == 0) != (rem == 1)) continue;
        int64_t n = std::min<int64_t>({rem, chunk_, budget_});
        const bool paced = pass == 1 && s->in->class_index > in_.pace_class;
        if (paced) {
          if (paced_left <= 0) continue;
          n = std::min(n, paced_left);
        }
        plan_seq(*s, static_cast<int32_t>(n));
        if (paced && s->in_step) paced_left -= n;
      }
    }
  }

  const PlanInput& in_;
  int32_t free_, wfree_;
  int32_t bs_;
  size_t max_seqs_;
  int64_t chunk_;
  int64_t budget_ = 0;
  int32_t fresh_ = -2;
  std::vector<Sim> sims_;
  std::vector<int32_t> refs_;  // by block id
  std::vector<Sim*> running_;  // sorted by key
  std::set<Sim*, Before> waiting_;
  std::vector<Sim*> planned_;
  PlanOutput out_;
};

}  // namespace

PlanOutput plan_step(const PlanInput& in) {
  return Round(in).run();
}

std::string to_string(PlanAction::Kind k) {
  switch (k) {
    case PlanAction::admit:
      return "admit";
    case PlanAction::wait:
      return "wait";
    case PlanAction::preempt:
      return "preempt";
    case PlanAction::recompute:
      return "recompute";
    case PlanAction::alloc:
      return "alloc";
    case PlanAction::plan:
      return "plan";
    case PlanAction::fail:
      return "fail";
  }
  return "?";
}

}  // namespace sy::policy
