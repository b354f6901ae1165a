// The cluster client over libnats: jobs published through the node's own NatsLink::publish_job
// (the contract's subject and Nats-Msg-Id), results read from a core-NATS inbox and from ordered
// consumers of SWITCHYARD_RESULTS, all decoded with the wire codec.
#include "clients/cpp/cluster_client.hpp"

#include <nats/nats.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_set>

#include "ingress/nats_link.hpp"

namespace sy::client {
namespace {

// JetStream's error code for a message it could not store; with a discard-new stream at its
// max_msgs or max_bytes the text says "maximum messages exceeded" or "maximum bytes exceeded".
constexpr int kStoreFailed = 10077;

// Raw bodies delivered by libnats's threads, read by the client's thread. Shared with every
// subscription's callback, which may still run while a subscription is being torn down.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> bodies;
};

void on_message(natsConnection*, natsSubscription*, natsMsg* m, void* closure) {
  auto& box = **static_cast<std::shared_ptr<Mailbox>*>(closure);
  std::string body(natsMsg_GetData(m), static_cast<size_t>(natsMsg_GetDataLength(m)));
  natsMsg_Destroy(m);
  // An empty message is no result (a JetStream status without payload).
  if (body.empty()) return;
  {
    std::lock_guard<std::mutex> lk(box.mu);
    box.bodies.push_back(std::move(body));
  }
  box.cv.notify_one();
}

// Frees a subscription's share of the mailbox once libnats has delivered its last message.
void on_complete(void* closure) {
  delete static_cast<std::shared_ptr<Mailbox>*>(closure);
}

std::string nats_text(natsStatus s) {
  std::string t = natsStatus_GetText(s);
  const char* last = nats_GetLastError(nullptr);
  if (last && *last && t.find(last) == std::string::npos) t += std::string(": ") + last;
  return t;
}

// Why JetStream refused a job when the refusal is a full stream ("maximum messages exceeded",
// "maximum bytes exceeded"); "" for any other failure.
std::string full_stream_reason(const cluster::NatsError& e) {
  if (e.code != kStoreFailed) return "";
  const std::string what = e.what();
  for (const char* reason : {"maximum messages exceeded", "maximum bytes exceeded"})
    if (what.find(reason) != std::string::npos) return reason;
  return "";
}

// The same client-side limits as the ZeroMQ client: a done carries the whole completion.
wire::DecodeLimits result_limits() {
  wire::DecodeLimits l;
  l.max_message_bytes = 64u << 20;
  l.max_string_bytes = 64u << 20;
  return l;
}

}  // namespace

struct ClusterClient::Impl {
  ClusterOptions opt;
  std::unique_ptr<cluster::NatsLink> link;
  std::shared_ptr<Mailbox> box = std::make_shared<Mailbox>();
  std::vector<natsSubscription*> subs;
  jsCtx* js = nullptr;
  std::string inbox;
  std::deque<wire::ServerMessage> pending;
  // Keys (<tenant>/<id>) whose done or error was delivered: a second result of one (the reply
  // subject and a followed stream, or a job run twice) is dropped, and so are chunks after it.
  std::unordered_set<std::string> finished;
  std::uint64_t repeated = 0;

  ~Impl() {
    // Subscriptions go before the connection (the link); their callbacks hold their own share
    // of the mailbox.
    for (auto* s : subs) {
      natsSubscription_Unsubscribe(s);
      natsSubscription_Destroy(s);
    }
    if (js) jsCtx_Destroy(js);
  }

  // Registers `sub`, created with `share` (from share()) as its closure; libnats frees the share
  // once the subscription has delivered its last message.
  void keep(natsSubscription* sub, std::shared_ptr<Mailbox>* share) {
    natsSubscription_SetOnCompleteCB(sub, &on_complete, share);
    subs.push_back(sub);
  }
  std::shared_ptr<Mailbox>* share() { return new std::shared_ptr<Mailbox>(box); }

  // The next message delivered to the mailbox, decoded, less repeats of a finished key;
  // nullopt after `timeout`.
  std::optional<wire::ServerMessage> recv(milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::string body;
      {
        std::unique_lock<std::mutex> lk(box->mu);
        if (!box->cv.wait_until(lk, until, [&] { return !box->bodies.empty(); }))
          return std::nullopt;
        body = std::move(box->bodies.front());
        box->bodies.pop_front();
      }
      static const wire::DecodeLimits limits = result_limits();
      auto d = wire::decode_server(body.data(), body.size(), limits);
      if (auto* e = std::get_if<wire::DecodeError>(&d))
        throw ClientError("undecodable result message: " + e->message);
      auto m = std::get<wire::ServerMessage>(std::move(d));
      const std::string id = message_id(m);
      if (id.empty()) return m;
      const std::string key = cluster::job_msg_id(message_tenant(m), id);
      const bool terminal =
          std::holds_alternative<wire::Done>(m) || std::holds_alternative<wire::Error>(m);
      if (finished.count(key)) {
        if (terminal) ++repeated;
        continue;
      }
      if (terminal) finished.insert(key);
      return m;
    }
  }
};

ClusterClient::ClusterClient(const ClusterOptions& options) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.opt = options;
  if (im.opt.nats.empty()) throw ClientError("cluster client: no NATS server URL");
  if (auto why = cluster::subject_token_problem(im.opt.default_class); !why.empty())
    throw ClientError("cluster client: default class " + wire::quoted(im.opt.default_class) +
                      " cannot be a subject token: it " + why);
  ClusterConfig cfg;
  cfg.nats = im.opt.nats;
  cfg.node_name = im.opt.name.empty() ? "switchyard-client" : im.opt.name;
  try {
    im.link = std::make_unique<cluster::NatsLink>(cfg, std::vector<std::string>{},
                                                  im.opt.connect_timeout_ms);
  } catch (const cluster::NatsError& e) {
    throw ClientError(e.what());
  }
  natsConnection* nc = im.link->connection();
  if (im.opt.reply) {
    natsInbox* inbox = nullptr;
    if (natsInbox_Create(&inbox) != NATS_OK) throw ClientError("cluster client: no inbox");
    im.inbox = inbox;
    natsInbox_Destroy(inbox);
    natsSubscription* sub = nullptr;
    auto* share = im.share();
    natsStatus s = natsConnection_Subscribe(&sub, nc, im.inbox.c_str(), &on_message, share);
    if (s != NATS_OK) {
      delete share;
      throw ClientError("cluster client: subscribing to " + im.inbox + ": " + nats_text(s));
    }
    im.keep(sub, share);
    // The server knows the subscription before any job names it: no result can come first.
    s = natsConnection_FlushTimeout(nc, 5000);
    if (s != NATS_OK) throw ClientError("cluster client: flushing: " + nats_text(s));
  }
}

ClusterClient::~ClusterClient() = default;

const std::string& ClusterClient::reply_subject() const {
  return impl_->inbox;
}

std::string ClusterClient::class_of(const wire::Submit& s) const {
  return s.priority.empty() ? impl_->opt.default_class : s.priority;
}

Published ClusterClient::submit(const wire::Submit& s) {
  auto& im = *impl_;
  Published p;
  const std::string cls = class_of(s);
  if (auto why = cluster::subject_token_problem(cls); !why.empty())
    throw ClientError("priority class " + wire::quoted(cls) + " cannot be a subject token: it " +
                      why);
  // The tenant names the results subject (switchyard.results.<tenant>).
  if (auto why = cluster::subject_token_problem(s.tenant); !why.empty())
    throw ClientError("tenant " + wire::quoted(s.tenant) + " cannot be a subject token: it " + why);
  p.subject = cluster::jobs_subject(cls);
  // Published again: its next result is news.
  im.finished.erase(cluster::job_msg_id(s.tenant, s.id));
  wire::Submit body = s;
  body.priority = cls;  // the subject and the body name the same class
  try {
    p.stream_seq = im.link->publish_job(cls, s.tenant, s.id, wire::encode_client(body), im.inbox,
                                        &p.duplicate);
  } catch (const cluster::NatsError& e) {
    const std::string key = cluster::job_msg_id(s.tenant, s.id);
    if (auto reason = full_stream_reason(e); !reason.empty())
      throw ClusterOverloaded("the cluster is overloaded: " + std::string(cluster::kJobsStream) +
                              " is full and refused job " + wire::quoted(key) + " on " + p.subject +
                              " (" + reason +
                              "; the limits are the nodes' cluster.max_jobs and "
                              "cluster.max_job_bytes)");
    if (std::string(e.what()).find(natsStatus_GetText(NATS_NO_RESPONDERS)) != std::string::npos)
      throw ClientError("no stream takes " + p.subject + ": no Switchyard node has created " +
                        cluster::kJobsStream + " yet, or class " + wire::quoted(cls) +
                        " is not one of the cluster's classes");
    throw ClientError(e.what());
  }
  return p;
}

void ClusterClient::cancel(const std::string& id, const std::string& tenant,
                           const std::string& token) {
  auto& im = *impl_;
  const std::string body = wire::encode_client(wire::Cancel{id, tenant, token});
  // Stored in SWITCHYARD_CANCELS (a publish-ack), so that a node that starts later reads it.
  try {
    im.link->publish_cancel(body);
  } catch (const cluster::NatsError& e) {
    throw ClientError("cancel of " + wire::quoted(cluster::job_msg_id(tenant, id)) + ": " +
                      e.what());
  }
}

void ClusterClient::follow_results(const std::string& tenant, bool from_start) {
  auto& im = *impl_;
  if (auto why = cluster::subject_token_problem(tenant); !why.empty())
    throw ClientError("tenant " + wire::quoted(tenant) + " cannot be a subject token: it " + why);
  jsErrCode jerr = static_cast<jsErrCode>(0);
  if (!im.js) {
    jsOptions jo;
    jsOptions_Init(&jo);
    if (natsStatus s = natsConnection_JetStream(&im.js, im.link->connection(), &jo); s != NATS_OK)
      throw ClientError("cluster client: JetStream context: " + nats_text(s));
  }
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = cluster::kResultsStream;
  so.Ordered = true;
  so.Config.DeliverPolicy = from_start ? js_DeliverAll : js_DeliverNew;
  const std::string subject = cluster::results_subject(tenant);
  natsSubscription* sub = nullptr;
  auto* share = im.share();
  natsStatus s =
      js_Subscribe(&sub, im.js, subject.c_str(), &on_message, share, nullptr, &so, &jerr);
  if (s != NATS_OK) {
    delete share;
    std::string why = nats_text(s);
    if (jerr != 0) why += " (JetStream error " + std::to_string(static_cast<int>(jerr)) + ")";
    throw ClientError("following " + subject + " in " + cluster::kResultsStream + ": " + why);
  }
  im.keep(sub, share);
}

std::uint64_t ClusterClient::repeated_results() const {
  return impl_->repeated;
}

std::optional<wire::ServerMessage> ClusterClient::next(milliseconds timeout) {
  auto& im = *impl_;
  if (!im.pending.empty()) {
    auto m = std::move(im.pending.front());
    im.pending.pop_front();
    return m;
  }
  return im.recv(timeout);
}

Result ClusterClient::wait(const std::string& id, milliseconds timeout, const std::string& tenant) {
  auto& im = *impl_;
  return collect_job(
      im.pending, [&im](milliseconds t) { return im.recv(t); }, id, timeout, tenant);
}

Result ClusterClient::run(const wire::Submit& s, milliseconds timeout) {
  submit(s);
  return wait(s.id, timeout, s.tenant);
}

}  // namespace sy::client
