// KV-cache policies as plain values: which cached slots a token attends to (full, sliding window,
// attention sinks), which KV blocks a sequence may give back, and the watermark hysteresis that
// switches to a pressure policy. Pure functions of their arguments; the batcher applies them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sy::policy {

/// One KV-cache policy. Slots are a sequence's token positions 0, 1, 2, ... (slot == position).
///  - full: a token at slot t attends to [0, t].
///  - sliding_window(W): to (t - W, t]; RoPE positions keep counting up (Mistral's semantics).
///  - sinks(S, W): to [0, S) and (t - W, t], with StreamingLLM's positions: inside the cache the
///    sinks sit at 0..S-1 and the window right after them, so no position exceeds S + W - 1.
struct KvPolicy {
  enum Kind : uint8_t { full = 0, sliding_window = 1, sinks = 2 };
  uint8_t kind = full;
  int32_t window = 0;   ///< W (sliding_window, sinks); 0 for full
  int32_t n_sinks = 0;  ///< S (sinks); 0 otherwise
  bool operator==(const KvPolicy&) const = default;
};

/// The policy's canonical name: "full", "sliding_window:512", "sinks:4:60" (parse_kv_policy's
/// input format).
std::string to_string(const KvPolicy& p);

/// Parses "full", "sliding_window:W" or "sinks:S:W" (W >= 1, S >= 0). nullopt with `why` set to
/// a message naming the problem when malformed.
std::optional<KvPolicy> parse_kv_policy(std::string_view text, std::string* why = nullptr);

/// Window arguments as an engine step takes them (SeqStep::window, SeqStep::sinks): 0, 0 for full.
int32_t step_window(const KvPolicy& p);
int32_t step_sinks(const KvPolicy& p);

/// Whether the slot `slot` is still needed once the sequence's next token will be written at
/// slot `next` (every later token attends to a subset of what `next` attends to).
bool slot_needed(const KvPolicy& p, int64_t slot, int64_t next);

/// Number of leading logical blocks of the block table that can never be needed again, for a
/// sequence whose next token goes to slot `next`, block size `bs`. Blocks holding sink slots are
/// never counted (they stay); for full the answer is 0. Releasing is of blocks
/// [first_released, first_needed) — see released_block_range.
struct BlockRange {
  int64_t begin = 0;  ///< first block index of the range
  int64_t end = 0;    ///< one past the last; begin == end: empty
};
/// Blocks wholly outside what slot `next` (and every later slot) attends to.
BlockRange released_block_range(const KvPolicy& p, int64_t next, int32_t bs);

/// The policy under which a layer with an attention window of its own (`layer_window` > 0,
/// gemma2's even layers) sees a sequence that runs under `p`: the layer's window without sinks
/// where it is the narrower (or p is full), else p itself; `p` for layer_window <= 0. The engines
/// apply the same rule, so this says which of the layer's blocks a sequence may give back.
KvPolicy layer_policy(const KvPolicy& p, int32_t layer_window);

/// Most blocks a sequence can hold at once while it processes slots up to `n_slots` (exclusive)
/// in chunks of at most `chunk` tokens: full holds all of them, the windowed policies the sink
/// blocks plus the window and one chunk.
int64_t max_blocks_held(const KvPolicy& p, int64_t n_slots, int64_t chunk, int32_t bs);

/// Slots below this bound have the same K/V under this policy as under full attention (no token
/// there has lost sight of any earlier one): full -> INT64_MAX, sliding_window -> W,
/// sinks -> S + W. Only blocks wholly below it may be shared through the prefix cache.
int64_t full_attention_horizon(const KvPolicy& p);

/// Whether a sequence under this policy must end at the model's context length: true for full and
/// sliding_window (positions keep counting up), false for sinks (positions stay below S + W).
bool bounded_by_context(const KvPolicy& p);

/// The watermark hysteresis of automatic policy swaps. Usage is KV blocks held by sequences over
/// blocks in the pool, in [0, 1].
struct Watermarks {
  double high = 0.90;  ///< at or above: switch to the pressure policy
  double low = 0.70;   ///< at or below (while under pressure): switch back
};

/// The next pressure state: true when usage reaches `high`, false when it falls to `low`,
/// otherwise unchanged.
bool next_pressure_state(bool under_pressure, double usage, const Watermarks& w);

}  // namespace sy::policy
