// The batcher's KV block pool with prefix caching: reference-counted blocks, full blocks
// published under a hash of their tokens and of every token before them, unreferenced cached
// blocks kept for reuse and evicted least-recently-used only when a fresh block is needed.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace sy {

/// Reference-counted KV blocks with a prefix cache. Ids are [0, n_total). A block is in exactly
/// one state: free (on the free list), held (reference count > 0), or cached (published, count 0,
/// evictable). Not thread-safe: one owner (the batcher).
class PrefixBlockPool {
 public:
  /// `n_blocks` blocks of `block_size` tokens. With `caching` false, publish() does nothing and
  /// lookups find nothing (every block is private).
  PrefixBlockPool(int32_t n_blocks, int32_t block_size, bool caching = true);

  /// A block for fresh content (count 1): from the free list, else by evicting the least recently
  /// used cached block (it is unpublished); nullopt when every block is held.
  std::optional<int32_t> alloc();
  /// One more reference to held block `id` (a sequence forked from another shares its blocks).
  /// Throws std::logic_error for a block not held.
  void share(int32_t id);
  /// Drops one reference. At zero a published block becomes cached (most recently used), an
  /// unpublished one goes back to the free list. Throws std::logic_error for a block not held.
  void release(int32_t id);

  /// Chain hash of one full block: of its `block_size` tokens and the hash of the block before it
  /// (`parent`, 0 for the first block).
  uint64_t block_hash(uint64_t parent, const int32_t* tokens) const;

  /// The longest run of leading full blocks of `tokens` that is cached or held by others, at most
  /// `max_blocks`: each block found gets one more reference (a cached one becomes held) and its
  /// id is appended to `blocks`, its hash to `hashes`. Tokens are compared, not only hashes, so a
  /// hash collision never shares a block. Returns the number of blocks found.
  int32_t acquire_prefix(const int32_t* tokens, int64_t n_tokens, int64_t max_blocks,
                         std::vector<int32_t>& blocks, std::vector<uint64_t>& hashes);

  /// What acquire_prefix would find now, without taking anything: the ids are appended to `ids`.
  /// `known` may hold the chain hashes of the leading blocks (the sequence's own, as
  /// acquire_prefix returned or as published): they are not computed again.
  int32_t find_prefix(const int32_t* tokens, int64_t n_tokens, int64_t max_blocks,
                      const std::vector<uint64_t>& known, std::vector<int32_t>& ids) const;

  /// Publishes held block `id`, whose content is the full block `tokens` (block_size of them)
  /// after the chain `parent`, under hash `hash`. False (nothing changes) when caching is off or
  /// another block already holds that content; then `id` stays private.
  bool publish(int32_t id, uint64_t hash, uint64_t parent, const int32_t* tokens);

  int32_t block_size() const { return bs_; }
  int32_t n_total() const { return n_total_; }
  int32_t n_held() const { return n_held_; }             ///< reference count > 0
  int32_t n_cached() const { return n_cached_; }         ///< published, unreferenced (evictable)
  int32_t n_free() const { return n_total_ - n_held_; }  ///< alloc() can hand out this many
  int32_t ref_count(int32_t id) const;
  bool is_published(int32_t id) const;
  int64_t hits() const { return hits_; }            ///< blocks found by acquire_prefix
  int64_t evictions() const { return evictions_; }  ///< cached blocks reclaimed by alloc

 private:
  struct Block {
    int32_t refs = 0;
    bool published = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;           // content of a published block (collision check)
    int32_t lru_prev = -1, lru_next = -1;  // intrusive LRU list of cached blocks
  };
  int32_t n_total_, bs_;
  bool caching_;
  int32_t n_held_ = 0;
  int32_t n_cached_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;
  int32_t lru_head_ = -1, lru_tail_ = -1;        // head: least recently used
  std::unordered_map<uint64_t, int32_t> index_;  // hash -> published block
  int64_t hits_ = 0, evictions_ = 0;

  void unpublish(int32_t id);      // drops the block from index_ and forgets its content
  void lru_unlink(int32_t id);     // takes a cached block off the LRU list
  void lru_push_back(int32_t id);  // appends a block as most recently used
};

}  // namespace sy
