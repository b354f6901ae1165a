// The YAML config loader: every key of server/config.hpp, unknown keys refused (a typo must not be
// silently ignored), every error naming the file, the key path, the line and the problem.
#include "server/config.hpp"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>
#include <stdexcept>

#include "ingress/nats_link.hpp"
#include "policies/kv_policy.hpp"

namespace sy {
namespace {

// Where we are in the file, for messages like "cfg.yaml: key 'batching.max_sequences' (line 4): ...".
struct Ctx {
  std::string file;
  [[noreturn]] void fail(const std::string& key, const YAML::Node& n,
                         const std::string& what) const {
    std::string where = file + ": key '" + key + "'";
    if (n.IsDefined() && n.Mark().line >= 0)
      where += " (line " + std::to_string(n.Mark().line + 1) + ")";
    throw std::runtime_error(where + ": " + what);
  }
};

std::string join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// A scalar's text for error messages, cut so a huge value cannot flood the log.
std::string shown(const YAML::Node& n) {
  if (!n.IsScalar()) return n.IsSequence() ? "a list" : n.IsMap() ? "a map" : "null";
  std::string s = n.Scalar();
  if (s.size() > 40) s = s.substr(0, 40) + "...";
  return "'" + s + "'";
}

// Refuses keys of `map` that are not in `known` (a misspelt key would otherwise do nothing).
void check_keys(const Ctx& c, const std::string& prefix, const YAML::Node& map,
                const std::set<std::string>& known) {
  for (const auto& kv : map) {
    std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (!known.count(k)) {
      std::string list;
      for (const auto& s : known) list += (list.empty() ? "" : ", ") + s;
      c.fail(join(prefix, k), kv.first, "unknown key (known here: " + list + ")");
    }
  }
}

void need_map(const Ctx& c, const std::string& key, const YAML::Node& n) {
  if (!n.IsMap()) c.fail(key, n, "expected a map, got " + shown(n));
}

std::string get_string(const Ctx& c, const std::string& key, const YAML::Node& n) {
  if (n.IsNull()) return "";
  if (!n.IsScalar()) c.fail(key, n, "expected a string, got " + shown(n));
  return n.Scalar();
}

// An integer in [lo, hi]; refuses floats and text instead of truncating them.
int64_t get_int(const Ctx& c, const std::string& key, const YAML::Node& n, int64_t lo, int64_t hi) {
  if (!n.IsScalar()) c.fail(key, n, "expected an integer, got " + shown(n));
  const std::string& s = n.Scalar();
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos, 10);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size()) c.fail(key, n, "expected an integer, got " + shown(n));
  if (v < lo || v > hi)
    c.fail(key, n,
           "value " + s + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

double get_real(const Ctx& c, const std::string& key, const YAML::Node& n, double lo, double hi) {
  if (!n.IsScalar()) c.fail(key, n, "expected a number, got " + shown(n));
  const std::string& s = n.Scalar();
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size() || !std::isfinite(v))
    c.fail(key, n, "expected a number, got " + shown(n));
  if (v < lo || v > hi)
    c.fail(key, n,
           "value " + s + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

bool get_bool(const Ctx& c, const std::string& key, const YAML::Node& n) {
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "False" || s == "no" || s == "off") return false;
  }
  c.fail(key, n, "expected true or false, got " + shown(n));
}

// Visits each key of a map with its full path, after refusing unknown keys.
template <class F>
void each(const Ctx& c, const std::string& prefix, const YAML::Node& map,
          const std::set<std::string>& known, F&& f) {
  need_map(c, prefix, map);
  check_keys(c, prefix, map, known);
  for (const auto& kv : map) f(kv.first.Scalar(), join(prefix, kv.first.Scalar()), kv.second);
}

constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
constexpr int64_t kU32 = std::numeric_limits<uint32_t>::max();
constexpr int64_t kI64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kHourMs = 3600000;
// endpoints.max_connections: a million descriptors is past any host's limit, so more is a typo.
constexpr int64_t kMaxConnections = 1 << 20;
// Weights are shares; 1e6 is far beyond any sensible ratio and keeps the WFQ tags finite.
constexpr double kMaxWeight = 1e6;

void load_endpoints(const Ctx& c, const YAML::Node& n, EndpointConfig& e) {
  each(c, "endpoints", n,
       {"bind", "pull", "results", "max_message_bytes", "sndhwm", "rcvhwm", "curve_secret_key",
        "curve_public_key", "curve_allowed_keys", "heartbeat_ivl_ms", "heartbeat_timeout_ms",
        "heartbeat_ttl_ms", "handshake_timeout_ms", "max_waiting_requests", "max_waiting_bytes",
        "tcp_keepalive_idle_s", "max_connections", "max_connections_per_address", "max_handshaking"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "bind") e.bind = get_string(c, key, v);
         // Key files, like the model, are found relative to the config file's folder.
         else if (k == "curve_secret_key" || k == "curve_public_key" || k == "curve_allowed_keys") {
           std::string f = get_string(c, key, v);
           if (!f.empty() && std::filesystem::path(f).is_relative())
             f = (std::filesystem::path(c.file).parent_path() / f).lexically_normal().string();
           (k == "curve_secret_key"   ? e.curve_secret_key
            : k == "curve_public_key" ? e.curve_public_key
                                      : e.curve_allowed_keys) = f;
         } else if (k == "pull")
           e.pull = get_string(c, key, v);
         else if (k == "results")
           e.results = get_string(c, key, v);
         // A frame needs a few hundred bytes at least; 1 GiB is far past any prompt limit.
         else if (k == "max_message_bytes")
           e.max_message_bytes = get_int(c, key, v, 256, int64_t{1} << 30);
         else if (k == "sndhwm")
           e.sndhwm = static_cast<int>(get_int(c, key, v, 0, kI32));
         else if (k == "rcvhwm")
           e.rcvhwm = static_cast<int>(get_int(c, key, v, 0, kI32));
         // Liveness timers: an hour bounds them all (beyond that a value is a typo, and a
         // stalled peer would keep its buffers that long).
         else if (k == "heartbeat_ivl_ms")
           e.heartbeat_ivl_ms = get_int(c, key, v, 0, kHourMs);
         else if (k == "heartbeat_timeout_ms")
           e.heartbeat_timeout_ms = get_int(c, key, v, 0, kHourMs);
         // ZMTP sends the TTL in tenths of a second in 16 bits.
         else if (k == "heartbeat_ttl_ms")
           e.heartbeat_ttl_ms = get_int(c, key, v, 0, 6553500);
         else if (k == "handshake_timeout_ms")
           e.handshake_timeout_ms = get_int(c, key, v, 0, kHourMs);
         // The kernel takes the idle time in seconds as an int; a day is past any use.
         else if (k == "tcp_keepalive_idle_s")
           e.tcp_keepalive_idle_s = get_int(c, key, v, 0, 86400);
         // At least one request must be able to wait, or nothing is ever admitted.
         else if (k == "max_waiting_requests")
           e.max_waiting_requests = get_int(c, key, v, 1, kI32);
         else if (k == "max_waiting_bytes")
           e.max_waiting_bytes = get_int(c, key, v, 1, int64_t{1} << 40);
         // 0 = unlimited (all three).
         else if (k == "max_connections")
           e.max_connections = get_int(c, key, v, 0, kMaxConnections);
         else if (k == "max_connections_per_address")
           e.max_connections_per_address = get_int(c, key, v, 0, kMaxConnections);
         else if (k == "max_handshaking")
           e.max_handshaking = get_int(c, key, v, 0, kMaxConnections);
       });
}

void load_tenant(const Ctx& c, const std::string& prefix, const YAML::Node& n, TenantConfig& t) {
  each(c, prefix, n,
       {"name", "token", "weight", "max_in_flight", "tokens_per_second", "burst_tokens"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "name")
           t.name = get_string(c, key, v);
         else if (k == "token")
           t.token = get_string(c, key, v);
         else if (k == "weight")
           t.weight = get_real(c, key, v, 1e-6, kMaxWeight);
         else if (k == "max_in_flight")
           t.max_in_flight = static_cast<uint32_t>(get_int(c, key, v, 0, kU32));
         else if (k == "tokens_per_second")
           t.tokens_per_second = get_real(c, key, v, 0, 1e12);
         else if (k == "burst_tokens")
           t.burst_tokens = get_real(c, key, v, 0, 1e15);
       });
  if (t.name.empty()) c.fail(join(prefix, "name"), n, "a tenant needs a name");
}

void load_tenants(const Ctx& c, const std::string& key, const YAML::Node& n,
                  std::vector<TenantConfig>& out) {
  if (!n.IsSequence()) c.fail(key, n, "expected a list of tenants, got " + shown(n));
  out.clear();
  for (size_t i = 0; i < n.size(); ++i) {
    TenantConfig t;
    load_tenant(c, key + "[" + std::to_string(i) + "]", n[i], t);
    out.push_back(std::move(t));
  }
}

void load_admission(const Ctx& c, const YAML::Node& n, AdmissionConfig& a) {
  each(c, "admission", n,
       {"allow_anonymous", "tenants", "max_prompt_tokens", "max_output_tokens", "result_cache",
        "result_cache_bytes", "tenant_idle_ms", "max_idle_tenants", "admin_token", "max_programs"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "allow_anonymous")
           a.allow_anonymous = get_bool(c, key, v);
         else if (k == "tenants")
           load_tenants(c, key, v, a.tenants);
         else if (k == "max_prompt_tokens")
           a.max_prompt_tokens = static_cast<uint32_t>(get_int(c, key, v, 0, kU32));
         else if (k == "max_output_tokens")
           a.max_output_tokens = static_cast<uint32_t>(get_int(c, key, v, 1, kU32));
         else if (k == "max_programs")
           a.max_programs = static_cast<size_t>(get_int(c, key, v, 1, kI64));
         else if (k == "result_cache")
           a.result_cache = static_cast<size_t>(get_int(c, key, v, 0, kI64));
         else if (k == "result_cache_bytes")
           a.result_cache_bytes = static_cast<size_t>(get_int(c, key, v, 0, kI64));
         // A day: idle tenants kept longer are no longer "idle", they are a leak.
         else if (k == "tenant_idle_ms")
           a.tenant_idle_ms = get_int(c, key, v, 0, 86400000);
         else if (k == "max_idle_tenants")
           a.max_idle_tenants = static_cast<size_t>(get_int(c, key, v, 0, kI64));
         else if (k == "admin_token")
           a.admin_token = get_string(c, key, v);
       });
}

void load_class(const Ctx& c, const std::string& prefix, const YAML::Node& n,
                policy::PriorityClass& pc) {
  each(c, prefix, n, {"name", "rank", "weight", "queue_limit", "queue_timeout_ms"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "name")
           pc.name = get_string(c, key, v);
         else if (k == "rank")
           pc.rank = static_cast<int>(get_int(c, key, v, 0, 1000));
         else if (k == "weight")
           pc.weight = get_real(c, key, v, 1e-6, kMaxWeight);
         else if (k == "queue_limit")
           pc.queue_limit = static_cast<size_t>(get_int(c, key, v, 1, kI32));
         else if (k == "queue_timeout_ms")
           pc.queue_timeout_ms = get_int(c, key, v, 0, kI64 / 1000);
       });
  if (pc.name.empty()) c.fail(join(prefix, "name"), n, "a priority class needs a name");
}

void load_router(const Ctx& c, const YAML::Node& n, RouterConfig& r) {
  each(c, "router", n,
       {"classes", "default_class", "prefix_affinity", "prefix_affinity_slack", "priority_reserve"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "priority_reserve") {
           // More than a few thousand credits held back would idle whole executors.
           r.priority_reserve = static_cast<uint32_t>(get_int(c, key, v, 0, 4096));
         } else if (k == "prefix_affinity") {
           r.prefix_affinity = get_bool(c, key, v);
         } else if (k == "prefix_affinity_slack") {
           // Beyond a million jobs of difference the balance would never matter: a typo.
           r.prefix_affinity_slack = static_cast<uint32_t>(get_int(c, key, v, 0, 1 << 20));
         } else if (k == "default_class") {
           r.default_class = get_string(c, key, v);
         } else if (k == "classes") {
           if (!v.IsSequence()) c.fail(key, v, "expected a list of classes, got " + shown(v));
           r.classes.clear();
           for (size_t i = 0; i < v.size(); ++i) {
             policy::PriorityClass pc;
             load_class(c, key + "[" + std::to_string(i) + "]", v[i], pc);
             r.classes.push_back(std::move(pc));
           }
         }
       });
}

void load_batching(const Ctx& c, const YAML::Node& n, BatchingConfig& b) {
  each(c, "batching", n,
       {"step_token_budget", "max_sequences",    "prefill_chunk",  "kv_block_size",
        "kv_memory_mb",      "step_delay_ms",    "kv_policy",      "kv_pressure_policy",
        "kv_high_watermark", "kv_low_watermark", "prefix_cache",   "step_timeout_ms",
        "max_job_retries",   "kv_gpu_fraction",  "kv_dtype",       "layer_window_kv",
        "urgent_prefill",    "speculative",      "spec_max_draft", "spec_ngram_min",
        "spec_ngram_max",    "priority_pacing",  "priority_pacing_ms", "urgent_interrupt"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "step_token_budget")
           b.step_token_budget = static_cast<uint32_t>(get_int(c, key, v, 1, 1 << 20));
         else if (k == "max_sequences")
           b.max_sequences = static_cast<uint32_t>(get_int(c, key, v, 1, 1 << 16));
         else if (k == "prefill_chunk")
           b.prefill_chunk = static_cast<uint32_t>(get_int(c, key, v, 1, 1 << 20));
         // Block sizes beyond 1024 tokens waste most of a block on short jobs.
         else if (k == "kv_block_size")
           b.kv_block_size = static_cast<int32_t>(get_int(c, key, v, 1, 1024));
         else if (k == "kv_memory_mb")
           b.kv_memory_mb = get_int(c, key, v, 0, int64_t{1} << 24);
         // Below 1% the cache would hold almost nothing; above 100% there is nothing to take.
         else if (k == "kv_gpu_fraction")
           b.kv_gpu_fraction = get_real(c, key, v, 0.01, 1.0);
         else if (k == "kv_dtype") {
           const std::string text = get_string(c, key, v);
           const auto t = kernels::parse_kv_type(text);
           if (!t) c.fail(key, v, "expected f32, f16 or q8_0");
           b.kv_dtype = *t;
         }
         // One minute per step is already absurd; it exists only to slow tests down.
         else if (k == "step_delay_ms")
           b.step_delay_ms = static_cast<int32_t>(get_int(c, key, v, 0, 60000));
         else if (k == "kv_policy" || k == "kv_pressure_policy") {
           std::string text = get_string(c, key, v), why;
           if (!text.empty() && !policy::parse_kv_policy(text, &why)) c.fail(key, v, why);
           (k == "kv_policy" ? b.kv_policy : b.kv_pressure_policy) = text;
         } else if (k == "kv_high_watermark")
           b.kv_high_watermark = get_real(c, key, v, 0.0, 1.0);
         else if (k == "kv_low_watermark")
           b.kv_low_watermark = get_real(c, key, v, 0.0, 1.0);
         else if (k == "urgent_prefill")
           b.urgent_prefill = get_bool(c, key, v);
         else if (k == "urgent_interrupt")
           b.urgent_interrupt = get_bool(c, key, v);
         // A share of a decode step (more would be no pacing); a minute is past any stream of
         // requests of a class.
         else if (k == "priority_pacing")
           b.priority_pacing = get_real(c, key, v, 0.0, 1.0);
         else if (k == "priority_pacing_ms")
           b.priority_pacing_ms = static_cast<int32_t>(get_int(c, key, v, 0, 60000));
         else if (k == "prefix_cache")
           b.prefix_cache = get_bool(c, key, v);
         else if (k == "speculative") {
           const std::string text = get_string(c, key, v);
           const auto m = parse_spec_mode(text);
           if (!m || *m == SpecMode::server_default) c.fail(key, v, "expected auto, always or off");
           b.speculative = *m;
         }
         // Drafts beyond a few dozen tokens are almost never all accepted; 0 turns drafting off.
         else if (k == "spec_max_draft")
           b.spec_max_draft = static_cast<int32_t>(get_int(c, key, v, 0, 64));
         else if (k == "spec_ngram_min")
           b.spec_ngram_min = static_cast<int32_t>(get_int(c, key, v, 1, 16));
         else if (k == "spec_ngram_max")
           b.spec_ngram_max = static_cast<int32_t>(get_int(c, key, v, 1, 16));
         // An hour: a step that long is a hang by any measure; 0 turns the watchdog off.
         else if (k == "step_timeout_ms")
           b.step_timeout_ms = get_int(c, key, v, 0, 3600000);
         // Each retry recomputes the whole job; beyond a handful a job is the problem itself.
         else if (k == "max_job_retries")
           b.max_job_retries = static_cast<uint32_t>(get_int(c, key, v, 0, 100));
         else if (k == "layer_window_kv") {
           const std::string text = get_string(c, key, v);
           if (text != "release" && text != "keep") c.fail(key, v, "expected release or keep");
           b.release_layer_windows = text == "release";
         }
       });
}

void load_autoscale(const Ctx& c, const YAML::Node& n, AutoscaleConfig& a) {
  each(c, "autoscale", n,
       {"min_executors", "max_executors", "target_ongoing_per_executor", "target_queue_wait_ms",
        "upscale_delay_ms", "downscale_delay_ms", "interval_ms"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         // Same bound as executors.count (0: that count); delays up to an hour (longer is a
         // typo, not a policy).
         if (k == "min_executors")
           a.min_executors = static_cast<int>(get_int(c, key, v, 0, 256));
         else if (k == "max_executors")
           a.max_executors = static_cast<int>(get_int(c, key, v, 0, 256));
         else if (k == "target_ongoing_per_executor")
           a.target_ongoing_per_executor = static_cast<uint32_t>(get_int(c, key, v, 0, 1 << 20));
         else if (k == "target_queue_wait_ms")
           a.target_queue_wait_ms = get_int(c, key, v, 0, 3600000);
         else if (k == "upscale_delay_ms")
           a.upscale_delay_ms = get_int(c, key, v, 0, 3600000);
         else if (k == "downscale_delay_ms")
           a.downscale_delay_ms = get_int(c, key, v, 0, 3600000);
         // At least 10 ms between looks: each costs a stats round trip per pair.
         else if (k == "interval_ms")
           a.interval_ms = get_int(c, key, v, 10, 60000);
       });
}

void load_executors(const Ctx& c, const YAML::Node& n, ExecutorConfig& e) {
  each(c, "executors", n, {"backend", "count", "threads", "cpu_priority"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "backend") {
           const auto b = parse_backend(get_string(c, key, v));
           if (!b) c.fail(key, v, "unknown backend " + shown(v) + " (auto, cpu, cuda or null)");
           e.backend = *b;
         }
         // More pairs than this would only contend for the same cores.
         else if (k == "count")
           e.count = static_cast<int>(get_int(c, key, v, 1, 256));
         else if (k == "threads")
           e.threads = static_cast<int>(get_int(c, key, v, 0, 1024));
         else if (k == "cpu_priority") {
           const auto p = parse_cpu_priority(get_string(c, key, v));
           if (!p) c.fail(key, v, "unknown CPU priority " + shown(v) + " (normal or background)");
           e.cpu_priority = *p;
         }
       });
}

// cluster: the NATS servers and the JetStream limits (ingress/cluster_config.hpp).
void load_cluster(const Ctx& c, const YAML::Node& n, ClusterConfig& k) {
  each(c, "cluster", n,
       {"nats", "node_name", "replicas", "max_jobs", "max_job_bytes", "results_max_age_s",
        "results_max_bytes", "ack_wait_ms", "max_ack_pending", "max_in_flight",
        "duplicate_window_ms", "reconnect_wait_ms", "reconnect_max_ms", "cancels_max_age_s",
        "max_cancels"},
       [&](const std::string& f, const std::string& key, const YAML::Node& v) {
         if (f == "nats") {
           // One URL or a list of them (a NATS cluster's servers).
           k.nats.clear();
           if (v.IsSequence()) {
             for (const auto& u : v) k.nats.push_back(get_string(c, key, u));
           } else {
             k.nats.push_back(get_string(c, key, v));
           }
           for (const auto& u : k.nats)
             if (u.empty()) c.fail(key, v, "a NATS URL is empty");
         } else if (f == "node_name")
           k.node_name = get_string(c, key, v);
         // JetStream keeps at most 5 copies of a stream.
         else if (f == "replicas")
           k.replicas = static_cast<int>(get_int(c, key, v, 1, 5));
         else if (f == "max_jobs")
           k.max_jobs = get_int(c, key, v, 1, kI64);
         else if (f == "max_job_bytes")
           k.max_job_bytes = get_int(c, key, v, 1, kI64);
         else if (f == "results_max_age_s")
           k.results_max_age_s = get_int(c, key, v, 1, kI64 / 1000000000);
         else if (f == "results_max_bytes")
           k.results_max_bytes = get_int(c, key, v, 1, kI64);
         // Below a second in-progress acks (every third of it) would flood JetStream; above a
         // day a dead node's jobs would be lost to everyone for that long.
         else if (f == "ack_wait_ms")
           k.ack_wait_ms = get_int(c, key, v, 1000, 86400000);
         else if (f == "max_ack_pending")
           k.max_ack_pending = get_int(c, key, v, 1, kI32);
         else if (f == "max_in_flight")
           k.max_in_flight = get_int(c, key, v, 0, kI32);
         // JetStream's duplicate window cannot exceed a stream's age limit; a day is the most
         // that is sensible for a work queue.
         else if (f == "duplicate_window_ms")
           k.duplicate_window_ms = get_int(c, key, v, 1000, 86400000);
         else if (f == "reconnect_wait_ms")
           k.reconnect_wait_ms = get_int(c, key, v, 1, kHourMs);
         else if (f == "reconnect_max_ms")
           k.reconnect_max_ms = get_int(c, key, v, 1, kHourMs);
         // Never shorter than the longest deadline a job may name (a day): a cancel outlives
         // every job that could still be waiting for its deadline.
         else if (f == "cancels_max_age_s")
           k.cancels_max_age_s = get_int(c, key, v, 86400, kI64 / 1000000000);
         else if (f == "max_cancels")
           k.max_cancels = get_int(c, key, v, 1, kI32);
       });
}

// tracing: OTLP export of traced jobs' spans (server/tracing_config.hpp, docs/tracing.md).
void load_tracing(const Ctx& c, const YAML::Node& n, TracingConfig& t) {
  each(c, "tracing", n,
       {"otlp_endpoint", "sample", "max_queued_spans", "batch_spans", "export_interval_ms",
        "export_timeout_ms", "service_name"},
       [&](const std::string& k, const std::string& key, const YAML::Node& v) {
         if (k == "otlp_endpoint") {
           t.otlp_endpoint = get_string(c, key, v);
         } else if (k == "sample") {
           const std::string s = get_string(c, key, v);
           if (s != "traced" && s != "all") c.fail(key, v, "expected traced or all");
           t.sample_all = s == "all";
         } else if (k == "max_queued_spans") {
           t.max_queued_spans = static_cast<std::size_t>(get_int(c, key, v, 1, 1 << 24));
         } else if (k == "batch_spans") {
           t.batch_spans = static_cast<std::size_t>(get_int(c, key, v, 1, 65536));
         } else if (k == "export_interval_ms") {
           t.export_interval_ms = get_int(c, key, v, 1, 3600000);
         } else if (k == "export_timeout_ms") {
           t.export_timeout_ms = get_int(c, key, v, 1, 600000);
         } else if (k == "service_name") {
           t.service_name = get_string(c, key, v);
         }
       });
}

// http: the OpenAI-compatible HTTP door (ingress/http_config.hpp, docs/http.md).
void load_http(const Ctx& c, const YAML::Node& n, HttpConfig& h) {
  each(c, "http", n,
       {"bind", "model_name", "default_tenant", "batch_class", "max_connections",
        "max_header_bytes", "max_body_bytes", "header_timeout_ms", "body_timeout_ms",
        "idle_timeout_ms", "write_timeout_ms", "max_stream_backlog_bytes", "batch_max_file_bytes",
        "batch_max_lines", "batch_max_open", "batch_max_files", "batch_max_in_flight"},
       [&](const std::string& f, const std::string& key, const YAML::Node& v) {
         // Bounds: below 1 KiB of header no real client fits; a timeout beyond an hour is none.
         if (f == "bind")
           h.bind = get_string(c, key, v);
         else if (f == "model_name")
           h.model_name = get_string(c, key, v);
         else if (f == "default_tenant")
           h.default_tenant = get_string(c, key, v);
         else if (f == "batch_class")
           h.batch_class = get_string(c, key, v);
         else if (f == "max_connections")
           h.max_connections = static_cast<size_t>(get_int(c, key, v, 1, 1000000));
         else if (f == "max_header_bytes")
           h.max_header_bytes = static_cast<size_t>(get_int(c, key, v, 1024, 1 << 20));
         else if (f == "max_body_bytes")
           h.max_body_bytes = static_cast<size_t>(get_int(c, key, v, 1024, int64_t{1} << 30));
         else if (f == "header_timeout_ms")
           h.header_timeout_ms = static_cast<uint32_t>(get_int(c, key, v, 100, kHourMs));
         else if (f == "body_timeout_ms")
           h.body_timeout_ms = static_cast<uint32_t>(get_int(c, key, v, 100, kHourMs));
         else if (f == "idle_timeout_ms")
           h.idle_timeout_ms = static_cast<uint32_t>(get_int(c, key, v, 100, kHourMs));
         else if (f == "write_timeout_ms")
           h.write_timeout_ms = static_cast<uint32_t>(get_int(c, key, v, 100, kHourMs));
         else if (f == "max_stream_backlog_bytes")
           h.max_stream_backlog_bytes =
               static_cast<size_t>(get_int(c, key, v, 4096, int64_t{1} << 30));
         else if (f == "batch_max_file_bytes")
           h.batch_max_file_bytes =
               static_cast<uint64_t>(get_int(c, key, v, 1024, int64_t{1} << 34));
         else if (f == "batch_max_lines")
           h.batch_max_lines = static_cast<uint32_t>(get_int(c, key, v, 1, 10000000));
         else if (f == "batch_max_open")
           h.batch_max_open = static_cast<uint32_t>(get_int(c, key, v, 1, 100000));
         else if (f == "batch_max_files")
           h.batch_max_files = static_cast<uint32_t>(get_int(c, key, v, 1, 10000000));
         else if (f == "batch_max_in_flight")
           h.batch_max_in_flight = static_cast<uint32_t>(get_int(c, key, v, 0, 100000));
       });
}

}  // namespace

void load_config_file(const std::string& path, ServerConfig& cfg) {
  Ctx c{path};
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw std::runtime_error(path + ": cannot open the config file");
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(path + ": line " + std::to_string(e.mark.line + 1) +
                             ": YAML syntax: " + e.msg);
  }
  if (root.IsNull()) return;  // an empty file changes nothing
  try {
    each(c, "", root,
         {"model", "draft_model", "chat_template", "endpoints", "admission", "router", "batching", "executors",
          "shutdown_grace_ms", "metrics", "journal", "autoscale", "state_dir", "log", "cluster",
          "http", "tracing"},
         [&](const std::string& k, const std::string& key, const YAML::Node& v) {
           if (k == "model") {
             cfg.model = get_string(c, key, v);
             // A relative model path is read from the config file's folder, so a config and its
             // model can move together.
             if (!cfg.model.empty() && std::filesystem::path(cfg.model).is_relative())
               cfg.model = (std::filesystem::path(path).parent_path() / cfg.model)
                               .lexically_normal()
                               .string();
           } else if (k == "draft_model") {
             cfg.draft_model = get_string(c, key, v);
             if (!cfg.draft_model.empty() && std::filesystem::path(cfg.draft_model).is_relative())
               cfg.draft_model = (std::filesystem::path(path).parent_path() / cfg.draft_model)
                                     .lexically_normal()
                                     .string();
           } else if (k == "chat_template") {
             cfg.chat_template = get_string(c, key, v);
             // A template file is read from the config file's folder, like the model; a name
             // without a slash or dot is a built-in template's.
             const bool file = cfg.chat_template.find_first_of("/.") != std::string::npos;
             if (file && std::filesystem::path(cfg.chat_template).is_relative())
               cfg.chat_template = (std::filesystem::path(path).parent_path() / cfg.chat_template)
                                       .lexically_normal()
                                       .string();
           } else if (k == "endpoints")
             load_endpoints(c, v, cfg.endpoints);
           else if (k == "cluster")
             load_cluster(c, v, cfg.cluster);
           else if (k == "http")
             load_http(c, v, cfg.http);
           else if (k == "tracing")
             load_tracing(c, v, cfg.tracing);
           else if (k == "admission")
             load_admission(c, v, cfg.admission);
           else if (k == "router")
             load_router(c, v, cfg.router);
           else if (k == "batching")
             load_batching(c, v, cfg.batching);
           else if (k == "executors")
             load_executors(c, v, cfg.executors);
           else if (k == "autoscale")
             load_autoscale(c, v, cfg.autoscale);
           // An hour of grace is the most a deployment could want before a forced stop.
           else if (k == "shutdown_grace_ms")
             cfg.shutdown_grace_ms = get_int(c, key, v, 0, 3600000);
           else if (k == "state_dir") {
             cfg.state_dir = get_string(c, key, v);
             if (!cfg.state_dir.empty() && std::filesystem::path(cfg.state_dir).is_relative())
               cfg.state_dir = (std::filesystem::path(path).parent_path() / cfg.state_dir).string();
           } else if (k == "log")
             each(c, key, v, {"level", "format"},
                  [&](const std::string& k2, const std::string& key2, const YAML::Node& v2) {
                    const std::string s = get_string(c, key2, v2);
                    if (k2 == "level") {
                      auto l = log::parse_level(s);
                      if (!l) c.fail(key2, v2, "expected trace, debug, info, warn, error or off");
                      cfg.log.level = *l;
                    } else if (k2 == "format") {
                      auto f = log::parse_format(s);
                      if (!f) c.fail(key2, v2, "expected text or json");
                      cfg.log.format = *f;
                    }
                  });
           else if (k == "metrics")
             each(c, key, v, {"bind", "max_tenant_labels", "gpu", "test_fake_nvml"},
                  [&](const std::string& k2, const std::string& key2, const YAML::Node& v2) {
                    if (k2 == "bind")
                      cfg.metrics.bind = get_string(c, key2, v2);
                    else if (k2 == "gpu")
                      cfg.metrics.gpu = get_bool(c, key2, v2);
                    else if (k2 == "test_fake_nvml")
                      cfg.metrics.test_fake_nvml = get_bool(c, key2, v2);
                    else if (k2 == "max_tenant_labels")
                      cfg.metrics.max_tenant_labels =
                          static_cast<size_t>(get_int(c, key2, v2, 0, kI64));
                  });
           else if (k == "journal") {
             auto& j = cfg.journal;
             each(c, key, v, {"path", "fsync", "batch_ms", "delivered_lag_ms", "compact_bytes"},
                  [&](const std::string& k2, const std::string& key2, const YAML::Node& v2) {
                    if (k2 == "path") {
                      j.path = get_string(c, key2, v2);
                      // Like the model: a relative journal lives next to its config file.
                      if (!j.path.empty() && j.path != "off" &&
                          std::filesystem::path(j.path).is_relative())
                        j.path = (std::filesystem::path(path).parent_path() / j.path).string();
                    } else if (k2 == "fsync") {
                      j.fsync = get_string(c, key2, v2);
                      if (j.fsync != "always" && j.fsync != "batch" && j.fsync != "never")
                        c.fail(key2, v2, "expected always, batch or never");
                    }
                    // A group commit longer than a second would hold every ack that long.
                    else if (k2 == "batch_ms")
                      j.batch_ms = get_int(c, key2, v2, 0, 1000);
                    else if (k2 == "delivered_lag_ms")
                      j.delivered_lag_ms = get_int(c, key2, v2, 0, 3600000);
                    // Below a megabyte compaction would run all the time for little gain.
                    else if (k2 == "compact_bytes")
                      j.compact_bytes = get_int(c, key2, v2, 1 << 20, int64_t{1} << 40);
                  });
           }
         });
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(path + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

void finalize_config(ServerConfig& cfg) {
  auto& classes = cfg.router.classes;
  if (classes.empty()) classes = policy::default_classes();
  std::set<std::string> names;
  for (const auto& pc : classes) {
    if (pc.name.empty()) throw std::runtime_error("config: a priority class has no name");
    if (!names.insert(pc.name).second)
      throw std::runtime_error("config: priority class '" + pc.name + "' is defined twice");
    if (!(pc.weight > 0))
      throw std::runtime_error("config: priority class '" + pc.name + "' needs a weight > 0");
    if (pc.queue_limit == 0)
      throw std::runtime_error("config: priority class '" + pc.name + "' needs a queue_limit >= 1");
  }
  if (!cfg.cluster.nats.empty()) {
    // Each class is a subject token of switchyard.jobs.<class> and a consumer's name.
    for (const auto& pc : classes)
      if (auto why = cluster::subject_token_problem(pc.name); !why.empty())
        throw std::runtime_error("config: priority class '" + pc.name +
                                 "' cannot name a cluster subject (switchyard.jobs." + pc.name +
                                 "): it " + why);
    if (cfg.cluster.reconnect_wait_ms > cfg.cluster.reconnect_max_ms)
      throw std::runtime_error("config: cluster.reconnect_wait_ms must be <= reconnect_max_ms");
  }
  if (cfg.router.default_class.empty()) {
    cfg.router.default_class = classes.front().name;
  } else if (!names.count(cfg.router.default_class)) {
    throw std::runtime_error("config: router.default_class '" + cfg.router.default_class +
                             "' is not one of the priority classes");
  }
  std::set<std::string> tenants;
  for (auto& t : cfg.admission.tenants) {
    if (t.name.empty()) throw std::runtime_error("config: a tenant has no name");
    if (!tenants.insert(t.name).second)
      throw std::runtime_error("config: tenant '" + t.name + "' is defined twice");
    // Ten seconds of the rate lets a tenant send a burst without waiting for refill.
    if (t.tokens_per_second > 0 && t.burst_tokens <= 0) t.burst_tokens = t.tokens_per_second * 10;
  }
  if (cfg.executors.backend > Backend::null)
    throw std::runtime_error("config: unknown backend '" +
                             std::to_string(static_cast<unsigned>(cfg.executors.backend)) +
                             "' (auto, cpu, cuda or null)");
  if (cfg.executors.count < 1) throw std::runtime_error("config: executors.count must be >= 1");
  if (cfg.executors.threads < 0) throw std::runtime_error("config: executors.threads must be >= 0");
  if (cfg.autoscale.min_executors > 0 && cfg.autoscale.max_executors > 0 &&
      cfg.autoscale.min_executors > cfg.autoscale.max_executors)
    throw std::runtime_error("config: autoscale.min_executors must be <= max_executors");
  if (cfg.batching.max_sequences < 1 || cfg.batching.step_token_budget < 1 ||
      cfg.batching.prefill_chunk < 1)
    throw std::runtime_error("config: batching limits must be >= 1");
  // A step must fit at least one decode token of every running sequence.
  if (cfg.batching.step_token_budget < cfg.batching.max_sequences)
    cfg.batching.max_sequences = cfg.batching.step_token_budget;
  if (cfg.batching.kv_block_size < 1 || cfg.batching.kv_memory_mb < 0)
    throw std::runtime_error(
        "config: batching.kv_block_size must be >= 1 and kv_memory_mb >= 0 (0: auto)");
  for (const std::string* text : {&cfg.batching.kv_policy, &cfg.batching.kv_pressure_policy}) {
    std::string why;
    if (!text->empty() && !policy::parse_kv_policy(*text, &why))
      throw std::runtime_error("config: batching kv policy '" + *text + "': " + why);
  }
  if (cfg.batching.spec_ngram_min > cfg.batching.spec_ngram_max)
    throw std::runtime_error("config: batching.spec_ngram_min must not be above spec_ngram_max");
  if (!(cfg.batching.kv_low_watermark < cfg.batching.kv_high_watermark))
    throw std::runtime_error("config: batching.kv_low_watermark must be below kv_high_watermark");
  if (auto p = policy::parse_kv_policy(cfg.batching.kv_policy);
      p && !policy::bounded_by_context(*p))
    cfg.admission.beyond_context = true;
  if (cfg.endpoints.bind.empty() && cfg.endpoints.pull.empty())
    throw std::runtime_error("config: neither endpoints.bind nor endpoints.pull is set: no way in");
  if (!cfg.endpoints.pull.empty() && cfg.endpoints.results.empty())
    throw std::runtime_error(
        "config: endpoints.pull needs endpoints.results (where pipeline results go)");
  cfg.router.block_size = cfg.batching.kv_block_size;
  cfg.journal.keep_result_bytes = cfg.admission.result_cache_bytes;
  cfg.router.max_job_retries = cfg.batching.max_job_retries;
  // Affinity only pays where the batcher keeps prefixes.
  if (!cfg.batching.prefix_cache) cfg.router.prefix_affinity = false;
  if (cfg.shutdown_grace_ms < 0) throw std::runtime_error("config: shutdown_grace_ms must be >= 0");
  if (!cfg.endpoints.curve_public_key.empty() && cfg.endpoints.curve_secret_key.empty())
    throw std::runtime_error(
        "config: endpoints.curve_public_key needs endpoints.curve_secret_key (the server's own "
        "secret key turns CURVE on)");
}

namespace {

// FNV-1a (64 bit): a stable, dependency-free hash; it only has to tell endpoint names apart.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// True when `endpoint` binds a port (or ipc path) that ZeroMQ picks at bind time: such a name
// means another address after every restart, so a journal keyed by it would never be replayed.
bool wildcard_endpoint(const std::string& endpoint) {
  auto sep = endpoint.find("://");
  std::string scheme = sep == std::string::npos ? "" : endpoint.substr(0, sep);
  std::string rest = sep == std::string::npos ? endpoint : endpoint.substr(sep + 3);
  if (scheme == "ipc") return rest == "*";
  if (scheme == "tcp" || scheme == "ws" || scheme == "wss") {
    auto colon = rest.rfind(':');
    std::string port = colon == std::string::npos ? "" : rest.substr(colon + 1);
    return port.empty() || port == "*" || port == "0" ||
           port.find_first_not_of("0123456789") != std::string::npos;
  }
  return false;
}

// The endpoint spelled as one folder name: the scheme, then the address with ':' and '/' turned
// into '-'. Whenever that spelling could stand for two endpoints (a '-' beside a replaced
// separator, both separators replaced, any other character replaced) or is long, a hash of the
// full endpoint is appended, so two servers never share a folder while common names stay readable.
std::string endpoint_slug(const std::string& endpoint) {
  // Far below NAME_MAX (255), and short enough to read in a listing.
  constexpr size_t kMaxReadable = 64;
  std::string slug;
  bool lossy = false, dash = false, colon = false, slash = false;
  auto sep = endpoint.find("://");
  size_t from = 0;
  if (sep != std::string::npos) {
    for (char c : endpoint.substr(0, sep)) {
      if (std::isalnum(static_cast<unsigned char>(c)))
        slug += c;
      else
        lossy = true;
    }
    slug += '-';
    from = sep + 3;
  } else {
    lossy = true;  // not a ZeroMQ endpoint as written; keep it apart from every real one
  }
  for (size_t i = from; i < endpoint.size(); ++i) {
    char c = endpoint[i];
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_') {
      slug += c;
    } else if (c == '-') {
      slug += c;
      dash = true;
    } else if (c == ':' || c == '/') {
      slug += '-';
      (c == ':' ? colon : slash) = true;
    } else {
      // "*" (every interface) is common enough to deserve a readable spelling.
      slug += c == '*' ? "any" : "-";
      lossy = true;
    }
  }
  // One kind of replaced separator and no '-' of its own: every '-' maps back to that separator.
  if ((colon && slash) || (dash && (colon || slash))) lossy = true;
  if (slug.size() > kMaxReadable) {
    slug.resize(kMaxReadable);
    lossy = true;
  }
  if (lossy) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%08llx",
                  static_cast<unsigned long long>(fnv1a(endpoint) & 0xffffffffull));
    slug += '-';
    slug += hex;
  }
  return slug;
}

}  // namespace

std::string journal_location(const ServerConfig& cfg, std::string* why) {
  if (cfg.journal.path == "off") return {};
  if (!cfg.journal.path.empty()) return cfg.journal.path;
  std::string endpoint = cfg.endpoints.bind.empty() ? cfg.endpoints.pull : cfg.endpoints.bind;
  // A relative ipc path names a different socket in every working folder: spell it absolute so
  // that two servers in two folders get two journals (and '@' abstract names stay as they are).
  if (endpoint.rfind("ipc://", 0) == 0 && endpoint.size() > 6 && endpoint[6] != '/' &&
      endpoint[6] != '@' && endpoint != "ipc://*") {
    std::error_code ec;
    auto abs = std::filesystem::absolute(endpoint.substr(6), ec);
    if (!ec) endpoint = "ipc://" + abs.lexically_normal().string();
  }
  if (cfg.state_dir.empty()) {
    if (why)
      *why =
          "no state directory (give --state-dir, or set XDG_STATE_HOME or HOME), or give --journal "
          "PATH";
    return {};
  }
  if (endpoint.empty()) {
    if (why)
      *why = "no bind or pull address to name the default journal after; give --journal PATH";
    return {};
  }
  if (wildcard_endpoint(endpoint)) {
    if (why)
      *why = "the address " + endpoint +
             " has a wildcard port, which changes at every start, so a default journal would "
             "never be replayed; give a fixed port or --journal PATH";
    return {};
  }
  return (std::filesystem::path(cfg.state_dir) / endpoint_slug(endpoint) / "switchyard.journal")
      .string();
}

}  // namespace sy
