// PrefixBlockPool: reference-counted KV blocks, full blocks published under a chain hash, and an
// LRU list of unreferenced published blocks that alloc() evicts only when the free list is empty.
#include "gpu/prefix_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "policies/prefix_route.hpp"

namespace sy {

PrefixBlockPool::PrefixBlockPool(int32_t n_blocks, int32_t block_size, bool caching)
    : n_total_(n_blocks), bs_(block_size), caching_(caching) {
  if (n_blocks < 0) throw std::invalid_argument("PrefixBlockPool: negative block count");
  if (block_size < 1) throw std::invalid_argument("PrefixBlockPool: block size must be >= 1");
  blocks_.resize(static_cast<size_t>(n_blocks));
  free_.reserve(static_cast<size_t>(n_blocks));
  // Pushed in reverse so that a fresh pool hands out 0, 1, 2, ... (easy to read in traces).
  for (int32_t i = n_blocks; i-- > 0;) free_.push_back(i);
}

std::optional<int32_t> PrefixBlockPool::alloc() {
  int32_t id = -1;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (lru_head_ >= 0) {
    id = lru_head_;
    lru_unlink(id);
    unpublish(id);
    --n_cached_;
    ++evictions_;
  } else {
    return std::nullopt;
  }
  blocks_[static_cast<size_t>(id)].refs = 1;
  ++n_held_;
  return id;
}

void PrefixBlockPool::share(int32_t id) {
  if (id < 0 || id >= n_total_ || blocks_[static_cast<size_t>(id)].refs <= 0)
    throw std::logic_error("PrefixBlockPool::share: block " + std::to_string(id) + " is not held");
  ++blocks_[static_cast<size_t>(id)].refs;
}

void PrefixBlockPool::release(int32_t id) {
  if (id < 0 || id >= n_total_)
    throw std::logic_error("PrefixBlockPool::release: block " + std::to_string(id) +
                           " out of range");
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.refs <= 0)
    throw std::logic_error("PrefixBlockPool::release: block " + std::to_string(id) +
                           " is not held");
  if (--b.refs > 0) return;
  --n_held_;
  if (b.published) {
    lru_push_back(id);
    ++n_cached_;
  } else {
    free_.push_back(id);
  }
}

uint64_t PrefixBlockPool::block_hash(uint64_t parent, const int32_t* tokens) const {
  return policy::chain_block_hash(parent, {tokens, static_cast<std::size_t>(bs_)});
}

int32_t PrefixBlockPool::acquire_prefix(const int32_t* tokens, int64_t n_tokens, int64_t max_blocks,
                                        std::vector<int32_t>& blocks,
                                        std::vector<uint64_t>& hashes) {
  if (!caching_ || n_tokens < bs_ || max_blocks <= 0) return 0;
  const int64_t limit = std::min(n_tokens / bs_, max_blocks);
  uint64_t parent = 0;
  int32_t found = 0;
  for (int64_t i = 0; i < limit; ++i) {
    const int32_t* blk = tokens + i * bs_;
    const uint64_t h = block_hash(parent, blk);
    const auto it = index_.find(h);
    if (it == index_.end()) break;
    const int32_t id = it->second;
    Block& b = blocks_[static_cast<size_t>(id)];
    // Same hash but other content (a collision) or another chain: not this prefix.
    if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), blk)) break;
    if (b.refs == 0) {  // cached -> held
      lru_unlink(id);
      --n_cached_;
      ++n_held_;
    }
    ++b.refs;
    blocks.push_back(id);
    hashes.push_back(h);
    parent = h;
    ++found;
  }
  hits_ += found;
  return found;
}

int32_t PrefixBlockPool::find_prefix(const int32_t* tokens, int64_t n_tokens, int64_t max_blocks,
                                     const std::vector<uint64_t>& known,
                                     std::vector<int32_t>& ids) const {
  if (!caching_ || n_tokens < bs_ || max_blocks <= 0) return 0;
  const int64_t limit = std::min(n_tokens / bs_, max_blocks);
  uint64_t parent = 0;
  int32_t found = 0;
  for (int64_t i = 0; i < limit; ++i) {
    const int32_t* blk = tokens + i * bs_;
    const uint64_t h = i < static_cast<int64_t>(known.size()) ? known[static_cast<size_t>(i)]
                                                              : block_hash(parent, blk);
    const auto it = index_.find(h);
    if (it == index_.end()) break;
    const Block& b = blocks_[static_cast<size_t>(it->second)];
    if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), blk)) break;
    ids.push_back(it->second);
    parent = h;
    ++found;
  }
  return found;
}

bool PrefixBlockPool::publish(int32_t id, uint64_t hash, uint64_t parent, const int32_t* tokens) {
  if (!caching_ || id < 0 || id >= n_total_) return false;
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.refs <= 0) return false;
  const auto it = index_.find(hash);
  if (it != index_.end()) {
    // Publishing the same block twice under the same content is harmless; anything else would
    // make one hash name two blocks.
    return it->second == id && b.parent == parent &&
           std::equal(b.tokens.begin(), b.tokens.end(), tokens);
  }
  if (b.published) return false;  // its content is already published under another hash
  b.published = true;
  b.hash = hash;
  b.parent = parent;
  b.tokens.assign(tokens, tokens + bs_);
  index_.emplace(hash, id);
  return true;
}

int32_t PrefixBlockPool::ref_count(int32_t id) const {
  if (id < 0 || id >= n_total_)
    throw std::out_of_range("PrefixBlockPool::ref_count: block " + std::to_string(id));
  return blocks_[static_cast<size_t>(id)].refs;
}

bool PrefixBlockPool::is_published(int32_t id) const {
  if (id < 0 || id >= n_total_)
    throw std::out_of_range("PrefixBlockPool::is_published: block " + std::to_string(id));
  return blocks_[static_cast<size_t>(id)].published;
}

void PrefixBlockPool::unpublish(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (!b.published) return;
  index_.erase(b.hash);
  b.published = false;
  b.hash = b.parent = 0;
  b.tokens.clear();
}

void PrefixBlockPool::lru_unlink(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.lru_prev >= 0)
    blocks_[static_cast<size_t>(b.lru_prev)].lru_next = b.lru_next;
  else
    lru_head_ = b.lru_next;
  if (b.lru_next >= 0)
    blocks_[static_cast<size_t>(b.lru_next)].lru_prev = b.lru_prev;
  else
    lru_tail_ = b.lru_prev;
  b.lru_prev = b.lru_next = -1;
}

void PrefixBlockPool::lru_push_back(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  b.lru_prev = lru_tail_;
  b.lru_next = -1;
  if (lru_tail_ >= 0)
    blocks_[static_cast<size_t>(lru_tail_)].lru_next = id;
  else
    lru_head_ = id;
  lru_tail_ = id;
}

}  // namespace sy
