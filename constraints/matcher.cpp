// Token masks against a vocabulary trie. Per automaton state, a table holds the tokens the state
// accepts whatever the stack below it is, and the trie nodes where the state's rule may end with
// token bytes left over; a parser state's mask is the union of its stacks' tables plus a walk of
// those leftovers against the real stack, cached per parser state (XGrammar's split of
// context-independent and context-dependent tokens, on bytes).
#include "constraints/matcher.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace sy::constraints {

/// The pieces as a byte trie, nodes in preorder: node 0 is the empty prefix, a node's subtree is
/// [i, end[i]), its first child (if any) i + 1. The ids whose piece ends at node i are
/// ids[tok_off[i], tok_off[i + 1]). Pieces of end-of-generation ids and empty pieces are left out.
struct VocabTrie {
  std::vector<uint8_t> byte;
  std::vector<uint32_t> depth;
  std::vector<uint32_t> end;
  std::vector<uint32_t> tok_off;
  std::vector<int32_t> ids;
  uint32_t max_depth = 0;
};

namespace {

std::atomic<uint64_t> next_serial{1};

std::unique_ptr<VocabTrie> build_trie(const std::vector<std::string>& pieces,
                                      const std::vector<char>& eog) {
  std::vector<int32_t> order;
  for (std::size_t i = 0; i < pieces.size(); ++i)
    if (!pieces[i].empty() && !eog[i]) order.push_back(static_cast<int32_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces[static_cast<std::size_t>(a)] < pieces[static_cast<std::size_t>(b)];
  });
  auto t = std::make_unique<VocabTrie>();
  auto add_node = [&](uint8_t b, uint32_t depth) {
    t->byte.push_back(b);
    t->depth.push_back(depth);
    t->end.push_back(0);
    t->tok_off.push_back(static_cast<uint32_t>(t->ids.size()));
    t->max_depth = std::max(t->max_depth, depth);
  };
  add_node(0, 0);
  std::vector<uint32_t> path{0};  // node at each depth of the current piece
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& p = pieces[static_cast<std::size_t>(id)];
    std::size_t common = 0;
    if (prev != nullptr)
      while (common < p.size() && common < prev->size() && p[common] == (*prev)[common]) ++common;
    while (path.size() > common + 1) {
      t->end[path.back()] = static_cast<uint32_t>(t->byte.size());
      path.pop_back();
    }
    for (std::size_t k = common; k < p.size(); ++k) {
      path.push_back(static_cast<uint32_t>(t->byte.size()));
      add_node(static_cast<uint8_t>(p[k]), static_cast<uint32_t>(k + 1));
    }
    t->ids.push_back(id);
    prev = &p;
  }
  while (!path.empty()) {
    t->end[path.back()] = static_cast<uint32_t>(t->byte.size());
    path.pop_back();
  }
  t->tok_off.push_back(static_cast<uint32_t>(t->ids.size()));
  return t;
}

uint64_t hash_words(const uint32_t* p, std::size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  return h;
}

void set_bit(std::vector<uint64_t>& w, int32_t id) {
  w[static_cast<std::size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
}

/// What one automaton state accepts on its own (see the file comment).
struct StateTable {
  std::vector<uint32_t> ids;   // accepted ids, when few
  std::vector<uint64_t> bits;  // accepted ids as a bitset, when many
  std::vector<uint32_t> pops;  // trie nodes after which the state's rule may end, more bytes due
  std::size_t bytes() const {
    return sizeof(StateTable) + ids.capacity() * 4 + bits.capacity() * 8 + pops.capacity() * 4;
  }
};

/// Walks subtrees of the trie against a stack set, pruning a subtree as soon as no stack takes
/// its byte. Holds scratch: one per thread of use.
class Walker {
 public:
  Walker(const Grammar& g, const VocabTrie& t) : g_(&g), t_(&t), st_(g) {
    level_.resize(t.max_depth + 2);
    arena_.resize(1024);
  }

  /// Scratch for callers that collect ids.
  std::vector<uint32_t>& ids() { return ids_; }
  /// Trie nodes stepped so far (the cost of the walks).
  std::size_t visited() const { return visited_; }

  /// Visits the nodes below `top` whose prefix some stack takes, `set` (`len` words) being the
  /// stack set at `top`: on_tokens(node) for each; with `pops`, on_pop(node) for each node with
  /// children where some stack may end entirely.
  template <class OnTokens, class OnPop>
  void walk(uint32_t top, const uint32_t* set, std::size_t len, bool pops, OnTokens&& on_tokens,
            OnPop&& on_pop) {
    const VocabTrie& t = *t_;
    const Grammar& g = *g_;
    const uint8_t* bytes = t.byte.data();
    const uint32_t* depth = t.depth.data();
    const uint32_t* end = t.end.data();
    reserve(len);
    std::copy(set, set + len, arena_.data());
    const uint32_t base = depth[top];
    level_[0] = 0;
    level_[1] = len;
    for (uint32_t i = top + 1, stop = end[top]; i < stop; ++visited_) {
      const uint32_t k = depth[i] - base;
      const std::size_t from = level_[k - 1], to = level_[k];
      const uint32_t n = arena_[from];
      const uint32_t d = arena_[from + n];
      std::size_t size;
      bool ends;
      if (to - from == n + 1 && g.call_begin[d] == g.call_begin[d + 1] && (n == 1 || !g.final[d])) {
        // One stack whose top neither calls nor ends: the byte either moves the top or fails
        // (most nodes of a walk; the general step below copies and compares far more).
        const uint32_t next = g.step(d, bytes[i]);
        if (next == kNoState) {
          i = end[i];  // no stack takes this byte: skip the subtree
          continue;
        }
        reserve(to + n + 1);
        uint32_t* a = arena_.data();
        if (n == 1) {
          a[to] = 1;
        } else {
          std::copy(a + from, a + from + n, a + to);
        }
        a[to + n] = next;
        size = to + n + 1;
        ends = g.final[next] && (n == 1 || all_final(g, a + to));
      } else {
        tmp_.clear();
        st_.step(arena_, from, to, bytes[i], tmp_);
        if (tmp_.empty()) {
          i = end[i];
          continue;
        }
        reserve(to + tmp_.size());
        std::copy(tmp_.begin(), tmp_.end(), arena_.begin() + static_cast<std::ptrdiff_t>(to));
        size = to + tmp_.size();
        ends = any_all_final(g, tmp_.data(), tmp_.size());
      }
      level_[k + 1] = size;
      on_tokens(i);
      if (pops && ends && end[i] > i + 1) on_pop(i);
      ++i;
    }
  }

 private:
  void reserve(std::size_t n) {
    if (arena_.size() < n) arena_.resize(2 * n);
  }

  const Grammar* g_;
  const VocabTrie* t_;
  Stepper st_;
  StackWords arena_;  // the stack set of each depth of the current path, one after the other
  StackWords tmp_;
  std::vector<std::size_t> level_;
  std::vector<uint32_t> ids_;
  std::size_t visited_ = 0;
};

std::shared_ptr<const StateTable> build_table(const Grammar& g, const VocabTrie& t, int32_t n_vocab,
                                              uint32_t d, Walker& w) {
  auto table = std::make_shared<StateTable>();
  if (g.final[d] && t.end[0] > 1) table->pops.push_back(0);
  const uint32_t set[2] = {1, d};
  std::vector<uint32_t>& ids = w.ids();
  ids.clear();
  w.walk(
      0, set, 2, true,
      [&](uint32_t node) {
        for (uint32_t j = t.tok_off[node]; j < t.tok_off[node + 1]; ++j)
          ids.push_back(static_cast<uint32_t>(t.ids[j]));
      },
      [&](uint32_t node) { table->pops.push_back(node); });
  // A bitset costs n/8 bytes, a list 4 bytes an id: keep the smaller.
  if (ids.size() * 32 >= static_cast<std::size_t>(n_vocab)) {
    table->bits.assign((static_cast<std::size_t>(n_vocab) + 63) / 64, 0);
    for (uint32_t id : ids) set_bit(table->bits, static_cast<int32_t>(id));
  } else {
    std::sort(ids.begin(), ids.end());
    table->ids.assign(ids.begin(), ids.end());
  }
  table->pops.shrink_to_fit();
  return table;
}

// A parser state as a cache key: its canonical stack words, which the entry owns.
struct KeyView {
  const uint32_t* p;
  std::size_t n;
  uint64_t hash;
};
struct KeyViewHash {
  std::size_t operator()(const KeyView& k) const { return static_cast<std::size_t>(k.hash); }
};
struct KeyViewEq {
  bool operator()(const KeyView& a, const KeyView& b) const {
    return a.n == b.n && std::equal(a.p, a.p + a.n, b.p);
  }
};

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> pieces, std::vector<int32_t> eog_ids)
    : pieces_(std::move(pieces)), eog_(std::move(eog_ids)), serial_(next_serial++) {
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
  eog_flag_.assign(pieces_.size(), 0);
  for (int32_t id : eog_) {
    if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size())
      throw std::invalid_argument("end-of-generation id " + std::to_string(id) +
                                  " is outside the vocabulary of " +
                                  std::to_string(pieces_.size()) + " pieces");
    eog_flag_[static_cast<std::size_t>(id)] = 1;
  }
  trie_ = build_trie(pieces_, eog_flag_);
}

Vocabulary::~Vocabulary() = default;

std::size_t Vocabulary::memory_bytes() const {
  std::size_t n = sizeof(*this) + eog_flag_.size() + eog_.size() * 4;
  for (const std::string& p : pieces_) n += sizeof(std::string) + p.capacity();
  const VocabTrie& t = *trie_;
  n += t.byte.size() + (t.depth.size() + t.end.size() + t.tok_off.size() + t.ids.size()) * 4;
  return n;
}

TokenMask::TokenMask(std::vector<uint64_t> words, int32_t n, int32_t eog_allowed) : n_(n) {
  for (uint64_t x : words) count_ += std::popcount(x);
  can_continue_ = count_ > eog_allowed;
  // A list costs 4 bytes an id, the bitset n/8 bytes: keep what is smallest.
  const auto list_limit = static_cast<int32_t>(words.size() * 2);
  if (count_ <= list_limit || n - count_ <= list_limit) {
    form_ = count_ <= list_limit ? Form::Allowed : Form::Refused;
    const bool want = form_ == Form::Allowed;
    ids_.reserve(static_cast<std::size_t>(want ? count_ : n - count_));
    for (std::size_t w = 0; w < words.size(); ++w) {
      uint64_t x = want ? words[w] : ~words[w];
      while (x != 0) {
        const auto id = static_cast<int32_t>(w * 64) + std::countr_zero(x);
        if (id >= n) break;  // the last word's bits past n
        ids_.push_back(id);
        x &= x - 1;
      }
    }
  } else {
    form_ = Form::Bits;
    bits_ = std::move(words);
  }
}

bool TokenMask::test(int32_t id) const {
  switch (form_) {
    case Form::Bits:
      return (bits_[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1;
    case Form::Allowed:
      return std::binary_search(ids_.begin(), ids_.end(), id);
    case Form::Refused:
      return !std::binary_search(ids_.begin(), ids_.end(), id);
  }
  return false;
}

void TokenMask::fill(uint64_t* words) const {
  const std::size_t n_words = (static_cast<std::size_t>(n_) + 63) / 64;
  switch (form_) {
    case Form::Bits:
      std::copy(bits_.begin(), bits_.end(), words);
      return;
    case Form::Allowed:
      std::fill(words, words + n_words, 0);
      for (int32_t id : ids_) words[static_cast<std::size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
      return;
    case Form::Refused:
      std::fill(words, words + n_words, ~uint64_t{0});
      if (n_ % 64 != 0) words[n_words - 1] = (uint64_t{1} << (n_ % 64)) - 1;
      for (int32_t id : ids_)
        words[static_cast<std::size_t>(id) >> 6] &= ~(uint64_t{1} << (id & 63));
      return;
  }
}

/// The caches of one Compiled, behind one mutex: tables per automaton state and masks per parser
/// state, each an LRU bounded in bytes (see CacheOptions).
struct CompiledCaches {
  CompiledCaches(const Grammar& g, const Vocabulary& v, const CacheOptions& o)
      : g(g), v(v), opt(o), tables(g.n_states), used(g.n_states, 0) {}

  struct MaskEntry {
    StackWords key;
    uint64_t hash;
    std::shared_ptr<const TokenMask> mask;
    std::size_t bytes;
  };

  const Grammar& g;
  const Vocabulary& v;
  CacheOptions opt;
  mutable std::mutex mu;
  std::vector<std::shared_ptr<const StateTable>> tables;
  std::vector<uint64_t> used;  // tick of the last use of each table
  uint64_t tick = 0;
  std::size_t table_bytes = 0;
  uint64_t tables_built = 0;
  std::list<MaskEntry> lru;  // most recent first
  std::unordered_map<KeyView, std::list<MaskEntry>::iterator, KeyViewHash, KeyViewEq> index;
  std::size_t mask_bytes = 0;
  uint64_t hits = 0, misses = 0;

  std::shared_ptr<const StateTable> table(uint32_t d, Walker& w) {
    {
      std::lock_guard<std::mutex> lock(mu);
      used[d] = ++tick;
      if (tables[d]) return tables[d];
    }
    auto t = build_table(g, v.trie(), v.size(), d, w);
    std::lock_guard<std::mutex> lock(mu);
    if (tables[d]) return tables[d];  // another thread built it meanwhile
    tables[d] = t;
    table_bytes += t->bytes();
    ++tables_built;
    // Evict the least recently used tables (a scan, but only once the budget is full).
    while (table_bytes > opt.table_cache_bytes) {
      uint32_t victim = kNoState;
      for (uint32_t s = 0; s < tables.size(); ++s)
        if (tables[s] && s != d && (victim == kNoState || used[s] < used[victim])) victim = s;
      if (victim == kNoState) break;
      table_bytes -= tables[victim]->bytes();
      tables[victim].reset();
    }
    return t;
  }

  void clear_tables() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& t : tables) t.reset();
    table_bytes = 0;
  }

  std::shared_ptr<const TokenMask> lookup(const StackWords& key, uint64_t hash) {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = index.find(KeyView{key.data(), key.size(), hash});
    if (it == index.end()) {
      ++misses;
      return nullptr;
    }
    ++hits;
    lru.splice(lru.begin(), lru, it->second);
    return it->second->mask;
  }

  std::shared_ptr<const TokenMask> insert(const StackWords& key, uint64_t hash,
                                          std::shared_ptr<const TokenMask> m) {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = index.find(KeyView{key.data(), key.size(), hash});
    if (it != index.end()) return it->second->mask;
    const std::size_t bytes = m->bytes() + key.size() * 4 + 128;
    lru.push_front(MaskEntry{key, hash, std::move(m), bytes});
    index.emplace(KeyView{lru.front().key.data(), lru.front().key.size(), hash}, lru.begin());
    mask_bytes += bytes;
    while (mask_bytes > opt.mask_cache_bytes && lru.size() > 1) {
      const MaskEntry& e = lru.back();
      index.erase(KeyView{e.key.data(), e.key.size(), e.hash});
      mask_bytes -= e.bytes;
      lru.pop_back();
    }
    return lru.front().mask;
  }

  void clear_masks() {
    std::lock_guard<std::mutex> lock(mu);
    index.clear();
    lru.clear();
    mask_bytes = 0;
  }

  // Adds what the stack frames[0, n) allows: its top state's own tokens, then, where that rule
  // may end with bytes left, those bytes against the stack below; where it may end before any
  // byte, all of that again one frame down (a loop: stacks can be as deep as the text is long).
  void or_stack(const uint32_t* frames, uint32_t n, std::vector<uint64_t>& words, Walker& w) {
    const VocabTrie& trie = v.trie();
    StackWords below;
    for (; n > 0; --n) {
      const auto t = table(frames[n - 1], w);
      if (!t->bits.empty()) {
        for (std::size_t i = 0; i < words.size(); ++i) words[i] |= t->bits[i];
      } else {
        for (uint32_t id : t->ids) set_bit(words, static_cast<int32_t>(id));
      }
      if (n == 1) return;  // the bottom rule ending is the end of the text: nothing to add
      bool ends_here = false;
      below.clear();
      for (uint32_t node : t->pops) {
        if (node == 0) {
          ends_here = true;
          continue;
        }
        if (below.empty()) {
          below.push_back(n - 1);
          below.insert(below.end(), frames, frames + (n - 1));
        }
        w.walk(
            node, below.data(), below.size(), false,
            [&](uint32_t i) {
              for (uint32_t j = trie.tok_off[i]; j < trie.tok_off[i + 1]; ++j)
                set_bit(words, trie.ids[j]);
            },
            [](uint32_t) {});
      }
      if (!ends_here) return;
    }
  }

  std::shared_ptr<const TokenMask> compute(const StackWords& stacks) {
    std::vector<uint64_t> words(v.mask_words(), 0);
    Walker w(g, v.trie());
    for (std::size_t i = 0; i < stacks.size(); i += stacks[i] + 1)
      or_stack(stacks.data() + i + 1, stacks[i], words, w);
    int32_t eog = 0;
    if (any_all_final(g, stacks.data(), stacks.size())) {
      for (int32_t id : v.eog_ids()) set_bit(words, id);
      eog = static_cast<int32_t>(v.eog_ids().size());
    }
    return std::make_shared<TokenMask>(std::move(words), v.size(), eog);
  }
};

Compiled::Compiled(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v,
                   const CacheOptions& opt)
    : grammar_(std::move(g)), vocab_(std::move(v)), opt_(opt) {
  none_ = std::make_shared<TokenMask>(std::vector<uint64_t>(vocab_->mask_words(), 0),
                                      vocab_->size(), 0);
  caches_ = std::make_unique<CompiledCaches>(*grammar_, *vocab_, opt_);
  if (opt_.precompute) {
    Walker w(*grammar_, vocab_->trie());
    for (uint32_t d = 0; d < grammar_->n_states && w.visited() < opt_.precompute_nodes; ++d)
      caches_->table(d, w);
  }
}

Compiled::~Compiled() = default;

std::shared_ptr<const Compiled> compile(std::shared_ptr<const Grammar> g,
                                        std::shared_ptr<const Vocabulary> v,
                                        const CacheOptions& opt) {
  if (!g || !v) throw std::invalid_argument("compile needs a grammar and a vocabulary");
  return std::shared_ptr<const Compiled>(new Compiled(std::move(g), std::move(v), opt));
}

std::shared_ptr<const TokenMask> Compiled::mask_for(const StackWords& stacks, uint64_t hash) const {
  if (auto m = caches_->lookup(stacks, hash)) return m;
  return caches_->insert(stacks, hash, caches_->compute(stacks));
}

Compiled::Stats Compiled::stats() const {
  std::lock_guard<std::mutex> lock(caches_->mu);
  Stats s;
  s.mask_hits = caches_->hits;
  s.mask_misses = caches_->misses;
  s.tables_built = caches_->tables_built;
  s.masks = caches_->lru.size();
  s.mask_bytes = caches_->mask_bytes;
  s.table_bytes = caches_->table_bytes;
  return s;
}

std::size_t Compiled::memory_bytes() const {
  const Grammar& g = *grammar_;
  std::size_t n = sizeof(*this) + sizeof(Grammar) + g.next.size() * 4 + g.call_begin.size() * 4 +
                  g.calls.size() * sizeof(DfaCall) + g.final.size();
  std::lock_guard<std::mutex> lock(caches_->mu);
  return n + caches_->mask_bytes + caches_->table_bytes;
}

void Compiled::clear_masks() const {
  caches_->clear_masks();
}
void Compiled::clear_tables() const {
  caches_->clear_tables();
}

Matcher::Matcher(std::shared_ptr<const Compiled> c) : c_(std::move(c)), stepper_(c_->grammar()) {
  stacks_ = {1, c_->grammar().start};
  set_state();
}

void Matcher::set_state() {
  hash_ = hash_words(stacks_.data(), stacks_.size());
  can_end_ = any_all_final(c_->grammar(), stacks_.data(), stacks_.size());
  mask_.reset();
  bits_of_ = nullptr;  // a new mask may reuse the old one's address
  walked_ = 0;
  walked_id_ = -1;
}

const StackWords* Matcher::walk(int32_t id) const {
  if (walked_ != 0 && walked_id_ == id) return walked();
  const std::string& piece = c_->vocabulary().piece(id);
  const StackWords* cur = &stacks_;
  int which = 0;
  walked_ = 0;
  for (const char ch : piece) {
    which = which == 1 ? 2 : 1;
    StackWords& out = which == 1 ? a_ : b_;
    out.clear();
    stepper_.step(*cur, 0, cur->size(), static_cast<uint8_t>(ch), out);
    if (out.empty()) return nullptr;
    cur = &out;
  }
  walked_ = which;
  walked_id_ = id;
  return cur;
}

bool Matcher::allows(int32_t id) const {
  const Vocabulary& v = c_->vocabulary();
  if (ended_ || id < 0 || id >= v.size()) return false;
  if (v.is_eog(id)) return can_end_;
  if (mask_) return mask_->test(id);
  if (v.piece(id).empty()) return false;
  return walk(id) != nullptr;
}

void Matcher::advance(int32_t id) {
  if (!allows(id))
    throw std::logic_error("token " + std::to_string(id) +
                           " is not allowed by the constraint here");
  if (c_->vocabulary().is_eog(id)) {
    ended_ = true;
    can_end_ = false;
    stacks_.clear();
    hash_ = 0;
    mask_ = c_->none_;
    bits_of_ = nullptr;
    walked_ = 0;
    return;
  }
  const StackWords* next = walk(id);
  // Canonical order, so that equal parser states are equal keys in the mask cache.
  StackWords& spare = next == &a_ ? b_ : a_;
  spare.clear();
  std::size_t count = 0;
  for (std::size_t i = 0; i < next->size(); i += (*next)[i] + 1) {
    spare.push_back(static_cast<uint32_t>(i));
    ++count;
  }
  if (count > 1) {
    const StackWords& s = *next;
    std::sort(spare.begin(), spare.end(), [&](uint32_t x, uint32_t y) {
      return std::lexicographical_compare(s.begin() + x, s.begin() + x + s[x] + 1, s.begin() + y,
                                          s.begin() + y + s[y] + 1);
    });
    stacks_.clear();
    for (uint32_t off : spare)
      stacks_.insert(stacks_.end(), s.begin() + off, s.begin() + off + s[off] + 1);
  } else {
    stacks_.assign(next->begin(), next->end());
  }
  set_state();
}

const std::vector<uint64_t>& Matcher::mask() const {
  const TokenMask* m = mask_ptr().get();
  if (bits_of_ != m) {
    bits_.resize(c_->vocabulary().mask_words());
    m->fill(bits_.data());
    bits_of_ = m;
  }
  return bits_;
}

std::shared_ptr<const TokenMask> Matcher::mask_ptr() const {
  if (!mask_) mask_ = c_->mask_for(stacks_, hash_);
  return mask_;
}

void Matcher::fill_mask(uint64_t* words) const {
  mask_ptr()->fill(words);
}

int32_t Matcher::allowed_count() const {
  return mask_ptr()->count();
}

bool Matcher::can_continue() const {
  return !ended_ && mask_ptr()->can_continue();
}

}  // namespace sy::constraints
