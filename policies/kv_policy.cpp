// KV-cache policies: the text format, the attention sets, which blocks a sequence may give back,
// how many blocks it can hold at most, and the pressure hysteresis (see kv_policy.hpp).
#include "policies/kv_policy.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <vector>

namespace sy::policy {
namespace {

// No real model attends over more than 16M slots; anything above is a typo (or an overflow in
// the making when S + W and block counts are computed), not a configuration.
constexpr int64_t kMaxParam = int64_t{1} << 24;

bool fail(std::string* why, std::string msg) {
  if (why) *why = std::move(msg);
  return false;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t i = s.find(sep);
    out.push_back(s.substr(0, i));
    if (i == std::string_view::npos) return out;
    s.remove_prefix(i + 1);
  }
}

// One integer parameter named `name` ("W", "S") of policy `policy`, within [min, kMaxParam].
bool parse_param(std::string_view policy, std::string_view name, std::string_view text, int64_t min,
                 int32_t& out, std::string* why) {
  const std::string where = std::string(policy) + " parameter " + std::string(name);
  if (text.empty()) return fail(why, where + " is missing");
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range)
    return fail(why, where + " '" + std::string(text) + "' is out of range (at most " +
                         std::to_string(kMaxParam) + ")");
  if (ec != std::errc() || ptr != end)
    return fail(why, where + " '" + std::string(text) + "' is not an integer");
  if (v < min)
    return fail(why, where + " must be >= " + std::to_string(min) + ", got " + std::to_string(v));
  if (v > kMaxParam)
    return fail(why, where + " " + std::to_string(v) + " is too large (at most " +
                         std::to_string(kMaxParam) + ")");
  out = static_cast<int32_t>(v);
  return true;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return a <= 0 ? 0 : (a + b - 1) / b;
}

// Blocks [0, sink_blocks) hold at least one sink slot and therefore stay for the whole sequence.
int64_t sink_blocks(const KvPolicy& p, int32_t bs) {
  return p.kind == KvPolicy::sinks ? ceil_div(p.n_sinks, bs) : 0;
}

}  // namespace

std::string to_string(const KvPolicy& p) {
  switch (p.kind) {
    case KvPolicy::sliding_window:
      return "sliding_window:" + std::to_string(p.window);
    case KvPolicy::sinks:
      return "sinks:" + std::to_string(p.n_sinks) + ":" + std::to_string(p.window);
    default:
      return "full";
  }
}

std::optional<KvPolicy> parse_kv_policy(std::string_view text, std::string* why) {
  const std::vector<std::string_view> parts = split(trim(text), ':');
  const std::string_view name = parts[0];
  const size_t n_params = parts.size() - 1;
  auto count_error = [&](size_t want, std::string_view form) {
    fail(why, std::string(n_params < want ? "missing" : "extra") +
                  " parameter: " + std::string(name) + " takes " + std::to_string(want) + " (" +
                  std::string(form) + "), got " + std::to_string(n_params));
    return std::nullopt;
  };
  KvPolicy p;
  if (name == "full") {
    if (n_params != 0) return count_error(0, "\"full\"");
    return p;
  }
  if (name == "sliding_window") {
    if (n_params != 1) return count_error(1, "\"sliding_window:W\"");
    p.kind = KvPolicy::sliding_window;
    if (!parse_param(name, "W", parts[1], 1, p.window, why)) return std::nullopt;
    return p;
  }
  if (name == "sinks") {
    if (n_params != 2) return count_error(2, "\"sinks:S:W\"");
    p.kind = KvPolicy::sinks;
    if (!parse_param(name, "S", parts[1], 0, p.n_sinks, why)) return std::nullopt;
    if (!parse_param(name, "W", parts[2], 1, p.window, why)) return std::nullopt;
    return p;
  }
  fail(why, "unknown KV policy '" + std::string(name) +
                "' (expected \"full\", \"sliding_window:W\" or \"sinks:S:W\")");
  return std::nullopt;
}

int32_t step_window(const KvPolicy& p) {
  return p.kind == KvPolicy::full ? 0 : p.window;
}

int32_t step_sinks(const KvPolicy& p) {
  return p.kind == KvPolicy::sinks ? p.n_sinks : 0;
}

bool slot_needed(const KvPolicy& p, int64_t slot, int64_t next) {
  if (slot < 0) return false;
  if (p.kind == KvPolicy::full) return true;
  if (p.kind == KvPolicy::sinks && slot < p.n_sinks) return true;
  // The window of `next` is (next - W, next]; slots at or after `next` are still to be written.
  return slot > next - p.window;
}

BlockRange released_block_range(const KvPolicy& p, int64_t next, int32_t bs) {
  if (p.kind == KvPolicy::full || bs <= 0) return {};
  const int64_t begin = sink_blocks(p, bs);
  // Lowest slot `next` still attends to in its window; blocks ending at or below it are dead.
  const int64_t lowest = std::max<int64_t>(0, next - p.window + 1);
  const int64_t end = std::max(begin, lowest / bs);
  return {begin, end};
}

KvPolicy layer_policy(const KvPolicy& p, int32_t layer_window) {
  if (layer_window <= 0) return p;
  if (p.kind == KvPolicy::full || layer_window < p.window)
    return {KvPolicy::sliding_window, layer_window, 0};
  return p;
}

int64_t max_blocks_held(const KvPolicy& p, int64_t n_slots, int64_t chunk, int32_t bs) {
  if (bs <= 0) return 0;
  const int64_t all = ceil_div(n_slots, bs);
  if (p.kind == KvPolicy::full) return all;
  // A step over slots [a, a + c) needs (a - W, a + c): L = W - 1 + c slots. Starting at offset
  // o in a block they touch ceil((o + L) / bs) blocks, at worst (o = bs - 1) ceil((L + bs - 1) /
  // bs) — never more than ceil(L / bs) + 1, and one fewer when L % bs is 0 or 1 (or bs is 1).
  const int64_t span = int64_t{p.window} - 1 + std::max<int64_t>(chunk, 1);
  return std::min(all, sink_blocks(p, bs) + ceil_div(span + bs - 1, bs));
}

int64_t full_attention_horizon(const KvPolicy& p) {
  switch (p.kind) {
    case KvPolicy::sliding_window:
      return p.window;
    case KvPolicy::sinks:
      return int64_t{p.n_sinks} + p.window;
    default:
      return std::numeric_limits<int64_t>::max();
  }
}

bool bounded_by_context(const KvPolicy& p) {
  return p.kind != KvPolicy::sinks;
}

bool next_pressure_state(bool under_pressure, double usage, const Watermarks& w) {
  if (usage != usage) return under_pressure;  // NaN: no measurement, keep the state
  if (!under_pressure) return usage >= w.high;
  return !(usage <= w.low);
}

}  // namespace sy::policy
