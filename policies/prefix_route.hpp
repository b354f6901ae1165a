// Prefix-aware dispatch, the pure part: chain hashes of a prompt's leading full blocks, a bounded
// LRU index of the hashes the router sent to one batcher, and the choice among batchers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace sy::policy {

/// Chain hash of one full block of tokens after the block whose hash is `parent` (0 for a
/// sequence's first block); never 0. The batchers' prefix cache (gpu/prefix_pool) publishes
/// blocks under the same hash, so the router's index and the caches name blocks alike.
uint64_t chain_block_hash(uint64_t parent, std::span<const int32_t> block);

/// Chain hashes of the leading full blocks of `tokens` (`block_size` tokens each; a partial last
/// block has none): block k's hash covers its tokens and block k-1's hash, so equal hashes mean
/// (barring collisions) equal prefixes. At most `max_blocks` are computed. Empty when
/// block_size < 1. Never 0, so 0 can stand for "no parent".
std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                          std::size_t max_blocks = SIZE_MAX);

/// The block hashes one batcher was sent, with a capacity: past it the least recently recorded
/// hash is forgotten. It approximates the batcher's prefix cache without asking it, so a
/// collision or an eviction there only costs a less useful routing choice, never a wrong output.
class PrefixIndex {
 public:
  /// An index that holds at most `capacity` hashes (at least 1).
  explicit PrefixIndex(std::size_t capacity);

  /// How many of `hashes`, from the first, are held (stops at the first one that is not).
  std::size_t match(std::span<const uint64_t> hashes) const;
  /// Records `hashes` as the most recent, the first block freshest: it is shared by every longer
  /// prefix, and match() stops at the first miss, so losing it would strand the rest.
  void record(std::span<const uint64_t> hashes);
  /// Number of hashes held.
  std::size_t size() const { return pos_.size(); }
  /// The most hashes held.
  std::size_t capacity() const { return capacity_; }
  /// Forgets everything.
  void clear();

 private:
  std::size_t capacity_;
  std::list<uint64_t> order_;  // front: most recent
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

/// One batcher as choose() sees it.
struct RouteCandidate {
  uint64_t credit = 0;             ///< free credit (jobs it will take now)
  std::size_t matched_blocks = 0;  ///< leading blocks of the job its index holds
};

/// What choose() decided.
struct RouteDecision {
  std::size_t index = 0;   ///< the chosen candidate
  bool by_prefix = false;  ///< chosen for a matched prefix (matched_blocks >= 1)
  /// Some candidate matched, but every matching one had no credit or was more than the slack
  /// busier than the freest, so the job went to the freest instead.
  bool overruled = false;
};

/// The rule: a candidate is eligible for affinity when its credit is > 0 and within `slack` of
/// the largest credit. Among eligible candidates with at least one matched block, the longest
/// match wins, then the larger credit, then the lower index. With none, the largest credit wins
/// (the lowest index on ties) — the plain rule. `cands` must not be empty.
RouteDecision choose(std::span<const RouteCandidate> cands, uint64_t slack);

}  // namespace sy::policy
