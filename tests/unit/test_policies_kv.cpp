// KV policy tests: text format round trips and errors, attention sets, block release and the
// most blocks held (cross-checked by brute force against slot_needed), horizons, hysteresis.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "policies/kv_policy.hpp"

BOOST_AUTO_TEST_SUITE(test_policies_kv)

using namespace sy::policy;

namespace {

KvPolicy full() {
  return {};
}
KvPolicy window(int32_t w) {
  return {KvPolicy::sliding_window, w, 0};
}
KvPolicy sinks(int32_t s, int32_t w) {
  return {KvPolicy::sinks, w, s};
}

}  // namespace

BOOST_AUTO_TEST_CASE(parse_valid_and_round_trip) {
  struct Case {
    std::string text;
    KvPolicy expect;
    std::string canonical;
  };
  const std::vector<Case> cases = {
      {"full", full(), "full"},
      {"sliding_window:512", window(512), "sliding_window:512"},
      {"sliding_window:1", window(1), "sliding_window:1"},
      {"sinks:4:60", sinks(4, 60), "sinks:4:60"},
      {"sinks:0:8", sinks(0, 8), "sinks:0:8"},
      {"  sinks:4:60 ", sinks(4, 60), "sinks:4:60"},  // surrounding blanks are forgiven
      {"sliding_window:16777216", window(1 << 24), "sliding_window:16777216"},
  };
  for (const Case& c : cases) {
    std::string why = "unchanged";
    const auto p = parse_kv_policy(c.text, &why);
    BOOST_TEST_REQUIRE(p.has_value(), c.text << ": " << why);
    BOOST_TEST((*p == c.expect), c.text);
    BOOST_TEST(to_string(*p) == c.canonical);
    BOOST_TEST((parse_kv_policy(to_string(*p)) == p));
  }
}

BOOST_AUTO_TEST_CASE(parse_errors_name_the_problem) {
  struct Case {
    std::string text;
    std::string why_contains;
  };
  const std::vector<Case> cases = {
      {"", "unknown KV policy"},
      {"lru", "unknown KV policy 'lru'"},
      {"Full", "unknown KV policy"},
      {"full:3", "extra parameter"},
      {"sliding_window", "missing parameter"},
      {"sliding_window:", "W is missing"},
      {"sliding_window:8:9", "extra parameter"},
      {"sliding_window:abc", "not an integer"},
      {"sliding_window:12x", "not an integer"},
      {"sliding_window:+5", "not an integer"},
      {"sliding_window:1.5", "not an integer"},
      {"sliding_window:0", "W must be >= 1"},
      {"sliding_window:-3", "W must be >= 1"},
      {"sliding_window:16777217", "too large"},
      {"sliding_window:99999999999999999999999", "out of range"},
      {"sinks:4", "missing parameter"},
      {"sinks", "missing parameter"},
      {"sinks:4:60:1", "extra parameter"},
      {"sinks:-1:60", "S must be >= 0"},
      {"sinks:4:0", "W must be >= 1"},
      {"sinks::60", "S is missing"},
      {"sinks:4:", "W is missing"},
      {"sinks:x:60", "not an integer"},
      {"sinks:4:1e9", "not an integer"},
      {"sinks:100000000:4", "too large"},
  };
  for (const Case& c : cases) {
    std::string why;
    BOOST_TEST(!parse_kv_policy(c.text, &why).has_value(), c.text);
    BOOST_TEST(why.find(c.why_contains) != std::string::npos,
               "'" << c.text << "' -> '" << why << "' lacks '" << c.why_contains << "'");
  }
  BOOST_TEST(!parse_kv_policy("nope").has_value());  // no `why` wanted: no crash
}

BOOST_AUTO_TEST_CASE(step_arguments) {
  BOOST_TEST(step_window(full()) == 0);
  BOOST_TEST(step_sinks(full()) == 0);
  BOOST_TEST(step_window(window(7)) == 7);
  BOOST_TEST(step_sinks(window(7)) == 0);
  BOOST_TEST(step_window(sinks(4, 60)) == 60);
  BOOST_TEST(step_sinks(sinks(4, 60)) == 4);
}

BOOST_AUTO_TEST_CASE(slot_needed_table) {
  struct Case {
    KvPolicy p;
    int64_t slot, next;
    bool expect;
  };
  const std::vector<Case> cases = {
      {full(), 0, 1000, true},      {full(), 999, 1000, true},    {full(), -1, 5, false},
      {window(4), 6, 10, false},    {window(4), 7, 10, true},     {window(4), 10, 10, true},
      {window(4), 11, 10, true},  // not written yet: later tokens need it
      {window(4), 0, 3, true},      {window(4), 0, 4, false},     {sinks(2, 4), 0, 100, true},
      {sinks(2, 4), 1, 100, true},  {sinks(2, 4), 2, 100, false}, {sinks(2, 4), 96, 100, false},
      {sinks(2, 4), 97, 100, true}, {sinks(2, 4), 5, 5, true},    {sinks(0, 1), 4, 5, false},
      {sinks(0, 1), 5, 5, true},
  };
  for (const Case& c : cases)
    BOOST_TEST(slot_needed(c.p, c.slot, c.next) == c.expect,
               to_string(c.p) << " slot " << c.slot << " next " << c.next);
}

BOOST_AUTO_TEST_CASE(released_block_range_table) {
  struct Case {
    KvPolicy p;
    int64_t next;
    int32_t bs;
    int64_t begin, end;
  };
  const std::vector<Case> cases = {
      {full(), 10'000, 16, 0, 0},
      {window(32), 0, 16, 0, 0},
      {window(32), 32, 16, 0, 0},  // window (0, 32]: slot 1.. needed, block 0 holds slot 1
      {window(32), 47, 16, 0, 1},  // lowest needed 16: block 0 done
      {window(32), 48, 16, 0, 1},
      {window(32), 63, 16, 0, 2},
      {window(1), 16, 16, 0, 1},  // only the new slot itself
      {sinks(4, 32), 200, 16, 1, 10},
      {sinks(4, 32), 40, 16, 1, 1},  // lowest needed 9: nothing past the sink block yet
      {sinks(16, 32), 200, 16, 1, 10},
      {sinks(17, 32), 200, 16, 2, 10},
      {sinks(0, 32), 200, 16, 0, 10},
  };
  for (const Case& c : cases) {
    const BlockRange r = released_block_range(c.p, c.next, c.bs);
    BOOST_TEST(r.begin == c.begin, to_string(c.p) << " next " << c.next);
    BOOST_TEST(r.end == c.end, to_string(c.p) << " next " << c.next);
  }
}

BOOST_AUTO_TEST_CASE(max_blocks_held_table) {
  struct Case {
    KvPolicy p;
    int64_t n_slots, chunk;
    int32_t bs;
    int64_t expect;
  };
  const std::vector<Case> cases = {
      {full(), 0, 64, 16, 0},
      {full(), 1, 64, 16, 1},
      {full(), 4096, 64, 16, 256},
      {full(), 4097, 64, 16, 257},
      {window(512), 4096, 64, 16, 37},  // 575 slots straddle at most 37 blocks of 16
      {window(17), 4096, 1, 16, 2},     // 17 slots straddle at most 2 blocks of 16
      {window(18), 4096, 1, 16, 3},
      {window(8), 4096, 1, 1, 8},       // one-slot blocks: exactly the window
      {window(512), 100, 64, 16, 7},    // never more than the whole sequence
      {window(16), 1 << 20, 1, 16, 2},  // decode only: the window straddles two blocks
      {sinks(4, 60), 1 << 20, 1, 16, 1 + 4 + 1},
      {sinks(4, 60), 1 << 20, 64, 16, 1 + 8 + 1},
  };
  for (const Case& c : cases)
    BOOST_TEST(max_blocks_held(c.p, c.n_slots, c.chunk, c.bs) == c.expect,
               to_string(c.p) << " n " << c.n_slots << " chunk " << c.chunk);
}

// For many policies and block sizes, against slot_needed as the definition:
//  - every block in released_block_range(next) holds no slot that `next` or any later token needs;
//  - the range is maximal: blocks [0, begin) hold a sink slot, block `end` holds a needed slot;
//  - the blocks held while a step processes [a, a + c) (everything written so far and this
//    chunk, minus what was released at next = a) never exceed max_blocks_held, which is reached
//    when the sequence is long enough.
BOOST_AUTO_TEST_CASE(brute_force_against_slot_needed) {
  std::vector<KvPolicy> policies = {full()};
  for (int32_t w : {1, 2, 3, 5, 8, 16, 17, 31}) policies.push_back(window(w));
  for (int32_t s : {0, 1, 3, 4, 8, 9})
    for (int32_t w : {1, 2, 5, 8, 13}) policies.push_back(sinks(s, w));
  int64_t checks = 0;
  for (const KvPolicy& p : policies) {
    for (int32_t bs : {1, 2, 3, 4, 8}) {
      for (int64_t chunk : {1, 2, 5, 8}) {
        const int64_t n_slots = 96;
        int64_t worst = 0;
        for (int64_t a = 0; a < n_slots; ++a) {
          const BlockRange r = released_block_range(p, a, bs);
          BOOST_TEST_REQUIRE(r.begin <= r.end);
          if (chunk == 1) {    // the range itself depends on `next` only
            bool dead = true;  // one assertion per case: millions of them would be slow
            for (int64_t b = r.begin; b < r.end; ++b)
              for (int64_t s = b * bs; s < (b + 1) * bs; ++s)
                for (int64_t later = a; later < a + 40; ++later, ++checks)
                  dead &= !slot_needed(p, s, later);
            BOOST_TEST_REQUIRE(dead, to_string(p) << " bs " << bs << " next " << a);
            for (int64_t b = 0; b < r.begin; ++b)
              BOOST_TEST_REQUIRE((p.kind == KvPolicy::sinks && b * bs < p.n_sinks));
            // Block `end` is live unless it lies wholly at or after `next` (nothing written).
            if (r.end * bs < a) {
              bool live = false;
              for (int64_t s = r.end * bs; s < (r.end + 1) * bs; ++s) live |= slot_needed(p, s, a);
              BOOST_TEST_REQUIRE(live, to_string(p) << " bs " << bs << " next " << a);
            }
            if (p.kind == KvPolicy::full) BOOST_TEST_REQUIRE(r.begin == r.end);
          }
          for (int64_t c = 1; c <= chunk && a + c <= n_slots; ++c) {
            const int64_t touched = (a + c + bs - 1) / bs;
            worst = std::max(worst, touched - (r.end - r.begin));
          }
        }
        const int64_t bound = max_blocks_held(p, n_slots, chunk, bs);
        BOOST_TEST_REQUIRE(worst <= bound, to_string(p) << " bs " << bs << " chunk " << chunk);
        // 96 slots leave room for the worst alignment after the sinks for these sizes.
        BOOST_TEST(worst == bound, to_string(p) << " bs " << bs << " chunk " << chunk << " worst "
                                                << worst << " bound " << bound);
        ++checks;
      }
    }
  }
  BOOST_TEST(checks > 10'000);
}

BOOST_AUTO_TEST_CASE(horizon_and_context_bound) {
  BOOST_TEST(full_attention_horizon(full()) == std::numeric_limits<int64_t>::max());
  BOOST_TEST(full_attention_horizon(window(512)) == 512);
  BOOST_TEST(full_attention_horizon(sinks(4, 60)) == 64);
  BOOST_TEST(bounded_by_context(full()));
  BOOST_TEST(bounded_by_context(window(512)));
  BOOST_TEST(!bounded_by_context(sinks(4, 60)));
  // Below the horizon, every token still sees every earlier slot: same K/V as under full.
  for (const KvPolicy& p : {window(7), sinks(3, 5), sinks(0, 4)}) {
    const int64_t h = full_attention_horizon(p);
    for (int64_t t = 0; t < h; ++t)
      for (int64_t s = 0; s <= t; ++s) BOOST_TEST_REQUIRE(slot_needed(p, s, t));
    bool lost = false;  // and at the horizon some token has lost sight of one
    for (int64_t s = 0; s < h; ++s) lost |= !slot_needed(p, s, h);
    BOOST_TEST(lost, to_string(p));
  }
}

BOOST_AUTO_TEST_CASE(pressure_hysteresis) {
  const Watermarks w{0.9, 0.7};
  struct Case {
    bool state;
    double usage;
    bool expect;
  };
  const std::vector<Case> cases = {
      {false, 0.0, false}, {false, 0.89, false},         {false, 0.9, true},
      {false, 1.0, true},  {true, 0.95, true},           {true, 0.8, true},
      {true, 0.71, true},  {true, 0.7, false},           {true, 0.1, false},
      {false, 0.8, false}, {false, std::nan(""), false}, {true, std::nan(""), true},
  };
  for (const Case& c : cases)
    BOOST_TEST(next_pressure_state(c.state, c.usage, w) == c.expect,
               "state " << c.state << " usage " << c.usage);
  // A usage trace: enters at 0.9, stays through the band, leaves at 0.7, re-enters only at 0.9.
  const std::vector<double> trace = {0.5, 0.85, 0.9, 0.8, 0.75, 0.7, 0.8, 0.89, 0.95};
  const std::vector<bool> expect = {false, false, true, true, true, false, false, false, true};
  bool s = false;
  for (size_t i = 0; i < trace.size(); ++i) {
    s = next_pressure_state(s, trace[i], w);
    BOOST_TEST(s == expect[i], "step " << i);
  }
}

// A layer with a window of its own sees a sequence through the narrower of the two windows, and
// sinks only where the policy's window is the narrower (the engines' rule for gemma2's layers).
BOOST_AUTO_TEST_CASE(layer_policy_is_the_narrower_window) {
  const KvPolicy full{};
  const KvPolicy sw8{KvPolicy::sliding_window, 8, 0}, sw16{KvPolicy::sliding_window, 16, 0};
  const KvPolicy sw64{KvPolicy::sliding_window, 64, 0};
  const KvPolicy sk_wide{KvPolicy::sinks, 60, 4}, sk_narrow{KvPolicy::sinks, 8, 4};
  BOOST_TEST(to_string(layer_policy(full, 16)) == to_string(sw16));
  BOOST_TEST(to_string(layer_policy(sw64, 16)) == to_string(sw16));
  BOOST_TEST(to_string(layer_policy(sw8, 16)) == to_string(sw8));
  BOOST_TEST(to_string(layer_policy(sw16, 16)) == to_string(sw16));
  // The layer's window without sinks; the policy's window with its sinks; no window of its own.
  BOOST_TEST(to_string(layer_policy(sk_wide, 16)) == to_string(sw16));
  BOOST_TEST(to_string(layer_policy(sk_narrow, 16)) == to_string(sk_narrow));
  BOOST_TEST(to_string(layer_policy(sk_narrow, 0)) == to_string(sk_narrow));
  BOOST_TEST(to_string(layer_policy(full, 0)) == to_string(full));
}

BOOST_AUTO_TEST_SUITE_END()  // test_policies_kv
