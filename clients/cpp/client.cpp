// The C++ client library: DEALER / PUSH / PULL sockets speaking the msgpack protocol v1.
#include "clients/cpp/client.hpp"

#include <sstream>

#include "ingress/curve.hpp"

namespace sy::client {
namespace {

// Decode limits on the client side: the server's messages are trusted more than clients', but a
// non-streamed done carries the whole completion, so arrays may be as long as any max_tokens.
wire::DecodeLimits client_limits() {
  wire::DecodeLimits l;
  l.max_message_bytes = 64u << 20;  // a done with a long text and its ids
  l.max_string_bytes = 64u << 20;
  return l;
}

// A DEALER or a sink closes at once: unsent requests of a client that gave up should not keep a
// process alive.
constexpr int kLinger = 0;
// A Pusher's jobs were handed over: a producer that pushes and exits must not lose what ZeroMQ
// still holds, but a server that is gone must not keep it forever either.
constexpr int kPusherLingerMs = 60000;

zmq::socket_t make(zmq::context_t& ctx, zmq::socket_type t, const std::string& endpoint,
                   const ClientOptions& o = {}) {
  zmq::socket_t s(ctx, t);
  s.set(zmq::sockopt::linger, t == zmq::socket_type::push ? kPusherLingerMs : kLinger);
  // Receive options count only when set before connect.
  s.set(zmq::sockopt::rcvhwm, o.rcvhwm);
  if (o.rcvbuf >= 0) s.set(zmq::sockopt::rcvbuf, o.rcvbuf);
  // CURVE options, like the receive ones, count only when set before connect.
  if (!o.server_key.empty()) curve::make_client(s.handle(), o.server_key, o.client_key);
  s.connect(endpoint);
  return s;
}

std::optional<wire::ServerMessage> recv_one(zmq::socket_t& s, milliseconds timeout) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
  zmq::message_t msg;
  if (!s.recv(msg, zmq::recv_flags::dontwait)) return std::nullopt;
  static const wire::DecodeLimits limits = client_limits();
  auto d = wire::decode_server(msg.data(), msg.size(), limits);
  if (auto* e = std::get_if<wire::DecodeError>(&d))
    throw ClientError("undecodable server message: " + e->message);
  return std::get<wire::ServerMessage>(std::move(d));
}

bool send_timed(zmq::socket_t& s, const void* data, std::size_t size, milliseconds timeout) {
  zmq::message_t msg(data, size);
  if (timeout.count() < 0) {
    s.send(msg, zmq::send_flags::none);
    return true;
  }
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLOUT, 0};
  if (zmq::poll(&item, 1, timeout) == 0) return false;
  return s.send(msg, zmq::send_flags::dontwait).has_value();
}

}  // namespace

std::string read_server_key(const std::string& path) {
  return curve::read_key_file(path, "CURVE server public key");
}

std::string read_client_key(const std::string& path) {
  return curve::read_key_file(path, "CURVE client secret key");
}

// ---- Client ----

Client::Client(const std::string& endpoint)
    : own_ctx_(std::make_unique<zmq::context_t>(1)),
      sock_(make(*own_ctx_, zmq::socket_type::dealer, endpoint)) {}

Client::Client(const std::string& endpoint, const ClientOptions& options)
    : own_ctx_(std::make_unique<zmq::context_t>(1)),
      sock_(make(*own_ctx_, zmq::socket_type::dealer, endpoint, options)) {}

Client::Client(zmq::context_t& ctx, const std::string& endpoint)
    : sock_(make(ctx, zmq::socket_type::dealer, endpoint)) {}

void Client::send(const wire::ClientMessage& m) {
  auto bytes = wire::encode_client(m);
  send_raw(bytes.data(), bytes.size());
}

void Client::send_raw(const void* data, std::size_t size) {
  zmq::message_t msg(data, size);
  sock_.send(msg, zmq::send_flags::none);
}

void Client::cancel(const std::string& id, const std::string& tenant, const std::string& token) {
  send(wire::Cancel{id, tenant, token});
}

void Client::status(const std::string& id, const std::string& tenant, const std::string& token) {
  send(wire::Status{id, tenant, token});
}

std::optional<wire::ServerMessage> Client::recv(milliseconds timeout) {
  return recv_one(sock_, timeout);
}

std::optional<wire::ServerMessage> Client::next(milliseconds timeout) {
  if (!pending_.empty()) {
    auto m = std::move(pending_.front());
    pending_.pop_front();
    return m;
  }
  return recv(timeout);
}

Result Client::run(const wire::Submit& s, milliseconds timeout) {
  submit(s);
  return wait(s.id, timeout, s.tenant);
}

Result Client::wait(const std::string& id, milliseconds timeout, const std::string& tenant) {
  return collect_job(
      pending_, [this](milliseconds t) { return recv(t); }, id, timeout, tenant);
}

void Client::tool_result(const wire::ToolCall& call, std::string content,
                         const std::string& token) {
  send(wire::ToolResult{call.id, call.tenant, token, call.call, std::move(content)});
}

Result Client::run_program(const wire::Submit& s, const ToolHandler& tools, milliseconds timeout) {
  submit(s);
  return collect_job(
      pending_, [this](milliseconds t) { return recv(t); }, s.id, timeout, s.tenant,
      [&](const wire::ToolCall& c) {
        if (!tools) return;
        if (auto content = tools(c)) {
          wire::ToolCall named = c;
          // A tool_call names the program's tenant; an older server might leave it out.
          if (named.tenant.empty()) named.tenant = s.tenant;
          tool_result(named, std::move(*content), s.token);
        }
      });
}

const wire::Var* Result::var(std::string_view name) const {
  if (!done) return nullptr;
  for (const wire::Var& v : done->vars)
    if (v.name == name) return &v;
  return nullptr;
}

std::string Result::step_text(std::string_view path) const {
  std::string text;
  for (const wire::Tokens& t : chunks)
    if (t.step == path) text += t.text;
  return text;
}

Result collect_job(std::deque<wire::ServerMessage>& pending,
                   const std::function<std::optional<wire::ServerMessage>(milliseconds)>& recv,
                   const std::string& id, milliseconds timeout, const std::string& tenant,
                   const std::function<void(const wire::ToolCall&)>& on_tool_call) {
  Result r;
  // Replies name their tenant: one connection may run the same id for two tenants.
  auto is_mine = [&](const wire::ServerMessage& m) {
    if (message_id(m) != id) return false;
    const std::string t = message_tenant(m);
    return tenant.empty() || t.empty() || t == tenant;
  };
  // First what was set aside earlier for this job, then the socket.
  std::deque<wire::ServerMessage> mine;
  for (auto it = pending.begin(); it != pending.end();) {
    if (is_mine(*it)) {
      mine.push_back(std::move(*it));
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
  for (;;) {
    std::optional<wire::ServerMessage> m;
    if (!mine.empty()) {
      m = std::move(mine.front());
      mine.pop_front();
    } else {
      m = recv(timeout);
      if (!m) {
        r.timed_out = true;
        return r;
      }
      if (!is_mine(*m)) {
        pending.push_back(std::move(*m));
        continue;
      }
    }
    const bool tool_call = std::holds_alternative<wire::ToolCall>(*m);
    if (add_to_result(r, std::move(*m))) return r;
    if (tool_call && on_tool_call) on_tool_call(r.tool_calls.back());
  }
}

bool add_to_result(Result& r, wire::ServerMessage&& m) {
  if (auto* a = std::get_if<wire::Accepted>(&m)) {
    r.accepted = *a;
  } else if (auto* t = std::get_if<wire::Tokens>(&m); t && !t->step.empty()) {
    // A program's chunk belongs to one of its steps, not to the program's own result.
    r.chunks.push_back(std::move(*t));
  } else if (auto* t = std::get_if<wire::Tokens>(&m)) {
    if (r.choices.size() <= t->choice) r.choices.resize(t->choice + std::size_t{1});
    wire::Choice& c = r.choices[t->choice];
    c.index = t->choice;
    c.ids.insert(c.ids.end(), t->ids.begin(), t->ids.end());
    c.text += t->text;
    c.logprobs.insert(c.logprobs.end(), t->logprobs.begin(), t->logprobs.end());
    if (t->choice == 0) {
      r.ids.insert(r.ids.end(), t->ids.begin(), t->ids.end());
      r.text += t->text;
      r.logprobs.insert(r.logprobs.end(), t->logprobs.begin(), t->logprobs.end());
    }
    r.chunks.push_back(std::move(*t));
  } else if (auto* d = std::get_if<wire::Done>(&m)) {
    // A streamed job's done has no text/ids (the chunks carried them).
    if (!d->ids.empty() || !d->text.empty()) {
      r.ids = d->ids;
      r.text = d->text;
    } else if (!r.steps.empty()) {
      // A program's text is its last top-level step's output, which its step event carried.
      for (auto it = r.steps.rbegin(); it != r.steps.rend(); ++it)
        if (it->step.find('.') == std::string::npos) {
          r.text = it->output;
          break;
        }
    }
    if (!d->logprobs.empty()) r.logprobs = d->logprobs;
    if (d->choices.empty()) {
      r.choices.clear();  // one sample: its chunks are the job's own
    } else {
      r.ids.clear();  // several samples: each is in choices, the job's own fields stay empty
      r.text.clear();
      r.logprobs.clear();
      if (r.choices.size() < d->choices.size()) r.choices.resize(d->choices.size());
      for (const wire::Choice& c : d->choices) {
        if (c.index >= r.choices.size()) continue;
        wire::Choice& into = r.choices[c.index];
        into.index = c.index;
        into.finish_reason = c.finish_reason;
        if (!c.ids.empty() || !c.text.empty()) {
          into.ids = c.ids;
          into.text = c.text;
        }
        if (!c.logprobs.empty()) into.logprobs = c.logprobs;
      }
    }
    r.done = std::move(*d);
    return true;
  } else if (auto* e = std::get_if<wire::Error>(&m)) {
    r.error = std::move(*e);
    return true;
  } else if (auto* st = std::get_if<wire::Step>(&m)) {
    r.steps.push_back(std::move(*st));
  } else if (auto* tc = std::get_if<wire::ToolCall>(&m)) {
    r.tool_calls.push_back(std::move(*tc));
  }
  // status replies for this id are not part of the job's stream: ignored here
  return false;
}

ControlResult Client::control(const std::string& command, const std::string& policy,
                              const std::string& token, milliseconds timeout) {
  send(wire::Control{token, command, policy});
  ControlResult r;
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
    auto m = left.count() > 0 ? recv(left) : std::nullopt;
    if (!m) {
      r.timed_out = true;
      return r;
    }
    if (auto* c = std::get_if<wire::ControlReply>(&*m)) {
      r.reply = std::move(*c);
      return r;
    }
    // A control error names no job; job errors (and everything else) are set aside.
    if (auto* e = std::get_if<wire::Error>(&*m); e && e->id.empty()) {
      r.error = std::move(*e);
      return r;
    }
    pending_.push_back(std::move(*m));
  }
}

bool Client::ping_wait(milliseconds timeout) {
  std::uint64_t seq = ++ping_seq_;
  ping(seq);
  for (;;) {
    auto m = recv(timeout);
    if (!m) return false;
    if (auto* p = std::get_if<wire::Pong>(&*m); p && p->seq == seq) return true;
    pending_.push_back(std::move(*m));
  }
}

// ---- Pusher ----

Pusher::Pusher(const std::string& endpoint)
    : own_ctx_(std::make_unique<zmq::context_t>(1)),
      sock_(make(*own_ctx_, zmq::socket_type::push, endpoint)) {}

Pusher::Pusher(zmq::context_t& ctx, const std::string& endpoint)
    : sock_(make(ctx, zmq::socket_type::push, endpoint)) {}

Pusher::Pusher(const std::string& endpoint, const ClientOptions& options)
    : own_ctx_(std::make_unique<zmq::context_t>(1)),
      sock_(make(*own_ctx_, zmq::socket_type::push, endpoint, options)) {}

bool Pusher::submit(const wire::Submit& s, milliseconds timeout) {
  return send(s, timeout);
}

bool Pusher::send(const wire::ClientMessage& m, milliseconds timeout) {
  auto bytes = wire::encode_client(m);
  return send_timed(sock_, bytes.data(), bytes.size(), timeout);
}

bool Pusher::send_raw(const void* data, std::size_t size, milliseconds timeout) {
  return send_timed(sock_, data, size, timeout);
}

// ---- Sink ----

Sink::Sink(const std::string& endpoint)
    : own_ctx_(std::make_unique<zmq::context_t>(1)),
      sock_(make(*own_ctx_, zmq::socket_type::pull, endpoint)) {}

Sink::Sink(zmq::context_t& ctx, const std::string& endpoint)
    : sock_(make(ctx, zmq::socket_type::pull, endpoint)) {}

Sink::Sink(const std::string& endpoint, const ClientOptions& options)
    : own_ctx_(std::make_unique<zmq::context_t>(1)),
      sock_(make(*own_ctx_, zmq::socket_type::pull, endpoint, options)) {}

std::optional<wire::ServerMessage> Sink::next(milliseconds timeout) {
  return recv_one(sock_, timeout);
}

// ---- helpers ----

std::string message_id(const wire::ServerMessage& m) {
  return std::visit(
      [](const auto& x) -> std::string {
        if constexpr (requires { x.id; })
          return x.id;
        else
          return "";
      },
      m);
}

std::string message_tenant(const wire::ServerMessage& m) {
  return std::visit(
      [](const auto& x) -> std::string {
        if constexpr (requires { x.tenant; })
          return x.tenant;
        else
          return "";
      },
      m);
}

std::string describe(const wire::ServerMessage& m) {
  std::ostringstream o;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, wire::Accepted>) {
          o << "accepted " << x.id << " queue_position=" << x.queue_position;
        } else if constexpr (std::is_same_v<T, wire::Tokens>) {
          o << "tokens " << x.id;
          if (!x.step.empty()) o << " step=" << x.step;
          o << " index=" << x.index << " n=" << x.ids.size() << " text=" << x.text;
        } else if constexpr (std::is_same_v<T, wire::Done>) {
          o << "done " << x.id << " finish=" << wire::to_string(x.finish_reason)
            << " prompt_tokens=" << x.usage.prompt_tokens
            << " completion_tokens=" << x.usage.completion_tokens
            << " cached_tokens=" << x.usage.cached_tokens << " ttft_ms=" << x.timings.ttft_ms
            << " total_ms=" << x.timings.total_ms;
          if (x.steps > 0) o << " steps=" << x.steps << " vars=" << x.vars.size();
          o << " text=" << x.text;
        } else if constexpr (std::is_same_v<T, wire::Error>) {
          o << "error " << x.id << " " << to_string(x.code) << ": " << x.message;
          if (x.retry_after_ms) o << " retry_after_ms=" << *x.retry_after_ms;
        } else if constexpr (std::is_same_v<T, wire::Pong>) {
          o << "pong " << x.seq;
        } else if constexpr (std::is_same_v<T, wire::ControlReply>) {
          o << "control_reply " << x.command << " " << x.result;
        } else if constexpr (std::is_same_v<T, wire::Step>) {
          o << "step " << x.id << " " << x.step << " " << x.kind;
          if (!x.name.empty()) o << " '" << x.name << "'";
          o << " output=" << x.output;
        } else if constexpr (std::is_same_v<T, wire::ToolCall>) {
          o << "tool_call " << x.id << " call=" << x.call << " name=" << x.name
            << " arguments=" << x.arguments;
        } else {
          static_assert(std::is_same_v<T, wire::StatusReply>, "a server message describe() lacks");
          o << "status " << x.id << " " << wire::to_string(x.state)
            << " queue_position=" << x.queue_position
            << " completion_tokens=" << x.completion_tokens;
        }
      },
      m);
  return o.str();
}

}  // namespace sy::client
