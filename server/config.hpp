// The server's configuration: one plain struct per component, filled from a YAML file and
// command-line flags (flags win), passed by value at spawn. No globals, no environment reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policies/qos.hpp"

namespace sy {

struct EndpointConfig {
  std::string bind = "tcp://127.0.0.1:5555";  // ROUTER for DEALER clients
  std::string pull;                           // PULL for pipeline producers ("" = off)
  std::string results;                        // PUSH for pipeline sinks ("" = off)
  int64_t max_message_bytes = 1 << 20;        // ZMQ_MAXMSGSIZE: a bigger frame disconnects
  int sndhwm = 1000, rcvhwm = 1000;           // ZeroMQ high-water marks (messages)
};

struct TenantConfig {
  std::string name;
  std::string token;                 // "" = no token needed
  double weight = 1.0;               // share inside a priority class
  uint32_t max_in_flight = 0;        // 0 = unlimited
  double tokens_per_second = 0;      // token-rate quota (prompt + max_tokens); 0 = unlimited
  double burst_tokens = 0;           // bucket size; 0 = tokens_per_second * 10
};

struct AdmissionConfig {
  bool allow_anonymous = true;       // no tenants configured: every tenant name is accepted
  std::vector<TenantConfig> tenants;
  uint32_t max_prompt_tokens = 0;    // 0 = the model context
  uint32_t max_output_tokens = 4096;
  size_t result_cache = 100000;      // finished job keys remembered for resubmission
  std::string admin_token;           // operator commands (switchyard ctl); "" = none allowed
  // Let prompt + max_tokens exceed the model context (set when the KV policy is sinks, whose
  // positions never pass the cache size); jobs under other policies still end at the context.
  bool beyond_context = false;
};

struct RouterConfig {
  std::vector<policy::PriorityClass> classes;  // empty: interactive (rank 0) and batch (rank 1)
  std::string default_class;                   // "" = the lowest-rank... first class
};

struct BatchingConfig {
  uint32_t step_token_budget = 512;  // new tokens per step (decode + prefill chunks)
  uint32_t max_sequences = 64;       // running sequences per batcher
  uint32_t prefill_chunk = 256;      // longest prefill chunk of one sequence per step
  int32_t kv_block_size = 16;
  int64_t kv_memory_mb = 256;        // KV memory per executor
  int32_t step_delay_ms = 0;         // TEST ONLY: sleep before each step (slow executor)
  // KV-cache policy (policies/kv_policy.hpp format: full | sliding_window:W | sinks:S:W);
  // "" = the model's declared sliding window if it has one, else full.
  std::string kv_policy;
  std::string kv_pressure_policy;    // swapped in above kv_high_watermark; "" = never
  double kv_high_watermark = 0.90;   // fraction of KV blocks held by sequences
  double kv_low_watermark = 0.70;    // back to the normal policy at or below this
  bool prefix_cache = true;          // reuse cached KV blocks of shared prompt prefixes
};

struct ExecutorConfig {
  std::string backend = "cpu";       // cpu | null (fixed tokens, no model: measures overhead)
  int count = 1;                     // batcher+executor pairs
  int threads = 0;                   // per executor; 0 = cores / count
};

struct ServerConfig {
  std::string model;                 // GGUF path; "" = the demo model
  EndpointConfig endpoints;
  AdmissionConfig admission;
  RouterConfig router;
  BatchingConfig batching;
  ExecutorConfig executors;
  int64_t shutdown_grace_ms = 5000;  // finish in-flight jobs this long on SIGTERM, then cancel
};

/// Reads a YAML file into `cfg` (keys absent keep their values); throws std::runtime_error
/// naming the file, key and problem.
void load_config_file(const std::string& path, ServerConfig& cfg);
/// Fills defaults that depend on other values (priority classes, default class).
void finalize_config(ServerConfig& cfg);

}  // namespace sy
