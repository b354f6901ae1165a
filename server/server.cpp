// The wiring of a whole server process (see server.hpp): actor system, model, actors, gateway,
// and the ordered graceful shutdown.
#include "server/server.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <caf/all.hpp>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "actors/admission.hpp"
#include "actors/batcher.hpp"
#include "actors/constraint_support.hpp"
#include "actors/control.hpp"
#include "actors/executor.hpp"
#include "actors/journal.hpp"
#include "actors/log.hpp"
#include "actors/messages.hpp"
#include "actors/metrics.hpp"
#include "actors/router.hpp"
#include "actors/supervisor.hpp"
#include "gpu/backend.hpp"
#include "ingress/egress.hpp"
#include "ingress/gateway.hpp"
#include "ingress/http_door.hpp"
#include "model/llama.hpp"
#include "server/cluster_wiring.hpp"
#include "server/metrics.hpp"
#include "server/otlp_exporter.hpp"
#include "server/telemetry.hpp"
#include "storage/journal_file.hpp"

namespace sy {
namespace {

// The actor system's settings: the sharing scheduler wakes an idle worker about 7x sooner for a
// message sent from the (non-CAF) gateway thread than the default work-stealing one. Its workers
// share one locked queue, so more workers than cores (CAF's default is at least 4) only add lock
// hand-offs and wake-ups: the gateway, ZeroMQ's I/O thread and the executors need cores too.
struct SystemConfig : caf::actor_system_config {
  SystemConfig() {
    register_message_types(*this);
    set("scheduler.policy", caf::atom("sharing"));
    size_t cores = std::max(1u, std::thread::hardware_concurrency());
    set("scheduler.max-threads", std::min<size_t>(cores, 4));
  }
};

// The gateway's counters that the stats records show (the gateway is no actor; these are atomics).
EdgeStats edge_stats(const Gateway& g) {
  const GatewayStats st = g.stats();
  EdgeStats e;
  e.received = static_cast<int64_t>(st.received);
  e.sent = static_cast<int64_t>(st.sent);
  e.decode_errors = static_cast<int64_t>(st.decode_errors);
  e.curve_refused = static_cast<int64_t>(st.curve_refused);
  e.intake_refused = static_cast<int64_t>(st.intake_refused);
  e.connections_refused = static_cast<int64_t>(st.connections_refused);
  e.connections_refused_per_address = static_cast<int64_t>(st.refused_per_address);
  e.connections_refused_total = static_cast<int64_t>(st.refused_total);
  e.connections_refused_handshaking = static_cast<int64_t>(st.refused_handshaking);
  e.connections_open = st.connections_open;
  e.connections_handshaking = st.connections_handshaking;
  return e;
}

// The HTTP door of a server (cfg.http.bind set): the model's names, the edge limits and classes
// it parses requests with, and its Batch API folder beside the journal (no journal: no Batch
// API, since a batch that could not survive a restart would break its promise).
std::shared_ptr<HttpDoor> make_http_door(const ServerConfig& c, const GatewayOptions& go,
                                         const LlamaModel* model, const std::string& journal) {
  HttpDoorContext x;
  std::string name = c.http.model_name;
  if (name.empty())
    name = c.model.empty() ? "switchyard" : std::filesystem::path(c.model).stem().string();
  x.parse.models.push_back(name);
  if (!c.model.empty() && c.model != name) x.parse.models.push_back(c.model);
  x.parse.limits = go.limits;
  x.parse.limits.max_message_bytes = c.endpoints.max_message_bytes;
  x.parse.chat_default_max_tokens = c.admission.max_output_tokens;
  auto classes = effective_classes(c.router.classes);
  std::stable_sort(classes.begin(), classes.end(),
                   [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (const auto& pc : classes) x.parse.classes.push_back(pc.name);
  x.batch_class = c.http.batch_class;
  if (x.batch_class.empty())
    x.batch_class =
        std::find(x.parse.classes.begin(), x.parse.classes.end(), "batch") != x.parse.classes.end()
            ? "batch"
            : x.parse.classes.back();
  else if (std::find(x.parse.classes.begin(), x.parse.classes.end(), x.batch_class) ==
           x.parse.classes.end())
    throw std::invalid_argument("http.batch_class '" + x.batch_class +
                                "' is not a configured priority class");
  if (model) {
    x.max_model_len = static_cast<uint32_t>(model->config().ctx_len);
    x.token_text = [model](int32_t id) { return model->tokenizer().token_to_piece(id, true); };
  }
  x.tenants = c.admission.tenants;
  x.intake = go.intake;
  x.max_waiting_requests = c.endpoints.max_waiting_requests;
  x.max_waiting_bytes = c.endpoints.max_waiting_bytes;
  if (!journal.empty())
    x.batch_dir = (std::filesystem::path(journal).parent_path() / "http-batches").string();
  x.batch_priority = c.executors.cpu_priority;
  HttpConfig hc = c.http;
  if (hc.batch_max_in_flight == 0) {
    const uint64_t slots =
        uint64_t{c.batching.max_sequences} *
        static_cast<uint64_t>(std::max({1, c.executors.count, c.autoscale.max_executors}));
    hc.batch_max_in_flight =
        static_cast<uint32_t>(std::clamp<uint64_t>(slots - slots / 4, 1, 100000));
  }
  return std::make_shared<HttpDoor>(hc, std::move(x));
}

}  // namespace

struct Server::Impl {
  ServerConfig cfg;
  SystemConfig sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<LlamaModel> model;
  std::shared_ptr<LlamaModel> draft;  // batching's draft model (--draft-model), or null
  std::shared_ptr<Gateway> gateway;
  std::shared_ptr<cluster::ClusterNode> node;  // only with cluster.nats (--nats)
  std::shared_ptr<HttpDoor> http;              // only with http.bind (--http)
  EgressActor egress;
  RouterActor router;
  AdmissionActor admission;
  ControlActor control;
  JournalActor journal;        // only with a journal_location(); stands in front of egress
  SupervisorActor supervisor;  // owns the batcher+executor pairs (elastic, crash recovery)
  bool started = false;
  bool stopped = false;
  MetricsActor metrics;  // only with cfg.metrics.bind set
  std::unique_ptr<MetricsEndpoint> metrics_http;
  std::shared_ptr<TraceBuffer> traces;     // only with tracing.otlp_endpoint (docs/tracing.md)
  std::unique_ptr<OtlpExporter> exporter;  // drains `traces`

  // Asks one actor for its stats record R; nullopt on timeout or error.
  template <class R, class Handle>
  std::optional<R> ask_stats(const Handle& a) {
    std::optional<R> out;
    if (!a) return out;
    caf::scoped_actor self{*sys};
    // A second is long enough for an actor that is merely busy; a stuck one must not hang us.
    self->request(a, std::chrono::seconds(1), stats_atom::value)
        .receive([&](R& s) { out = std::move(s); }, [&](caf::error&) {});
    return out;
  }
};

Server::Server(ServerConfig cfg) : impl_(new Impl) {
  auto& d = *impl_;
  d.cfg = std::move(cfg);
  if (!d.cfg.tracing.otlp_endpoint.empty()) {
    d.traces =
        std::make_shared<TraceBuffer>(d.cfg.tracing.max_queued_spans, d.cfg.tracing.sample_all);
    d.exporter = std::make_unique<OtlpExporter>(d.cfg.tracing, d.traces);  // checks the URL
    d.cfg.admission.traces = d.traces;
    d.cfg.batching.traces = d.traces;
  }
  // auto: cuda where a device answers, else cpu; cuda without a device throws, saying why.
  d.cfg.executors.backend = resolve_backend(d.cfg.executors.backend);
  const auto& c = d.cfg;
  if (c.executors.backend != Backend::null) {
    if (c.model.empty())
      throw std::invalid_argument("the " + std::string(to_string(c.executors.backend)) +
                                  " backend needs a model file");
    d.model = LlamaModel::load(c.model);
  }
  if (!c.draft_model.empty()) {
    if (!d.model)
      throw std::invalid_argument(
          "--draft-model needs the cpu or cuda backend (the null backend "
          "runs no model)");
    try {
      d.draft = LlamaModel::load(c.draft_model);
    } catch (const std::exception& e) {
      throw std::invalid_argument("draft model " + c.draft_model + ": " + e.what());
    }
    const std::string why = draft_vocabulary_mismatch(*d.model, *d.draft);
    if (!why.empty())
      throw std::invalid_argument("draft model " + c.draft_model +
                                  " does not share the target's vocabulary: " + why);
    log::info("draft model " + c.draft_model + " (" + std::to_string(d.draft->config().n_layers) +
              " layers) drafts for speculative decoding" +
              (c.batching.speculative == SpecMode::off ? "; batching.speculative is off: no job "
                                                         "uses it unless it asks"
                                                       : ""));
  }
  d.sys = std::make_unique<caf::actor_system>(d.sys_cfg);

  // The edge refuses what admission would refuse anyway, before anything is allocated.
  GatewayOptions go;
  uint32_t ctx = d.model ? static_cast<uint32_t>(d.model->config().ctx_len) : 0;
  uint32_t max_prompt = c.admission.max_prompt_tokens;
  if (max_prompt == 0 || (ctx > 0 && max_prompt > ctx)) max_prompt = ctx;
  if (max_prompt > 0) go.limits.max_prompt_tokens = max_prompt;
  go.limits.max_new_tokens = c.admission.max_output_tokens;
  go.intake = std::make_shared<IntakeMeter>();
  AdmissionConfig admission_cfg = c.admission;
  admission_cfg.intake = go.intake;
  // One vocabulary index and one cache of compiled constraints: admission compiles a job's
  // constraint to check it, and its executor then finds it compiled.
  std::shared_ptr<ConstraintSupport> constraints;
  if (d.model) constraints = make_constraint_support(*d.model);
  admission_cfg.constraints = constraints;
  d.gateway = std::make_shared<Gateway>(c.endpoints, go);

  d.node = make_cluster_node(c, go.limits);
  std::string why_no_journal;
  const std::string journal_path = journal_location(c, &why_no_journal);
  if (!c.http.bind.empty()) d.http = make_http_door(c, go, d.model.get(), journal_path);
  // Each door's clients get their events through that door; the rest through the gateway.
  auto outbox = std::make_shared<KindOutbox>(d.gateway);
  if (d.node) outbox->route(ClientRef::cluster, d.node);
  if (d.http) outbox->route(ClientRef::http, d.http);
  d.egress = spawn_egress(*d.sys, outbox, d.traces);
  // With a journal, a job's done or error and admission's answers go through the journal actor on
  // their way to egress, so that a journaled job's result leaves only once it is durable
  // (docs/durability.md). What needs no record goes straight (d.egress): `accepted` from the
  // router, the streamed chunks, and the end of a job that is not journaled; they never wait
  // behind the journal's fsync.
  EgressActor out = d.egress;
  JournalReplay replay;
  if (journal_path.empty() && !why_no_journal.empty()) log::info("no journal: " + why_no_journal);
  if (!journal_path.empty()) {
    JournalConfig jc = c.journal;
    jc.path = journal_path;
    auto file = open_journal(jc, c.admission.result_cache, replay);
    if (!replay.warning.empty()) log::warn("WARNING: " + replay.warning);
    log::info("journal " + file->path() + " (fsync " + c.journal.fsync +
              "): " + std::to_string(replay.records) + " records, " +
              std::to_string(replay.pending.size()) + " jobs to run again, " +
              std::to_string(replay.results.size()) + " results kept, " +
              std::to_string(replay.redeliver.size()) + " results to deliver again");
    d.journal =
        spawn_journal(*d.sys, jc, std::move(file), replay, c.admission.result_cache, d.egress,
                      /*own_thread=*/true);
    out = d.journal;
  }
  RouterOptions ro;
  ro.direct_egress = d.egress;
  d.router = spawn_router(*d.sys, c.router, out, AdmissionActor{}, c.admission.tenants, ro);
  if (d.journal)
    d.admission =
        spawn_admission(*d.sys, admission_cfg, effective_classes(c.router.classes),
                        c.router.default_class, d.model, d.router, out, d.journal, replay);
  else
    d.admission = spawn_admission(*d.sys, admission_cfg, effective_classes(c.router.classes),
                                  c.router.default_class, d.model, d.router, d.egress);

  // The supervisor runs between min and max batcher+executor pairs (a fixed executors.count
  // unless the autoscale section says otherwise) and replaces failed ones.
  SupervisorConfig sc;
  sc.knobs.min_executors =
      c.autoscale.min_executors > 0 ? c.autoscale.min_executors : c.executors.count;
  sc.knobs.max_executors = c.autoscale.max_executors > 0
                               ? c.autoscale.max_executors
                               : std::max(c.executors.count, sc.knobs.min_executors);
  sc.knobs.target_ongoing_per_executor = c.autoscale.target_ongoing_per_executor;
  sc.knobs.target_queue_wait_ms = c.autoscale.target_queue_wait_ms;
  sc.knobs.upscale_delay_ms = c.autoscale.upscale_delay_ms;
  sc.knobs.downscale_delay_ms = c.autoscale.downscale_delay_ms;
  sc.interval_ms = c.autoscale.interval_ms;
  // One slot per CUDA device for the cuda backend (a pair per device); CPU slots otherwise.
  sc.slots = policy::executor_slots(c.executors.backend == Backend::cuda, usable_cuda_devices(),
                                    sc.knobs.max_executors);
  // Engine threads: the cores split between the most executors that may run, at least one each.
  int threads = c.executors.threads;
  if (threads == 0)
    threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / sc.knobs.max_executors);
  // On a GPU with kv_memory_mb 0 (auto) each engine sizes its pool from the device's free
  // memory and the supervisor hands that size to the pair's batcher.
  const bool device_kv = c.executors.backend == Backend::cuda && c.batching.kv_memory_mb == 0;
  const int64_t kv_per_token =
      d.model ? d.model->limits().kv_bytes_per_token(c.batching.kv_dtype) : 0;
  // A model whose layers are of two kinds (gemma2) keeps its windowed layers' K/V in a pool of
  // their own on the CPU backend unless batching.layer_window_kv is keep; the CUDA engine keeps
  // one block table for all layers.
  const bool split = c.executors.backend == Backend::cpu && c.batching.release_layer_windows &&
                     d.model && d.model->limits().split_window() > 0;
  KvPools pools;
  if (split) {
    pools = kv_pools_for(c.batching, d.model->limits(), true);
  } else {
    pools.n_blocks = device_kv ? 0 : kv_blocks_for(c.batching, kv_per_token);
  }
  const int32_t n_blocks = pools.n_blocks;
  if (!device_kv && kv_per_token > 0) {
    // One line with every figure of the cache, so a change of batching.kv_dtype shows in the log.
    const int64_t bs = c.batching.kv_block_size;
    if (split) {
      const ModelLimits& lim = d.model->limits();
      const int64_t full = lim.kv_bytes_per_token_full(c.batching.kv_dtype);
      const int64_t win = lim.kv_bytes_per_token_window(c.batching.kv_dtype);
      log::info("KV cache per executor: " + std::to_string(n_blocks) + " blocks of " +
                std::to_string(bs) + " tokens for the full-attention layers (" +
                std::to_string(full) + " bytes a token) and " +
                std::to_string(pools.n_window_blocks) + " for the layers with a window of " +
                std::to_string(lim.split_window()) + " (" + std::to_string(win) +
                " bytes a token), K/V " + kernels::kv_type_name(c.batching.kv_dtype) + ", " +
                std::to_string((int64_t{n_blocks} * full + int64_t{pools.n_window_blocks} * win) *
                               bs / (1024 * 1024)) +
                " MiB");
    } else {
      log::info("KV cache per executor: " + std::to_string(n_blocks) + " blocks of " +
                std::to_string(bs) + " tokens, K/V " + kernels::kv_type_name(c.batching.kv_dtype) +
                ", " + std::to_string(kv_per_token) + " bytes a token, " +
                std::to_string((int64_t{n_blocks} * bs * kv_per_token) / (1024 * 1024)) + " MiB");
    }
  }
  sc.n_blocks = n_blocks;
  sc.executor.n_window_blocks = pools.n_window_blocks;
  sc.batching = c.batching;
  sc.executor.backend = c.executors.backend;
  sc.executor.model = d.model;
  sc.executor.draft_model = d.draft;
  sc.executor.constraints = constraints;
  sc.executor.threads = threads;
  sc.executor.cpu_priority = c.executors.cpu_priority;
  if (sc.executor.cpu_priority == CpuPriority::background)
    log::info(
        "executor threads: CPU priority background (they yield their cores to the request "
        "path's threads)");
  sc.executor.n_blocks = n_blocks;
  sc.executor.kv_gpu_fraction = c.batching.kv_gpu_fraction;
  sc.executor.kv_type = c.batching.kv_dtype;
  sc.executor.block_size = c.batching.kv_block_size;
  sc.executor.max_batch_tokens = static_cast<int32_t>(c.batching.step_token_budget);
  sc.executor.step_delay_ms = c.batching.step_delay_ms;
  sc.executor.test_fault_throw_after = c.executors.test_fault_throw_after;
  sc.test_fault_batcher_throw_after = c.executors.test_fault_batcher_throw_after;
  sc.executor.test_fault_hang_after = c.executors.test_fault_hang_after;
  sc.executor.test_nan_logits_token = c.executors.test_nan_logits_token;
  // Fail here, not inside the actor, when the executor cannot be built (bad backend or model).
  if (sc.executor.backend != Backend::null && !sc.executor.model)
    throw std::invalid_argument("the " + std::string(to_string(sc.executor.backend)) +
                                " backend needs a model");
  SupervisorWiring sw;
  sw.router = d.router;
  sw.egress = out;
  sw.direct_egress = d.egress;
  sw.admission = d.admission;
  sw.model = d.model;
  d.supervisor = spawn_supervisor(*d.sys, std::move(sc), std::move(sw));
  ControlWiring cw;
  cw.admin_token = c.admission.admin_token;
  cw.admission = d.admission;
  cw.router = d.router;
  cw.egress = d.egress;
  // A weak reference: the gateway owns the control handle, not the other way round.
  cw.edge_stats = [gw = std::weak_ptr<Gateway>(d.gateway)] {
    auto g = gw.lock();
    return g ? edge_stats(*g) : EdgeStats{};
  };
  d.control = spawn_control(*d.sys, std::move(cw));
  {
    // A round trip, not a plain send: the control actor must know the first batchers before the
    // gateway can hand it a command (the supervisor sends the list before it answers).
    std::string start_error;
    {
      caf::scoped_actor self{*d.sys};
      self->request(d.supervisor, std::chrono::seconds(10), connect_atom::value, d.control)
          .receive([&](std::string& e) { start_error = std::move(e); }, [](caf::error&) {});
    }
    if (!start_error.empty()) {
      // No executor could be built (the model or its KV cache does not fit the device): a
      // server that cannot run a job must not say "ready". Stop the actors, then report.
      shutdown(std::chrono::milliseconds(0));
      throw std::runtime_error(start_error);
    }
  }
  d.gateway->set_admission(d.admission);
  d.gateway->set_control(d.control);
  if (d.node) wire_cluster_node(*d.node, d.gateway, d.admission);
  if (d.http) d.http->set_admission(d.admission);
  if (!c.metrics.bind.empty()) {
    MetricsWiring mw;
    mw.admission = d.admission;
    mw.router = d.router;
    mw.supervisor = d.supervisor;
    mw.journal = d.journal;
    mw.gateway_stats = [gw = std::weak_ptr<Gateway>(d.gateway)] {
      auto g = gw.lock();
      return g ? edge_stats(*g) : EdgeStats{};
    };
    for (const auto& pc : effective_classes(c.router.classes)) mw.classes.push_back(pc.name);
    for (const auto& t : c.admission.tenants) mw.tenants.push_back(t.name);
    mw.max_tenant_labels = c.metrics.max_tenant_labels;
    d.metrics = spawn_metrics(*d.sys, std::move(mw));
    caf::anon_send(d.admission, observe_atom::value, d.metrics);
    caf::anon_send(d.supervisor, observe_atom::value, d.metrics);  // pairs now and later
    auto cluster_text = cluster_metrics(d.node);
    std::weak_ptr<HttpDoor> door = d.http;
    auto telemetry = std::make_shared<Telemetry>(c.metrics.gpu, c.metrics.test_fake_nvml, d.traces);
    auto extra = [cluster_text, door, telemetry] {
      std::string t = cluster_text ? cluster_text() : std::string();
      if (auto h = door.lock()) t += http_metrics_text(h->stats());
      return t + telemetry->text();
    };
    d.metrics_http = std::make_unique<MetricsEndpoint>(*d.sys, d.metrics, c.metrics.bind, extra);
  }
}

Server::~Server() {
  try {
    shutdown(std::chrono::milliseconds(0));
  } catch (...) {
    // A destructor must not throw; shutdown's failures only concern a process that is ending.
  }
}

void Server::start() {
  impl_->gateway->start();
  if (impl_->node) impl_->node->start();
  if (impl_->http) impl_->http->start();
  if (impl_->metrics_http) impl_->metrics_http->start();
  if (impl_->exporter) impl_->exporter->start();
  impl_->started = true;
}

std::string Server::endpoint() const {
  return impl_->gateway->endpoint();
}
std::string Server::pull_endpoint() const {
  return impl_->gateway->pull_endpoint();
}
std::string Server::results_endpoint() const {
  return impl_->gateway->results_endpoint();
}
std::string Server::http_endpoint() const {
  return impl_->http ? impl_->http->address() : std::string();
}
std::string Server::metrics_endpoint() const {
  return impl_->metrics_http ? impl_->metrics_http->address() : std::string();
}

ServerSnapshot Server::snapshot() {
  auto& d = *impl_;
  ServerSnapshot s;
  if (d.stopped) return s;
  // An actor that does not answer in time leaves its record at zero.
  s.admission = d.ask_stats<AdmissionStats>(d.admission).value_or(AdmissionStats{});
  s.router = d.ask_stats<RouterStats>(d.router).value_or(RouterStats{});
  // The supervisor sums its batchers' records and adds its own counters.
  s.supervisor = d.ask_stats<SupervisorStats>(d.supervisor).value_or(SupervisorStats{});
  static_cast<EdgeStats&>(s) = edge_stats(*d.gateway);
  if (d.journal) s.journal = d.ask_stats<JournalStats>(d.journal).value_or(JournalStats{});
  return s;
}

void Server::shutdown(std::chrono::milliseconds grace) {
  auto& d = *impl_;
  if (d.stopped) return;
  d.stopped = true;
  using clock = std::chrono::steady_clock;
  auto until = clock::now() + grace;
  // After the grace: a cancel takes effect within one engine step, and a second is ample for a
  // step while keeping a wedged engine from holding up the exit; then half a second to hand the
  // last results to ZeroMQ (results that finished or were cancelled should reach their clients).
  constexpr auto kCancelWait = std::chrono::seconds(1);
  constexpr auto kFinalDelivery = std::chrono::milliseconds(500);
  if (d.started) {
    // Phase 1: no new work. The gateway keeps reading both client sockets and answers every new
    // submit `unavailable` itself (clients fail over at once instead of waiting on silence;
    // cancel and status still reach the jobs that finish); admission answers `unavailable` to
    // submits read before; the router stops granting PULL credit. The gateway is told first:
    // a submit it passed on after admission heard of the drain is refused there.
    d.gateway->refuse_submits(until + kCancelWait + kFinalDelivery);
    if (d.http) d.http->refuse_submits();
    if (d.node) d.node->stop_fetching();  // its running jobs finish, or go back (below)
    caf::anon_send(d.admission, drain_atom::value);
    caf::anon_send(d.router, drain_atom::value);
    // Phase 2: let admitted jobs finish within the grace period. Polled every 20 ms: shutdown
    // is rare, and a short poll keeps an idle server's exit quick.
    while (clock::now() < until) {
      auto s = d.ask_stats<AdmissionStats>(d.admission);
      if (!s || s->active == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Phase 3: grace is over: cancel what still runs, so that its clients get done with
    // finish_reason "cancelled" instead of silence.
    auto s = d.ask_stats<AdmissionStats>(d.admission);
    // A cluster job still running goes back to JetStream for another node, not cancelled.
    if (d.node && s && s->active > 0) d.node->release_running();
    if (s && s->active > 0) {
      caf::anon_send(d.admission, cancel_atom::value, drain_atom::value);
      auto cancel_until = clock::now() + kCancelWait;
      while (clock::now() < cancel_until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        auto t = d.ask_stats<AdmissionStats>(d.admission);
        if (!t || t->active == 0) break;
      }
    }
    // Phase 4: deliver what is queued for the clients, close the sockets.
    d.gateway->stop(kFinalDelivery);
    if (d.node) d.node->stop(kFinalDelivery);
    // The HTTP door's last answers were posted with the gateway's: it closes after them.
    if (d.http) d.http->stop();
  } else {
    d.gateway->stop(std::chrono::milliseconds(0));
    if (d.node) d.node->stop(std::chrono::milliseconds(0));
    if (d.http) d.http->stop();
  }
  // Phase 5: stop every actor; the system's destructor waits for them.
  auto stop = [](const auto& a) {
    if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  // The HTTP thread asks actors through the system: it stops before them.
  if (d.metrics_http) d.metrics_http->stop();
  if (d.exporter) d.exporter->stop();  // the last spans, once every job has ended
  stop(d.metrics);
  d.metrics = MetricsActor{};
  stop(d.control);
  stop(d.admission);
  stop(d.router);
  stop(d.supervisor);  // stops its pairs first
  d.supervisor = SupervisorActor{};
  stop(d.journal);
  stop(d.egress);
  d.admission = AdmissionActor{};
  d.router = RouterActor{};
  d.egress = EgressActor{};
  d.control = ControlActor{};
  d.journal = JournalActor{};
  d.sys.reset();
  d.gateway.reset();
  d.http.reset();
}

std::string ServerSnapshot::to_json() const {
  return summary_json(admission, router, supervisor.batchers, *this, &supervisor, &journal,
                      nullptr);
}

void Server::block_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A peer that vanishes must never kill the process through a write.
  signal(SIGPIPE, SIG_IGN);
}

int Server::wait_for_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace sy
