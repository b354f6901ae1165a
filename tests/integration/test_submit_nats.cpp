// `switchyard submit --nats` and ClusterClient against a real node (`switchyard serve --nats`,
// null backend) and a real nats-server -js: a JSONL batch runs to completion with the same
// result lines as over ZeroMQ, a streamed job's chunks come to the reply subject, every result
// is stored in SWITCHYARD_RESULTS, a cancel stops a running job, and a result that reaches the
// reply subject twice is passed on and written once.
#include <nats/nats.h>

#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "clients/cpp/cluster_client.hpp"
#include "tests/integration/server_process.hpp"
#include "tests/support/nats_server.hpp"

BOOST_AUTO_TEST_SUITE(test_submit_nats)

using namespace sy;
using std::chrono::milliseconds;

namespace {

std::vector<nlohmann::json> result_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  std::string l;
  while (std::getline(f, l)) out.push_back(nlohmann::json::parse(l));
  return out;
}

client::ClusterOptions options(const test::NatsServer& ns, bool reply = true) {
  client::ClusterOptions o;
  o.nats = {ns.url()};
  o.reply = reply;
  return o;
}

// Waits until a node has created SWITCHYARD_JOBS: a node says "ready" for its own endpoints and
// joins the cluster alongside, and a job published before the stream exists is refused. A node
// joins within a second on loopback; 30 s only bounds a node that never does.
void wait_for_jobs_stream(const test::NatsServer& ns) {
  natsConnection* nc = nullptr;
  BOOST_REQUIRE(natsConnection_ConnectTo(&nc, ns.url().c_str()) == NATS_OK);
  jsCtx* js = nullptr;
  BOOST_REQUIRE(natsConnection_JetStream(&js, nc, nullptr) == NATS_OK);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool found = false;
  while (!found && std::chrono::steady_clock::now() < until) {
    jsStreamInfo* si = nullptr;
    found = js_GetStreamInfo(&si, js, "SWITCHYARD_JOBS", nullptr, nullptr) == NATS_OK;
    if (si) jsStreamInfo_Destroy(si);
    if (!found) std::this_thread::sleep_for(milliseconds(20));
  }
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  BOOST_REQUIRE_MESSAGE(found, "no node created SWITCHYARD_JOBS within 30 s");
}

}  // namespace

BOOST_AUTO_TEST_CASE(batch_runs_on_a_node_and_resumes) {
  test::NatsServer ns;
  it::ServerProcess node({"--backend", "null", "--nats", ns.url()});
  wait_for_jobs_stream(ns);
  it::TempDir dir;
  std::string jobs;
  for (int i = 0; i < 40; ++i)
    jobs += "{\"id\": \"j" + std::to_string(i) + "\", \"prompt\": [1, 2, 3], \"max_tokens\": 5, " +
            "\"ignore_eos\": true" + (i % 2 ? ", \"priority\": \"batch\"" : "") + "}\n";
  const std::string in = dir.write("jobs.jsonl", jobs);
  const std::string out = dir.path() + "/results.jsonl";
  const std::string cmd =
      "submit --nats " + ns.url() + " --tenant acme --window 8 --input " + in + " --output " + out;
  auto r = it::run_binary(cmd, "timeout 120 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("switchyard: summary: 40 done, 0 failed") != std::string::npos, r.out);
  std::set<std::string> ids;
  for (const auto& l : result_lines(out)) {
    ids.insert(l.at("id").get<std::string>());
    BOOST_TEST(l.at("usage").at("completion_tokens") == 5, l.dump());
    BOOST_TEST(l.at("ids").size() == 5u, l.dump());
    BOOST_TEST(l.at("finish_reason") == "length", l.dump());
  }
  BOOST_TEST(ids.size() == 40u);

  // Every result is stored in SWITCHYARD_RESULTS under the tenant's subject.
  client::ClusterClient reader(options(ns, false));
  reader.follow_results("acme", true);
  std::set<std::string> stored;
  while (stored.size() < 40u) {
    auto m = reader.next(milliseconds(10000));
    BOOST_REQUIRE(m.has_value());
    BOOST_TEST(std::holds_alternative<wire::Done>(*m));
    stored.insert(client::message_id(*m));
  }
  BOOST_TEST(stored == ids);

  // Nothing left to run: a rerun publishes nothing.
  r = it::run_binary(cmd, "timeout 60 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("40 already in " + out + ", 0 to publish") != std::string::npos, r.out);
  BOOST_TEST(node.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(streamed_chunks_reach_the_reply_subject_and_cancel_stops_a_job) {
  test::NatsServer ns;
  // Each step takes 20 ms (test-only), so a 2000-token job runs for 40 s unless cancelled.
  it::ServerProcess node({"--backend", "null", "--step-delay-ms", "20", "--nats", ns.url()});
  wait_for_jobs_stream(ns);
  client::ClusterClient cc(options(ns));

  wire::Submit s;
  s.id = "st1";
  s.tenant = "acme";
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = 6;
  s.ignore_eos = true;
  s.stream = true;
  auto r = cc.run(s, milliseconds(30000));
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(r.chunks.size() >= 1u);
  BOOST_TEST(r.ids.size() == 6u);
  BOOST_TEST(r.done->usage.completion_tokens == 6u);

  wire::Submit long_job = s;
  long_job.id = "long";
  long_job.max_tokens = 2000;
  cc.submit(long_job);
  // Running once its first chunk arrives; then cancelled.
  auto first = cc.next(milliseconds(30000));
  BOOST_REQUIRE(first.has_value());
  BOOST_TEST(std::holds_alternative<wire::Tokens>(*first));
  BOOST_TEST(client::message_id(*first) == "long");
  cc.cancel("long", "acme");
  auto end = cc.wait("long", milliseconds(30000), "acme");
  BOOST_REQUIRE(!end.timed_out);
  if (end.done) {
    BOOST_TEST((end.done->finish_reason == wire::FinishReason::cancelled));
    BOOST_TEST(end.done->usage.completion_tokens < 2000u);
  } else {
    BOOST_TEST((end.error->code == ErrorCode::cancelled));
  }
  BOOST_TEST(node.stop(SIGTERM) == 0);
}

// The cluster path carries constraints and sampling controls like the ZeroMQ door: a node runs
// them, and a constraint the node cannot compile comes back as bad_request on the reply subject.
BOOST_AUTO_TEST_CASE(constrained_jobs_run_through_the_cluster) {
  test::NatsServer ns;
  it::ServerProcess node({"--model", it::kStories, "--threads", "1", "--nats", ns.url()});
  wait_for_jobs_stream(ns);
  client::ClusterClient cc(options(ns));
  wire::Submit s;
  s.id = "c1";
  s.tenant = "acme";
  s.prompt = std::string("Lily");
  s.max_tokens = 20;
  s.seed = 5;
  s.controls.presence_penalty = 0.5f;
  s.constraint.kind = Constraint::choices;
  s.constraint.options = {" ran", " sat down"};
  auto r = cc.run(s, milliseconds(30000));
  BOOST_REQUIRE(r.ok());
  BOOST_TEST((r.text == " ran" || r.text == " sat down"), r.text);
  s.id = "c2";
  s.constraint = {Constraint::regex, "(a)\\1", {}};
  r = cc.run(s, milliseconds(30000));
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST((r.error->code == ErrorCode::bad_request));
  BOOST_TEST(r.error->message.find("back-reference") != std::string::npos, r.error->message);
  BOOST_TEST(node.stop(SIGTERM) == 0);
}

// A program is one JetStream message run whole by the node (docs/cluster.md): its result carries
// every variable, and a tool step, which has no door back on a node, is refused before it runs.
BOOST_AUTO_TEST_CASE(a_program_runs_whole_on_a_node) {
  test::NatsServer ns;
  it::ServerProcess node({"--model", it::kStories, "--threads", "1", "--nats", ns.url()});
  wait_for_jobs_stream(ns);
  client::ClusterClient cc(options(ns));
  const std::string steps = R"([{"type":"text","text":"Once upon a time, {{who}}"},
    {"type":"gen","name":"a","max_tokens":8,"temperature":0},
    {"type":"select","name":"m","choices":[" happy"," sad"]},
    {"type":"fork","n":2,"steps":[{"type":"gen","name":"d","max_tokens":4,"temperature":0.8}]},
    {"type":"join","mode":"list","name":"ds","var":"d"}])";
  wire::Submit s = client::program_submit("p1", "acme", steps, {{"who", "Lily"}});
  auto r = cc.run(s, milliseconds(30000));
  BOOST_REQUIRE(r.ok());
  BOOST_REQUIRE(r.done.has_value());
  BOOST_TEST(r.done->steps == 4u);  // gen, select, two branch gens
  const wire::Var* a = r.var("a");
  BOOST_REQUIRE(a != nullptr);
  BOOST_TEST(!a->values.at(0).empty());
  const wire::Var* m = r.var("m");
  BOOST_REQUIRE(m != nullptr);
  BOOST_TEST((m->values.at(0) == " happy" || m->values.at(0) == " sad"));
  const wire::Var* ds = r.var("ds");
  BOOST_REQUIRE(ds != nullptr);
  BOOST_TEST(ds->list);
  BOOST_TEST(ds->values.size() == 2u);
  wire::Submit t = client::program_submit(
      "p2", "acme", R"([{"type":"text","text":"x"},{"type":"tool","name":"r","tool":"search"}])",
      {});
  r = cc.run(t, milliseconds(30000));
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST((r.error->code == ErrorCode::bad_request));
  BOOST_TEST(r.error->message.find("step 1 (tool 'r')") != std::string::npos, r.error->message);
  BOOST_TEST(node.stop(SIGTERM) == 0);
}

// A node that sends every result to the reply subject twice (--test-duplicate-results, as a job
// run twice would): a plain subscriber on the client's reply subject sees both copies, the
// client library passes on one, and `submit --nats` writes each key once.
BOOST_AUTO_TEST_CASE(a_result_sent_twice_to_the_reply_subject_is_written_once) {
  test::NatsServer ns;
  it::ServerProcess node({"--backend", "null", "--nats", ns.url(), "--test-duplicate-results"});
  wait_for_jobs_stream(ns);
  client::ClusterClient cc(options(ns));
  natsConnection* nc = nullptr;
  BOOST_REQUIRE(natsConnection_ConnectTo(&nc, ns.url().c_str()) == NATS_OK);
  natsSubscription* raw = nullptr;
  BOOST_REQUIRE(natsConnection_SubscribeSync(&raw, nc, cc.reply_subject().c_str()) == NATS_OK);
  BOOST_REQUIRE(natsConnection_Flush(nc) == NATS_OK);
  constexpr int kJobs = 5;
  wire::Submit s;
  s.tenant = "acme";
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = 3;
  s.ignore_eos = true;
  for (int i = 0; i < kJobs; ++i) {
    s.id = "d" + std::to_string(i);
    cc.submit(s);
  }
  // Both copies of every result reach a plain subscriber.
  int copies = 0;
  while (copies < 2 * kJobs) {
    natsMsg* m = nullptr;
    BOOST_REQUIRE_MESSAGE(natsSubscription_NextMsg(&m, raw, 20000) == NATS_OK,
                          "only " << copies << " results on the reply subject");
    natsMsg_Destroy(m);
    ++copies;
  }
  natsSubscription_Destroy(raw);
  natsConnection_Destroy(nc);
  // A last job: its result comes after every copy of the others (one results thread publishes
  // the two copies of a result one after the other), so once the client has it, it has had all.
  s.id = "last";
  cc.submit(s);
  std::map<std::string, int> results;
  while (!results.count("last")) {
    auto m = cc.next(milliseconds(20000));
    BOOST_REQUIRE(m.has_value());
    if (std::holds_alternative<wire::Done>(*m)) ++results[client::message_id(*m)];
  }
  BOOST_TEST(results.size() == size_t{kJobs + 1});
  for (const auto& [id, n] : results) BOOST_TEST(n == 1, id << " came " << n << " times");
  BOOST_TEST(cc.repeated_results() >= uint64_t{kJobs});

  // The command line: each key written once.
  it::TempDir dir;
  std::string jobs;
  constexpr int kBatch = 20;
  for (int i = 0; i < kBatch; ++i)
    jobs += "{\"id\": \"b" + std::to_string(i) +
            "\", \"prompt\": [1, 2, 3], \"max_tokens\": 3, \"ignore_eos\": true}\n";
  const std::string in = dir.write("jobs.jsonl", jobs);
  const std::string out = dir.path() + "/results.jsonl";
  auto r = it::run_binary(
      "submit --nats " + ns.url() + " --tenant acme --window 4 --input " + in + " --output " + out,
      "timeout 120 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("switchyard: summary: 20 done, 0 failed") != std::string::npos, r.out);
  std::map<std::string, int> written;
  for (const auto& l : result_lines(out)) ++written[l.at("id").get<std::string>()];
  BOOST_TEST(written.size() == size_t{kBatch});
  for (const auto& [id, n] : written) BOOST_TEST(n == 1, id << " written " << n << " times");
  // Every result but the last one's second copy came before the run ended (each result's two
  // copies are published back to back), and each was dropped.
  const auto at = r.out.find(" repeated results dropped");
  BOOST_REQUIRE(at != std::string::npos);
  const auto from = r.out.rfind(' ', at - 1) + 1;
  BOOST_TEST(std::stoi(r.out.substr(from, at - from)) >= kBatch - 1, r.out);
  BOOST_TEST(node.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_submit_nats
