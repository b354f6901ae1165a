// policy::plan_step table-tested: the step's token budget split (decodes first, then prefill
// chunks), admission in priority order, preemption victims (highest class_index, then latest
// arrival), prefix blocks in the block count, and a job that does not fit even alone.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "policies/step_planner.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_step_planner)

using namespace sy::policy;

namespace {

constexpr int32_t kBs = 4;  // tokens per block in every row

// A running sequence: `n_tokens` to hold, `n_cached` of them cached in `blocks`.
PlanSeq run(uint64_t uid, uint32_t cls, int64_t arrival, int32_t n_tokens, int32_t n_cached,
            std::vector<int32_t> blocks) {
  PlanSeq s;
  s.uid = uid;
  s.class_index = cls;
  s.arrival_us = arrival;
  s.n_tokens = n_tokens;
  s.n_cached = n_cached;
  s.table = static_cast<int32_t>(blocks.size());
  s.blocks = std::move(blocks);
  s.max_blocks = (n_tokens + kBs - 1) / kBs;
  return s;
}

// A waiting job of `n_tokens` (full attention: it holds them all at once).
PlanSeq wait(uint64_t uid, uint32_t cls, int64_t arrival, int32_t n_tokens,
             std::vector<int32_t> prefix = {}) {
  PlanSeq s;
  s.uid = uid;
  s.class_index = cls;
  s.arrival_us = arrival;
  s.n_tokens = n_tokens;
  s.max_blocks = (n_tokens + kBs - 1) / kBs;
  s.prefix = std::move(prefix);
  return s;
}

PlanInput input(int32_t free_blocks, int64_t budget = 100, uint32_t max_seqs = 8,
                int64_t chunk = 8) {
  PlanInput in;
  in.free_blocks = free_blocks;
  in.block_size = kBs;
  in.step_token_budget = budget;
  in.max_sequences = max_seqs;
  in.prefill_chunk = chunk;
  return in;
}

// "admit:1 alloc:1:2 plan:1:8 ..." (walloc: the window group's blocks).
std::string trace(const PlanOutput& out) {
  std::string t;
  for (const PlanAction& a : out.actions) {
    if (!t.empty()) t += ' ';
    t += a.kind == PlanAction::alloc && a.window ? std::string("walloc") : to_string(a.kind);
    t += ':' + std::to_string(a.uid);
    if (a.kind == PlanAction::alloc || a.kind == PlanAction::plan)
      t += ':' + std::to_string(a.tokens);
  }
  return t;
}

struct Row {
  std::string name;
  PlanInput in;
  std::string want;       // the action trace
  std::string want_step;  // "uid:tokens ..."
  int64_t want_budget_left;
};

std::string step_of(const PlanOutput& out) {
  std::string t;
  for (const StepEntry& e : out.step) {
    if (!t.empty()) t += ' ';
    t += std::to_string(e.uid) + ':' + std::to_string(e.tokens);
  }
  return t;
}

std::vector<Row> rows() {
  std::vector<Row> r;
  {  // decodes take one token each before any prefill; the prefill gets the budget left
    PlanInput in = input(20, /*budget=*/10);
    in.running = {run(3, 0, 3, 40, 0, {}), run(1, 0, 1, 9, 8, {0, 1}), run(2, 0, 2, 5, 4, {2})};
    r.push_back({"budget split", in, "alloc:1:1 plan:1:1 alloc:2:1 plan:2:1 alloc:3:2 plan:3:8",
                 "1:1 2:1 3:8", 0});
  }
  {  // the budget ends a chunk early
    PlanInput in = input(20, /*budget=*/5);
    in.running = {run(1, 0, 1, 30, 0, {})};
    r.push_back({"budget cuts a chunk", in, "alloc:1:2 plan:1:5", "1:5", 0});
  }
  {  // prefill_chunk caps one sequence's tokens per step
    PlanInput in = input(20, /*budget=*/100);
    in.running = {run(1, 0, 1, 30, 0, {})};
    r.push_back({"chunk caps a prefill", in, "alloc:1:2 plan:1:8", "1:8", 92});
  }
  {  // a chunk continues where the cache ends: slots 8..15 need blocks 2 and 3
    PlanInput in = input(20, /*budget=*/100);
    in.running = {run(1, 0, 1, 30, 8, {0, 1})};
    r.push_back({"chunk after cached tokens", in, "alloc:1:2 plan:1:8", "1:8", 92});
  }
  {  // class first: class 0 arrived later and still goes first
    PlanInput in = input(20, /*budget=*/1);
    in.running = {run(1, 1, 0, 5, 4, {0}), run(2, 0, 9, 5, 4, {1})};
    r.push_back({"class before arrival", in, "alloc:2:1 plan:2:1", "2:1", 0});
  }
  {  // same class: the earlier arrival
    PlanInput in = input(20, /*budget=*/1);
    in.running = {run(1, 0, 5, 5, 4, {0}), run(2, 0, 3, 5, 4, {1})};
    r.push_back({"earlier arrival first", in, "alloc:2:1 plan:2:1", "2:1", 0});
  }
  {  // admission stops at max_sequences; the third job waits (its prefix was looked up)
    PlanInput in = input(10, 100, /*max_seqs=*/2);
    in.waiting = {wait(3, 0, 3, 4), wait(1, 0, 1, 4), wait(2, 0, 2, 4)};
    r.push_back({"max_sequences", in,
                 "admit:1 admit:2 wait:3 alloc:1:1 plan:1:4 alloc:2:1 plan:2:4", "1:4 2:4", 92});
  }
  {  // a more important arrival takes the slot of the least important running sequence
    PlanInput in = input(10, 100, /*max_seqs=*/1);
    in.running = {run(5, 2, 1, 8, 4, {0})};
    in.waiting = {wait(6, 0, 9, 4)};
    r.push_back({"slot preemption", in, "preempt:5 admit:6 wait:5 alloc:6:1 plan:6:4", "6:4", 96});
  }
  {  // ... and the running sequences' blocks when the pool is short: least important first
    PlanInput in = input(1);
    in.running = {run(5, 1, 1, 9, 8, {0, 1}), run(7, 2, 1, 9, 8, {2, 3})};
    in.waiting = {wait(6, 0, 5, 12)};
    in.waiting.push_back(wait(8, 3, 5, 4));
    r.push_back({"room preemption", in,
                 "preempt:7 admit:6 wait:7 alloc:5:1 plan:5:1 alloc:6:2 plan:6:8", "5:1 6:8", 91});
  }
  {  // a less important running sequence is never preempted for a job behind it
    PlanInput in = input(3);
    in.running = {run(9, 0, 0, 5, 4, {0})};
    in.waiting = {wait(1, 0, 5, 40), wait(2, 1, 1, 4)};
    r.push_back(
        {"first that cannot start stops admission", in, "wait:1 alloc:9:1 plan:9:1", "9:1", 99});
  }
  {  // an empty batch takes its most important job even beyond the free blocks
    PlanInput in = input(2);
    in.waiting = {wait(1, 0, 1, 20)};
    r.push_back({"empty batch takes the job", in, "admit:1 alloc:1:2 plan:1:8", "1:8", 92});
  }
  {  // victim when the pool runs dry: highest class_index, then the latest arrival; the
     // sequence itself when it is the least important
    PlanInput in = input(0);
    in.running = {run(1, 0, 1, 5, 4, {0}), run(2, 1, 1, 5, 4, {1}), run(3, 1, 2, 5, 4, {2})};
    r.push_back({"victim choice", in, "preempt:3 alloc:1:1 plan:1:1 preempt:2", "1:1", 99});
  }
  {  // a victim planned earlier in the step gives its tokens back to the budget
    PlanInput in = input(2, /*budget=*/6);
    in.running = {run(1, 0, 1, 20, 0, {}), run(2, 1, 1, 5, 4, {0})};
    r.push_back({"planned victim returns its budget", in,
                 "alloc:2:1 plan:2:1 alloc:1:1 preempt:2 alloc:1:1 plan:1:5", "1:5", 1});
  }
  {  // alone and still short of blocks: the job fails
    PlanInput in = input(2, 100, 8, /*chunk=*/16);
    in.running = {run(1, 0, 1, 20, 0, {})};
    r.push_back({"does not fit alone", in, "alloc:1:2 fail:1", "", 100});
  }
  {  // a prefix shared with a running sequence costs no free block
    PlanInput in = input(2);
    in.running = {run(9, 0, 0, 9, 8, {5, 6})};
    in.waiting = {wait(1, 0, 5, 12, {5, 6})};
    r.push_back({"shared prefix admits", in, "admit:1 alloc:9:1 plan:9:1 alloc:1:1 plan:1:4",
                 "9:1 1:4", 95});
  }
  {  // the same job without the prefix needs three blocks: it waits
    PlanInput in = input(2);
    in.running = {run(9, 0, 0, 9, 8, {5, 6})};
    in.waiting = {wait(1, 0, 5, 12)};
    r.push_back({"no prefix waits", in, "wait:1 alloc:9:1 plan:9:1", "9:1", 99});
  }
  {  // a cached block nobody holds is one of the free blocks: taking it leaves one fewer
    PlanInput in = input(2);
    in.running = {run(9, 0, 0, 5, 4, {0})};
    in.waiting = {wait(1, 0, 5, 8, {5})};
    r.push_back({"cached prefix block", in, "admit:1 alloc:9:1 plan:9:1 preempt:1", "9:1", 99});
  }
  {  // preempting a sequence frees only the blocks nobody else holds
    PlanInput in = input(0);
    in.running = {run(1, 0, 0, 9, 8, {0, 1}), run(2, 1, 0, 9, 8, {0, 2}), run(3, 2, 0, 5, 4, {0})};
    r.push_back({"shared block stays", in, "preempt:3 preempt:2 alloc:1:1 plan:1:1", "1:1", 99});
  }
  {  // a lost window group: every block back, refilled from slot 0
    PlanInput in = input(0);
    in.split = true;
    in.free_wblocks = 0;
    PlanSeq s = run(1, 0, 1, 9, 8, {0, 1});
    s.wtable = 2;
    s.wheld = 1;
    s.lost_window = true;
    in.running = {s};
    r.push_back({"recompute", in, "recompute:1 alloc:1:1 walloc:1:1 plan:1:1", "1:1", 99});
  }
  {  // the window group running dry preempts as well
    PlanInput in = input(5);
    in.split = true;
    in.free_wblocks = 0;
    PlanSeq a = run(1, 0, 1, 5, 4, {0});
    a.wtable = a.wheld = 1;
    PlanSeq b = run(2, 1, 1, 5, 4, {1});
    b.wtable = b.wheld = 1;
    in.running = {a, b};
    r.push_back({"window group dry", in, "alloc:1:1 preempt:2 walloc:1:1 plan:1:1", "1:1", 99});
  }
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(plan_table) {
  for (const Row& row : rows()) {
    BOOST_TEST_CONTEXT(row.name) {
      const PlanOutput out = plan_step(row.in);
      BOOST_TEST(trace(out) == row.want);
      BOOST_TEST(step_of(out) == row.want_step);
      BOOST_TEST(out.budget_left == row.want_budget_left);
    }
  }
}

BOOST_AUTO_TEST_CASE(summary_lists_follow_the_actions) {
  PlanInput in = input(1);
  in.running = {run(5, 1, 1, 9, 8, {0, 1}), run(7, 2, 1, 9, 8, {2, 3})};
  in.waiting = {wait(6, 0, 5, 12)};
  const PlanOutput out = plan_step(in);
  BOOST_TEST(out.admitted == std::vector<uint64_t>({6}));
  BOOST_TEST(out.preempted == std::vector<uint64_t>({7}));
  BOOST_TEST(out.failed.empty());
}

BOOST_AUTO_TEST_CASE(zero_limits_still_move_a_token) {
  // The batcher clamps its limits to 1; so does the planner, so that no round stalls.
  PlanInput in = input(4, /*budget=*/0, /*max_seqs=*/0, /*chunk=*/0);
  in.waiting = {wait(1, 0, 1, 8), wait(2, 0, 2, 8)};
  const PlanOutput out = plan_step(in);
  BOOST_TEST(trace(out) == "admit:1 wait:2 alloc:1:1 plan:1:1");
}

// Urgent prefill (plan_step 3.): six batch decodes (class 2) and an interactive job's prompt of
// 3 tokens (class 0): 3 tokens against 6, so the batch sits this step out.
PlanInput urgent_case() {
  PlanInput in = input(64);
  in.urgent_prefill = true;
  for (uint64_t u = 1; u <= 6; ++u)
    in.running.push_back(run(u, 2, static_cast<int64_t>(u), 9, 8,
                             {static_cast<int32_t>(2 * u), static_cast<int32_t>(2 * u + 1)}));
  in.waiting = {wait(9, 0, 10, 3)};
  return in;
}

BOOST_AUTO_TEST_CASE(an_urgent_prompt_runs_without_the_less_important_decodes) {
  const PlanOutput out = plan_step(urgent_case());
  BOOST_TEST(out.urgent);
  BOOST_TEST(step_of(out) == "9:3");
  BOOST_TEST(out.admitted == std::vector<uint64_t>({9}));
  BOOST_TEST(out.preempted.empty());  // left out, not preempted: their blocks stay
}

BOOST_AUTO_TEST_CASE(urgent_steps_never_follow_each_other) {
  PlanInput in = urgent_case();
  in.last_step_urgent = true;
  const PlanOutput out = plan_step(in);
  BOOST_TEST(!out.urgent);
  BOOST_TEST(step_of(out) == "1:1 2:1 3:1 4:1 5:1 6:1 9:3");
}

BOOST_AUTO_TEST_CASE(urgent_prefill_off_or_not_worth_it_plans_everyone) {
  PlanInput off = urgent_case();
  off.urgent_prefill = false;
  BOOST_TEST(!plan_step(off).urgent);
  BOOST_TEST(step_of(plan_step(off)) == "1:1 2:1 3:1 4:1 5:1 6:1 9:3");
  // A prompt of 8 tokens (one chunk) against 6 decodes: leaving them out saves less than half.
  PlanInput long_prompt = urgent_case();
  long_prompt.waiting = {wait(9, 0, 10, 12)};
  const PlanOutput out = plan_step(long_prompt);
  BOOST_TEST(!out.urgent);
  BOOST_TEST(step_of(out) == "1:1 2:1 3:1 4:1 5:1 6:1 9:8");
  // One class only: nobody is less important.
  PlanInput same = urgent_case();
  same.waiting = {wait(9, 2, 10, 3)};
  BOOST_TEST(!plan_step(same).urgent);
}

// Pacing (4.): while class 0 is active, the prompts of classes 1 and 2 feed 5 tokens a step
// together (in priority order: uid 8 of class 1 first, then uid 4 gets the last token, uid 5
// none); their decodes and class 0's prompt are not limited.
BOOST_AUTO_TEST_CASE(pacing_limits_the_less_important_prompts_together) {
  PlanInput in = input(64);
  for (uint64_t u = 1; u <= 3; ++u)
    in.running.push_back(run(u, 2, static_cast<int64_t>(u), 9, 8,
                             {static_cast<int32_t>(2 * u), static_cast<int32_t>(2 * u + 1)}));
  in.waiting = {wait(4, 2, 10, 6), wait(5, 2, 11, 6), wait(8, 1, 12, 4), wait(9, 0, 13, 7)};
  in.pace_class = 0;
  in.pace_prefill = 5;
  const PlanOutput out = plan_step(in);
  BOOST_TEST(step_of(out) == "1:1 2:1 3:1 9:7 8:4 4:1");
  BOOST_TEST(out.admitted.size() == 4u);  // admitted all the same: 5 waits for its tokens
  // Without pacing every prompt runs whole.
  in.pace_class = UINT32_MAX;
  BOOST_TEST(step_of(plan_step(in)) == "1:1 2:1 3:1 9:7 8:4 4:6 5:6");
  // Pacing for class 1: class 2 alone is paced.
  in.pace_class = 1;
  BOOST_TEST(step_of(plan_step(in)) == "1:1 2:1 3:1 9:7 8:4 4:5");
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_step_planner
