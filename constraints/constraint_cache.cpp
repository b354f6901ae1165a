// The process-wide cache of compiled constraints, and what admission asks of a new constraint:
// its GBNF (converted from JSON Schema, regex or choices), compiled, and able to start.
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "constraints/convert.hpp"
#include "constraints/matcher.hpp"

namespace sy::constraints {

std::string constraint_gbnf(const sy::Constraint& c, const Limits& lim) {
  switch (c.kind) {
    case sy::Constraint::grammar:
      return c.source;
    case sy::Constraint::json_schema:
      return json_schema_to_gbnf(c.source, lim);
    case sy::Constraint::regex:
      return regex_to_gbnf(c.source, lim);
    case sy::Constraint::choices:
      return choices_to_gbnf(c.options, lim);
    default:
      throw ConstraintError("unknown constraint kind " + std::to_string(c.kind));
  }
}

void check_startable(const std::shared_ptr<const Compiled>& c) {
  const Matcher m(c);
  if (m.dead()) throw ConstraintError("no token of the vocabulary can start this constraint");
}

namespace {

struct Key {
  uint8_t kind = 0;
  std::string source;
  std::vector<std::string> options;
  uint64_t vocab = 0;
  Limits lim;
  bool operator==(const Key& o) const {
    return kind == o.kind && vocab == o.vocab && source == o.source && options == o.options &&
           lim.max_source_bytes == o.lim.max_source_bytes && lim.max_rules == o.lim.max_rules &&
           lim.max_elements == o.lim.max_elements && lim.max_choices == o.lim.max_choices &&
           lim.max_stacks == o.lim.max_stacks;
  }
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = std::hash<std::string>{}(k.source);
    auto mix = [&h](std::size_t x) { h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
    mix(k.kind);
    mix(static_cast<std::size_t>(k.vocab));
    for (const std::string& o : k.options) mix(std::hash<std::string>{}(o));
    mix(k.lim.max_source_bytes);
    mix(k.lim.max_rules);
    mix(k.lim.max_elements);
    mix(k.lim.max_choices);
    mix(k.lim.max_stacks);
    return h;
  }
};

}  // namespace

struct ConstraintCache::Impl {
  struct Entry {
    Key key;
    std::shared_ptr<const Compiled> compiled;
  };
  std::size_t max_entries;
  std::size_t max_bytes;
  CacheOptions opt;
  mutable std::mutex mu;
  std::list<Entry> lru;  // most recent first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index;
  Stats stats;

  // Evicts from the cold end while over either bound; the newest entry always stays.
  void trim() {
    std::size_t bytes = 0;
    for (const Entry& e : lru) bytes += e.compiled->memory_bytes();
    while (lru.size() > 1 && (lru.size() > max_entries || bytes > max_bytes)) {
      bytes -= lru.back().compiled->memory_bytes();
      index.erase(lru.back().key);
      lru.pop_back();
      ++stats.evictions;
    }
  }
};

ConstraintCache::ConstraintCache(std::size_t max_entries, std::size_t max_bytes, CacheOptions opt)
    : impl_(std::make_unique<Impl>()) {
  impl_->max_entries = std::max<std::size_t>(1, max_entries);
  impl_->max_bytes = max_bytes;
  impl_->opt = opt;
}

ConstraintCache::~ConstraintCache() = default;

std::shared_ptr<const Compiled> ConstraintCache::get(const sy::Constraint& c,
                                                     std::shared_ptr<const Vocabulary> v,
                                                     const Limits& lim) {
  if (c.empty()) return nullptr;
  if (!v) throw std::invalid_argument("ConstraintCache::get needs a vocabulary");
  Key key{c.kind, c.source, c.options, v->serial(), lim};
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const auto it = impl_->index.find(key);
    if (it != impl_->index.end()) {
      ++impl_->stats.hits;
      impl_->lru.splice(impl_->lru.begin(), impl_->lru, it->second);
      impl_->trim();
      return it->second->compiled;
    }
    ++impl_->stats.misses;
  }
  // Compiled without the lock: two threads asking for the same new constraint may both compile
  // it; the first to finish is kept.
  // max_source_bytes bounds what the client sent; a converted constraint's grammar text is
  // larger than its source and is bounded by the rule and element limits instead.
  Limits grammar_lim = lim;
  if (c.kind != sy::Constraint::grammar) grammar_lim.max_source_bytes = SIZE_MAX;
  auto compiled =
      compile(compile_gbnf(constraint_gbnf(c, lim), grammar_lim), std::move(v), impl_->opt);
  check_startable(compiled);
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto it = impl_->index.find(key);
  if (it != impl_->index.end()) return it->second->compiled;
  impl_->lru.push_front({key, compiled});
  impl_->index.emplace(std::move(key), impl_->lru.begin());
  impl_->trim();
  return compiled;
}

ConstraintCache::Stats ConstraintCache::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Stats s = impl_->stats;
  s.entries = impl_->lru.size();
  return s;
}

}  // namespace sy::constraints
