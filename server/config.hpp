// The server's configuration: one plain struct per component, filled from a YAML file and
// command-line flags (flags win), passed by value at spawn. No globals, no environment reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/admission_config.hpp"
#include "actors/batcher_config.hpp"
#include "actors/executor_config.hpp"
#include "storage/journal_config.hpp"
#include "actors/log.hpp"
#include "actors/metrics_config.hpp"
#include "actors/router_config.hpp"
#include "actors/supervisor_config.hpp"
#include "ingress/cluster_config.hpp"
#include "ingress/endpoint_config.hpp"
#include "ingress/http_config.hpp"
#include "server/tracing_config.hpp"

namespace sy {

struct ServerConfig {
  std::string model;  // GGUF path; "" = the demo model
  // `--draft-model` / the `draft_model` key: a GGUF of the same vocabulary whose greedy decoding
  // drafts tokens for speculative decoding (docs/speculation.md); "" = prompt lookup.
  std::string draft_model;
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
  log::LogConfig log;  // the level and line format of the server's log (stderr)
  ClusterConfig cluster;  // `cluster` / --nats: a NATS JetStream cluster node (docs/cluster.md)
  HttpConfig http;        // `http` / --http: the OpenAI-compatible HTTP door (docs/http.md)
  TracingConfig tracing;  // `tracing` / --otlp-endpoint: spans of traced jobs (docs/tracing.md)
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
