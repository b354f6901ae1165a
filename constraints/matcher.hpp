// Token masks for constrained generation: a vocabulary as a byte trie, a grammar compiled against
// it with its caches, the per-sequence matcher that says which tokens may come next, and the
// process-wide cache of compiled constraints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "constraints/automaton.hpp"
#include "constraints/error.hpp"
#include "constraints/grammar.hpp"
#include "core/generation.hpp"

namespace sy::constraints {

struct VocabTrie;
struct CompiledCaches;

/// The token pieces of one model's vocabulary as a byte trie; built once per model, shared.
class Vocabulary {
 public:
  /// `pieces[id]` is the text token `id` adds to the output (Tokenizer::token_to_piece without
  /// special: "" for control and padding ids, which are then never allowed); `eog_ids` end
  /// generation and are allowed exactly where the grammar accepts the whole text so far.
  Vocabulary(std::vector<std::string> pieces, std::vector<int32_t> eog_ids);
  ~Vocabulary();
  Vocabulary(const Vocabulary&) = delete;
  Vocabulary& operator=(const Vocabulary&) = delete;

  /// Number of ids (the mask has this many bits).
  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  /// 64-bit words of a mask over this vocabulary.
  std::size_t mask_words() const { return (pieces_.size() + 63) / 64; }
  /// The text of token `id`; throws std::out_of_range on a bad id.
  const std::string& piece(int32_t id) const { return pieces_.at(static_cast<std::size_t>(id)); }
  /// Whether `id` ends generation.
  bool is_eog(int32_t id) const {
    return id >= 0 && static_cast<std::size_t>(id) < eog_flag_.size() &&
           eog_flag_[static_cast<std::size_t>(id)];
  }
  /// The end-of-generation ids, ascending.
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  /// Distinct for every Vocabulary of the process, never reused (cache keys).
  uint64_t serial() const { return serial_; }
  /// Bytes held (pieces and trie).
  std::size_t memory_bytes() const;
  /// The byte trie of the pieces (internal to constraints/).
  const VocabTrie& trie() const { return *trie_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_;
  std::vector<char> eog_flag_;
  uint64_t serial_ = 0;
  std::unique_ptr<VocabTrie> trie_;
};

/// A set of allowed token ids, kept in the smallest of three forms: a bitset, the list of the
/// allowed ids, or the list of the refused ones (most parser states allow a handful of tokens, or
/// all but a handful, and the cache then holds hundreds of bytes instead of n/8).
class TokenMask {
 public:
  /// From a bitset of `n` ids (bit id % 64 of word id / 64); `eog_allowed` of the set bits are
  /// end-of-generation ids.
  TokenMask(std::vector<uint64_t> words, int32_t n, int32_t eog_allowed);

  /// Whether `id` is in the set (0 <= id < n).
  bool test(int32_t id) const;
  /// Writes the set as a bitset of (n + 63) / 64 words.
  void fill(uint64_t* words) const;
  /// Ids in the set, end-of-generation ids included.
  int32_t count() const { return count_; }
  /// Whether an id that is not end-of-generation is in the set.
  bool can_continue() const { return can_continue_; }
  /// Bytes held.
  std::size_t bytes() const { return sizeof(*this) + bits_.capacity() * 8 + ids_.capacity() * 4; }

 private:
  enum class Form : uint8_t { Bits, Allowed, Refused };
  Form form_ = Form::Bits;
  int32_t n_ = 0;
  int32_t count_ = 0;
  bool can_continue_ = false;
  std::vector<uint64_t> bits_;  // Form::Bits
  std::vector<int32_t> ids_;    // Form::Allowed or Form::Refused, ascending
};

/// What one compiled constraint may keep in memory. A mask is at most 12.5 KiB at a 100k
/// vocabulary (most are lists of a few ids); a JSON document of a few hundred tokens visits a
/// few hundred parser states, so 16 MiB keeps them all. A table is as large for a state that
/// allows most tokens (inside a string); a 4k-state JSON Schema grammar needs about 2 MiB of
/// them. ConstraintCache bounds the sum over all constraints.
struct CacheOptions {
  std::size_t mask_cache_bytes = 16u << 20;   // token masks per parser state (LRU)
  std::size_t table_cache_bytes = 64u << 20;  // per-automaton-state token tables (LRU)
  // Build the states' tables at compile time, so that the first jobs do not pay for them in
  // the middle of a batch; off, they are built when first needed.
  bool precompute = true;
  // Trie nodes the precomputation may visit (10 to 30 ns each, so about a second): a grammar
  // with a huge automaton (a regex like [a-z]* "a" [a-z]{16} has 2^17 states) must not hold
  // admission for minutes; the tables past this budget are built when first needed.
  std::size_t precompute_nodes = 32u << 20;
};

/// A grammar compiled against a vocabulary, with its caches; immutable from outside and safe to
/// share between threads (the caches lock inside; checking one token takes no lock).
class Compiled {
 public:
  ~Compiled();
  Compiled(const Compiled&) = delete;
  Compiled& operator=(const Compiled&) = delete;

  /// The grammar and the vocabulary it was compiled for.
  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocabulary() const { return *vocab_; }

  /// Counters of the caches.
  struct Stats {
    uint64_t mask_hits = 0;
    uint64_t mask_misses = 0;
    uint64_t tables_built = 0;
    std::size_t masks = 0;
    std::size_t mask_bytes = 0;
    std::size_t table_bytes = 0;
  };
  /// A snapshot of the counters.
  Stats stats() const;
  /// Bytes held by the caches and the automaton (not the shared vocabulary).
  std::size_t memory_bytes() const;
  /// Drops the cached masks (the per-state tables stay): benchmarks time the cold path with it.
  void clear_masks() const;
  /// Drops the per-state tables too.
  void clear_tables() const;

 private:
  friend class Matcher;
  friend std::shared_ptr<const Compiled> compile(std::shared_ptr<const Grammar>,
                                                 std::shared_ptr<const Vocabulary>,
                                                 const CacheOptions&);
  Compiled(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> v,
           const CacheOptions& opt);
  std::shared_ptr<const TokenMask> mask_for(const StackWords& stacks, uint64_t hash) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  CacheOptions opt_;
  std::shared_ptr<const TokenMask> none_;  // nothing allowed (after end of generation)
  std::unique_ptr<CompiledCaches> caches_;
};

/// Compiles `g` against `v`; with opt.precompute, builds the states' token tables now (within
/// opt.precompute_nodes).
std::shared_ptr<const Compiled> compile(std::shared_ptr<const Grammar> g,
                                        std::shared_ptr<const Vocabulary> v,
                                        const CacheOptions& opt = {});

/// Where one sequence is in its constraint. Copyable: n samples fork from one state. Not safe
/// for concurrent use (it keeps scratch buffers); copies are independent.
class Matcher {
 public:
  /// At the start of the constraint (nothing generated yet).
  explicit Matcher(std::shared_ptr<const Compiled> c);

  /// Whether token `id` may come next (end-of-generation ids: where can_end()). Cheap: walks the
  /// token's bytes, or tests the mask when one is known for this state. Throws ConstraintError
  /// past the grammar's max_stacks.
  bool allows(int32_t id) const;
  /// Takes token `id`; throws std::logic_error when allows(id) is false. After an
  /// end-of-generation id nothing is allowed any more.
  void advance(int32_t id);
  /// The allowed ids as a bitset of vocabulary().mask_words() words (end-of-generation ids
  /// included where can_end()); computed once per parser state and shared through the cache,
  /// written out here (the reference is valid until the matcher moves or is asked again).
  const std::vector<uint64_t>& mask() const;
  /// The same set as the cache holds it, shared (valid after the matcher moves on).
  std::shared_ptr<const TokenMask> mask_ptr() const;
  /// Copies mask() into `words` (vocabulary().mask_words() of them).
  void fill_mask(uint64_t* words) const;
  /// Number of allowed ids (from the mask, computed if needed).
  int32_t allowed_count() const;
  /// Whether the text so far is a whole text of the grammar (end of generation allowed).
  bool can_end() const { return can_end_; }
  /// Whether some token that is not end-of-generation is allowed.
  bool can_continue() const;
  /// Whether nothing at all is allowed.
  bool dead() const { return ended_ || (!can_end_ && !can_continue()); }
  /// Whether an end-of-generation id was taken.
  bool ended() const { return ended_; }
  /// The compiled constraint this matcher walks.
  const Compiled& compiled() const { return *c_; }

 private:
  const StackWords* walk(int32_t id) const;
  const StackWords* walked() const { return walked_ == 1 ? &a_ : walked_ == 2 ? &b_ : nullptr; }
  void set_state();

  std::shared_ptr<const Compiled> c_;
  StackWords stacks_;  // canonical: stacks sorted, no duplicates
  uint64_t hash_ = 0;
  bool can_end_ = false;
  bool ended_ = false;
  mutable std::shared_ptr<const TokenMask> mask_;
  mutable std::vector<uint64_t> bits_;          // mask_ written out by mask()
  mutable const TokenMask* bits_of_ = nullptr;  // the mask bits_ holds
  mutable Stepper stepper_;
  mutable StackWords a_, b_;        // scratch of walks
  mutable int32_t walked_id_ = -1;  // the id whose successor set a_ (1) or b_ (2) holds
  mutable int walked_ = 0;
};

/// The GBNF text of a constraint: the grammar itself, or the conversion of a JSON Schema, regex
/// or choice list (constraints/convert.hpp). Throws ConstraintError.
std::string constraint_gbnf(const sy::Constraint& c, const Limits& lim = {});

/// Refuses (ConstraintError "no token of the vocabulary can start this constraint") a compiled
/// constraint whose start allows no token and cannot end: admission calls it.
void check_startable(const std::shared_ptr<const Compiled>& c);

/// Compiled constraints of the process by (kind, source, options, vocabulary, limits): a job
/// repeating another's constraint reuses its automaton and masks. Bounded, thread-safe.
class ConstraintCache {
 public:
  /// Keeps at most `max_entries` constraints and evicts the least recently used past
  /// `max_bytes` of their memory (checked at each get, as their caches grow while used).
  explicit ConstraintCache(std::size_t max_entries = 64, std::size_t max_bytes = 1u << 30,
                           CacheOptions opt = {});
  ~ConstraintCache();
  ConstraintCache(const ConstraintCache&) = delete;
  ConstraintCache& operator=(const ConstraintCache&) = delete;

  /// The compiled constraint, from the cache or compiled now (conversion, grammar, startability
  /// check); nullptr for Constraint::none. Throws ConstraintError; failures are not cached.
  std::shared_ptr<const Compiled> get(const sy::Constraint& c, std::shared_ptr<const Vocabulary> v,
                                      const Limits& lim = {});

  /// Counters.
  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
    std::size_t entries = 0;
  };
  /// A snapshot of the counters.
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy::constraints
