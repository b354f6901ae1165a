// The batcher's KV block manager: each sequence's block tables over the executor's pools (the
// full-attention group and, for models with windowed layers, the window group), trimming under
// the KV policy, prefix reuse and publishing through the prefix cache. No CAF.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/prefix_pool.hpp"
#include "policies/kv_policy.hpp"

namespace sy {

/// One sequence's KV state.
struct KvTables {
  std::vector<int32_t> blocks;   ///< full-attention block table; -1: released (outside the window)
  std::vector<int32_t> wblocks;  ///< the window group's block table (split cache); -1: released
  std::vector<uint64_t> hashes;  ///< chain hashes of the leading full blocks seen by the cache
  int32_t n_past = 0;            ///< tokens cached in the tables
  policy::KvPolicy policy;       ///< the KV policy the sequence runs under

  int32_t held() const;   ///< full-attention blocks held (>= 0 entries)
  int32_t wheld() const;  ///< window-group blocks held
};

/// A block copy the engine must make before the next step (KvManager::copy_on_write).
struct KvBlockCopyPlan {
  int32_t src = 0;
  int32_t dst = 0;
  bool window = false;  ///< of the window group's pool
};

/// The block pools of one executor and the rules for a sequence's tables in them.
class KvManager {
 public:
  /// `n_blocks` full-attention blocks and `n_window_blocks` window-group blocks (0: one group)
  /// of `block_size` tokens; `layer_window` is the windowed layers' own window
  /// (ModelLimits::split_window), required > 0 with two groups. Prefix reuse only with one group:
  /// a cached prefix would need its window-group blocks too, which are given back behind the
  /// window. Throws std::invalid_argument for two groups without a layer window.
  KvManager(int32_t n_blocks, int32_t n_window_blocks, int32_t block_size, bool prefix_cache,
            int32_t layer_window);

  bool split() const { return split_; }
  int32_t block_size() const { return bs_; }
  /// The policy of the window group's layers for a sequence under `p` (split cache only).
  policy::KvPolicy window_policy(const policy::KvPolicy& p) const;

  /// Why a sequence of `n_prompt` tokens with `max_tokens` to generate under `p` can never fit
  /// ("" when it can), processed in chunks of `chunk`.
  std::string check_fits(int32_t n_prompt, uint32_t max_tokens, const policy::KvPolicy& p,
                         int64_t chunk) const;
  /// Most blocks of each group the sequence holds at once while `n_tokens` are recomputed in
  /// chunks of `chunk` (0 for the window group with one group).
  int64_t max_blocks(const KvTables& t, int64_t n_tokens, int64_t chunk) const;
  int64_t max_window_blocks(const KvTables& t, int64_t n_tokens, int64_t chunk) const;

  /// Gives every block back; the sequence is recomputed from slot 0.
  void free(KvTables& t);
  /// Gives back the blocks the policy no longer lets any later token see; in the window group,
  /// those behind the windowed layers' window.
  void trim(KvTables& t);
  /// Whether the window group lacks a block its policy needs: after a switch to a pressure policy
  /// with sinks narrower than the layers' window, the sink blocks given back under the layers'
  /// own window are needed again. The sequence must then be recomputed.
  bool window_blocks_lost(const KvTables& t) const;
  /// Starts a sequence without blocks from the longest cached prefix of `tokens` (at least the
  /// last token is left to compute, for the logits). Only blocks inside the policy's
  /// full-attention horizon are shared: beyond it their content depends on the policy.
  void reuse_prefix(KvTables& t, const std::vector<int32_t>& tokens);
  /// The blocks reuse_prefix would give the sequence now (nothing taken).
  std::vector<int32_t> peek_prefix(const KvTables& t, const std::vector<int32_t>& tokens) const;
  /// Publishes the sequence's newly completed blocks to the prefix cache.
  void publish(KvTables& t, const std::vector<int32_t>& tokens);
  /// One fresh block appended to a table (`window`: the window group's); false when that group
  /// has no block to give.
  bool grow(KvTables& t, bool window);

  /// A sequence forked from `t` (samples of one prompt, a score's continuations): the same
  /// tables, each held block with one more reference, so that the forks share the KV computed so
  /// far.
  KvTables fork(const KvTables& t);
  /// Copy-on-write before `t` writes slot `slot`: when the block holding it is shared with
  /// another sequence, a fresh block takes its place in `t` and the copy to make (old -> new) is
  /// appended to `copies` (for Engine::copy_blocks, before the step that writes). Where no fresh
  /// block is left, `t` gives the shared block back and keeps only the slots before it (n_past
  /// lowered: those tokens are computed again). Returns whether a copy was added.
  bool copy_on_write(KvTables& t, int32_t slot, std::vector<KvBlockCopyPlan>& copies);

  const PrefixBlockPool& pool() const { return pool_; }
  const PrefixBlockPool& window_pool() const { return wpool_; }
  int64_t peak() const { return peak_; }          ///< most full-attention blocks held
  int64_t window_peak() const { return wpeak_; }  ///< most window-group blocks held

 private:
  void trim_table(std::vector<int32_t>& table, PrefixBlockPool& pool, const policy::KvPolicy& p,
                  int32_t n_past);

  bool split_;
  int32_t gw_;             // the windowed layers' window (split only)
  PrefixBlockPool pool_;   // the full-attention group's blocks (every layer's with one group)
  PrefixBlockPool wpool_;  // the window group's (split only; one unused block otherwise)
  int32_t bs_;
  int64_t peak_ = 0, wpeak_ = 0;
};

}  // namespace sy
