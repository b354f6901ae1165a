// The cluster node (cluster_node.hpp): an intake thread that joins NATS and fetches jobs against
// the router's credit, a results thread that publishes results, acknowledges jobs and keeps long
// jobs alive with in-progress acks, and a cancel listener on libnats's delivery thread.
#include "ingress/cluster_node.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <variant>

#include "actors/log.hpp"
#include "ingress/submit_request.hpp"

namespace sy::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using Headers = std::vector<std::pair<std::string, std::string>>;

// Most jobs one fetch asks for: JetStream answers a batch in one reply, and a node's credit comes
// in quarter-window lumps (16 with the default PULL window of 64), so larger asks gain nothing.
constexpr uint32_t kMaxFetch = 64;
// The wait of a fetch that only looks at what a class has queued: JetStream answers a pull on
// loopback or a LAN in well under a millisecond, and an empty class costs about this much per
// look (a one-shot pull request is held open until its expiry when the class is empty; libnats
// sends an expiry only from 10 ms up with the margin NatsLink::fetch keeps). Jobs that arrive
// late come with the next fetch.
constexpr int64_t kLookMs = 10;
// With nothing queued in any class, the node waits this long on the most important class's
// consumer before it looks at every class again: an interactive job is taken the moment it is
// published, a lower class's waits at most this much longer, and an idle node costs JetStream
// twenty requests a second.
constexpr int64_t kIdleWaitMs = 50;
// With no credit (the router's queues are full) or no room under max_in_flight, the node looks
// again after this long, or sooner when one of its jobs ends: credit comes back as the router
// takes jobs in, and a few milliseconds are small next to any job's run time.
constexpr auto kCreditPoll = std::chrono::milliseconds(5);
// While NATS is away, results wait and are retried this often: the link reconnects by itself
// within reconnect_wait_ms..reconnect_max_ms, so polling faster would only spin.
constexpr auto kRetryWait = std::chrono::milliseconds(100);
// A result refused this many times in a row while connected is not a lost connection but a
// result JetStream will not take (beyond the server's max_payload): an error result stands in.
constexpr int kMaxRefusals = 5;
// A transient refusal (overloaded, rate_limited, unavailable) gives the job back with this delay
// when the error named no retry_after_ms: long enough not to spin on a full node, short next to
// the ack_wait after which a dead node's jobs come back.
constexpr int64_t kRequeueDelayMs = 1000;
// TESTS ONLY (cluster.test_overfetch): at most one pull request the node does not wait on is
// open per class; it expires at JetStream after 50 ms (NatsLink::request_into_buffer).
constexpr auto kOverfetchEvery = std::chrono::milliseconds(100);
// The tenant token of results whose body named no usable tenant (switchyard.results._invalid).
constexpr const char* kNoTenant = "_invalid";

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string default_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  return std::string(host[0] ? host : "node") + ":" + std::to_string(getpid());
}

// Server messages decoded back in the node (to read a result's code and timings) are its own
// encodings: the client-side limits would only refuse a long completion.
wire::DecodeLimits own_limits() {
  wire::DecodeLimits l;
  l.max_message_bytes = std::size_t{1} << 30;
  l.max_array = std::size_t{1} << 26;
  l.max_string_bytes = std::size_t{1} << 30;
  return l;
}

bool transient(ErrorCode c) {
  return c == ErrorCode::overloaded || c == ErrorCode::rate_limited || c == ErrorCode::unavailable;
}

const char* message_kind(const wire::ClientMessage& m) {
  switch (m.index()) {
    case 1:
      return "cancel";
    case 2:
      return "status";
    case 3:
      return "ping";
    case 4:
      return "control";
    default:
      return "submit";
  }
}

}  // namespace

struct ClusterNode::Impl {
  NodeOptions opt;
  std::string name;
  wire::DecodeLimits out_limits = own_limits();

  // A job fetched and handed to admission, until its result is queued.
  struct Flight {
    Delivery d;
    std::string tenant, id, reply_to;
    bool stream = false;
    int64_t fetched_ms = 0;  // unix ms when the fetch that took it began
  };
  // Work for the results thread, in order.
  struct Outgoing {
    enum Kind : uint8_t { result, chunk, requeue } kind = result;
    Delivery d;
    std::string tenant, msg_id, bytes, subject;  // subject: a chunk's reply subject
    std::string reply_to;
    Headers headers;
    int64_t delay_ms = 0;
    bool stored = false;  // the result is in SWITCHYARD_RESULTS; only the ack is left
    Clock::time_point stored_at{};
    int refusals = 0;  // failed publishes while connected, in a row
    int attempts = 0;  // failed publishes in all (the first is logged)
  };

  // A cancel remembered for jobs not yet started: its token and when it was published (unix ms).
  struct Cancel {
    std::string token;
    int64_t at_ms = 0;
  };

  mutable std::mutex mu;
  std::condition_variable cv_out;     // results thread: work or a stop
  std::condition_variable cv_intake;  // intake thread: a job ended, or a stop
  NodeHooks hooks;
  std::shared_ptr<NatsLink> link;
  bool joined = false;
  std::unordered_map<std::string, Flight> flights;  // by handle
  std::deque<Outgoing> out;
  std::unordered_map<std::string, Cancel> cancelled;         // job key -> its cancel
  std::deque<std::pair<int64_t, std::string>> cancel_order;  // (at_ms, key), oldest first
  // Jobs delivered and not started yet, per class in fetch order: kept alive by in-progress
  // acks, started before anything fetched later.
  std::vector<std::deque<Delivery>> waiting;
  uint64_t next_handle = 1;
  bool fetching = true, stopping = false;
  Clock::time_point stop_deadline{};
  std::thread intake, results;
  bool started = false, joined_threads = false;

  std::atomic<uint64_t> connect_failures{0}, bad_jobs{0}, cancels_heard{0}, cancelled_at_fetch{0},
      requeued{0}, result_retries{0}, ack_failures{0}, held{0};
  // Intake thread only: the next SWITCHYARD_CANCELS sequence to read, and the link's reconnect
  // count when the node last read it to its end (none: not read since joining).
  uint64_t cancels_next_seq = 1;
  std::optional<uint64_t> cancels_synced_at;
  bool cancels_logged = false;
  std::vector<Clock::time_point> next_overfetch;

  std::shared_ptr<NatsLink> get_link() const {
    std::lock_guard<std::mutex> lk(mu);
    return link;
  }
  NodeHooks get_hooks() const {
    std::lock_guard<std::mutex> lk(mu);
    return hooks;
  }
  bool running_intake() const {
    std::lock_guard<std::mutex> lk(mu);
    return fetching && !stopping;
  }

  // ---- joining ----

  // Connects, creates or checks the streams and consumers, subscribes to cancels; retried with
  // the reconnect backoff until it works or the node stops. False: stopped first.
  bool join() {
    int64_t wait = std::max<int64_t>(1, opt.cluster.reconnect_wait_ms);
    bool logged = false;
    for (;;) {
      if (!running_intake()) return false;
      try {
        ClusterConfig cc = opt.cluster;
        if (cc.node_name.empty()) cc.node_name = name;
        auto l = std::make_shared<NatsLink>(cc, opt.classes, opt.connect_timeout_ms);
        for (const auto& note : l->ensure_streams()) log::warn("cluster: " + note);
        for (const auto& note : l->bind_consumers()) log::warn("cluster: " + note);
        l->subscribe(kCancelSubject, [this](const std::string& data) { on_cancel(data); });
        {
          std::lock_guard<std::mutex> lk(mu);
          link = std::move(l);
          joined = true;
        }
        std::string urls;
        for (const auto& u : opt.cluster.nats) urls += (urls.empty() ? "" : ",") + u;
        log::info("cluster: node " + name + " joined NATS at " + urls + " (classes fetched in " +
                  "this order:" +
                  [&] {
                    std::string s;
                    for (const auto& c : opt.classes) s += " " + c;
                    return s;
                  }() +
                  ")");
        cv_out.notify_all();
        return true;
      } catch (const NatsError& e) {
        ++connect_failures;
        if (!logged)
          log::warn(std::string(e.what()) +
                    "; serving the ZeroMQ endpoints meanwhile, retrying in the background");
        logged = true;
      }
      std::unique_lock<std::mutex> lk(mu);
      cv_intake.wait_for(lk, std::chrono::milliseconds(wait),
                         [&] { return !fetching || stopping; });
      wait = std::min<int64_t>(wait * 2, std::max<int64_t>(1, opt.cluster.reconnect_max_ms));
    }
  }

  // ---- intake ----

  void queue(Outgoing o) {
    {
      std::lock_guard<std::mutex> lk(mu);
      out.push_back(std::move(o));
    }
    cv_out.notify_all();
  }

  // The result of a job that never reached admission (a bad body, a cancelled key).
  void answer_here(const Delivery& d, std::string tenant, std::string id, wire::ServerMessage m,
                   int64_t fetched_ms) {
    // A body too broken to name its key is answered under the key its producer published it
    // with (Nats-Msg-Id <tenant>/<id>), so that the producer's sink finds the error.
    if (tenant.empty() && id.empty()) {
      const auto slash = d.msg_id.find('/');
      if (slash != std::string::npos) {
        tenant = d.msg_id.substr(0, slash);
        id = d.msg_id.substr(slash + 1);
        if (auto* e = std::get_if<wire::Error>(&m)) {
          e->tenant = tenant;
          e->id = id;
        }
      }
    }
    Outgoing o;
    o.kind = Outgoing::result;
    o.d = d;
    // A body with no usable key is answered under its delivery's stream sequence, so that two
    // bad bodies never share a result id.
    o.msg_id = id.empty() ? std::string(kNoTenant) + "/seq-" + std::to_string(d.stream_seq)
                          : job_msg_id(tenant, id);
    if (!subject_token_problem(tenant).empty()) tenant = kNoTenant;
    o.tenant = tenant;
    o.bytes = wire::encode_server(m);
    o.reply_to = d.reply_to;
    o.headers = {{kNodeHeader, name},
                 {kFetchedHeader, std::to_string(fetched_ms)},
                 {kDeliveryHeader, std::to_string(d.delivered)}};
    queue(std::move(o));
  }

  // One fetched job: true when it went to admission (it used a credit).
  bool take(Delivery d, int64_t cycle_ms, int64_t cycle_us, const NodeHooks& h) {
    const std::string& cls = opt.classes[d.class_index];
    auto decoded = wire::decode_client(d.data.data(), d.data.size(), opt.limits);
    if (auto* err = std::get_if<wire::DecodeError>(&decoded)) {
      ++bad_jobs;
      wire::Error e = wire::to_error(*err);
      e.message = "job on " + jobs_subject(cls) + ": " + e.message;
      answer_here(d, err->tenant, err->id, e, cycle_ms);
      return false;
    }
    auto& msg = std::get<wire::ClientMessage>(decoded);
    auto* sub = std::get_if<wire::Submit>(&msg);
    if (!sub) {
      ++bad_jobs;
      std::string tenant, id;
      std::visit(
          [&](auto& x) {
            if constexpr (requires { x.tenant; }) tenant = x.tenant;
            if constexpr (requires { x.id; }) id = x.id;
          },
          msg);
      answer_here(d, tenant, id,
                  wire::Error{id, tenant, ErrorCode::bad_request,
                              std::string("job on ") + jobs_subject(cls) +
                                  ": a job must be a submit message, not " + message_kind(msg),
                              std::nullopt},
                  cycle_ms);
      return false;
    }
    if (auto why = subject_token_problem(sub->tenant); !why.empty()) {
      ++bad_jobs;
      answer_here(
          d, sub->tenant, sub->id,
          wire::Error{sub->id, sub->tenant, ErrorCode::bad_request,
                      "job on " + jobs_subject(cls) + ": tenant " + wire::quoted(sub->tenant) +
                          " cannot name a results subject: it " + why,
                      std::nullopt},
          cycle_ms);
      return false;
    }
    const std::string key = job_msg_id(sub->tenant, sub->id);
    std::string handle;
    {
      std::lock_guard<std::mutex> lk(mu);
      auto c = cancelled.find(key);
      // A cancel counts for a queued job when it carries the job's own token (the proof a
      // client cancel gives admission).
      if (c == cancelled.end() || c->second.token != sub->token) {
        handle = std::to_string(next_handle++);
        Flight f;
        f.d = d;
        f.tenant = sub->tenant;
        f.id = sub->id;
        f.reply_to = d.reply_to;
        f.stream = sub->stream && !d.reply_to.empty();
        f.fetched_ms = cycle_ms;
        flights.emplace(handle, std::move(f));
      }
    }
    if (handle.empty()) {
      ++cancelled_at_fetch;
      // What a job cancelled in its queue ends with on the results socket too.
      wire::Done done;
      done.id = sub->id;
      done.tenant = sub->tenant;
      done.finish_reason = FinishReason::cancelled;
      answer_here(d, sub->tenant, sub->id, done, cycle_ms);
      return false;
    }
    const bool stream = sub->stream && !d.reply_to.empty();
    if (log::enabled(log::Level::debug))
      log::debug("cluster: starting " + key + " from " + jobs_subject(cls) + " (delivery " +
                 std::to_string(d.delivered) + ")");
    SubmitRequest req = to_request(std::move(*sub), ClientRef{ClientRef::cluster, handle});
    // The subject is the job's class: it decided the fetch order, so it decides the queue too.
    req.priority = cls;
    req.stream = stream;
    req.arrival_us = cycle_us;
    h.submit(std::move(req));
    return true;
  }

  // Logs each lost and regained connection once (libnats reconnects by itself, counted by the
  // link; its callbacks run on libnats's threads, so the log line is written here).
  void log_connection(const NatsLink& l, uint64_t& disconnects, uint64_t& reconnects) {
    const LinkCounters c = l.counters();
    if (c.disconnects > disconnects)
      log::warn("cluster: lost the NATS connection (" + std::to_string(c.disconnects) +
                " times so far); fetching paused, results kept until it is back");
    if (c.reconnects > reconnects)
      log::info("cluster: reconnected to NATS (" + std::to_string(c.reconnects) +
                " reconnects so far)");
    disconnects = c.disconnects;
    reconnects = c.reconnects;
  }

  void hold(Delivery d) {
    ++held;
    std::lock_guard<std::mutex> lk(mu);
    waiting[d.class_index].push_back(std::move(d));
  }

  // Jobs JetStream delivered after their fetch returned wait in the pull subscriptions' buffers,
  // their ack_wait running: they are taken out every round, whether or not there is credit, and
  // held (kept alive by in-progress acks) until they can start.
  void hold_buffered(NatsLink& l) {
    for (uint32_t ci = 0; ci < opt.classes.size(); ++ci)
      if (l.buffered(ci) > 0)
        for (auto& d : l.take_buffered(ci)) hold(std::move(d));
  }

  // TESTS ONLY: keeps up to cluster.test_overfetch jobs per class beyond what the node starts
  // in the buffers, with pull requests the node does not wait on.
  void overfetch(NatsLink& l) {
    const int64_t want = opt.cluster.test_overfetch;
    const auto now = Clock::now();
    for (uint32_t ci = 0; ci < opt.classes.size(); ++ci) {
      if (now < next_overfetch[ci]) continue;
      int64_t have = l.buffered(ci);
      {
        std::lock_guard<std::mutex> lk(mu);
        have += static_cast<int64_t>(waiting[ci].size());
      }
      if (have >= want) continue;
      l.request_into_buffer(ci, static_cast<int>(want - have));
      next_overfetch[ci] = now + kOverfetchEvery;
    }
  }

  // Reads SWITCHYARD_CANCELS up to its end (from the start when joining, from where it stopped
  // after a reconnect: the live subscription missed what came while the connection was down).
  // False when JetStream did not answer; the node fetches nothing until it has.
  bool sync_cancels(NatsLink& l, uint64_t reconnects) {
    try {
      cancels_next_seq =
          l.read_cancels(cancels_next_seq,
                         [this](const std::string& body, int64_t at_ms) { remember(body, at_ms); });
    } catch (const NatsError& e) {
      if (!cancels_logged)
        log::warn(std::string(e.what()) + "; no job is started before the stored cancels are read");
      cancels_logged = true;
      return false;
    }
    cancels_synced_at = reconnects;
    cancels_logged = false;
    return true;
  }

  void give_back_held(const std::shared_ptr<NatsLink>& l) {
    if (l)
      for (uint32_t ci = 0; ci < opt.classes.size(); ++ci)
        for (auto& d : l->take_buffered(ci)) hold(std::move(d));
    std::vector<std::deque<Delivery>> back;
    {
      std::lock_guard<std::mutex> lk(mu);
      back.swap(waiting);
      waiting.resize(opt.classes.size());
      for (auto& q : back)
        for (auto& d : q) {
          Outgoing o;
          o.kind = Outgoing::requeue;
          o.d = std::move(d);
          out.push_back(std::move(o));
        }
    }
    cv_out.notify_all();
  }

  void pause(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lk(mu);
    cv_intake.wait_for(lk, d, [&] { return !fetching || stopping; });
  }

  void intake_loop() {
    if (!join()) return;
    const int64_t cap = opt.cluster.max_in_flight;
    uint64_t disconnects = 0, reconnects = 0;
    std::shared_ptr<NatsLink> l;
    while (running_intake()) {
      l = get_link();
      log_connection(*l, disconnects, reconnects);
      auto h = get_hooks();
      if (!h.take_credit || !h.submit) break;
      const LinkCounters c = l->counters();
      if (!c.connected) {
        pause(kCreditPoll);
        continue;
      }
      // No job starts before the cancels stored while this node was away are known.
      if (cancels_synced_at != c.reconnects && !sync_cancels(*l, c.reconnects)) {
        pause(kRetryWait);
        continue;
      }
      hold_buffered(*l);
      if (opt.cluster.test_overfetch > 0) overfetch(*l);
      int64_t held_now = 0, flying = 0;
      {
        std::lock_guard<std::mutex> lk(mu);
        for (const auto& q : waiting) held_now += static_cast<int64_t>(q.size());
        flying = static_cast<int64_t>(flights.size());
      }
      // What may still be fetched: held jobs count against max_in_flight like running ones.
      uint32_t room = kMaxFetch;
      if (cap > 0)
        room = static_cast<uint32_t>(std::clamp<int64_t>(cap - flying - held_now, 0, kMaxFetch));
      const auto want = static_cast<uint32_t>(std::min<int64_t>(held_now + room, kMaxFetch));
      uint32_t credit = want > 0 ? h.take_credit(want) : 0;
      if (credit == 0) {
        pause(kCreditPoll);
        continue;
      }
      uint32_t used = 0, got = 0;
      // The round's start is the receipt of the jobs it hands to admission.
      int64_t cycle_ms = unix_ms(), cycle_us = now_us();
      // Fetched jobs start at once unless the connection was lost and regained since the
      // cancels were read: then they wait for the next round's read.
      auto start_all = [&](std::vector<Delivery> ds) {
        const bool synced = cancels_synced_at == l->counters().reconnects;
        for (auto& d : ds) {
          ++got;
          if (!synced || used >= credit)
            hold(std::move(d));
          else if (take(std::move(d), cycle_ms, cycle_us, h))
            ++used;
        }
      };
      for (uint32_t ci = 0; ci < opt.classes.size() && used < credit; ++ci) {
        // Held jobs of a class first: JetStream delivered them before anything fetched now.
        while (used < credit) {
          Delivery d;
          {
            std::lock_guard<std::mutex> lk(mu);
            if (waiting[ci].empty()) break;
            d = std::move(waiting[ci].front());
            waiting[ci].pop_front();
          }
          ++got;
          if (take(std::move(d), cycle_ms, cycle_us, h)) ++used;
        }
        const uint32_t ask = std::min(credit - used, room);
        if (ask == 0) continue;
        auto ds = l->fetch(ci, static_cast<int>(ask), kLookMs);
        room -= static_cast<uint32_t>(std::min<size_t>(ds.size(), room));
        start_all(std::move(ds));
      }
      if (got == 0 && room > 0) {
        cycle_ms = unix_ms();
        cycle_us = now_us();
        start_all(l->fetch(0, static_cast<int>(std::min(credit, room)), kIdleWaitMs));
      }
      if (used < credit && h.return_credit) h.return_credit(credit - used);
    }
    // Held jobs go back to JetStream at once, for any node: this one starts nothing more.
    give_back_held(l);
  }

  // ---- cancels (libnats's delivery thread) ----

  void on_cancel(const std::string& data) { remember(data, unix_ms()); }

  // A cancel heard live or read from SWITCHYARD_CANCELS (published at `at_ms`): remembered for
  // jobs not started yet, and handed to admission when its job runs here.
  void remember(const std::string& data, int64_t at_ms) {
    auto decoded = wire::decode_client(data.data(), data.size(), opt.limits);
    auto* msg = std::get_if<wire::ClientMessage>(&decoded);
    auto* c = msg ? std::get_if<wire::Cancel>(msg) : nullptr;
    if (!c) {
      log::debug("cluster: a message on " + std::string(kCancelSubject) + " is no cancel; ignored");
      return;
    }
    const std::string key = job_msg_id(c->tenant, c->id);
    const int64_t max_age_ms = opt.cluster.cancels_max_age_s * 1000;
    const auto max_keys = static_cast<size_t>(std::max<int64_t>(1, opt.cluster.max_cancels));
    if (unix_ms() - at_ms > max_age_ms) return;  // older than the stream keeps them
    bool running = false, fresh = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      const int64_t now = unix_ms();
      // The stream's own limits: a key goes when its newest cancel is older than the age limit,
      // or when it is the oldest of more keys than the stream holds.
      while (!cancel_order.empty() &&
             (cancel_order.size() >= max_keys || now - cancel_order.front().first > max_age_ms)) {
        auto it = cancelled.find(cancel_order.front().second);
        if (it != cancelled.end() && it->second.at_ms == cancel_order.front().first)
          cancelled.erase(it);
        cancel_order.pop_front();
      }
      auto [it, inserted] = cancelled.try_emplace(key, Cancel{c->token, at_ms});
      fresh = inserted || it->second.token != c->token;
      if (!inserted && it->second.at_ms >= at_ms && !fresh) return;  // known already
      it->second = Cancel{c->token, std::max(at_ms, it->second.at_ms)};
      cancel_order.emplace_back(it->second.at_ms, key);
      for (const auto& [handle, f] : flights)
        if (f.tenant == c->tenant && f.id == c->id) running = true;
    }
    if (fresh) ++cancels_heard;
    auto h = get_hooks();
    if (!running || !h.cancel) return;
    // Admission finds the job by its key and checks the token, as for a client's cancel. Its
    // replies to the cancel itself (not_found, unauthorized) go to a handle that names no job,
    // so they are dropped.
    KeyRequest kr;
    kr.kind = KeyRequest::cancel;
    kr.client = ClientRef{ClientRef::cluster, "cancel"};
    kr.id = c->id;
    kr.tenant = c->tenant;
    kr.token = c->token;
    h.cancel(std::move(kr));
  }

  // ---- results ----

  void on_event(OutMessage&& m) {
    std::unique_lock<std::mutex> lk(mu);
    auto it = flights.find(m.to.identity);
    if (it == flights.end()) return;  // a reply to a cancel, or a job given back
    if (!m.terminal) {
      if (!it->second.stream) return;
      Outgoing o;
      o.kind = Outgoing::chunk;
      o.subject = it->second.reply_to;
      o.bytes = std::move(m.bytes);
      out.push_back(std::move(o));
      lk.unlock();
      cv_out.notify_all();
      return;
    }
    Flight f = std::move(it->second);
    flights.erase(it);
    lk.unlock();
    cv_intake.notify_all();
    Outgoing o;
    o.d = f.d;
    o.tenant = f.tenant;
    o.msg_id = job_msg_id(f.tenant, f.id);
    o.reply_to = f.reply_to;
    o.headers = {{kNodeHeader, name},
                 {kFetchedHeader, std::to_string(f.fetched_ms)},
                 {kDeliveryHeader, std::to_string(f.d.delivered)}};
    auto decoded = wire::decode_server(m.bytes.data(), m.bytes.size(), out_limits);
    if (auto* sm = std::get_if<wire::ServerMessage>(&decoded)) {
      if (auto* e = std::get_if<wire::Error>(sm); e && transient(e->code)) {
        // Not the job's end: this node cannot take it now (full, over a tenant's rate, draining).
        o.kind = Outgoing::requeue;
        o.delay_ms = e->retry_after_ms ? int64_t{*e->retry_after_ms} : kRequeueDelayMs;
        queue(std::move(o));
        return;
      }
      if (auto* d = std::get_if<wire::Done>(sm))
        o.headers.emplace_back(
            kStartedHeader,
            std::to_string(f.fetched_ms + static_cast<int64_t>(d->timings.queue_ms)));
    }
    o.kind = Outgoing::result;
    o.bytes = std::move(m.bytes);
    queue(std::move(o));
  }

  // Publishes (or gives back) the front item; false when it must wait for NATS.
  bool process(NatsLink& l, Outgoing& o) {
    switch (o.kind) {
      case Outgoing::chunk:
        l.publish(o.subject, o.bytes);
        return true;
      case Outgoing::requeue:
        ++requeued;
        l.nak(o.d, o.delay_ms);
        return true;
      case Outgoing::result:
        break;
    }
    if (!o.stored) {
      try {
        l.publish_result(o.tenant, o.msg_id, o.bytes, o.headers);
      } catch (const NatsError& e) {
        ++result_retries;
        if (o.attempts++ == 0)
          log::warn(std::string(e.what()) + "; kept, published again once NATS takes it");
        if (l.counters().connected && ++o.refusals >= kMaxRefusals) {
          log::warn(std::string(e.what()) + "; an error result stands in for it");
          auto decoded = wire::decode_server(o.bytes.data(), o.bytes.size(), out_limits);
          std::string id, tenant = o.tenant;
          if (auto* sm = std::get_if<wire::ServerMessage>(&decoded))
            std::visit(
                [&](auto& x) {
                  if constexpr (requires { x.id; }) id = x.id;
                },
                *sm);
          o.bytes = wire::encode_server(
              wire::Error{id, tenant, ErrorCode::internal,
                          "the result (" + std::to_string(o.bytes.size()) +
                              " bytes) could not be stored in " + kResultsStream + ": " + e.what(),
                          std::nullopt});
          o.refusals = 0;
        }
        return false;
      }
      o.stored = true;
      o.stored_at = Clock::now();
      if (!o.reply_to.empty()) {
        l.publish(o.reply_to, o.bytes);
        if (opt.cluster.test_duplicate_results) l.publish(o.reply_to, o.bytes);
      }
    }
    if (l.ack(o.d)) return true;
    // The result is stored; without the ack JetStream delivers the job again after ack_wait
    // (a duplicate result, dropped by the results stream's duplicate window). Past ack_wait
    // the ack is pointless.
    if (Clock::now() - o.stored_at > std::chrono::milliseconds(opt.cluster.ack_wait_ms)) {
      ++ack_failures;
      return true;
    }
    return false;
  }

  void results_loop() {
    const auto progress_every =
        std::chrono::milliseconds(std::max<int64_t>(1, opt.cluster.ack_wait_ms / 3));
    auto next_progress = Clock::now() + progress_every;
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv_out.wait_until(lk, next_progress, [&] { return (!out.empty() && link) || stopping; });
      if (stopping && (out.empty() || !link || Clock::now() >= stop_deadline)) break;
      auto l = link;
      if (!l) continue;
      if (Clock::now() >= next_progress) {
        // Running and held jobs restart their ack_wait; a job whose node dies is back after it.
        std::vector<Delivery> running;
        for (const auto& [h, f] : flights) running.push_back(f.d);
        for (const auto& q : waiting)
          for (const auto& d : q) running.push_back(d);
        lk.unlock();
        for (const auto& d : running) l->in_progress(d);
        lk.lock();
        next_progress = Clock::now() + progress_every;
      }
      // A long queue of results waits for the in-progress acks: they are due within ack_wait.
      while (!out.empty() && Clock::now() < next_progress) {
        Outgoing o = std::move(out.front());
        out.pop_front();
        lk.unlock();
        const bool done = process(*l, o);
        lk.lock();
        if (!done) {
          out.push_front(std::move(o));
          cv_out.wait_for(lk, kRetryWait,
                          [&] { return stopping && Clock::now() >= stop_deadline; });
          break;
        }
      }
    }
    // What could not be published within the grace goes back to JetStream (or, unacked, comes
    // back after ack_wait anyway).
    auto l = link;
    std::deque<Outgoing> left = std::move(out);
    lk.unlock();
    if (l)
      for (auto& o : left)
        if (o.kind != Outgoing::chunk && !o.stored) l->nak(o.d);
  }
};

ClusterNode::ClusterNode(NodeOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->opt = std::move(options);
  impl_->name =
      impl_->opt.cluster.node_name.empty() ? default_name() : impl_->opt.cluster.node_name;
  impl_->waiting.resize(impl_->opt.classes.size());
  impl_->next_overfetch.resize(impl_->opt.classes.size());
}

ClusterNode::~ClusterNode() {
  stop(std::chrono::milliseconds(0));
}

void ClusterNode::set_hooks(NodeHooks hooks) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->hooks = std::move(hooks);
}

void ClusterNode::start() {
  auto& d = *impl_;
  if (d.started) return;
  d.started = true;
  d.intake = std::thread([&d] { d.intake_loop(); });
  d.results = std::thread([&d] { d.results_loop(); });
}

void ClusterNode::stop_fetching() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->fetching = false;
  }
  impl_->cv_intake.notify_all();
}

void ClusterNode::release_running() {
  auto& d = *impl_;
  std::unique_lock<std::mutex> lk(d.mu);
  for (auto& [h, f] : d.flights) {
    Impl::Outgoing o;
    o.kind = Impl::Outgoing::requeue;
    o.d = f.d;
    d.out.push_back(std::move(o));
  }
  d.flights.clear();
  lk.unlock();
  d.cv_out.notify_all();
}

void ClusterNode::stop(std::chrono::milliseconds grace) {
  auto& d = *impl_;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    if (d.stopping) return;
    d.stopping = true;
    d.fetching = false;
    d.stop_deadline = Clock::now() + grace;
  }
  d.cv_intake.notify_all();
  d.cv_out.notify_all();
  if (d.intake.joinable()) d.intake.join();
  if (d.results.joinable()) d.results.join();
  std::shared_ptr<NatsLink> l;
  std::deque<Impl::Outgoing> left;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    l = std::move(d.link);
    d.hooks = NodeHooks{};  // breaks the cycle through admission's handle
    d.flights.clear();
    left.swap(d.out);
  }
  // Held jobs the intake gave back after the results thread had ended.
  if (l)
    for (auto& o : left)
      if (o.kind == Impl::Outgoing::requeue) l->nak(o.d);
  l.reset();  // closes the connection (the cancel listener's thread ends with it)
}

void ClusterNode::post(OutMessage m) {
  impl_->on_event(std::move(m));
}

NodeStats ClusterNode::stats(bool with_lag) const {
  auto& d = *impl_;
  NodeStats s;
  std::shared_ptr<NatsLink> l;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    l = d.link;
    s.joined = d.joined;
    s.in_flight = static_cast<int64_t>(d.flights.size());
    for (const auto& q : d.waiting) s.waiting += static_cast<int64_t>(q.size());
    s.results_waiting = static_cast<int64_t>(d.out.size());
  }
  if (l) {
    s.link = l->counters();
    // Not while disconnected: each request would wait out its timeout, holding the scrape.
    if (with_lag && s.link.connected)
      for (uint32_t i = 0; i < d.opt.classes.size(); ++i) s.lag.push_back(l->lag(i));
  }
  s.connect_failures = d.connect_failures;
  s.bad_jobs = d.bad_jobs;
  s.cancels_heard = d.cancels_heard;
  s.cancelled_at_fetch = d.cancelled_at_fetch;
  s.requeued = d.requeued;
  s.result_retries = d.result_retries;
  s.ack_failures = d.ack_failures;
  s.held = d.held;
  return s;
}

const std::string& ClusterNode::name() const {
  return impl_->name;
}

const std::vector<std::string>& ClusterNode::classes() const {
  return impl_->opt.classes;
}

}  // namespace sy::cluster
