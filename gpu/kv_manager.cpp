// KvManager: block tables, window trimming and prefix reuse over the executor's block pools.
#include "gpu/kv_manager.hpp"

#include <algorithm>
#include <stdexcept>

namespace sy {

int32_t KvTables::held() const {
  return static_cast<int32_t>(
      std::count_if(blocks.begin(), blocks.end(), [](int32_t b) { return b >= 0; }));
}

int32_t KvTables::wheld() const {
  return static_cast<int32_t>(
      std::count_if(wblocks.begin(), wblocks.end(), [](int32_t b) { return b >= 0; }));
}

KvManager::KvManager(int32_t n_blocks, int32_t n_window_blocks, int32_t block_size,
                     bool prefix_cache, int32_t layer_window)
    : split_(n_window_blocks > 0),
      gw_(split_ ? layer_window : 0),
      pool_(std::max<int32_t>(1, n_blocks), std::max<int32_t>(1, block_size),
            prefix_cache && !split_),
      wpool_(std::max<int32_t>(1, n_window_blocks), std::max<int32_t>(1, block_size), false),
      bs_(std::max<int32_t>(1, block_size)) {
  if (split_ && gw_ <= 0)
    throw std::invalid_argument(
        "batcher: window_blocks given for a model whose layers are not of two kinds");
}

policy::KvPolicy KvManager::window_policy(const policy::KvPolicy& p) const {
  return policy::layer_policy(p, gw_);
}

std::string KvManager::check_fits(int32_t n_prompt, uint32_t max_tokens, const policy::KvPolicy& p,
                                  int64_t chunk) const {
  // The last sampled token is never fed back: the cache holds at most prompt + max - 1.
  const int64_t slots = int64_t{n_prompt} + std::max<uint32_t>(1, max_tokens) - 1;
  const int64_t need = policy::max_blocks_held(p, slots, chunk, bs_);
  if (need > pool_.n_total())
    return "prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
           std::to_string(max_tokens) + ") needs " + std::to_string(need) +
           " KV blocks, the executor has " + std::to_string(pool_.n_total());
  if (split_) {
    const int64_t wneed = policy::max_blocks_held(window_policy(p), slots, chunk, bs_);
    if (wneed > wpool_.n_total())
      return "prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
             std::to_string(max_tokens) + ") needs " + std::to_string(wneed) +
             " KV blocks of the window group, the executor has " + std::to_string(wpool_.n_total());
  }
  return "";
}

int64_t KvManager::max_blocks(const KvTables& t, int64_t n_tokens, int64_t chunk) const {
  return policy::max_blocks_held(t.policy, n_tokens, chunk, bs_);
}

int64_t KvManager::max_window_blocks(const KvTables& t, int64_t n_tokens, int64_t chunk) const {
  return split_ ? policy::max_blocks_held(window_policy(t.policy), n_tokens, chunk, bs_) : 0;
}

void KvManager::free(KvTables& t) {
  for (int32_t b : t.blocks)
    if (b >= 0) pool_.release(b);
  t.blocks.clear();
  for (int32_t b : t.wblocks)
    if (b >= 0) wpool_.release(b);
  t.wblocks.clear();
  t.hashes.clear();
  t.n_past = 0;
}

void KvManager::trim(KvTables& t) {
  trim_table(t.blocks, pool_, t.policy, t.n_past);
  if (split_) trim_table(t.wblocks, wpool_, window_policy(t.policy), t.n_past);
}

void KvManager::trim_table(std::vector<int32_t>& table, PrefixBlockPool& pool,
                           const policy::KvPolicy& p, int32_t n_past) {
  const policy::BlockRange r = policy::released_block_range(p, n_past, bs_);
  const int64_t end = std::min<int64_t>(r.end, static_cast<int64_t>(table.size()));
  for (int64_t b = r.begin; b < end; ++b) {
    int32_t& id = table[static_cast<size_t>(b)];
    if (id >= 0) pool.release(id);
    id = -1;
  }
}

bool KvManager::window_blocks_lost(const KvTables& t) const {
  if (!split_) return false;
  const policy::BlockRange r = policy::released_block_range(window_policy(t.policy), t.n_past, bs_);
  for (size_t b = 0; b < t.wblocks.size(); ++b) {
    const int64_t i = static_cast<int64_t>(b);
    if (t.wblocks[b] < 0 && (i < r.begin || i >= r.end)) return true;
  }
  return false;
}

namespace {
// Leading blocks a sequence may take from the cache: not its last token (its logits are needed),
// nothing beyond the full-attention horizon.
int64_t reusable_blocks(const KvTables& t, int64_t n, int32_t bs) {
  return std::min((n - 1) / bs, policy::full_attention_horizon(t.policy) / bs);
}
}  // namespace

void KvManager::reuse_prefix(KvTables& t, const std::vector<int32_t>& tokens) {
  if (!t.blocks.empty()) return;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = reusable_blocks(t, n, bs_);
  int32_t found = 0;
  if (max_blocks > 0)
    found = pool_.acquire_prefix(tokens.data(), n, max_blocks, t.blocks, t.hashes);
  t.n_past = found * bs_;
  peak_ = std::max<int64_t>(peak_, pool_.n_held());
  trim(t);
}

std::vector<int32_t> KvManager::peek_prefix(const KvTables& t,
                                            const std::vector<int32_t>& tokens) const {
  std::vector<int32_t> ids;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = reusable_blocks(t, n, bs_);
  if (max_blocks > 0) pool_.find_prefix(tokens.data(), n, max_blocks, t.hashes, ids);
  return ids;
}

void KvManager::publish(KvTables& t, const std::vector<int32_t>& tokens) {
  const int64_t horizon = policy::full_attention_horizon(t.policy);
  for (;;) {
    const int64_t b = static_cast<int64_t>(t.hashes.size());
    const int64_t end = (b + 1) * bs_;
    if (end > t.n_past || end > horizon || b >= static_cast<int64_t>(t.blocks.size())) return;
    const uint64_t parent = b ? t.hashes.back() : 0;
    const int32_t* toks = tokens.data() + b * bs_;
    const uint64_t h = pool_.block_hash(parent, toks);
    const int32_t id = t.blocks[static_cast<size_t>(b)];
    if (id >= 0) pool_.publish(id, h, parent, toks);
    t.hashes.push_back(h);
  }
}

KvTables KvManager::fork(const KvTables& t) {
  KvTables f = t;
  for (int32_t b : f.blocks)
    if (b >= 0) pool_.share(b);
  for (int32_t b : f.wblocks)
    if (b >= 0) wpool_.share(b);
  return f;
}

bool KvManager::copy_on_write(KvTables& t, int32_t slot, std::vector<KvBlockCopyPlan>& copies) {
  const auto b = static_cast<size_t>(slot / bs_);
  const bool shared =
      (b < t.blocks.size() && t.blocks[b] >= 0 && pool_.ref_count(t.blocks[b]) > 1) ||
      (split_ && b < t.wblocks.size() && t.wblocks[b] >= 0 && wpool_.ref_count(t.wblocks[b]) > 1);
  if (!shared) return false;
  // Both groups' blocks of that index, or neither: a fork writes the slot in every layer.
  const bool need_full = b < t.blocks.size() && t.blocks[b] >= 0;
  const bool need_win = split_ && b < t.wblocks.size() && t.wblocks[b] >= 0;
  if ((need_full && pool_.n_free() < 1) || (need_win && wpool_.n_free() < 1)) {
    // No room for a copy: keep the slots before the shared block, compute its tokens again.
    for (size_t i = b; i < t.blocks.size(); ++i)
      if (t.blocks[i] >= 0) pool_.release(t.blocks[i]);
    if (t.blocks.size() > b) t.blocks.resize(b);
    for (size_t i = b; i < t.wblocks.size(); ++i)
      if (t.wblocks[i] >= 0) wpool_.release(t.wblocks[i]);
    if (t.wblocks.size() > b) t.wblocks.resize(b);
    if (t.hashes.size() > b) t.hashes.resize(b);
    t.n_past = std::min<int32_t>(t.n_past, static_cast<int32_t>(b) * bs_);
    return false;
  }
  bool copied = false;
  if (need_full && pool_.ref_count(t.blocks[b]) > 1) {
    const int32_t dst = *pool_.alloc();
    copies.push_back({t.blocks[b], dst, false});
    pool_.release(t.blocks[b]);
    t.blocks[b] = dst;
    peak_ = std::max<int64_t>(peak_, pool_.n_held());
    copied = true;
  }
  if (need_win && wpool_.ref_count(t.wblocks[b]) > 1) {
    const int32_t dst = *wpool_.alloc();
    copies.push_back({t.wblocks[b], dst, true});
    wpool_.release(t.wblocks[b]);
    t.wblocks[b] = dst;
    wpeak_ = std::max<int64_t>(wpeak_, wpool_.n_held());
    copied = true;
  }
  return copied;
}

bool KvManager::grow(KvTables& t, bool window) {
  PrefixBlockPool& pool = window ? wpool_ : pool_;
  const std::optional<int32_t> b = pool.alloc();
  if (!b) return false;
  if (window) {
    t.wblocks.push_back(*b);
    wpeak_ = std::max<int64_t>(wpeak_, wpool_.n_held());
  } else {
    t.blocks.push_back(*b);
    peak_ = std::max<int64_t>(peak_, pool_.n_held());
  }
  return true;
}

}  // namespace sy
