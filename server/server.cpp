// The wiring of a whole server process (see server.hpp): actor system, model, actors, gateway,
// and the ordered graceful shutdown.
#include "server/server.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <caf/all.hpp>
#include <iostream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "actors/admission.hpp"
#include "actors/batcher.hpp"
#include "actors/control.hpp"
#include "actors/executor.hpp"
#include "actors/messages.hpp"
#include "actors/router.hpp"
#include "model/llama.hpp"
#include "server/egress.hpp"
#include "server/gateway.hpp"

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

// An int64 counter of a stats dictionary, 0 when absent.
int64_t counter(const caf::settings& s, const char* name) {
  auto it = s.find(name);
  if (it == s.end()) return 0;
  if (auto v = caf::get_if<int64_t>(&it->second)) return *v;
  return 0;
}

}  // namespace

struct Server::Impl {
  ServerConfig cfg;
  SystemConfig sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<LlamaModel> model;
  std::shared_ptr<Gateway> gateway;
  caf::actor egress, router, admission, control;
  std::vector<caf::actor> executors, batchers;
  bool started = false;
  bool stopped = false;

  // Asks one actor for its stats (a caf::settings), empty on timeout or error.
  caf::settings ask_stats(const caf::actor& a) {
    caf::settings out;
    if (!a) return out;
    caf::scoped_actor self{*sys};
    // A second is long enough for an actor that is merely busy; a stuck one must not hang us.
    self->request(a, std::chrono::seconds(1), stats_atom::value)
        .receive([&](caf::settings& s) { out = std::move(s); }, [&](caf::error&) {});
    return out;
  }
};

Server::Server(ServerConfig cfg) : impl_(new Impl) {
  auto& d = *impl_;
  d.cfg = std::move(cfg);
  const auto& c = d.cfg;
  if (c.executors.backend == "cpu") {
    if (c.model.empty()) throw std::invalid_argument("the cpu backend needs a model file");
    d.model = LlamaModel::load(c.model);
  } else if (c.executors.backend != "null") {
    throw std::invalid_argument("unknown backend '" + c.executors.backend + "' (cpu or null)");
  }
  d.sys = std::make_unique<caf::actor_system>(d.sys_cfg);

  // The edge refuses what admission would refuse anyway, before anything is allocated.
  GatewayOptions go;
  uint32_t ctx = d.model ? static_cast<uint32_t>(d.model->config().ctx_len) : 0;
  uint32_t max_prompt = c.admission.max_prompt_tokens;
  if (max_prompt == 0 || (ctx > 0 && max_prompt > ctx)) max_prompt = ctx;
  if (max_prompt > 0) go.limits.max_prompt_tokens = max_prompt;
  go.limits.max_new_tokens = c.admission.max_output_tokens;
  d.gateway = std::make_shared<Gateway>(c.endpoints, go);

  d.egress = spawn_egress(*d.sys, d.gateway);
  d.router = spawn_router(*d.sys, c.router, d.egress, caf::actor{}, c.admission.tenants);
  d.admission = spawn_admission(*d.sys, c.admission, effective_classes(c.router.classes),
                                c.router.default_class, d.model, d.router, d.egress);

  // Engine threads: the cores split between the executors, at least one each.
  int threads = c.executors.threads;
  if (threads == 0)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / c.executors.count);
  int32_t n_blocks = kv_blocks_for(c.batching, d.model ? &d.model->config() : nullptr);
  for (int i = 0; i < c.executors.count; ++i) {
    ExecutorSpec spec;
    spec.backend = c.executors.backend;
    spec.model = d.model;
    spec.threads = threads;
    spec.n_blocks = n_blocks;
    spec.block_size = c.batching.kv_block_size;
    spec.max_batch_tokens = static_cast<int32_t>(c.batching.step_token_budget);
    spec.step_delay_ms = c.batching.step_delay_ms;
    auto ex = spawn_executor(*d.sys, spec);
    d.executors.push_back(ex);
    d.batchers.push_back(
        spawn_batcher(*d.sys, c.batching, d.model, ex, d.router, d.egress, d.admission, n_blocks));
  }
  ControlWiring cw;
  cw.admin_token = c.admission.admin_token;
  cw.admission = d.admission;
  cw.router = d.router;
  cw.egress = d.egress;
  cw.batchers = d.batchers;
  // A weak reference: the gateway owns the control handle, not the other way round.
  cw.extra_stats = [gw = std::weak_ptr<Gateway>(d.gateway)](caf::settings& s) {
    if (auto g = gw.lock()) {
      auto st = g->stats();
      caf::put(s, "received", static_cast<int64_t>(st.received));
      caf::put(s, "sent", static_cast<int64_t>(st.sent));
      caf::put(s, "decode_errors", static_cast<int64_t>(st.decode_errors));
    }
  };
  d.control = spawn_control(*d.sys, std::move(cw));
  d.gateway->set_admission(d.admission);
  d.gateway->set_control(d.control);
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
  impl_->started = true;
}

std::string Server::endpoint() const { return impl_->gateway->endpoint(); }
std::string Server::pull_endpoint() const { return impl_->gateway->pull_endpoint(); }
std::string Server::results_endpoint() const { return impl_->gateway->results_endpoint(); }

ServerSnapshot Server::snapshot() {
  auto& d = *impl_;
  ServerSnapshot s;
  if (d.stopped) return s;
  auto a = d.ask_stats(d.admission);
  s.active_jobs = counter(a, "active");
  s.admitted = counter(a, "admitted");
  s.overloaded = counter(a, "overloaded");
  auto r = d.ask_stats(d.router);
  s.queued = counter(r, "queued");
  s.dispatched = counter(r, "dispatched");
  s.expired = counter(r, "expired");
  for (auto& b : d.batchers) {
    auto bs = d.ask_stats(b);
    s.running += counter(bs, "running");
    s.blocks_used += counter(bs, "blocks_used");
    s.blocks_total += counter(bs, "blocks_total");
    s.blocks_cached += counter(bs, "blocks_cached");
    s.policy_swaps += counter(bs, "policy_swaps");
    s.prefix_hit_tokens += counter(bs, "prefix_hit_tokens");
    s.preemptions += counter(bs, "preemptions");
    s.steps += counter(bs, "steps");
  }
  auto g = d.gateway->stats();
  s.received = g.received;
  s.sent = g.sent;
  s.decode_errors = g.decode_errors;
  return s;
}

void Server::shutdown(std::chrono::milliseconds grace) {
  auto& d = *impl_;
  if (d.stopped) return;
  d.stopped = true;
  using clock = std::chrono::steady_clock;
  auto until = clock::now() + grace;
  if (d.started) {
    // Phase 1: no new work. The gateway stops reading; admission answers `unavailable` to what
    // was already read; the router stops granting PULL credit.
    d.gateway->stop_reading();
    caf::anon_send(d.admission, drain_atom::value);
    caf::anon_send(d.router, drain_atom::value);
    // Phase 2: let admitted jobs finish within the grace period. Polled every 20 ms: shutdown
    // is rare, and a short poll keeps an idle server's exit quick.
    while (clock::now() < until) {
      auto s = d.ask_stats(d.admission);
      if (s.empty() || counter(s, "active") == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Phase 3: grace is over: cancel what still runs, so that its clients get done with
    // finish_reason "cancelled" instead of silence. A cancel takes effect within one engine
    // step; a second is ample for a step and keeps a wedged engine from holding up the exit.
    auto s = d.ask_stats(d.admission);
    if (counter(s, "active") > 0) {
      caf::anon_send(d.admission, cancel_atom::value, drain_atom::value);
      auto cancel_until = clock::now() + std::chrono::seconds(1);
      while (clock::now() < cancel_until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        auto t = d.ask_stats(d.admission);
        if (t.empty() || counter(t, "active") == 0) break;
      }
    }
    // Phase 4: deliver what is queued for the clients (up to 500 ms: results that finished
    // or were cancelled should reach their clients), close the sockets.
    d.gateway->stop(std::chrono::milliseconds(500));
  } else {
    d.gateway->stop(std::chrono::milliseconds(0));
  }
  // Phase 5: stop every actor; the system's destructor waits for them.
  auto stop = [](const caf::actor& a) {
    if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  stop(d.control);
  stop(d.admission);
  stop(d.router);
  for (auto& b : d.batchers) stop(b);
  for (auto& e : d.executors) stop(e);
  stop(d.egress);
  d.admission = d.router = d.egress = d.control = caf::actor{};
  d.batchers.clear();
  d.executors.clear();
  d.sys.reset();
  d.gateway.reset();
}

std::string ServerSnapshot::to_json() const {
  std::string j = "{";
  auto put = [&](const char* k, auto v) {
    if (j.size() > 1) j += ", ";
    j += '"';
    j += k;
    j += "\": ";
    j += std::to_string(v);
  };
  put("active_jobs", active_jobs);
  put("admitted", admitted);
  put("overloaded", overloaded);
  put("queued", queued);
  put("dispatched", dispatched);
  put("expired", expired);
  put("running", running);
  put("blocks_used", blocks_used);
  put("blocks_total", blocks_total);
  put("blocks_cached", blocks_cached);
  put("preemptions", preemptions);
  put("steps", steps);
  put("policy_swaps", policy_swaps);
  put("prefix_hit_tokens", prefix_hit_tokens);
  put("received", received);
  put("sent", sent);
  put("decode_errors", decode_errors);
  return j + "}";
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
