// The token matcher: masks equal brute force (a token is allowed iff the text so far plus its
// piece is a prefix of the grammar's language) on a synthetic vocabulary and on the real
// llama-spm one, end of generation exactly where the text is complete, advance and copy
// semantics, cache reuse and bounds, the constraint cache and the admission check.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "constraints/grammar.hpp"
#include "constraints/matcher.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

BOOST_AUTO_TEST_SUITE(test_constraints_matcher)

using namespace sy::constraints;

namespace {

const std::string kVocabDir = std::string(SY_MODELS_DIR) + "/vocab/";

// Ids 0 and 1 are padding and BOS (empty pieces), 2 and 61 end generation (61 has a text).
std::vector<std::string> synthetic_pieces() {
  return {"",     "",        "",     "a",    "b",     "c",    "ab",       "abc",  "ba",   "(",
          ")",    "((",      "))",   "()",   ")(",    " ",    "\"",       "\",",  "x\"",  "\\",
          "\\\"", "é",       "\xC3", "\xA9", "日",    "\xE6", "\x97\xA5", ",",    "{",    "}",
          "[",    "]",       ":",    "1",    "12",    "-",    ".",        "true", "tr",   "ue",
          "null", "\n",      "  ",   "a\"",  "\"}",   "\"]",  "}}",       "]}",   "\xFF", "\": ",
          "0",    "e",       "x",    "{\"",  "\"a\"", "\n ",  "a,",       "1,",   "1]",   "\"b",
          "a\"}", "<|eot|>", "2",    "3",    "-0",    "@",    "x.",       "com",  "5-",   "05"};
}

std::shared_ptr<const Vocabulary> synthetic_vocab() {
  return std::make_shared<Vocabulary>(synthetic_pieces(), std::vector<int32_t>{2, 61});
}

const char* kJson = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

const char* kParens = R"g(root ::= item*
item ::= "(" item* ")" | "[" item* "]" | "a")g";

const char* kSchema =
    R"(root ::= "{" ws "\"a\"" ws ":" ws string ws "," ws "\"b\"" ws ":" ws list ws "}"
list ::= "[" ws ( num ( ws "," ws num )* )? ws "]"
num ::= "-"? [0-9]+ ( "." [0-9]+ )?
string ::= "\"" ( [^"\\] | "\\" ["\\] )* "\""
ws ::= | " " | "\n" [ ]{0,4})";

const char* kRegexLike =
    R"(root ::= [a-z]+ ( "." [a-z]+ )* "@" [a-z]+ "." ( "com" | "org" ) | [0-9]{4} "-" [0-9]{2})";

// `item` is too big to copy into its six call sites, so it stays a called rule: tokens that end
// an item and go on ("a,") are checked against the stack below at run time.
const char* kCalls = R"(root ::= item ("," item){0,5} "."?
item ::= [ab]{0,800} "c"?)";

const char* kUtf8 = R"(root ::= ( [^é] | "é" "!" )* "日" "本"?)";

// What the mask must be: every id whose piece extends the text to a prefix of the language,
// and the end-of-generation ids where the text is complete.
std::vector<uint64_t> brute_mask(const Grammar& g, const Vocabulary& v, const std::string& text) {
  std::vector<uint64_t> w(v.mask_words(), 0);
  const bool complete = grammar_accepts(g, text);
  for (int32_t id = 0; id < v.size(); ++id) {
    const std::string& p = v.piece(id);
    const bool ok = v.is_eog(id) ? complete : !p.empty() && grammar_accepts_prefix(g, text + p);
    if (ok) w[static_cast<std::size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  }
  return w;
}

int32_t popcount(const std::vector<uint64_t>& w) {
  int32_t n = 0;
  for (uint64_t x : w) n += __builtin_popcountll(x);
  return n;
}

// Checks mask, allows, counts and can_end of `m` against brute force after `text`; returns the
// number of mismatching ids.
int check_state(const Matcher& m, const Grammar& g, const Vocabulary& v, const std::string& text) {
  const std::vector<uint64_t> want = brute_mask(g, v, text);
  int bad = 0;
  for (int32_t id = 0; id < v.size(); ++id) {
    const bool w = (want[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1;
    if (m.allows(id) != w) ++bad;
  }
  const std::vector<uint64_t>& got = m.mask();
  for (int32_t id = 0; id < v.size(); ++id) {
    const bool a = (got[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1;
    const bool w = (want[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1;
    if (a != w) {
      if (bad < 5)
        BOOST_TEST_MESSAGE("after '" << text << "': id " << id << " '" << v.piece(id) << "' mask "
                                     << a << ", brute force " << w);
      ++bad;
    }
  }
  BOOST_TEST(m.allowed_count() == popcount(want));
  BOOST_TEST(m.can_end() == grammar_accepts(g, text));
  return bad;
}

// Random walks through the grammar, picking allowed tokens, checking every state on the way.
void random_walks(const char* grammar, int walks, int steps) {
  const auto g = compile_gbnf(grammar);
  const auto v = synthetic_vocab();
  const auto c = compile(g, v);
  std::mt19937 rng(1234);
  for (int w = 0; w < walks; ++w) {
    Matcher m(c);
    std::string text;
    for (int s = 0; s < steps; ++s) {
      BOOST_TEST_REQUIRE(check_state(m, *g, *v, text) == 0,
                         "walk " << w << " text '" << text << "'");
      std::vector<int32_t> ok;
      for (int32_t id = 0; id < v->size(); ++id)
        if (m.allows(id) && !v->is_eog(id)) ok.push_back(id);
      if (ok.empty()) break;
      const int32_t id = ok[rng() % ok.size()];
      m.advance(id);
      text += v->piece(id);
    }
  }
}

// Cuts `text` into pieces of the vocabulary, longest first (as a model could have produced it).
std::vector<int32_t> greedy_tokens(const Vocabulary& v, const std::string& text) {
  std::vector<int32_t> ids;
  for (std::size_t pos = 0; pos < text.size();) {
    int32_t best = -1;
    std::size_t len = 0;
    for (int32_t id = 0; id < v.size(); ++id) {
      const std::string& p = v.piece(id);
      if (!v.is_eog(id) && p.size() > len && text.compare(pos, p.size(), p) == 0) {
        best = id;
        len = p.size();
      }
    }
    BOOST_REQUIRE(best >= 0);
    ids.push_back(best);
    pos += len;
  }
  return ids;
}

std::shared_ptr<const Vocabulary> load_vocab(const std::string& file) {
  const auto f = sy::gguf::File::open(kVocabDir + file);
  const auto tok = sy::Tokenizer::from_gguf(f);
  std::vector<std::string> pieces(static_cast<std::size_t>(tok->n_vocab()));
  for (int32_t i = 0; i < tok->n_vocab(); ++i)
    pieces[static_cast<std::size_t>(i)] = tok->token_to_piece(i);
  return std::make_shared<Vocabulary>(std::move(pieces), tok->eog_ids());
}

}  // namespace

BOOST_AUTO_TEST_CASE(mask_equals_brute_force_synthetic) {
  random_walks(kJson, 12, 30);
  random_walks(kParens, 12, 25);
  random_walks(kSchema, 12, 40);
  random_walks(kRegexLike, 12, 15);
  random_walks(kUtf8, 12, 15);
  random_walks(kCalls, 12, 30);
}

BOOST_AUTO_TEST_CASE(deep_stacks) {
  // Thousands of open parentheses: the stack is as deep as the text, and its mask still right.
  const auto v = synthetic_vocab();
  const auto g = compile_gbnf(kParens);
  const auto c = compile(g, v);
  Matcher m(c);
  std::string text;
  for (int i = 0; i < 1500; ++i) {
    m.advance(11);  // "(("
    text += "((";
  }
  m.advance(30);  // "["
  text += "[";
  BOOST_TEST(check_state(m, *g, *v, text) == 0);
  m.advance(31);  // "]"
  text += "]";
  BOOST_TEST(check_state(m, *g, *v, text) == 0);
  BOOST_TEST(!m.can_end());
}

BOOST_AUTO_TEST_CASE(mask_equals_brute_force_real_vocab) {
  const auto v = load_vocab("ggml-vocab-llama-spm.gguf");
  const auto g = compile_gbnf(kJson);
  const auto c = compile(g, v);
  const std::string text =
      "{\"name\": \"Jos\xC3\xA9 \\\"the\\\" \xE6\x97\xA5\xE6\x9C\xAC\", \"tags\": [\"a\", [1, "
      "-2.5e3]],\n  \"ok\": {\"x\": null, \"y\": {}}}";
  BOOST_TEST_REQUIRE(grammar_accepts(*g, text));
  Matcher m(c);
  std::string sofar;
  for (const int32_t id : greedy_tokens(*v, text)) {
    BOOST_TEST_REQUIRE(check_state(m, *g, *v, sofar) == 0, "after '" << sofar << "'");
    m.advance(id);
    sofar += v->piece(id);
  }
  BOOST_TEST(check_state(m, *g, *v, sofar) == 0);
  BOOST_TEST(m.can_end());
  // Byte tokens: a character may arrive one byte at a time.
  Matcher b(c);
  std::string bytes;
  for (const char ch : std::string("{\"\xE6\x97\xA5")) {
    int32_t byte_id = -1;
    for (int32_t t = 0; t < v->size() && byte_id < 0; ++t)
      if (v->piece(t) == std::string(1, ch)) byte_id = t;
    BOOST_TEST_REQUIRE(byte_id >= 0);
    BOOST_TEST_REQUIRE(b.allows(byte_id));
    b.advance(byte_id);
    bytes += ch;
    BOOST_TEST(check_state(b, *g, *v, bytes) == 0);
  }
}

BOOST_AUTO_TEST_CASE(eog_only_where_the_text_is_complete) {
  const auto v = synthetic_vocab();
  const auto c = compile(compile_gbnf(R"(root ::= "a" "b"?)"), v);
  Matcher m(c);
  BOOST_TEST(!m.can_end());
  BOOST_TEST(!m.allows(2));
  BOOST_TEST(!m.allows(61));  // an end-of-generation id with a text is still only an ending
  BOOST_TEST(m.allows(3));
  BOOST_TEST(m.allows(6));   // "ab"
  BOOST_TEST(!m.allows(0));  // padding: empty piece
  BOOST_TEST(!m.allows(-1));
  BOOST_TEST(!m.allows(v->size()));
  m.advance(3);
  BOOST_TEST(m.can_end());
  BOOST_TEST(m.allows(2));
  BOOST_TEST(m.allows(61));
  BOOST_TEST(m.allows(4));
  BOOST_TEST(m.can_continue());
  m.advance(4);
  BOOST_TEST(m.can_end());
  BOOST_TEST(!m.can_continue());
  BOOST_TEST(m.allowed_count() == 2);  // the two end-of-generation ids
  BOOST_TEST(!m.dead());
  m.advance(61);
  BOOST_TEST(m.ended());
  BOOST_TEST(m.dead());
  BOOST_TEST(!m.allows(2));
  BOOST_TEST(popcount(m.mask()) == 0);
  BOOST_CHECK_THROW(m.advance(2), std::logic_error);
}

BOOST_AUTO_TEST_CASE(advance_and_copy_semantics) {
  const auto v = synthetic_vocab();
  const auto g = compile_gbnf(kParens);
  const auto c = compile(g, v);
  Matcher m(c);
  m.advance(9);  // "("
  const std::vector<uint64_t> before = m.mask();
  Matcher fork = m;
  BOOST_TEST(fork.allows(10));
  fork.advance(10);  // ")"
  BOOST_TEST(fork.can_end());
  BOOST_TEST(!m.can_end());
  BOOST_TEST(m.mask() == before);  // the original did not move
  BOOST_TEST(check_state(fork, *g, *v, "()") == 0);
  BOOST_TEST(check_state(m, *g, *v, "(") == 0);
  // A copy taken right after allows() (which keeps the walked successor) is independent too.
  Matcher a(c);
  BOOST_TEST(a.allows(11));  // "(("
  Matcher b = a;
  b.advance(11);
  a.advance(9);
  BOOST_TEST(check_state(a, *g, *v, "(") == 0);
  BOOST_TEST(check_state(b, *g, *v, "((") == 0);
  // Refused tokens throw and leave the state as it was.
  BOOST_CHECK_THROW(a.advance(31), std::logic_error);  // "]" after "("
  BOOST_CHECK_THROW(a.advance(0), std::logic_error);   // empty piece
  BOOST_TEST(check_state(a, *g, *v, "(") == 0);
  // fill_mask copies the same bits.
  std::vector<uint64_t> words(v->mask_words(), ~uint64_t{0});
  a.fill_mask(words.data());
  BOOST_TEST(words == a.mask());
}

BOOST_AUTO_TEST_CASE(cache_reuse_gives_identical_masks) {
  const auto v = synthetic_vocab();
  const auto g = compile_gbnf(kJson);
  const auto c = compile(g, v);
  const std::vector<int32_t> path = {28, 16, 3, 16, 32, 15, 30, 33, 27, 15, 37, 31, 29};
  std::vector<std::vector<uint64_t>> first;
  Matcher m1(c);
  for (int32_t id : path) {
    first.push_back(m1.mask());
    m1.advance(id);
  }
  const auto hits_before = c->stats().mask_hits;
  // A second sequence through the same states is served from the cache, same masks and the
  // same shared objects.
  Matcher m2(c), m3(c);
  for (std::size_t i = 0; i < path.size(); ++i) {
    BOOST_TEST(m2.mask() == first[i]);
    BOOST_TEST(m2.mask_ptr() == m3.mask_ptr());
    m2.advance(path[i]);
    m3.advance(path[i]);
  }
  BOOST_TEST(c->stats().mask_hits >= hits_before + path.size());
  // Recomputed from nothing (no masks, no tables), lazily, or with tiny caches: same masks.
  c->clear_masks();
  c->clear_tables();
  CacheOptions lazy;
  lazy.precompute = false;
  CacheOptions tiny;
  tiny.mask_cache_bytes = 1;
  tiny.table_cache_bytes = 1;
  const auto cl = compile(g, v, lazy);
  const auto ct = compile(g, v, tiny);
  Matcher a(c), b(cl), d(ct);
  for (std::size_t i = 0; i < path.size(); ++i) {
    BOOST_TEST(a.mask() == first[i]);
    BOOST_TEST(b.mask() == first[i]);
    BOOST_TEST(d.mask() == first[i]);
    a.advance(path[i]);
    b.advance(path[i]);
    d.advance(path[i]);
  }
  BOOST_TEST(ct->stats().masks <= 1u);  // the byte cap holds the cache to one entry
  BOOST_TEST(cl->stats().tables_built < g->n_states + 0u);
  BOOST_TEST(c->memory_bytes() > 0u);
}

BOOST_AUTO_TEST_CASE(threads_share_one_compiled_constraint) {
  const auto v = synthetic_vocab();
  const auto g = compile_gbnf(kParens);
  CacheOptions lazy;
  lazy.precompute = false;
  const auto c = compile(g, v, lazy);
  const std::vector<int32_t> path = {9, 30, 3, 31, 11, 12, 10, 13};
  std::vector<std::vector<uint64_t>> want;
  {
    const auto ref = compile(g, v);
    Matcher m(ref);
    for (int32_t id : path) {
      want.push_back(m.mask());
      m.advance(id);
    }
  }
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        Matcher m(c);
        for (std::size_t i = 0; i < path.size(); ++i) {
          if (m.mask() != want[i]) ++bad[static_cast<std::size_t>(t)];
          m.advance(path[i]);
        }
        if (t == 0 && round % 5 == 0) c->clear_masks();
      }
    });
  for (auto& th : threads) th.join();
  for (int b : bad) BOOST_TEST(b == 0);
}

BOOST_AUTO_TEST_CASE(ambiguity_past_max_stacks_is_refused) {
  Limits lim;
  lim.max_stacks = 16;
  const auto g = compile_gbnf(R"g(root ::= r
r ::= a | b
a ::= "(" r ")" | "x"
b ::= "(" r "]" | "x")g",
                              lim);
  const auto c = compile(g, synthetic_vocab());
  Matcher m(c);
  BOOST_CHECK_THROW(
      {
        for (int i = 0; i < 10; ++i) m.advance(9);
      },
      ConstraintError);
}

BOOST_AUTO_TEST_CASE(startability_check) {
  const auto v = synthetic_vocab();
  // No piece of the vocabulary begins with 'z'.
  BOOST_CHECK_EXCEPTION(check_startable(compile(compile_gbnf(R"(root ::= "z")"), v)),
                        ConstraintError, [](const ConstraintError& e) {
                          return std::string(e.what()) ==
                                 "no token of the vocabulary can start this constraint";
                        });
  // A grammar that may be empty can start (with an ending), as can one with a first token.
  BOOST_CHECK_NO_THROW(check_startable(compile(compile_gbnf(R"(root ::= "" | "z")"), v)));
  BOOST_CHECK_NO_THROW(check_startable(compile(compile_gbnf(R"(root ::= "ab")"), v)));
}

BOOST_AUTO_TEST_CASE(constraint_cache) {
  const auto v = synthetic_vocab();
  const auto w = synthetic_vocab();  // same pieces, another vocabulary object
  ConstraintCache cache(2);
  sy::Constraint g1{sy::Constraint::grammar, R"(root ::= "a"+)", {}};
  sy::Constraint g2{sy::Constraint::grammar, R"(root ::= "b"+)", {}};
  sy::Constraint g3{sy::Constraint::grammar, R"(root ::= "c"+)", {}};
  const auto a = cache.get(g1, v);
  BOOST_TEST(a != nullptr);
  BOOST_TEST(cache.get(g1, v) == a);
  BOOST_TEST(cache.get(g1, w) != a);
  Limits lim;
  lim.max_stacks = 8;
  BOOST_TEST(cache.get(g1, v, lim) != a);  // limits are part of the key
  BOOST_TEST(cache.stats().entries == 2u);
  BOOST_TEST(cache.stats().evictions >= 1u);
  cache.get(g2, v);
  cache.get(g3, v);
  BOOST_TEST(cache.get(g1, v) != a);  // evicted and compiled again
  BOOST_TEST(cache.get(sy::Constraint{}, v) == nullptr);
  BOOST_CHECK_THROW(cache.get(sy::Constraint{sy::Constraint::grammar, "root ::= (", {}}, v),
                    ConstraintError);
  BOOST_CHECK_THROW(cache.get(sy::Constraint{sy::Constraint::grammar, R"(root ::= "z")", {}}, v),
                    ConstraintError);
  // The other kinds go through their GBNF conversion.
  const auto ch = cache.get(sy::Constraint{sy::Constraint::choices, "", {"ab", "ba"}}, v);
  Matcher m(ch);
  BOOST_TEST(m.allows(6));   // "ab"
  BOOST_TEST(m.allows(8));   // "ba"
  BOOST_TEST(!m.allows(5));  // "c"
  m.advance(6);
  BOOST_TEST(m.can_end());
  BOOST_TEST(!m.can_continue());
}

BOOST_AUTO_TEST_CASE(token_mask_forms_round_trip) {
  // 200 ids: a few allowed (a list), all but a few (a list of the refused), about half (bits).
  std::mt19937 rng(5);
  for (const int allowed : {3, 100, 197, 0, 200}) {
    std::vector<uint64_t> words(4, 0);
    std::vector<int32_t> ids(200);
    for (int32_t i = 0; i < 200; ++i) ids[static_cast<std::size_t>(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i = 0; i < allowed; ++i) {
      const int32_t id = ids[static_cast<std::size_t>(i)];
      words[static_cast<std::size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    const TokenMask m(words, 200, 0);
    BOOST_TEST(m.count() == allowed);
    BOOST_TEST(m.can_continue() == (allowed > 0));
    std::vector<uint64_t> out(4, 0x5555);
    m.fill(out.data());
    BOOST_TEST(out == words);
    for (int32_t id = 0; id < 200; ++id)
      BOOST_TEST(m.test(id) ==
                 (((words[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1) != 0));
    if (allowed == 3) BOOST_TEST(m.bytes() < 200u);  // three ids, not the bitset
  }
  // Only end-of-generation ids allowed: nothing to continue with.
  const TokenMask end_only(std::vector<uint64_t>{0x6}, 10, 2);
  BOOST_TEST(!end_only.can_continue());
  BOOST_TEST(end_only.count() == 2);
}

BOOST_AUTO_TEST_CASE(vocabulary_rejects_bad_eog_ids) {
  BOOST_CHECK_THROW(Vocabulary({"a", "b"}, {5}), std::invalid_argument);
  const Vocabulary v({"a", "", "b"}, {1});
  BOOST_TEST(v.size() == 3);
  BOOST_TEST(v.mask_words() == 1u);
  BOOST_TEST(v.is_eog(1));
  BOOST_TEST(!v.is_eog(0));
  BOOST_TEST(v.serial() != synthetic_vocab()->serial());
}

BOOST_AUTO_TEST_SUITE_END()
