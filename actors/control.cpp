// The control actor (see control.hpp): admin-token check, KV-policy swaps fanned out to every
// batcher, and the stats gathered from admission, router and batchers into one JSON object.
#include "actors/control.hpp"

#include <caf/all.hpp>
#include <cstdio>
#include <memory>

#include "actors/admission.hpp"
#include "actors/messages.hpp"
#include "ingress/codec.hpp"
#include "ingress/error_code.hpp"
#include "policies/kv_policy.hpp"

namespace sy {
namespace {

// `s` as a JSON string literal. Policy names and stats keys are ASCII; control bytes are escaped
// anyway so the reply always parses.
std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string string_of(const caf::settings& s, const std::string& name) {
  auto it = s.find(name);
  if (it == s.end()) return "";
  if (auto v = caf::get_if<std::string>(&it->second)) return *v;
  return "";
}

// Builds `{"k": v, ...}` one field at a time.
class JsonObject {
 public:
  void raw(const std::string& k, const std::string& v) {
    out_ += out_.size() > 1 ? ", " : "";
    out_ += json_str(k) + ": " + v;
  }
  void num(const std::string& k, int64_t v) { raw(k, std::to_string(v)); }
  void str(const std::string& k, const std::string& v) { raw(k, json_str(v)); }
  std::string finish() const { return out_ + "}"; }

 private:
  std::string out_ = "{";
};

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
  caf::settings admission, router;
  std::vector<caf::settings> batchers;
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

using Self = caf::stateful_actor<ControlState>;

void reply_error(Self* self, const ClientRef& to, ErrorCode code, std::string message) {
  if (!self->state.w.egress) return;
  ErrorEvent e;
  e.to = to;
  e.code = static_cast<uint8_t>(code);
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
    JsonObject o;
    o.str("kv_policy", p.policy_name);
    o.num("batchers", static_cast<int64_t>(p.batchers.size()));
    reply_ok(self, p.req.client, p.req.command, o.finish());
    return;
  }
  caf::settings extra;
  if (self->state.w.extra_stats) self->state.w.extra_stats(extra);
  reply_ok(self, p.req.client, p.req.command,
           control_stats_json(p.admission, p.router, p.batchers, extra));
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
  auto ask = [&](const caf::actor& a, caf::settings Pending::*field, size_t index,
                 const std::string& who) {
    self->request(a, w.ask_timeout, stats_atom::value)
        .then(
            [=](caf::settings& s) {
              if (field)
                (*p).*field = std::move(s);
              else
                p->batchers[index] = std::move(s);
              answered(self, p);
            },
            failure_handler(self, p, who));
  };
  ask(w.admission, &Pending::admission, 0, "admission");
  ask(w.router, &Pending::router, 0, "router");
  for (size_t i = 0; i < w.batchers.size(); ++i)
    ask(w.batchers[i], nullptr, i, "batcher " + std::to_string(i));
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

int64_t stats_counter(const caf::settings& s, const std::string& name) {
  auto it = s.find(name);
  if (it == s.end()) return 0;
  if (auto v = caf::get_if<int64_t>(&it->second)) return *v;
  if (auto v = caf::get_if<bool>(&it->second)) return *v ? 1 : 0;
  if (auto v = caf::get_if<double>(&it->second)) return static_cast<int64_t>(*v);
  return 0;
}

std::string control_stats_json(const caf::settings& admission, const caf::settings& router,
                               const std::vector<caf::settings>& batchers,
                               const caf::settings& extra) {
  JsonObject o;
  o.num("active_jobs", stats_counter(admission, "active"));
  o.num("admitted", stats_counter(admission, "admitted"));
  o.num("overloaded", stats_counter(admission, "overloaded"));
  o.num("draining", stats_counter(admission, "draining"));
  o.num("queued", stats_counter(router, "queued"));
  o.num("dispatched", stats_counter(router, "dispatched"));
  o.num("expired", stats_counter(router, "expired"));
  o.num("affinity_hits", stats_counter(router, "affinity_hits"));
  o.num("affinity_overruled", stats_counter(router, "affinity_overruled"));
  auto sum = [&](const char* k) {
    int64_t t = 0;
    for (const auto& b : batchers) t += stats_counter(b, k);
    return t;
  };
  for (const char* k : {"running", "blocks_used", "blocks_total", "blocks_cached", "preemptions",
                        "steps", "policy_swaps", "prefix_hit_tokens", "seq_failures"})
    o.num(k, sum(k));
  for (const auto& [k, v] : extra) o.num(k, stats_counter(extra, k));
  std::string arr = "[";
  for (size_t i = 0; i < batchers.size(); ++i) {
    const auto& b = batchers[i];
    JsonObject bo;
    bo.str("kv_policy", string_of(b, "kv_policy"));
    for (const char* k :
         {"policy_swaps", "pressure_swaps", "pressure", "blocks_used", "blocks_cached",
          "blocks_used_peak", "window_blocks_used", "window_blocks_used_peak", "prefix_hit_blocks",
          "prefix_hit_tokens", "preemptions"})
      bo.num(k, stats_counter(b, k));
    arr += (i ? ", " : "") + bo.finish();
  }
  o.raw("batchers", arr + "]");
  return o.finish();
}

caf::actor spawn_control(caf::actor_system& sys, ControlWiring wiring) {
  return sys.spawn([w = std::move(wiring)](Self* self) mutable -> caf::behavior {
    self->state.w = std::move(w);
    return {
        // The supervisor's current batchers (elastic pairs come and go).
        [self](connect_atom, std::vector<caf::actor>& bs) {
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
