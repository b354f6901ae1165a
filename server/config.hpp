// The server's configuration: one plain struct per component, filled from a YAML file and
// command-line flags (flags win), passed by value at spawn. No globals, no environment reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "policies/qos.hpp"
#include "server/intake_meter.hpp"

namespace sy {

struct EndpointConfig {
  std::string bind = "tcp://127.0.0.1:5555";  // ROUTER for DEALER clients
  std::string pull;                           // PULL for pipeline producers ("" = off)
  std::string results;                        // PUSH for pipeline sinks ("" = off)
  int64_t max_message_bytes = 1 << 20;        // ZMQ_MAXMSGSIZE: a bigger frame disconnects
  int sndhwm = 1000, rcvhwm = 1000;           // ZeroMQ high-water marks (messages)
  // Connection liveness (docs/protocol.md, Sockets).
  // A connection that has not completed the ZMTP handshake (greeting, CURVE, READY) within
  // handshake_timeout_ms is dropped (ZMQ_HANDSHAKE_IVL; 0 = never). A real handshake takes a few
  // round trips, well under a second even across continents; 10 s leaves room for a loaded host
  // and is a third of libzmq's default, so strangers that connect and send nothing cost less.
  int64_t handshake_timeout_ms = 10000;
  // TCP keepalive on every connection (ZMQ_TCP_KEEPALIVE): after tcp_keepalive_idle_s without
  // traffic the kernel probes the peer every 10 s and drops the connection after 3 unanswered
  // probes, so a peer whose host died or vanished from the network frees its buffers (a
  // half-received frame included) within idle + 30 s. 0 = off. Probes are answered by the peer's
  // kernel, so a live but stalled peer is not dropped by them: see heartbeat_ivl_ms.
  int64_t tcp_keepalive_idle_s = 60;
  // ZMTP heartbeats on the request endpoint (ROUTER); 0 = off, the default. The server PINGs
  // every connection this often and drops one from which no whole message (a PONG counts) came
  // within heartbeat_timeout_ms of a PING: a dead client, or a live one stalled in the middle of
  // a frame, which otherwise pins the frame's buffer (up to max_message_bytes) for as long as it
  // stays connected. Suggested: 10 s and 30 s.
  // With heartbeats on, the ROUTER takes no receive high-water mark: libzmq 4.3.4 (and libzmq
  // master) aborts the process from its heartbeat timer when a peer resets a connection whose
  // input ZeroMQ had paused at the mark, and without a mark its input is never paused. The price:
  // what clients send faster than the gateway reads then queues in ZeroMQ without a bound, so
  // heartbeats suit endpoints whose clients are trusted (CURVE with an allow-list); that is why
  // they are off by default, where the mark bounds a flood to rcvhwm messages per connection.
  // The pipeline sockets never get heartbeats: a producer held back by backpressure is paused
  // that way in normal operation (the same abort, and a paused producer cannot answer a PING).
  int64_t heartbeat_ivl_ms = 0;
  int64_t heartbeat_timeout_ms = 30000;
  // Sent in each PING: a client drops the connection when it hears nothing from the server for
  // this long, so a dead server host is noticed and the client reconnects. Three intervals, as
  // above; ZMTP carries it in tenths of a second (at most 6553.5 s).
  int64_t heartbeat_ttl_ms = 30000;
  // Requests from the request endpoint handed to admission and not yet taken up by it (its
  // mailbox): past either bound new ones are answered `overloaded` by the gateway, so a flood
  // queues no more than this in front of admission. Admission takes a few hundred thousand small
  // requests a second; 4096 is about 10 ms of its work at that pace and a handful of
  // full-context prompts' bytes, so normal bursts never meet it. 64 MiB bounds what big prompts
  // can hold there.
  int64_t max_waiting_requests = 4096;
  int64_t max_waiting_bytes = int64_t{64} << 20;
  // Concurrent client connections on each listening endpoint (the request endpoint and the
  // pipeline input, counted apart); a connection past it is closed at once, and counted as
  // `connections_refused`. 0 = unlimited. A live peer stalled in the middle of a frame pins the
  // frame's buffer (up to max_message_bytes) while heartbeats are off, so this is what bounds
  // that memory: max_connections x max_message_bytes per endpoint, 1 GiB with the defaults. 1024
  // leaves room for a thousand clients each holding its own connection (a client process usually
  // shares one), and that worst case is small beside a model's weights and KV cache. Each
  // connection takes a file descriptor: the gateway raises the soft `ulimit -n` to what the caps
  // need where the hard limit allows, and warns at start where it does not.
  int64_t max_connections = 1024;
  // CURVE (docs/security.md): with a secret key file every bound socket is a CURVE server and
  // clients need the public key; "" = plain TCP. The public key file is optional and only checked
  // against the secret key (a mismatched pair is a deployment error worth catching at start).
  std::string curve_secret_key;  // Z85 secret key file (`switchyard keygen`)
  std::string curve_public_key;  // Z85 public key file
  // With CURVE on: a file of client public keys (Z85, one per line, '#' comments) that may
  // connect; every other key is refused during the handshake (ZAP). "" = any client that knows
  // the server's public key.
  std::string curve_allowed_keys;
};

struct TenantConfig {
  std::string name;
  std::string token;             // "" = no token needed
  double weight = 1.0;           // share inside a priority class
  uint32_t max_in_flight = 0;    // 0 = unlimited
  double tokens_per_second = 0;  // token-rate quota (prompt + max_tokens); 0 = unlimited
  double burst_tokens = 0;       // bucket size; 0 = tokens_per_second * 10
};

struct AdmissionConfig {
  bool allow_anonymous = true;  // no tenants configured: every tenant name is accepted
  std::vector<TenantConfig> tenants;
  uint32_t max_prompt_tokens = 0;  // 0 = the model context
  uint32_t max_output_tokens = 4096;
  size_t result_cache = 100000;  // finished job keys remembered for resubmission
  // ...and their bytes at most (completion text and ids, logprobs, keys): a count alone lets
  // long completions take gigabytes (100,000 of 4,096 tokens are ~1.9 GB). Oldest go first.
  size_t result_cache_bytes = size_t{256} << 20;
  // Open-tenant mode: a tenant name that is not configured is forgotten once it has no job in
  // flight and has not been used for this long (its state is an unlimited quota of weight 1,
  // rebuilt as it was on its next submit), so that endless new names do not grow the tables.
  int64_t tenant_idle_ms = 60000;
  // ...and at most this many such idle tenants are kept whatever their age (the longest idle
  // go first): the bound when names arrive faster than tenant_idle_ms forgets them.
  size_t max_idle_tenants = 10000;
  std::string admin_token;  // operator commands (switchyard ctl); "" = none allowed
  // Let prompt + max_tokens exceed the model context (set when the KV policy is sinks, whose
  // positions never pass the cache size); jobs under other policies still end at the context.
  bool beyond_context = false;
  // The chat template text that renders `messages` submits, overriding the model file's
  // tokenizer.chat_template; "" = the file's. Filled from ServerConfig::chat_template by
  // `switchyard serve` (model/chat_template.hpp load_template_text).
  std::string chat_template;
  std::string chat_template_source;  // where it came from (a name or a file), for the log
  // Wiring, not configuration: the gateway's meter of admission's mailbox
  // (server/intake_meter.hpp), counted out here; nullptr where no gateway feeds this admission
  // (tests).
  std::shared_ptr<IntakeMeter> intake;
};

struct RouterConfig {
  std::vector<policy::PriorityClass> classes;  // empty: interactive (rank 0) and batch (rank 1)
  std::string default_class;                   // "" = the lowest-rank... first class
  // Prefix-aware dispatch (policies/prefix_route.hpp): a job goes to the batcher that was last
  // sent its longest prompt prefix, unless that batcher has `prefix_affinity_slack` fewer free
  // credits than the freest one. Off by itself when batching.prefix_cache is off.
  bool prefix_affinity = true;
  uint32_t prefix_affinity_slack = 8;
  int32_t block_size = 16;       // set by finalize_config from batching.kv_block_size
  uint32_t max_job_retries = 2;  // set by finalize_config from batching.max_job_retries
};

struct BatchingConfig {
  uint32_t step_token_budget = 512;  // new tokens per step (decode + prefill chunks)
  uint32_t max_sequences = 64;       // running sequences per batcher
  uint32_t prefill_chunk = 256;      // longest prefill chunk of one sequence per step
  int32_t kv_block_size = 16;
  int64_t kv_memory_mb = 0;  // KV memory per executor; 0: auto (256 MiB on the CPU; on a GPU
                             // kv_gpu_fraction of what is left after the weights)
  // With kv_memory_mb 0 on a GPU: the share of the device memory left after the weights and the
  // step buffers that the KV cache takes; the rest is for cuBLASLt, the CUDA context and
  // fragmentation (vLLM's gpu_memory_utilization, counted after the weights).
  double kv_gpu_fraction = 0.85;
  // Element type of the CPU engine's cached keys and values (kernels::parse_kv_type): f16, as
  // llama.cpp's default (half of f32's memory, logits within the golden tests' bounds), f32, or
  // q8_0 (about a quarter of f32; head_dim a multiple of 32).
  kernels::DType kv_dtype = kernels::DType::F16;
  int32_t step_delay_ms = 0;  // TEST ONLY: sleep before each step (slow executor)
  // KV-cache policy (policies/kv_policy.hpp format: full | sliding_window:W | sinks:S:W);
  // "" = the model's declared sliding window if it has one, else full.
  std::string kv_policy;
  std::string kv_pressure_policy;   // swapped in above kv_high_watermark; "" = never
  double kv_high_watermark = 0.90;  // fraction of KV blocks held by sequences
  double kv_low_watermark = 0.70;   // back to the normal policy at or below this
  bool prefix_cache = true;         // reuse cached KV blocks of shared prompt prefixes
  // layer_window_kv: for a model whose layers are of two kinds (full attention and a window of
  // their own, gemma2): true ("release") keeps the windowed layers' K/V in a pool of its own and
  // gives back their blocks behind the window (no prefix reuse then); false ("keep"): one pool
  // for all layers, every block held for the full-attention layers, prefix reuse on. The CPU
  // backend only (docs/kv_policies.md).
  bool release_layer_windows = true;
  // Crash recovery: a step that takes longer than this means a hung executor. Generous, since a
  // long prefill on a slow CPU can take seconds; tests set it low.
  int64_t step_timeout_ms = 30000;
  uint32_t max_job_retries = 2;  // executor failures a job survives; then engine_dead
};

struct ExecutorConfig {
  std::string backend = "auto";    // auto (cuda where a device answers, else cpu) | cpu | cuda |
                                   // null (fixed tokens, no model: measures overhead)
  int count = 1;                   // batcher+executor pairs
  int threads = 0;                 // per executor; 0 = cores / count
  int test_fault_throw_after = 0;  // TEST ONLY: the first executor throws after N steps (0 off)
  int test_fault_hang_after = 0;   // TEST ONLY: the first executor stops answering after N steps
  int test_fault_batcher_throw_after = 0;  // TEST ONLY: the first batcher throws after N steps
  // TEST ONLY: a job whose first planned chunk feeds this token id gets NaN logits (every
  // executor), so that it fails alone; -1 off.
  int test_nan_logits_token = -1;
};

/// A backend name the configuration accepts (auto, cpu, cuda, null); gpu/backend.hpp resolves
/// auto and checks that cuda can run.
inline bool known_backend(const std::string& b) {
  return b == "auto" || b == "cpu" || b == "cuda" || b == "null";
}

/// Elastic pairs (actors/supervisor.hpp, policies/autoscale.hpp): Ray Serve's autoscaling knobs.
/// min/max 0 mean executors.count, so a config without this section runs a fixed count.
struct AutoscaleConfig {
  int min_executors = 0;
  int max_executors = 0;  // CPU executor slots (one per device where devices exist)
  uint32_t target_ongoing_per_executor = 0;  // jobs (running + queued) per executor; 0: off
  int64_t target_queue_wait_ms = 200;        // oldest queued job waiting longer means: add one
  int64_t upscale_delay_ms = 1000;           // the pressure must last this long before adding
  int64_t downscale_delay_ms = 10000;        // an executor idle this long is retired
  int64_t interval_ms = 100;                 // how often the supervisor looks at the load
};

/// The operator HTTP endpoints (/metrics, /health, /ready: docs/metrics.md).
struct MetricsConfig {
  std::string bind;  // "HOST:PORT" (port 0: any free one); "" = off
  // Tenants that are not configured (open-tenant mode) get a `tenant` label of their own up to
  // this many distinct names; later ones are counted under tenant="_other". A counter's series
  // never goes away, so without a cap every new tenant name would add series for good.
  size_t max_tenant_labels = 1000;
};

/// The durable journal of accepted jobs and results (docs/durability.md).
struct JournalConfig {
  // Journal file; a folder (or a path ending in '/') gets FOLDER/switchyard.journal. "" = the
  // default location (journal_location()), "off" = no journal.
  std::string path;
  std::string fsync = "batch";  // always | batch | never (policies/journal_file.hpp)
  int64_t batch_ms = 2;         // group-commit window: acks wait at most this for the fsync
  // A result handed to egress this long ago is marked delivered (not redelivered after a crash);
  // two seconds is far beyond the gateway's usual hand-off time to the socket.
  int64_t delivered_lag_ms = 2000;
  int64_t compact_bytes = 64 << 20;  // rewrite the file once it outgrows this and is mostly dead
  // The results kept in memory for compaction (the ones admission keeps for resubmissions) take
  // this many bytes at most; set by finalize_config from admission.result_cache_bytes.
  size_t keep_result_bytes = size_t{256} << 20;
};

struct ServerConfig {
  std::string model;  // GGUF path; "" = the demo model
  // `--chat-template` / the `chat_template` key: a built-in template name (chatml, llama3,
  // gemma, mistral, phi3) or a template file; "" = the model file's tokenizer.chat_template.
  std::string chat_template;
  EndpointConfig endpoints;
  AdmissionConfig admission;
  RouterConfig router;
  BatchingConfig batching;
  ExecutorConfig executors;
  AutoscaleConfig autoscale;
  int64_t shutdown_grace_ms = 5000;  // finish in-flight jobs this long on SIGTERM, then cancel
  MetricsConfig metrics;
  JournalConfig journal;
  // Where a server keeps its state (the default journal) when nothing more specific is given.
  // `switchyard serve` fills it ($XDG_STATE_HOME/switchyard or ~/.local/state/switchyard);
  // "" = no default journal.
  std::string state_dir;
};

/// The journal file a server with `cfg` uses, or "" for none: journal.path when set ("off" =
/// none), else STATE_DIR/<endpoint>/switchyard.journal where <endpoint> spells the bind (or pull)
/// address as a folder name — so two servers on one host never share a journal. A wildcard port
/// has no stable name across restarts, so it gets no default journal; `why` (if given) then says so.
std::string journal_location(const ServerConfig& cfg, std::string* why = nullptr);

/// Reads a YAML file into `cfg` (keys absent keep their values); throws std::runtime_error
/// naming the file, key and problem.
void load_config_file(const std::string& path, ServerConfig& cfg);
/// Fills defaults that depend on other values (priority classes, default class).
void finalize_config(ServerConfig& cfg);

}  // namespace sy
