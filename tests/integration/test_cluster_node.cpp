// Switchyard nodes on a real nats-server with JetStream: jobs of two classes in, one result per key
// out and the work queue empty; a bad body answered with an error while the node goes on; cancels
// of a running and of a queued job; a producer's reply subject with the stream chunks; three nodes
// with one killed by SIGKILL and a fourth started mid-run; interactive jobs overtaking queued
// batch jobs across two saturated nodes; jobs held beyond ack_wait starting once; a cancel read
// by a node started after it.
#include <nats/nats.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "ingress/codec.hpp"
#include "ingress/nats_link.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/nats_server.hpp"

BOOST_AUTO_TEST_SUITE(test_cluster_node)

using namespace sy;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kClasses = {"interactive", "batch"};

// The producer's side: the streams made as a node makes them (its consumers are the nodes').
std::unique_ptr<cluster::NatsLink> producer(const test::NatsServer& ns) {
  ClusterConfig c;
  c.nats = {ns.url()};
  c.node_name = "producer";
  auto l = std::make_unique<cluster::NatsLink>(c, kClasses);
  l->ensure_streams();
  return l;
}

std::string submit_body(const std::string& tenant, const std::string& id, uint32_t max_tokens,
                        bool stream = false) {
  wire::Submit s;
  s.id = id;
  s.tenant = tenant;
  s.prompt = std::string("Once upon a time");
  s.max_tokens = max_tokens;
  s.temperature = 0;
  s.ignore_eos = true;
  s.stream = stream;
  return wire::encode_client(s);
}

// One result as a sink reads it from SWITCHYARD_RESULTS.
struct Result {
  std::string subject, msg_id, node;
  int64_t fetched_ms = 0, started_ms = 0;
  uint64_t delivery = 0;
  wire::ServerMessage msg;
  const wire::Done* done() const { return std::get_if<wire::Done>(&msg); }
  const wire::Error* error() const { return std::get_if<wire::Error>(&msg); }
};

std::string header(natsMsg* m, const char* key) {
  const char* v = nullptr;
  return natsMsgHeader_Get(m, key, &v) == NATS_OK && v ? v : "";
}

// "prefix<i>" (appended, not operator+: g++ 12 warns falsely about `"k" + std::to_string(i)`).
std::string name(const char* prefix, int i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

int64_t number(const std::string& s) {
  return s.empty() ? 0 : std::stoll(s);
}

wire::ServerMessage decode(const char* data, int size) {
  auto d = wire::decode_server(data, static_cast<size_t>(size));
  if (auto* e = std::get_if<wire::DecodeError>(&d))
    throw std::runtime_error("undecodable result: " + e->message);
  return std::get<wire::ServerMessage>(d);
}

// A sink: an ephemeral consumer over the whole results stream, from its start, plus core NATS
// subscriptions for reply subjects.
class Sink {
 public:
  explicit Sink(const std::string& url) {
    check(natsConnection_ConnectTo(&nc_, url.c_str()), "connect");
    check(natsConnection_JetStream(&js_, nc_, nullptr), "jetstream");
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = cluster::kResultsStream;
    so.ManualAck = true;
    so.Config.AckPolicy = js_AckNone;
    so.Config.DeliverPolicy = js_DeliverAll;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    check(js_SubscribeSync(&results_, js_, "switchyard.results.>", nullptr, &so, &jerr),
          "results subscription");
  }
  ~Sink() {
    for (auto* s : {results_, reply_})
      if (s) natsSubscription_Destroy(s);
    if (js_) jsCtx_Destroy(js_);
    if (nc_) {
      natsConnection_Close(nc_);
      natsConnection_Destroy(nc_);
    }
  }
  Sink(const Sink&) = delete;
  Sink& operator=(const Sink&) = delete;

  /// Reads results until `n` were read in all, or `limit` passed; returns all read so far.
  const std::vector<Result>& read(size_t n, std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (got_.size() < n && std::chrono::steady_clock::now() < until) {
      natsMsg* m = nullptr;
      if (natsSubscription_NextMsg(&m, results_, 200) != NATS_OK) continue;
      Result r;
      r.subject = natsMsg_GetSubject(m);
      r.msg_id = header(m, "Nats-Msg-Id");
      r.node = header(m, "Switchyard-Node");
      r.fetched_ms = number(header(m, "Switchyard-Fetched-At"));
      r.started_ms = number(header(m, "Switchyard-Started-At"));
      r.delivery = static_cast<uint64_t>(number(header(m, "Switchyard-Delivery")));
      r.msg = decode(natsMsg_GetData(m), natsMsg_GetDataLength(m));
      natsMsg_Destroy(m);
      got_.push_back(std::move(r));
    }
    return got_;
  }
  const std::vector<Result>& results() const { return got_; }

  void listen(const std::string& subject) {
    check(natsConnection_SubscribeSync(&reply_, nc_, subject.c_str()), "reply subscription");
    check(natsConnection_Flush(nc_), "flush");
  }
  /// The next message on the reply subject, or nullopt after `wait`.
  std::optional<wire::ServerMessage> next_reply(std::chrono::milliseconds wait) {
    natsMsg* m = nullptr;
    if (natsSubscription_NextMsg(&m, reply_, wait.count()) != NATS_OK) return std::nullopt;
    auto msg = decode(natsMsg_GetData(m), natsMsg_GetDataLength(m));
    natsMsg_Destroy(m);
    return msg;
  }

 private:
  static void check(natsStatus s, const char* what) {
    if (s != NATS_OK)
      throw std::runtime_error(std::string("sink: ") + what + ": " + natsStatus_GetText(s));
  }
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  natsSubscription* results_ = nullptr;
  natsSubscription* reply_ = nullptr;
  std::vector<Result> got_;
};

// A node's config file: the cluster section (ack_wait short so a dead node's jobs come back
// within the test), the batcher's width, and (queue_limit > 0) the router's class queues.
std::string node_config(const it::TempDir& dir, const std::string& name, int64_t max_in_flight,
                        int max_sequences = 16, int queue_limit = 0) {
  const std::string path = dir.path() + "/" + name + ".yaml";
  std::ofstream f(path);
  f << "cluster:\n  ack_wait_ms: 1000\n  max_in_flight: " << max_in_flight
    << "\n  reconnect_wait_ms: 20\n  reconnect_max_ms: 200\n"
    << "batching:\n  max_sequences: " << max_sequences << "\n";
  if (queue_limit > 0)
    f << "router:\n  classes:\n"
      << "    - {name: interactive, rank: 0, weight: 1, queue_limit: " << queue_limit << "}\n"
      << "    - {name: batch, rank: 1, weight: 1, queue_limit: " << queue_limit << "}\n";
  return path;
}

// A node on the null backend; `journal`: with a journal file of its own in `dir`; `extra`: more
// flags; `log`: a file its stderr goes to; `queue_limit`: its router's class queues (0: the
// defaults).
std::unique_ptr<it::ServerProcess> start_node(const test::NatsServer& ns, const it::TempDir& dir,
                                              const std::string& name, int64_t max_in_flight,
                                              int step_delay_ms, int max_sequences = 16,
                                              bool journal = false,
                                              const std::vector<std::string>& extra = {},
                                              const std::string& log = "", int queue_limit = 0) {
  std::vector<std::string> args = {
      "--backend",       "null",
      "--nats",          ns.url(),
      "--node-name",     name,
      "--metrics",       "127.0.0.1:0",
      "--step-delay-ms", std::to_string(step_delay_ms),
      "--config",        node_config(dir, name, max_in_flight, max_sequences, queue_limit)};
  args.push_back(journal ? "--journal" : "--no-journal");
  if (journal) args.push_back(dir.path() + "/" + name + ".journal");
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<it::ServerProcess>(args, std::chrono::seconds(60), log);
}

// One series of a node's /metrics ("name" or "name{labels}"); -1 when absent.
double metric(it::ServerProcess& node, const std::string& series) {
  auto r = it::http_get(node.metrics_endpoint(), "/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

// Waits (bounded) until the node has bound its consumers: jobs published before that wait in
// the stream anyway, but a test that counts on a node's presence waits for it.
void wait_joined(it::ServerProcess& node) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (metric(node, "switchyard_cluster_joined") != 1) {
    if (std::chrono::steady_clock::now() > until) throw std::runtime_error("node never joined");
    std::this_thread::sleep_for(20ms);
  }
}

// Waits (bounded) until `done()` holds.
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// How often each job key was started by a node, from the debug lines of its log ("cluster:
// starting <tenant>/<id> from <subject> (delivery N)").
void count_starts(const std::string& log, std::map<std::string, int>& starts,
                  uint64_t& redeliveries) {
  std::ifstream in(log);
  std::string line;
  const std::string mark = "cluster: starting ";
  while (std::getline(in, line)) {
    const auto at = line.find(mark);
    if (at == std::string::npos) continue;
    const auto from = at + mark.size();
    const auto end = line.find(' ', from);
    ++starts[line.substr(from, end - from)];
    if (line.find("(delivery 1)") == std::string::npos) ++redeliveries;
  }
}

std::map<std::string, const Result*> by_key(const std::vector<Result>& rs) {
  std::map<std::string, const Result*> m;
  for (const auto& r : rs) m[r.msg_id] = &r;
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_node_two_classes_every_key_once_and_the_queue_empty) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  // With a journal: cluster jobs skip it (JetStream holds them until their result is stored).
  auto node = start_node(ns, dir, "n1", 64, 0, 16, true);
  for (int i = 0; i < 50; ++i)
    prod->publish_job(i % 2 ? "batch" : "interactive", "acme", name("j", i),
                      submit_body("acme", name("j", i), 4));
  const auto& rs = sink.read(50, 30s);
  BOOST_REQUIRE_EQUAL(rs.size(), 50u);
  auto keys = by_key(rs);
  BOOST_TEST(keys.size() == 50u);  // each key once
  for (int i = 0; i < 50; ++i) {
    const auto it = keys.find(name("acme/j", i));
    BOOST_REQUIRE(it != keys.end());
    const Result& r = *it->second;
    BOOST_TEST(r.subject == "switchyard.results.acme");
    BOOST_TEST(r.node == "n1");
    BOOST_TEST(r.delivery == 1u);
    BOOST_REQUIRE(r.done());
    BOOST_TEST(r.done()->id == name("j", i));
    BOOST_TEST(r.done()->tenant == "acme");
    BOOST_TEST(r.done()->usage.completion_tokens == 4u);
    BOOST_TEST(r.done()->ids.size() == 4u);  // a cluster result carries the whole completion
    BOOST_TEST(r.started_ms >= r.fetched_ms);
  }
  // Every job acknowledged once its result was stored: the work queue is empty.
  BOOST_TEST(eventually([&] {
    auto a = prod->lag(0), b = prod->lag(1);
    return a.pending == 0 && b.pending == 0 && a.ack_pending == 0 && b.ack_pending == 0;
  }));
  BOOST_TEST(metric(*node, "switchyard_cluster_fetched_total") == 50);
  BOOST_TEST(eventually([&] { return metric(*node, "switchyard_cluster_acked_total") == 50; }));
  BOOST_TEST(metric(*node, "switchyard_cluster_results_published_total") == 50);
  BOOST_TEST(metric(*node, "switchyard_cluster_connected") == 1);
  BOOST_TEST(metric(*node, "switchyard_cluster_consumer_pending{class=\"batch\"}") == 0);
  auto st = node->stats();
  BOOST_TEST(st["admitted"] == 50);
  BOOST_TEST(st["journal_accepted"] == 0);
  BOOST_TEST(node->stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_bad_body_gets_an_error_result_and_the_node_goes_on) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  auto node = start_node(ns, dir, "n1", 64, 0);
  prod->publish_job("batch", "acme", "bad1", std::string("\xc1\x00garbage", 9));
  // A well-formed message that is no submit, and a submit missing its prompt.
  prod->publish_job("batch", "acme", "ping1", wire::encode_client(wire::Ping{7}));
  prod->publish_job("batch", "acme", "ok1", submit_body("acme", "ok1", 2));
  const auto& rs = sink.read(3, 30s);
  BOOST_REQUIRE_EQUAL(rs.size(), 3u);
  auto keys = by_key(rs);
  BOOST_REQUIRE(keys.count("acme/bad1"));
  const Result& bad = *keys["acme/bad1"];
  BOOST_REQUIRE(bad.error());
  BOOST_TEST(bad.subject == "switchyard.results.acme");  // under the key it was published with
  BOOST_TEST(static_cast<int>(bad.error()->code) == static_cast<int>(ErrorCode::bad_request));
  BOOST_TEST(bad.error()->id == "bad1");
  BOOST_TEST(bad.error()->message.find("job on switchyard.jobs.batch: ") == 0);
  BOOST_TEST(bad.error()->message.find("msgpack") != std::string::npos, bad.error()->message);
  BOOST_REQUIRE(keys.count("acme/ping1"));
  BOOST_REQUIRE(keys["acme/ping1"]->error());
  BOOST_TEST(keys["acme/ping1"]->error()->message ==
             "job on switchyard.jobs.batch: a job must be a submit message, not ping");
  BOOST_REQUIRE(keys.count("acme/ok1"));
  BOOST_REQUIRE(keys["acme/ok1"]->done());
  BOOST_TEST(keys["acme/ok1"]->done()->usage.completion_tokens == 2u);
  BOOST_TEST(
      eventually([&] { return prod->lag(1).ack_pending == 0 && prod->lag(1).pending == 0; }));
  BOOST_TEST(metric(*node, "switchyard_cluster_bad_jobs_total") == 2);
  BOOST_TEST(node->alive());
}

BOOST_AUTO_TEST_CASE(cancel_stops_the_running_job_and_a_queued_key_ends_cancelled) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  // One job at a time, 20 ms a step: the first job runs for about 40 s unless cancelled, and
  // the second waits in JetStream until the first ends.
  auto node = start_node(ns, dir, "n1", 1, 20);
  wait_joined(*node);
  prod->publish_job("batch", "acme", "long", submit_body("acme", "long", 2000));
  prod->publish_job("batch", "acme", "queued", submit_body("acme", "queued", 4));
  BOOST_REQUIRE(eventually([&] { return metric(*node, "switchyard_cluster_in_flight") == 1; }));
  BOOST_TEST(prod->lag(1).pending == 1u);  // "queued" is still in the stream
  // The queued key first: the node remembers it; then the running one.
  prod->publish(cluster::kCancelSubject, wire::encode_client(wire::Cancel{"queued", "acme", ""}));
  BOOST_REQUIRE(
      eventually([&] { return metric(*node, "switchyard_cluster_cancels_heard_total") == 1; }));
  prod->publish(cluster::kCancelSubject, wire::encode_client(wire::Cancel{"long", "acme", ""}));
  const auto& rs = sink.read(2, 30s);
  BOOST_REQUIRE_EQUAL(rs.size(), 2u);
  auto keys = by_key(rs);
  BOOST_REQUIRE(keys.count("acme/long") && keys["acme/long"]->done());
  BOOST_TEST(static_cast<int>(keys["acme/long"]->done()->finish_reason) ==
             static_cast<int>(wire::FinishReason::cancelled));
  BOOST_TEST(keys["acme/long"]->done()->usage.completion_tokens < 2000u);
  BOOST_REQUIRE(keys.count("acme/queued") && keys["acme/queued"]->done());
  BOOST_TEST(static_cast<int>(keys["acme/queued"]->done()->finish_reason) ==
             static_cast<int>(wire::FinishReason::cancelled));
  BOOST_TEST(keys["acme/queued"]->done()->usage.completion_tokens == 0u);
  BOOST_TEST(metric(*node, "switchyard_cluster_cancelled_at_fetch_total") == 1);
  BOOST_TEST(
      eventually([&] { return prod->lag(1).ack_pending == 0 && prod->lag(1).pending == 0; }));
}

BOOST_AUTO_TEST_CASE(the_reply_subject_gets_the_chunks_and_the_result) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  sink.listen("inbox.client7");
  auto node = start_node(ns, dir, "n1", 64, 0);
  prod->publish_job("interactive", "acme", "s1", submit_body("acme", "s1", 6, true),
                    "inbox.client7");
  std::vector<int32_t> streamed;
  std::optional<wire::Done> done;
  while (!done) {
    auto m = sink.next_reply(20s);
    BOOST_REQUIRE(m);
    if (auto* t = std::get_if<wire::Tokens>(&*m)) {
      BOOST_TEST(t->id == "s1");
      streamed.insert(streamed.end(), t->ids.begin(), t->ids.end());
    } else {
      BOOST_REQUIRE(std::get_if<wire::Done>(&*m));
      done = std::get<wire::Done>(*m);
    }
  }
  BOOST_TEST(streamed.size() == 6u);
  BOOST_TEST(done->ids == streamed);  // the result carries the whole completion as well
  const auto& rs = sink.read(1, 20s);
  BOOST_REQUIRE_EQUAL(rs.size(), 1u);
  BOOST_REQUIRE(rs[0].done());
  BOOST_TEST(rs[0].done()->ids == streamed);
  // Without `stream` the reply subject gets the result only.
  prod->publish_job("interactive", "acme", "s2", submit_body("acme", "s2", 3), "inbox.client7");
  auto m = sink.next_reply(20s);
  BOOST_REQUIRE(m);
  BOOST_REQUIRE(std::get_if<wire::Done>(&*m));
  BOOST_TEST(std::get<wire::Done>(*m).id == "s2");
  BOOST_TEST(std::get<wire::Done>(*m).ids.size() == 3u);
}

BOOST_AUTO_TEST_CASE(three_nodes_one_killed_a_fourth_added_every_job_completes) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  // 16 jobs a node at a time, 8 steps of 20 ms each: about 100 jobs a second a node, so the
  // run lasts several seconds and the queue is still long when the fourth node comes.
  std::vector<std::unique_ptr<it::ServerProcess>> nodes;
  for (const char* n : {"n1", "n2", "n3"}) nodes.push_back(start_node(ns, dir, n, 16, 20));
  constexpr int kJobs = 2000;
  for (int i = 0; i < kJobs; ++i)
    prod->publish_job(i % 4 == 0 ? "interactive" : "batch", "acme", name("k", i),
                      submit_body("acme", name("k", i), 8));
  BOOST_REQUIRE_GE(sink.read(kJobs / 5, 60s).size(), size_t{kJobs / 5});
  nodes[0]->stop(SIGKILL);  // its unacknowledged jobs come back after ack_wait (1 s)
  nodes.push_back(start_node(ns, dir, "n4", 16, 20));
  const auto& rs = sink.read(kJobs, 90s);
  BOOST_REQUIRE_EQUAL(rs.size(), size_t{kJobs});
  auto keys = by_key(rs);
  BOOST_TEST(keys.size() == size_t{kJobs});  // each key once in SWITCHYARD_RESULTS
  std::map<std::string, int> per_node;
  int redelivered = 0;
  for (int i = 0; i < kJobs; ++i) {
    auto it = keys.find(name("acme/k", i));
    BOOST_REQUIRE(it != keys.end());
    BOOST_REQUIRE(it->second->done());  // executed to completion
    BOOST_TEST(static_cast<int>(it->second->done()->finish_reason) ==
               static_cast<int>(wire::FinishReason::length));
    BOOST_TEST(it->second->done()->usage.completion_tokens == 8u);
    ++per_node[it->second->node];
    if (it->second->delivery > 1) ++redelivered;
  }
  BOOST_TEST(per_node["n4"] > 0);  // the node started mid-run took work
  BOOST_TEST(redelivered > 0);     // the killed node's jobs ran elsewhere
  BOOST_TEST(eventually([&] {
    auto a = prod->lag(0), b = prod->lag(1);
    return a.pending == 0 && b.pending == 0 && a.ack_pending == 0 && b.ack_pending == 0;
  }));
  double duplicates = 0;
  for (size_t i = 1; i < nodes.size(); ++i)
    duplicates += metric(*nodes[i], "switchyard_cluster_duplicate_results_total");
  std::string spread;
  for (auto& [n, c] : per_node) spread += " " + n + "=" + std::to_string(c);
  BOOST_TEST_MESSAGE("results by node:" << spread << "; redelivered " << redelivered
                                        << "; duplicate results dropped by JetStream "
                                        << duplicates);
}

BOOST_AUTO_TEST_CASE(interactive_jobs_overtake_queued_batch_jobs_across_nodes) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  // Two nodes, four jobs each at a time: every fetched job starts at once, the rest of the batch
  // backlog waits in JetStream.
  auto a = start_node(ns, dir, "a", 4, 20, 4);
  auto b = start_node(ns, dir, "b", 4, 20, 4);
  constexpr int kBatch = 40, kInteractive = 6;
  for (int i = 0; i < kBatch; ++i)
    prod->publish_job("batch", "acme", name("b", i), submit_body("acme", name("b", i), 15));
  BOOST_REQUIRE(eventually([&] { return prod->lag(1).ack_pending == 8; }));  // both saturated
  for (int i = 0; i < kInteractive; ++i)
    prod->publish_job("interactive", "lab", name("i", i), submit_body("lab", name("i", i), 2));
  const auto published = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const auto& rs = sink.read(kBatch + kInteractive, 60s);
  BOOST_REQUIRE_EQUAL(rs.size(), size_t{kBatch + kInteractive});
  int64_t last_interactive_start = 0;
  for (const auto& r : rs)
    if (r.msg_id.rfind("lab/", 0) == 0) {
      BOOST_REQUIRE(r.done());
      last_interactive_start = std::max(last_interactive_start, r.started_ms);
    }
  // Batch jobs taken from the stream after every interactive job was in it: none of them
  // started before the last interactive job did. Started-At is whole milliseconds of the fetch's
  // start plus whole milliseconds of queue time (docs/cluster.md), each truncated: it lies up to
  // 2 ms (exclusive) below the true start, so of two jobs started in order the later one's header
  // is at most 1 ms below the earlier one's.
  int queued_batch = 0;
  for (const auto& r : rs)
    if (r.msg_id.rfind("acme/", 0) == 0 && r.fetched_ms > published) {
      ++queued_batch;
      BOOST_TEST(r.started_ms >= last_interactive_start - 1, r.msg_id << " started " << r.started_ms
                                                                      << ", an interactive job at "
                                                                      << last_interactive_start);
    }
  BOOST_TEST(queued_batch > 0);
  BOOST_TEST_MESSAGE("batch jobs still queued when the interactive ones came: " << queued_batch);
}

BOOST_AUTO_TEST_CASE(a_node_started_before_nats_serves_zeromq_and_joins_later) {
  // A port where nothing listens yet: the node starts, says ready, and keeps trying.
  int port = 0;
  {
    test::NatsServer probe;
    port = probe.port();
  }
  it::TempDir dir;
  auto node = std::make_unique<it::ServerProcess>(std::vector<std::string>{
      "--backend", "null", "--no-journal", "--nats", "nats://127.0.0.1:" + std::to_string(port),
      "--node-name", "early", "--metrics", "127.0.0.1:0", "--config",
      node_config(dir, "early", 64, 16)});
  BOOST_REQUIRE(
      eventually([&] { return metric(*node, "switchyard_cluster_connect_failures_total") >= 1; }));
  BOOST_TEST(metric(*node, "switchyard_cluster_joined") == 0);
  BOOST_TEST(metric(*node, "switchyard_cluster_connected") == 0);
  BOOST_TEST(it::http_get(node->metrics_endpoint(), "/health").status == 200);
  test::NatsServer ns(port);
  auto prod = producer(ns);
  Sink sink(ns.url());
  prod->publish_job("batch", "acme", "late1", submit_body("acme", "late1", 3));
  const auto& rs = sink.read(1, 30s);
  BOOST_REQUIRE_EQUAL(rs.size(), 1u);
  BOOST_REQUIRE(rs[0].done());
  BOOST_TEST(rs[0].node == "early");
  BOOST_TEST(metric(*node, "switchyard_cluster_joined") == 1);
}

BOOST_AUTO_TEST_CASE(nats_restarted_mid_run_loses_no_job_and_no_result) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  constexpr int kJobs = 200;
  auto node = start_node(ns, dir, "n1", 16, 10);
  for (int i = 0; i < kJobs; ++i)
    prod->publish_job("batch", "acme", name("r", i), submit_body("acme", name("r", i), 4));
  {
    Sink early(ns.url());
    BOOST_REQUIRE_GE(early.read(kJobs / 4, 30s).size(), size_t{kJobs / 4});
  }
  prod.reset();
  const auto stopped_at = std::chrono::steady_clock::now();
  ns.stop();
  // Down until a finished job's result was refused (its pub-ack timed out): that result is kept
  // and published again after the reconnect.
  BOOST_REQUIRE(eventually(
      [&] { return metric(*node, "switchyard_cluster_publish_failures_total") >= 1; }, 30s));
  BOOST_TEST(metric(*node, "switchyard_cluster_connected") == 0);
  // The outage the scenario asks for: nats-server stays away 5 s in all (the node keeps
  // finishing jobs and holding their results meanwhile).
  std::this_thread::sleep_until(stopped_at + 5s);
  ns.restart();  // same port, same store: what JetStream acknowledged is still there
  BOOST_REQUIRE(
      eventually([&] { return metric(*node, "switchyard_cluster_reconnects_total") >= 1; }, 30s));
  Sink sink(ns.url());
  const auto& rs = sink.read(kJobs, 60s);
  BOOST_REQUIRE_EQUAL(rs.size(), size_t{kJobs});
  auto keys = by_key(rs);
  BOOST_TEST(keys.size() == size_t{kJobs});
  for (int i = 0; i < kJobs; ++i) {
    auto it = keys.find(name("acme/r", i));
    BOOST_REQUIRE(it != keys.end());
    BOOST_TEST(it->second->done());
  }
  prod = producer(ns);
  BOOST_TEST(
      eventually([&] { return prod->lag(1).pending == 0 && prod->lag(1).ack_pending == 0; }));
  BOOST_TEST(metric(*node, "switchyard_cluster_results_published_total") >= kJobs);
}

BOOST_AUTO_TEST_CASE(a_node_stopping_gives_its_running_job_to_another) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  // 100 steps of 20 ms: the job still runs when the 100 ms grace is over.
  auto a = start_node(ns, dir, "a", 1, 20, 16, false, {"--grace-ms", "100"});
  prod->publish_job("batch", "acme", "handover", submit_body("acme", "handover", 100));
  BOOST_REQUIRE(eventually([&] { return metric(*a, "switchyard_cluster_in_flight") == 1; }));
  BOOST_TEST(a->stop(SIGTERM) == 0);
  auto b = start_node(ns, dir, "b", 1, 0);
  const auto& rs = sink.read(1, 30s);
  BOOST_REQUIRE_EQUAL(rs.size(), 1u);
  BOOST_REQUIRE(rs[0].done());
  // Not cancelled by the stopping node: run to its end by the other one.
  BOOST_TEST(rs[0].node == "b");
  BOOST_TEST(rs[0].delivery == 2u);
  BOOST_TEST(static_cast<int>(rs[0].done()->finish_reason) ==
             static_cast<int>(wire::FinishReason::length));
  BOOST_TEST(rs[0].done()->usage.completion_tokens == 100u);
  BOOST_TEST(
      eventually([&] { return prod->lag(1).pending == 0 && prod->lag(1).ack_pending == 0; }));
}

// A producer that publishes the same key again within the duplicate window (a retry after a lost
// pub-ack, say): JetStream drops the second publish, so the node fetches and runs the job once.
BOOST_AUTO_TEST_CASE(a_key_published_again_within_the_duplicate_window_runs_once) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  auto node = start_node(ns, dir, "n1", 16, 0);
  bool dup_first = true, dup_again = false, dup_other = true;
  prod->publish_job("batch", "acme", "twice", submit_body("acme", "twice", 4), {}, &dup_first);
  // The same key with another body (8 tokens): still the same job as far as the queue goes.
  prod->publish_job("batch", "acme", "twice", submit_body("acme", "twice", 8), {}, &dup_again);
  prod->publish_job("batch", "acme", "other", submit_body("acme", "other", 4), {}, &dup_other);
  BOOST_TEST(!dup_first);
  BOOST_TEST(dup_again);
  BOOST_TEST(!dup_other);
  const auto& rs = sink.read(2, 30s);
  BOOST_REQUIRE_EQUAL(rs.size(), 2u);
  auto keys = by_key(rs);
  BOOST_REQUIRE(keys.count("acme/twice"));
  BOOST_REQUIRE(keys.at("acme/twice")->done());
  BOOST_TEST(keys.at("acme/twice")->done()->usage.completion_tokens == 4u);  // the first body
  // Nothing else is left to deliver, and the node fetched two jobs, not three.
  BOOST_TEST(eventually([&] {
    auto b = prod->lag(1);
    return b.pending == 0 && b.ack_pending == 0;
  }));
  BOOST_TEST(metric(*node, "switchyard_cluster_fetched_total") == 2);
  BOOST_TEST(eventually([&] { return metric(*node, "switchyard_cluster_acked_total") == 2; }));
  BOOST_TEST(node->stop() == 0);
}

// Jobs a node holds beyond what it starts: --test-overfetch keeps up to 300 jobs a class in each
// node's pull subscription buffers, delivered by JetStream but not started, as a fetch that
// returned before its jobs arrived leaves them. The router's class queues take 8 jobs each, so
// its PULL credit stops once 8 are queued and a window of 64 waits beside them; the rest stay
// held in the node. Two nodes run 16 jobs at a time, each 4 steps of at least 20 ms, so a node
// ends at most 16 / 0.08 s = 200 jobs a second and the last of 300 held jobs waits at least
// 1.5 s, longer than the 1 s ack_wait: only the in-progress acks the node sends for held jobs
// keep JetStream from delivering them again. Every job must start exactly once (the nodes' own
// start lines), with no redelivery.
BOOST_AUTO_TEST_CASE(held_jobs_outlive_ack_wait_and_each_starts_once) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  const std::vector<std::string> logs = {dir.path() + "/h1.log", dir.path() + "/h2.log"};
  std::vector<std::unique_ptr<it::ServerProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(start_node(ns, dir, name("h", n + 1), 16, 20, 16, false,
                               {"--test-overfetch", "300", "--log-level", "debug"}, logs[n], 8));
    wait_joined(*nodes.back());
  }
  constexpr int kJobs = 2000;
  for (int i = 0; i < kJobs; ++i)
    prod->publish_job("batch", "acme", name("h", i), submit_body("acme", name("h", i), 4));
  const auto& rs = sink.read(kJobs, 120s);
  BOOST_REQUIRE_EQUAL(rs.size(), size_t{kJobs});
  auto keys = by_key(rs);
  BOOST_TEST(keys.size() == size_t{kJobs});
  for (const auto& r : rs) {
    BOOST_TEST(r.delivery == 1u, r.msg_id << " was delivered " << r.delivery << " times");
    BOOST_REQUIRE(r.done());
    BOOST_TEST(r.done()->usage.completion_tokens == 4u);
  }
  BOOST_TEST(eventually([&] {
    auto b = prod->lag(1);
    return b.pending == 0 && b.ack_pending == 0;
  }));
  double held = 0, redelivered = 0, fetched = 0;
  for (auto& n : nodes) {
    held += metric(*n, "switchyard_cluster_held_total");
    redelivered += metric(*n, "switchyard_cluster_redelivered_total");
    fetched += metric(*n, "switchyard_cluster_fetched_total");
  }
  BOOST_TEST(held >= 300);  // the scenario happened: at least one node's full buffer was held
  BOOST_TEST(redelivered == 0);
  BOOST_TEST(fetched == kJobs);
  for (auto& n : nodes) BOOST_TEST(n->stop() == 0);
  std::map<std::string, int> starts;
  uint64_t restarts = 0;
  for (const auto& log : logs) count_starts(log, starts, restarts);
  BOOST_TEST(starts.size() == size_t{kJobs});
  int twice = 0;
  for (const auto& [key, n] : starts)
    if (n != 1) ++twice;
  BOOST_TEST(twice == 0);
  BOOST_TEST(restarts == 0u);
  BOOST_TEST_MESSAGE("jobs held by the nodes: " << held);
}

// A cancel published while no node runs is kept by SWITCHYARD_CANCELS: a node started later reads
// it before it starts anything, so the cancelled job ends `cancelled` without ever starting on
// it, while the job beside it runs.
BOOST_AUTO_TEST_CASE(a_node_started_after_a_cancel_never_starts_the_cancelled_job) {
  test::NatsServer ns;
  it::TempDir dir;
  auto prod = producer(ns);
  Sink sink(ns.url());
  prod->publish_job("batch", "acme", "gone", submit_body("acme", "gone", 4));
  prod->publish_job("batch", "acme", "kept", submit_body("acme", "kept", 4));
  prod->publish_cancel(wire::encode_client(wire::Cancel{"gone", "acme", ""}));
  const std::string log = dir.path() + "/late.log";
  auto node = start_node(ns, dir, "late", 16, 0, 16, false, {"--log-level", "debug"}, log);
  const auto& rs = sink.read(2, 30s);
  BOOST_REQUIRE_EQUAL(rs.size(), 2u);
  auto keys = by_key(rs);
  BOOST_REQUIRE(keys.count("acme/gone") && keys["acme/gone"]->done());
  BOOST_TEST(static_cast<int>(keys["acme/gone"]->done()->finish_reason) ==
             static_cast<int>(wire::FinishReason::cancelled));
  BOOST_TEST(keys["acme/gone"]->done()->usage.completion_tokens == 0u);
  BOOST_REQUIRE(keys.count("acme/kept") && keys["acme/kept"]->done());
  BOOST_TEST(keys["acme/kept"]->done()->usage.completion_tokens == 4u);
  BOOST_TEST(metric(*node, "switchyard_cluster_cancels_heard_total") == 1);
  BOOST_TEST(metric(*node, "switchyard_cluster_cancelled_at_fetch_total") == 1);
  BOOST_TEST(
      eventually([&] { return prod->lag(1).pending == 0 && prod->lag(1).ack_pending == 0; }));
  BOOST_TEST(node->stop() == 0);
  std::map<std::string, int> starts;
  uint64_t restarts = 0;
  count_starts(log, starts, restarts);
  BOOST_TEST(starts["acme/kept"] == 1);
  BOOST_TEST(starts.count("acme/gone") == 0u);
}

BOOST_AUTO_TEST_SUITE_END()  // test_cluster_node
