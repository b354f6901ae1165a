// The control actor (see control.hpp): admin-token check, KV-policy swaps fanned out to every
// batcher, and the stats gathered from admission, router and batchers into one JSON object.
#include "actors/control.hpp"

#include <caf/all.hpp>
#include <memory>
#include <nlohmann/json.hpp>

#include "actors/admission.hpp"
#include "actors/messages.hpp"
#include "core/wire.hpp"
#include "core/error_code.hpp"
#include "policies/kv_policy.hpp"

namespace sy {
namespace {

// Why a request to an actor failed, for the operator.
void describe_failure(const caf::error& err, const std::string& who, ErrorCode& code,
                      std::string& message) {
  if (err == caf::sec::request_timeout) {
    code = ErrorCode::unavailable;
    message = who + " did not answer in time";
  } else {
    code = ErrorCode::internal;
    message = who + " failed: " + caf::to_string(err);
  }
}

// One command in progress: the answers still owed and the first failure seen.
struct Pending {
  ControlRequest req;
  size_t owed = 0;
  bool failed = false;
  ErrorCode code = ErrorCode::internal;
  std::string message;
  AdmissionStats admission;
  RouterStats router;
  std::vector<BatcherStats> batchers;
  std::string policy_name;

  void fail(ErrorCode c, std::string m) {
    if (failed) return;  // the first failure is the one the operator needs to see
    failed = true;
    code = c;
    message = std::move(m);
  }
};

struct ControlState {
  ControlWiring w;
};

using Self = ControlActor::stateful_base<ControlState>;

void reply_error(Self* self, const ClientRef& to, ErrorCode code, std::string message) {
  if (!self->state.w.egress) return;
  ErrorEvent e;
  e.to = to;
  e.code = code;
  e.message = std::move(message);
  self->send(self->state.w.egress, out_atom::value, std::move(e));
}

void reply_ok(Self* self, const ClientRef& to, const std::string& command, std::string result) {
  if (!self->state.w.egress) return;
  self->send(self->state.w.egress, out_atom::value, ControlEvent{to, command, std::move(result)});
}

// Sends the one reply of a finished command.
void complete(Self* self, Pending& p) {
  if (p.failed) {
    reply_error(self, p.req.client, p.code, p.message);
    return;
  }
  if (p.req.command == "kv_policy") {
    // The same layout as the stats reply (", " and ": "); nlohmann writes the policy string.
    reply_ok(self, p.req.client, p.req.command,
             "{\"kv_policy\": " + nlohmann::json(p.policy_name).dump() +
                 ", \"batchers\": " + std::to_string(p.batchers.size()) + "}");
    return;
  }
  EdgeStats edge;
  if (self->state.w.edge_stats) edge = self->state.w.edge_stats();
  reply_ok(self, p.req.client, p.req.command,
           control_stats_json(p.admission, p.router, p.batchers, edge));
}

void answered(Self* self, const std::shared_ptr<Pending>& p) {
  if (--p->owed == 0) complete(self, *p);
}

// The error handler of one request of a pending command: the failure is recorded (the first one
// becomes the reply) and the answer counted.
auto failure_handler(Self* self, std::shared_ptr<Pending> p, std::string who) {
  return [self, p, who](caf::error& err) {
    ErrorCode code;
    std::string message;
    describe_failure(err, who, code, message);
    p->fail(code, message);
    answered(self, p);
  };
}

void kv_policy(Self* self, ControlRequest& req) {
  std::string why;
  auto parsed = policy::parse_kv_policy(req.policy, &why);
  if (!parsed) {
    // The parser's reason quotes the text raw: it goes along only when the text needs no
    // escaping, so that client bytes reach a message one way only (wire::quoted).
    const std::string shown = wire::quoted(req.policy);
    const bool plain = shown == "'" + req.policy + "'";
    reply_error(self, req.client, ErrorCode::bad_request,
                "bad kv policy " + shown + ": " +
                    (plain ? why : std::string("bytes outside printable ASCII")));
    return;
  }
  auto p = std::make_shared<Pending>();
  p->req = std::move(req);
  p->policy_name = policy::to_string(*parsed);
  const auto& bs = self->state.w.batchers;
  p->batchers.resize(bs.size());
  p->owed = bs.size();
  if (p->owed == 0) {
    complete(self, *p);
    return;
  }
  for (size_t i = 0; i < bs.size(); ++i) {
    const std::string who = "batcher " + std::to_string(i);
    self->request(bs[i], self->state.w.ask_timeout, kvpolicy_atom::value, *parsed)
        .then(
            [=](std::string& refusal) {
              if (!refusal.empty()) p->fail(ErrorCode::bad_request, refusal);
              answered(self, p);
            },
            failure_handler(self, p, who));
  }
}

// Where one stats answer of type R goes in a pending command.
template <class R>
struct Keep {
  using record_type = R;
  std::function<void(Pending&, R&)> put;
  void operator()(Pending& p, R& r) const { put(p, r); }
};

void stats(Self* self, ControlRequest& req) {
  auto p = std::make_shared<Pending>();
  p->req = std::move(req);
  const auto& w = self->state.w;
  if (!w.admission || !w.router) {
    reply_error(self, p->req.client, ErrorCode::unavailable, "the server is not wired yet");
    return;
  }
  p->batchers.resize(w.batchers.size());
  p->owed = 2 + w.batchers.size();
  // Each answer lands in its own place: `keep` moves the record there.
  auto ask = [&](const auto& a, auto keep, const std::string& who) {
    self->request(a, w.ask_timeout, stats_atom::value)
        .then(
            [=](typename decltype(keep)::record_type& s) {
              keep(*p, s);
              answered(self, p);
            },
            failure_handler(self, p, who));
  };
  ask(w.admission, Keep<AdmissionStats>{[](Pending& q, AdmissionStats& s) { q.admission = s; }},
      "admission");
  ask(w.router, Keep<RouterStats>{[](Pending& q, RouterStats& s) { q.router = std::move(s); }},
      "router");
  for (size_t i = 0; i < w.batchers.size(); ++i)
    ask(w.batchers[i],
        Keep<BatcherStats>{[i](Pending& q, BatcherStats& s) { q.batchers[i] = std::move(s); }},
        "batcher " + std::to_string(i));
}

// The operator's drain: admission refuses new submits (`unavailable`) and the router stops PULL
// credit, so queued and running jobs finish and nothing new comes in; resume undoes both. The
// reply is the stats (asked after the drain messages, which admission and the router therefore
// handle first: one sender's messages keep their order), with "draining" in it.
void drain(Self* self, ControlRequest& req, bool on) {
  const auto& w = self->state.w;
  if (!w.admission || !w.router) {
    reply_error(self, req.client, ErrorCode::unavailable, "the server is not wired yet");
    return;
  }
  self->send(w.admission, drain_atom::value, on);
  self->send(w.router, drain_atom::value, on);
  log_line(std::string("control: ") + (on ? "drain: no new jobs until `resume`" : "resume"));
  stats(self, req);
}

}  // namespace

std::string control_stats_json(const AdmissionStats& admission, const RouterStats& router,
                               const std::vector<BatcherStats>& batchers, const EdgeStats& edge) {
  return summary_json(admission, router, sum_of(batchers), edge, nullptr, nullptr, &batchers);
}

ControlActor spawn_control(caf::actor_system& sys, ControlWiring wiring) {
  return sys.spawn([w = std::move(wiring)](Self* self) mutable -> ControlActor::behavior_type {
    self->state.w = std::move(w);
    return {
        // The supervisor's current batchers (elastic pairs come and go).
        [self](connect_atom, std::vector<BatcherActor>& bs) {
          self->state.w.batchers = std::move(bs);
        },
        [self](control_atom, ControlRequest& req) {
          const std::string& admin = self->state.w.admin_token;
          if (admin.empty()) {
            reply_error(self, req.client, ErrorCode::unauthorized,
                        "control commands are off: the server has no admin token");
            return;
          }
          if (req.token.empty()) {
            reply_error(self, req.client, ErrorCode::unauthorized,
                        "control commands need the admin token");
            return;
          }
          if (!tokens_equal(admin, req.token)) {
            reply_error(self, req.client, ErrorCode::unauthorized, "wrong admin token");
            return;
          }
          if (req.command == "kv_policy")
            kv_policy(self, req);
          else if (req.command == "stats")
            stats(self, req);
          else if (req.command == "drain" || req.command == "resume")
            drain(self, req, req.command == "drain");
          else
            reply_error(self, req.client, ErrorCode::bad_request,
                        "unknown control command " + wire::quoted(req.command));
        },
    };
  });
}

}  // namespace sy
