// Prefix-aware dispatch, the pure part: block chain hashing, the bounded LRU hash index and the
// choice among batchers (see prefix_route.hpp for the rule).
#include "policies/prefix_route.hpp"

#include <algorithm>
#include <stdexcept>

namespace sy::policy {

namespace {

// A bijective 64-bit mixer: xor-shifts fold high bits down, large odd multipliers spread low
// bits up, so one flipped input bit changes about half of the output bits (test_prefix_pool
// checks it).
uint64_t avalanche(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ull;
  x ^= x >> 27;
  x *= 0x81DADEF4BC2DD44Dull;
  x ^= x >> 33;
  return x;
}

// Added to every token so that token 0 still changes the state (avalanche(0) == 0); the golden
// ratio's fraction, an odd constant with no structure.
constexpr uint64_t kTokenOffset = 0x9E3779B97F4A7C15ull;
// Separates the chain's parent from the token stream, so (parent, tokens) cannot be confused
// with a longer token stream.
constexpr uint64_t kParentSalt = 0xD6E8FEB86659FD93ull;

}  // namespace

uint64_t chain_block_hash(uint64_t parent, std::span<const int32_t> block) {
  uint64_t h = avalanche(parent ^ kParentSalt);
  for (int32_t t : block)
    h = avalanche(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + kTokenOffset));
  // 0 is the parent of a sequence's first block; no block's own hash takes that value.
  return h == 0 ? 1 : h;
}

std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                          std::size_t max_blocks) {
  std::vector<uint64_t> out;
  if (block_size < 1) return out;
  const std::size_t bs = static_cast<std::size_t>(block_size);
  const std::size_t n = std::min(tokens.size() / bs, max_blocks);
  out.reserve(n);
  uint64_t parent = 0;
  for (std::size_t b = 0; b < n; ++b) {
    parent = chain_block_hash(parent, tokens.subspan(b * bs, bs));
    out.push_back(parent);
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
