// The batcher's step planner: a pure function from a snapshot of its sequences and KV blocks to
// what one scheduling round does (admit waiting jobs, plan the step's tokens, preempt), in the
// manner of vLLM's schedule() returning a SchedulerOutput. No CAF, ZeroMQ or CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sy::policy {

/// One sequence as the planner sees it. Priority: a lower class_index is a more important
/// class; within a class the earlier arrival, then the lower uid.
struct PlanSeq {
  uint64_t uid = 0;
  uint32_t class_index = 0;
  int64_t arrival_us = 0;
  int32_t n_tokens = 0;  ///< prompt + generated: what the KV cache must hold to go on
  int32_t n_cached = 0;  ///< of those, already in the cache (running sequences; 0 when waiting)
  /// Block table lengths of the full-attention and the window group, released entries included
  /// (running sequences).
  int32_t table = 0;
  int32_t wtable = 0;
  /// Full-attention blocks it holds (ids; a prefix block shared with others appears in each).
  std::vector<int32_t> blocks;
  int32_t wheld = 0;  ///< window-group blocks it holds (never shared)
  /// Its window group lacks a block its policy needs again (after a policy swap): when planned
  /// it gives back every block and is recomputed from slot 0.
  bool lost_window = false;
  /// The blocks the prefix cache would give it if it started now (ids, leading blocks first).
  /// Used when it is (or becomes) a waiting job.
  std::vector<int32_t> prefix;
  /// Most blocks of each group it holds at once while its n_tokens are recomputed in prefill
  /// chunks (kv_policy's max_blocks_held): what it needs free to be admitted.
  int64_t max_blocks = 0;
  int64_t max_wblocks = 0;
};

/// The snapshot of one batcher before a scheduling round.
struct PlanInput {
  std::vector<PlanSeq> running;  ///< any order
  std::vector<PlanSeq> waiting;  ///< any order; they hold no blocks
  int32_t free_blocks = 0;       ///< full-attention group: blocks that can be handed out
  int32_t free_wblocks = 0;      ///< window group (split cache only)
  bool split = false;            ///< two groups: every step needs blocks in both
  int32_t block_size = 16;
  int64_t step_token_budget = 512;  ///< new tokens per step (decode + prefill chunks), >= 1
  uint32_t max_sequences = 64;      ///< running sequences, >= 1
  int64_t prefill_chunk = 256;      ///< longest chunk of one sequence per step, >= 1
  /// Urgent prefills (see plan_step, 3.): on, and whether the batcher's last step was one.
  bool urgent_prefill = false;
  bool last_step_urgent = false;
  /// Pacing (see plan_step, 4.): the sequences of classes less important than pace_class feed
  /// at most pace_prefill prompt tokens a step, together. UINT32_MAX: no pacing.
  uint32_t pace_class = UINT32_MAX;
  int64_t pace_prefill = 0;
};

/// One thing the round does, in order. Applying them in this order to the real block pools gives
/// the state the planner simulated.
struct PlanAction {
  enum Kind : uint8_t {
    admit,      ///< a waiting job starts (from its cached prefix), joins the running set
    wait,       ///< the first waiting job that cannot start: its prefix was looked up, stays
    preempt,    ///< a running sequence gives back its blocks and waits (recomputed later)
    recompute,  ///< a running sequence gives back its blocks and refills from slot 0 (lost_window)
    alloc,      ///< `tokens` fresh blocks for a sequence being planned (`window`: that group's)
    plan,       ///< a running sequence feeds `tokens` in this step (its blocks were allocated)
    fail,       ///< a sequence that does not fit in the pool even alone
  };
  Kind kind = admit;
  uint64_t uid = 0;
  int32_t tokens = 0;   ///< plan: tokens fed this step; alloc: blocks
  bool window = false;  ///< alloc: of the window group
  bool operator==(const PlanAction&) const = default;
};

/// One sequence of the step.
struct StepEntry {
  uint64_t uid = 0;
  int32_t tokens = 0;
  bool operator==(const StepEntry&) const = default;
};

/// What one round decides.
struct PlanOutput {
  std::vector<PlanAction> actions;  ///< everything, in the order to apply it
  std::vector<StepEntry> step;      ///< the step: decodes first, then prefill chunks
  std::vector<uint64_t> admitted;   ///< jobs that started (a later preemption may undo it)
  std::vector<uint64_t> preempted;  ///< in order
  std::vector<uint64_t> failed;     ///< cannot fit even alone
  int64_t budget_left = 0;          ///< tokens of the step budget not used
  bool urgent = false;              ///< the step left less important classes out (3.)
};

/// One scheduling round:
///  1. admission, most important waiting job first: it starts when its whole recomputation
///     (max_blocks less its cached prefix) fits in the free blocks not promised to jobs admitted
///     before it in this round, and a running slot is free; to get them it preempts less
///     important running sequences (the least important first: highest class_index, then latest
///     arrival). An empty batch takes the job regardless. The first job that cannot start stops
///     admission (later ones would overtake it).
///  2. the step, in two passes over the running sequences in priority order: decodes (one token
///     left) first, then prefill chunks of min(tokens left, prefill_chunk, budget left), until the
///     token budget is spent. A sequence gets blocks for its tokens; when a group is dry the
///     least important running sequence is preempted (its planned tokens return to the budget);
///     when that is the sequence itself it waits, or fails when it is alone.
///  3. urgent prefill (urgent_prefill on, and the last step was not urgent): when a running
///     sequence still has a prompt to feed (more than one token left) and the sequences of less
///     important classes than its would bring more tokens to the step than it and its class and
///     the more important ones, those less important sequences sit this one step out. The
///     prompt then runs in a short step: an interactive job's first token comes after the step
///     in flight and its own short one, not after a full step of a batch's decodes. Never two
///     such steps in a row, so less important classes get at least every other step.
///  4. pacing (pace_class set): in 2., the prompt chunks of sequences of classes less important
///     than pace_class take at most pace_prefill tokens of the step together (their decodes are
///     not limited). While a more important class is active, no step is much longer than a
///     decode step, so its next job waits about one decode step for the step in flight.
PlanOutput plan_step(const PlanInput& in);

/// The action's name ("admit", "wait", ...), for test messages and logs.
std::string to_string(PlanAction::Kind k);

}  // namespace sy::policy
