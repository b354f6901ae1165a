// Prefix-aware dispatch, the pure part: block chain hashing, the bounded LRU hash index and the
// choice among batchers (see prefix_route.hpp for the rule).
#include "policies/prefix_route.hpp"

#include <algorithm>
#include <stdexcept>

namespace sy::policy {

namespace {

// splitmix64's finalizer: every input bit affects every output bit, so hashes of nearby token
// sequences do not cluster in the unordered_map.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Odd constants that keep a zero parent or a zero token from leaving the state unchanged.
constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kTokenSalt = 0xd6e8feb86659fd93ULL;

}  // namespace

std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                          std::size_t max_blocks) {
  std::vector<uint64_t> out;
  if (block_size < 1) return out;
  const std::size_t bs = static_cast<std::size_t>(block_size);
  const std::size_t n = std::min(tokens.size() / bs, max_blocks);
  out.reserve(n);
  uint64_t parent = 0;
  for (std::size_t b = 0; b < n; ++b) {
    uint64_t h = mix(parent ^ kSeed);
    for (std::size_t i = 0; i < bs; ++i)
      h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[b * bs + i])) + kTokenSalt));
    if (h == 0) h = 1;  // 0 is reserved for "no parent"
    out.push_back(h);
    parent = h;
  }
  return out;
}

PrefixIndex::PrefixIndex(std::size_t capacity) : capacity_(std::max<std::size_t>(1, capacity)) {}

std::size_t PrefixIndex::match(std::span<const uint64_t> hashes) const {
  std::size_t n = 0;
  while (n < hashes.size() && pos_.count(hashes[n])) ++n;
  return n;
}

void PrefixIndex::record(std::span<const uint64_t> hashes) {
  // Last block first, so that after the loop the first block is at the front (freshest).
  for (auto it = hashes.rbegin(); it != hashes.rend(); ++it) {
    auto p = pos_.find(*it);
    if (p != pos_.end()) {
      order_.splice(order_.begin(), order_, p->second);
      continue;
    }
    order_.push_front(*it);
    pos_.emplace(*it, order_.begin());
    if (pos_.size() > capacity_) {
      pos_.erase(order_.back());
      order_.pop_back();
    }
  }
}

void PrefixIndex::clear() {
  order_.clear();
  pos_.clear();
}

RouteDecision choose(std::span<const RouteCandidate> cands, uint64_t slack) {
  if (cands.empty()) throw std::invalid_argument("prefix_route::choose: no candidates");
  std::size_t freest = 0;
  bool any_match = false;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (cands[i].credit > cands[freest].credit) freest = i;
    any_match |= cands[i].matched_blocks > 0;
  }
  const uint64_t top = cands[freest].credit;
  const uint64_t floor = top > slack ? top - slack : 0;
  RouteDecision d;
  d.index = freest;
  bool found = false;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const auto& c = cands[i];
    if (c.matched_blocks == 0 || c.credit == 0 || c.credit < floor) continue;
    const auto& b = cands[d.index];
    if (!found || c.matched_blocks > b.matched_blocks ||
        (c.matched_blocks == b.matched_blocks && c.credit > b.credit)) {
      d.index = i;
      found = true;
    }
  }
  d.by_prefix = found;
  d.overruled = any_match && !found;
  return d;
}

}  // namespace sy::policy
