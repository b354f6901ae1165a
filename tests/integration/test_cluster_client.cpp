// The producer side of a cluster against a real nats-server -js: ClusterClient and `switchyard
// submit --nats` publish jobs that a node's NatsLink fetches with the contract's subject,
// Nats-Msg-Id and reply header; duplicates are reported; a full jobs stream is "overloaded"
// (ClusterOverloaded, exit status 3); results come back on the reply subject and from
// SWITCHYARD_RESULTS; cancels reach switchyard.cancel. The test plays the node with NatsLink.
#include <nats/nats.h>

#include <boost/test/unit_test.hpp>
#include <future>
#include <set>

#include "clients/cpp/cluster_client.hpp"
#include "ingress/nats_link.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/nats_server.hpp"

BOOST_AUTO_TEST_SUITE(test_cluster_client)

using namespace sy;
using std::chrono::milliseconds;

namespace {

const std::vector<std::string> kClasses = {"interactive", "batch"};

ClusterConfig node_config(const test::NatsServer& ns, int64_t max_jobs = 1000) {
  ClusterConfig c;
  c.nats = {ns.url()};
  c.node_name = "test-node";
  c.max_jobs = max_jobs;
  return c;
}

// The node's side: the streams and consumers made as a joining node makes them.
std::unique_ptr<cluster::NatsLink> node(const ClusterConfig& c) {
  auto l = std::make_unique<cluster::NatsLink>(c, kClasses);
  BOOST_TEST(l->ensure_streams().empty());
  BOOST_TEST(l->bind_consumers().empty());
  return l;
}

client::ClusterOptions client_options(const test::NatsServer& ns, bool reply = true) {
  client::ClusterOptions o;
  o.nats = {ns.url()};
  o.reply = reply;
  return o;
}

// Fetches `n` jobs of class `cls`, or fewer when `tries` fetches of 2 s come back empty; a
// fetch returns as soon as a job is there.
std::vector<cluster::Delivery> fetch_n(cluster::NatsLink& l, uint32_t cls, int n, int tries = 3) {
  std::vector<cluster::Delivery> got;
  while (static_cast<int>(got.size()) < n && tries > 0) {
    auto more = l.fetch(cls, n - static_cast<int>(got.size()), 2000);
    if (more.empty()) --tries;
    for (auto& d : more) got.push_back(std::move(d));
  }
  return got;
}

wire::Submit decode_job(const cluster::Delivery& d) {
  auto m = wire::decode_client(d.data.data(), d.data.size());
  BOOST_REQUIRE(std::holds_alternative<wire::ClientMessage>(m));
  auto& cm = std::get<wire::ClientMessage>(m);
  BOOST_REQUIRE(std::holds_alternative<wire::Submit>(cm));
  return std::get<wire::Submit>(cm);
}

std::string subject_of(const cluster::Delivery& d) {
  return natsMsg_GetSubject(d.msg.get());
}

wire::Submit job(const std::string& id, const std::string& tenant, const std::string& cls = "") {
  wire::Submit s;
  s.id = id;
  s.tenant = tenant;
  s.priority = cls;
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = 4;
  return s;
}

wire::Done done_of(const wire::Submit& s, std::vector<int32_t> ids) {
  wire::Done d;
  d.id = s.id;
  d.tenant = s.tenant;
  d.finish_reason = wire::FinishReason::length;
  d.ids = std::move(ids);
  d.text = "t" + s.id;
  d.usage.prompt_tokens = 3;
  d.usage.completion_tokens = static_cast<uint32_t>(d.ids.size());
  return d;
}

// What a node does with a finished job: the result to the reply subject (if any) and into
// SWITCHYARD_RESULTS, then the ack.
void answer(cluster::NatsLink& l, const cluster::Delivery& d, const wire::ServerMessage& m) {
  const std::string body = wire::encode_server(m);
  if (!d.reply_to.empty()) BOOST_TEST(l.publish(d.reply_to, body));
  l.publish_result(client::message_tenant(m), d.msg_id, body);
  BOOST_TEST(l.ack(d));
}

// A core-NATS subscription on switchyard.cancel, as every node has one.
struct CancelListener {
  explicit CancelListener(cluster::NatsLink& l) {
    BOOST_REQUIRE(natsConnection_SubscribeSync(&sub, l.connection(), cluster::kCancelSubject) ==
                  NATS_OK);
    BOOST_REQUIRE(natsConnection_FlushTimeout(l.connection(), 5000) == NATS_OK);
  }
  ~CancelListener() { natsSubscription_Destroy(sub); }
  // The next cancel, waiting up to 5 s (a published cancel arrives within milliseconds).
  std::optional<wire::Cancel> next() {
    natsMsg* m = nullptr;
    if (natsSubscription_NextMsg(&m, sub, 5000) != NATS_OK) return std::nullopt;
    auto d = wire::decode_client(natsMsg_GetData(m), static_cast<size_t>(natsMsg_GetDataLength(m)));
    natsMsg_Destroy(m);
    if (!std::holds_alternative<wire::ClientMessage>(d)) return std::nullopt;
    auto& cm = std::get<wire::ClientMessage>(d);
    if (!std::holds_alternative<wire::Cancel>(cm)) return std::nullopt;
    return std::get<wire::Cancel>(cm);
  }
  natsSubscription* sub = nullptr;
};

std::string jsonl(const std::vector<std::string>& ids, const std::string& extra = "") {
  std::string s;
  for (const auto& id : ids)
    s += "{\"id\": \"" + id + "\", \"prompt\": [1, 2, 3], \"max_tokens\": 4" + extra + "}\n";
  return s;
}

std::vector<nlohmann::json> result_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  std::string l;
  while (std::getline(f, l)) out.push_back(nlohmann::json::parse(l));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(client_publishes_with_the_contract_subject_id_and_reply) {
  test::NatsServer ns;
  auto n = node(node_config(ns));
  client::ClusterClient cc(client_options(ns));
  BOOST_TEST(cc.reply_subject().rfind("_INBOX.", 0) == 0u, cc.reply_subject());

  auto s = job("j1", "acme", "batch");
  s.stream = true;
  s.token = "sekret";
  auto p = cc.submit(s);
  BOOST_TEST(p.subject == "switchyard.jobs.batch");
  BOOST_TEST(p.stream_seq == 1u);
  BOOST_TEST(!p.duplicate);
  // No class named: the default class, named in the body as well.
  auto p2 = cc.submit(job("j2", "acme"));
  BOOST_TEST(p2.subject == "switchyard.jobs.interactive");
  BOOST_TEST(p2.stream_seq == 2u);

  auto batch = fetch_n(*n, 1, 1);
  BOOST_REQUIRE(batch.size() == 1u);
  BOOST_TEST(subject_of(batch[0]) == "switchyard.jobs.batch");
  BOOST_TEST(batch[0].msg_id == "acme/j1");
  BOOST_TEST(batch[0].reply_to == cc.reply_subject());
  BOOST_TEST(batch[0].delivered == 1u);
  auto got = decode_job(batch[0]);
  BOOST_TEST((got == s));  // the same submit body as on ZeroMQ, field for field
  auto inter = fetch_n(*n, 0, 1);
  BOOST_REQUIRE(inter.size() == 1u);
  BOOST_TEST(inter[0].msg_id == "acme/j2");
  BOOST_TEST(decode_job(inter[0]).priority == "interactive");

  // The same key again within the duplicate window: JetStream drops it, the client says so.
  auto again = cc.submit(job("j1", "acme", "batch"));
  BOOST_TEST(again.duplicate);
  BOOST_TEST(again.stream_seq == 1u);  // the sequence of the job already stored
  BOOST_TEST(n->fetch(1, 5, 300).empty());
  // Another tenant's j1 is another key.
  BOOST_TEST(!cc.submit(job("j1", "beta", "batch")).duplicate);
  auto beta = fetch_n(*n, 1, 1);
  BOOST_REQUIRE(beta.size() == 1u);
  BOOST_TEST(beta[0].msg_id == "beta/j1");
  for (auto* d : {&batch[0], &inter[0], &beta[0]}) BOOST_TEST(n->ack(*d));
}

BOOST_AUTO_TEST_CASE(results_come_on_the_reply_subject_and_from_the_results_stream) {
  test::NatsServer ns;
  auto n = node(node_config(ns));
  client::ClusterClient cc(client_options(ns));
  auto s1 = job("s1", "acme");
  s1.stream = true;
  auto s2 = job("s2", "acme", "batch");
  cc.submit(s1);
  cc.submit(s2);
  auto d1 = fetch_n(*n, 0, 1);
  auto d2 = fetch_n(*n, 1, 1);
  BOOST_REQUIRE(d1.size() == 1u);
  BOOST_REQUIRE(d2.size() == 1u);
  // s2 ends first; a streamed s1 gets its chunk on the reply subject, then its done.
  answer(*n, d2[0], wire::Error{"s2", "acme", ErrorCode::bad_request, "bad thing", std::nullopt});
  BOOST_TEST(n->publish(d1[0].reply_to,
                        wire::encode_server(wire::Tokens{"s1", 0, {7, 8}, "ab", {}, "acme"})));
  wire::Done d = done_of(s1, {});
  answer(*n, d1[0], d);

  auto r1 = cc.wait("s1", milliseconds(5000), "acme");
  BOOST_REQUIRE(r1.ok());
  BOOST_TEST(r1.chunks.size() == 1u);
  BOOST_TEST(r1.text == "ts1");                         // the done's text replaces the chunks'
  auto r2 = cc.wait("s2", milliseconds(5000), "acme");  // set aside while waiting for s1
  BOOST_REQUIRE(r2.error.has_value());
  BOOST_TEST(r2.error->message == "bad thing");

  // A second producer without a reply subject reads the same results from the stream, in the
  // order they were stored.
  client::ClusterClient reader(client_options(ns, false));
  BOOST_TEST(reader.reply_subject().empty());
  reader.follow_results("acme", true);
  auto m1 = reader.next(milliseconds(5000));
  auto m2 = reader.next(milliseconds(5000));
  BOOST_REQUIRE(m1.has_value());
  BOOST_REQUIRE(m2.has_value());
  BOOST_TEST(std::holds_alternative<wire::Error>(*m1));
  BOOST_TEST(client::message_id(*m1) == "s2");
  BOOST_TEST(std::holds_alternative<wire::Done>(*m2));
  BOOST_TEST(client::message_id(*m2) == "s1");
  // Following from now on: only what is stored later, and only the tenant's own.
  client::ClusterClient later(client_options(ns, false));
  later.follow_results("acme", false);
  auto s3 = job("s3", "acme");
  cc.submit(s3);
  cc.submit(job("o1", "other"));
  auto d3 = fetch_n(*n, 0, 2);
  BOOST_REQUIRE(d3.size() == 2u);
  for (auto& d : d3) {
    auto sj = decode_job(d);
    answer(*n, d, done_of(sj, {5}));
  }
  auto m3 = later.next(milliseconds(5000));
  BOOST_REQUIRE(m3.has_value());
  BOOST_TEST(client::message_id(*m3) == "s3");
  BOOST_TEST(!later.next(milliseconds(300)).has_value());

  // Cancels go to switchyard.cancel as the protocol's cancel body.
  CancelListener cancels(*n);
  cc.cancel("s9", "acme", "tok");
  auto c = cancels.next();
  BOOST_REQUIRE(c.has_value());
  BOOST_TEST((*c == wire::Cancel{"s9", "acme", "tok"}));
}

BOOST_AUTO_TEST_CASE(full_stream_is_overloaded_and_missing_streams_are_named) {
  test::NatsServer ns;
  client::ClusterClient cc(client_options(ns));
  // No node has joined: no stream takes the subject.
  try {
    cc.submit(job("x", "acme"));
    BOOST_FAIL("a publish without SWITCHYARD_JOBS was accepted");
  } catch (const client::ClusterOverloaded&) {
    BOOST_FAIL("a missing stream is not an overload");
  } catch (const client::ClientError& e) {
    BOOST_TEST(std::string(e.what()).find("no stream takes switchyard.jobs.interactive: no "
                                          "Switchyard node has created SWITCHYARD_JOBS yet") !=
                   std::string::npos,
               e.what());
  }
  try {
    cc.submit(job("x", "acme", "inter.active"));
    BOOST_FAIL("a class with a dot was published");
  } catch (const client::ClientError& e) {
    BOOST_TEST(std::string(e.what()) ==
               "priority class 'inter.active' cannot be a subject token: it contains '.'");
  }

  try {
    cc.submit(job("x", "ac me"));
    BOOST_FAIL("a tenant with a space was published");
  } catch (const client::ClientError& e) {
    BOOST_TEST(std::string(e.what()) ==
               "tenant 'ac me' cannot be a subject token: it contains whitespace or a control "
               "character");
  }

  auto n = node(node_config(ns, 2));
  cc.submit(job("j0", "acme"));
  cc.submit(job("j1", "acme", "batch"));
  try {
    cc.submit(job("j2", "acme"));
    BOOST_FAIL("a publish past max_jobs was accepted");
  } catch (const client::ClusterOverloaded& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("the cluster is overloaded: SWITCHYARD_JOBS is full and refused job "
                         "'acme/j2'") == 0u,
               what);
    BOOST_TEST(what.find("maximum messages exceeded") != std::string::npos, what);
  }
  // Nothing past the limit was stored; once a node takes a job there is room again.
  BOOST_TEST(n->lag(0).pending + n->lag(1).pending == 2u);
  auto d = fetch_n(*n, 0, 1);
  BOOST_REQUIRE(d.size() == 1u);
  BOOST_TEST(n->ack(d[0]));
  BOOST_TEST(!cc.submit(job("j2", "acme")).duplicate);
}

BOOST_AUTO_TEST_CASE(cli_no_wait_publishes_reports_duplicates_and_overload) {
  test::NatsServer ns;
  auto n = node(node_config(ns, 4));
  it::TempDir dir;
  const std::string in =
      dir.write("jobs.jsonl", jsonl({"a", "b"}) + jsonl({"c"}, ", \"priority\": \"batch\""));
  const std::string cmd = "submit --nats " + ns.url() + " --tenant acme --no-wait --input " + in;
  auto r = it::run_binary(cmd, "timeout 60 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("3 published (0 duplicates), 0 not published") != std::string::npos, r.out);
  auto inter = fetch_n(*n, 0, 2);
  auto batch = fetch_n(*n, 1, 1);
  BOOST_REQUIRE(inter.size() == 2u);
  BOOST_REQUIRE(batch.size() == 1u);
  BOOST_TEST(inter[0].msg_id == "acme/a");
  BOOST_TEST(inter[1].msg_id == "acme/b");
  BOOST_TEST(subject_of(inter[0]) == "switchyard.jobs.interactive");
  BOOST_TEST(batch[0].msg_id == "acme/c");
  BOOST_TEST(subject_of(batch[0]) == "switchyard.jobs.batch");
  BOOST_TEST(batch[0].reply_to.empty());  // --no-wait: nobody listens for the results
  BOOST_TEST(decode_job(batch[0]).max_tokens == 4u);

  // Published again within the duplicate window: nothing is queued twice.
  r = it::run_binary(cmd, "timeout 60 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("3 published (3 duplicates)") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("job 'acme/b' is a duplicate of one published within the duplicate "
                        "window: not queued again") != std::string::npos,
             r.out);
  BOOST_TEST(n->fetch(0, 5, 300).empty());

  // The three are still unacked (in the stream); max_jobs 4 leaves room for one of three more.
  const std::string in2 = dir.write("more.jsonl", jsonl({"d", "e", "f"}));
  r = it::run_binary("submit --nats " + ns.url() + " --tenant acme --no-wait --input " + in2,
                     "timeout 60 ");
  BOOST_TEST(r.status == 3, r.out);
  BOOST_TEST(r.out.find("switchyard: error: the cluster is overloaded: SWITCHYARD_JOBS is full and "
                        "refused job 'acme/e'") != std::string::npos,
             r.out);
  BOOST_TEST(r.out.find("1 published (0 duplicates), 2 not published") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(cli_waits_for_results_and_writes_them_like_zeromq) {
  test::NatsServer ns;
  auto n = node(node_config(ns));
  it::TempDir dir;
  const std::string in = dir.write("jobs.jsonl", jsonl({"a", "b", "c"}));
  const std::string out = dir.path() + "/results.jsonl";
  const std::string cmd = "submit --nats " + ns.url() + " --tenant acme --timeout-ms 30000 " +
                          "--window 2 --input " + in + " --output " + out;
  auto cli = std::async(std::launch::async, [&] { return it::run_binary(cmd, "timeout 120 "); });
  // The window lets two jobs out before the first result; the third comes after one ends.
  auto first = fetch_n(*n, 0, 2);
  BOOST_REQUIRE(first.size() == 2u);
  BOOST_TEST(n->fetch(0, 5, 300).empty());
  BOOST_TEST(!first[0].reply_to.empty());
  answer(*n, first[0], done_of(decode_job(first[0]), {4, 5, 6, 7}));
  auto third = fetch_n(*n, 0, 1);
  BOOST_REQUIRE(third.size() == 1u);
  BOOST_TEST(third[0].msg_id == "acme/c");
  answer(*n, third[0], done_of(decode_job(third[0]), {9}));
  answer(*n, first[1], wire::Error{"b", "acme", ErrorCode::bad_request, "no", std::nullopt});
  auto r = cli.get();
  BOOST_TEST(r.status == 1, r.out);  // one job failed
  BOOST_TEST(r.out.find("switchyard: summary: 2 done, 1 failed, 0 skipped (already in the "
                        "output), 0 not finished; 5 tokens") != std::string::npos,
             r.out);
  auto lines = result_lines(out);
  BOOST_REQUIRE(lines.size() == 3u);
  std::map<std::string, nlohmann::json> by_id;
  for (auto& l : lines) by_id[l.at("id").get<std::string>()] = l;
  BOOST_TEST(by_id.at("a").at("ids") == nlohmann::json({4, 5, 6, 7}));
  BOOST_TEST(by_id.at("a").at("text") == "ta");
  BOOST_TEST(by_id.at("a").at("finish_reason") == "length");
  BOOST_TEST(by_id.at("a").at("usage").at("completion_tokens") == 4);
  BOOST_TEST(by_id.at("c").at("ids") == nlohmann::json({9}));
  BOOST_TEST(by_id.at("b").at("error").at("code") == "bad_request");
  BOOST_TEST(by_id.at("b").at("error").at("message") == "no");

  // Everything is in the output: a rerun publishes nothing.
  r = it::run_binary(cmd, "timeout 60 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("3 already in " + out + ", 0 to publish") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(cli_reads_a_duplicates_result_from_the_results_stream) {
  test::NatsServer ns;
  auto n = node(node_config(ns));
  it::TempDir dir;
  const std::string in = dir.write("jobs.jsonl", jsonl({"k1"}));
  auto r = it::run_binary("submit --nats " + ns.url() + " --tenant acme --no-wait --input " + in,
                          "timeout 60 ");
  BOOST_TEST(r.status == 0, r.out);
  auto d = fetch_n(*n, 0, 1);
  BOOST_REQUIRE(d.size() == 1u);
  answer(*n, d[0], done_of(decode_job(d[0]), {3, 3}));  // stored, no reply subject
  const std::string out = dir.path() + "/results.jsonl";
  r = it::run_binary("submit --nats " + ns.url() + " --tenant acme --timeout-ms 30000 --input " +
                         in + " --output " + out,
                     "timeout 60 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("reading its result from SWITCHYARD_RESULTS") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("1 done, 0 failed") != std::string::npos, r.out);
  auto lines = result_lines(out);
  BOOST_REQUIRE(lines.size() == 1u);
  BOOST_TEST(lines[0].at("ids") == nlohmann::json({3, 3}));
}

BOOST_AUTO_TEST_CASE(cli_gives_up_after_the_timeout_and_cancels) {
  test::NatsServer ns;
  auto n = node(node_config(ns));
  it::TempDir dir;
  const std::string in = dir.write("jobs.jsonl", jsonl({"q1", "q2"}));
  // No node fetches: after --timeout-ms without a result the CLI stops; the jobs stay queued.
  auto r = it::run_binary("submit --nats " + ns.url() + " --tenant acme --timeout-ms 300 " +
                              "--input " + in + " --output " + dir.path() + "/o.jsonl",
                          "timeout 60 ");
  BOOST_TEST(r.status == 1, r.out);
  BOOST_TEST(
      r.out.find("no result within 300 ms with 2 jobs in flight: giving up") != std::string::npos,
      r.out);
  BOOST_TEST(n->lag(0).pending == 2u);

  CancelListener cancels(*n);
  r = it::run_binary(
      "submit --nats " + ns.url() + " --tenant acme --token tk --cancel q1 " + "--cancel q2",
      "timeout 60 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("cancel of 'acme/q1' published on switchyard.cancel") != std::string::npos,
             r.out);
  auto c1 = cancels.next();
  auto c2 = cancels.next();
  BOOST_REQUIRE(c1.has_value());
  BOOST_REQUIRE(c2.has_value());
  BOOST_TEST((*c1 == wire::Cancel{"q1", "acme", "tk"}));
  BOOST_TEST((*c2 == wire::Cancel{"q2", "acme", "tk"}));

  // Tenants and classes become subject tokens: refused before anything is published.
  r = it::run_binary("submit --nats " + ns.url() + " --tenant ac.me --no-wait --input " + in,
                     "timeout 60 ");
  BOOST_TEST(r.status == 2, r.out);
  BOOST_TEST(r.out.find("job 'q1': tenant 'ac.me' cannot be a NATS subject token: it contains "
                        "'.'") != std::string::npos,
             r.out);
  BOOST_TEST(n->lag(0).pending == 2u);

  r = it::run_binary("submit --cancel q1 --tenant acme", "timeout 60 ");
  BOOST_TEST(r.status == 2, r.out);
  BOOST_TEST(r.out.find("--cancel needs --nats") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(cli_overload_while_waiting_exits_3_after_the_published_jobs) {
  test::NatsServer ns;
  auto n = node(node_config(ns, 1));
  it::TempDir dir;
  const std::string in = dir.write("jobs.jsonl", jsonl({"w1", "w2", "w3"}));
  const std::string out = dir.path() + "/o.jsonl";
  auto cli = std::async(std::launch::async, [&] {
    return it::run_binary("submit --nats " + ns.url() + " --tenant acme --timeout-ms 30000 " +
                              "--input " + in + " --output " + out,
                          "timeout 120 ");
  });
  // w1 is queued, w2 refused (max_jobs 1); the CLI still collects w1's result. w1 is acked only
  // after the CLI is done, so that it fills the stream whenever w2 is published.
  auto d = fetch_n(*n, 0, 1);
  BOOST_REQUIRE(d.size() == 1u);
  BOOST_TEST(d[0].msg_id == "acme/w1");
  BOOST_TEST(n->publish(d[0].reply_to, wire::encode_server(done_of(decode_job(d[0]), {1}))));
  auto r = cli.get();
  BOOST_TEST(n->ack(d[0]));
  BOOST_TEST(r.status == 3, r.out);
  BOOST_TEST(r.out.find("the cluster is overloaded: SWITCHYARD_JOBS is full and refused job "
                        "'acme/w2'") != std::string::npos,
             r.out);
  BOOST_TEST(r.out.find("1 done, 0 failed, 0 skipped (already in the output), 2 not finished") !=
                 std::string::npos,
             r.out);
  BOOST_TEST(r.out.find("2 not published") != std::string::npos, r.out);
  BOOST_TEST(result_lines(out).size() == 1u);
  BOOST_TEST(n->fetch(0, 5, 300).empty());  // nothing past the limit was stored
}

BOOST_AUTO_TEST_SUITE_END()  // test_cluster_client
