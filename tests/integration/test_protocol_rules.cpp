// The rules of docs/protocol.md that concern what the real server sends: logprobs of a job that
// is not streamed come in its done (request endpoint and pipeline), status while a job runs,
// max_tokens clamped to the context, attaching to a running job, resubmitting an ended key,
// tenants on one connection, one escaping rule, and who hears about a cancel.
#include <boost/test/unit_test.hpp>

#include "clients/cpp/client.hpp"
#include "model/llama.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_protocol_rules)

using namespace std::chrono_literals;
using namespace sy;

namespace {

// One running sequence at a time (others queue), the null backend (fixed tokens, no model).
const char* kOneAtATime = R"(
batching:
  max_sequences: 1
executors:
  backend: "null"
)";

wire::Submit job(const std::string& id, const std::string& tenant, uint32_t max_tokens) {
  wire::Submit s;
  s.id = id;
  s.tenant = tenant;
  s.prompt = std::vector<int32_t>{1, 2, 3};
  s.max_tokens = max_tokens;
  s.ignore_eos = true;
  s.temperature = 0;
  return s;
}

/// The next message of `c`, failing the test after 30 s of silence.
wire::ServerMessage next(client::Client& c) {
  auto m = c.next(30s);
  BOOST_REQUIRE_MESSAGE(m.has_value(), "no message from the server within 30 s");
  return std::move(*m);
}

/// Reads `c` until a tokens chunk of job `id` with index >= `index` arrives; returns the job's
/// chunks read on the way.
std::vector<wire::Tokens> wait_for_chunk(client::Client& c, const std::string& id, uint32_t index) {
  std::vector<wire::Tokens> chunks;
  for (;;) {
    auto m = next(c);
    BOOST_REQUIRE_MESSAGE(!std::holds_alternative<wire::Error>(m), client::describe(m));
    BOOST_REQUIRE_MESSAGE(!std::holds_alternative<wire::Done>(m), client::describe(m));
    if (auto* t = std::get_if<wire::Tokens>(&m); t && t->id == id) {
      chunks.push_back(*t);
      if (t->index >= index) return chunks;
    }
  }
}

/// Sends a status request and returns its reply (other messages are kept for later reads).
wire::StatusReply status(client::Client& c, const std::string& id, const std::string& tenant,
                         std::vector<wire::ServerMessage>& others) {
  c.status(id, tenant);
  for (;;) {
    auto m = next(c);
    if (auto* s = std::get_if<wire::StatusReply>(&m); s && s->id == id) return *s;
    BOOST_REQUIRE_MESSAGE(
        !std::holds_alternative<wire::Error>(m) || std::get<wire::Error>(m).id != id,
        client::describe(m));
    others.push_back(std::move(m));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(logprobs_of_a_job_not_streamed_come_in_its_done) {
  it::ServerProcess srv({"--model", it::kStories, "--threads", "1", "--pull", "tcp://127.0.0.1:*",
                         "--results", "tcp://127.0.0.1:*"});
  client::Client cl(srv.endpoint());
  auto s = job("lp", "acme", 6);
  s.prompt = std::string("Once upon a time");
  s.logprobs = 3;
  cl.submit(s);
  std::optional<wire::Done> done;
  while (!done) {
    auto m = next(cl);
    // accepted, then done: no tokens message for a job that is not streamed.
    BOOST_REQUIRE_MESSAGE(
        std::holds_alternative<wire::Accepted>(m) || std::holds_alternative<wire::Done>(m),
        client::describe(m));
    if (auto* d = std::get_if<wire::Done>(&m)) done = *d;
  }
  BOOST_REQUIRE_EQUAL(done->ids.size(), 6u);
  BOOST_REQUIRE_EQUAL(done->logprobs.size(), done->ids.size());
  for (std::size_t i = 0; i < done->ids.size(); ++i) {
    BOOST_REQUIRE_EQUAL(done->logprobs[i].top.size(), 3u);
    // Greedy: the chosen token is the most likely one.
    BOOST_TEST(done->logprobs[i].top[0].id == done->ids[i]);
    BOOST_TEST(done->logprobs[i].logprob == done->logprobs[i].top[0].logprob);
  }
  // Streamed, the same job carries them in its chunks, and its done has none.
  s.id = "lp-streamed";
  s.stream = true;
  auto r = cl.run(s, 30s);
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(r.done->logprobs.empty());
  BOOST_REQUIRE_EQUAL(r.logprobs.size(), 6u);
  BOOST_TEST(r.ids == done->ids, boost::test_tools::per_element());
  for (std::size_t i = 0; i < r.logprobs.size(); ++i)
    BOOST_TEST(r.logprobs[i].top[0].id == done->logprobs[i].top[0].id);
  // On the pipeline, the done on the results socket carries them.
  client::Sink sink(srv.results_endpoint());
  client::Pusher push(srv.pull_endpoint());
  s.id = "lp-pipe";
  s.stream = false;
  BOOST_REQUIRE(push.submit(s, 10s));
  auto m = sink.next(30s);
  BOOST_REQUIRE(m.has_value());
  BOOST_REQUIRE_MESSAGE(std::holds_alternative<wire::Done>(*m), client::describe(*m));
  const auto& pd = std::get<wire::Done>(*m);
  BOOST_TEST(pd.ids == done->ids, boost::test_tools::per_element());
  BOOST_REQUIRE_EQUAL(pd.logprobs.size(), 6u);
  BOOST_TEST(pd.logprobs[5].top[0].id == done->logprobs[5].top[0].id);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(status_counts_tokens_while_running_and_jobs_ahead_while_queued) {
  it::TempDir dir;
  // 20 ms per step (TEST ONLY flag): the first job runs for seconds, the others wait behind it.
  it::ServerProcess srv({"--config", dir.write("a.yaml", kOneAtATime), "--step-delay-ms", "20"});
  client::Client cl(srv.endpoint());
  auto a = job("a", "acme", 500);
  a.stream = true;
  cl.submit(a);
  wait_for_chunk(cl, "a", 2);  // three tokens generated at least
  for (const char* id : {"b", "c", "d"}) cl.submit(job(id, "acme", 4));
  std::vector<wire::ServerMessage> others;
  const auto sa = status(cl, "a", "acme", others);
  BOOST_TEST(wire::to_string(sa.state) == "running");
  BOOST_TEST(sa.completion_tokens >= 3u);
  BOOST_TEST(sa.tenant == "acme");
  const auto sd = status(cl, "d", "acme", others);
  BOOST_TEST(wire::to_string(sd.state) == "queued");
  BOOST_TEST(sd.queue_position == 2u);  // b and c; not the queue depth (3)
  const auto sb = status(cl, "b", "acme", others);
  BOOST_TEST(sb.queue_position == 0u);
  // The count goes on growing with the job.
  wait_for_chunk(cl, "a", sa.completion_tokens + 1);
  BOOST_TEST(status(cl, "a", "acme", others).completion_tokens > sa.completion_tokens);
  for (const char* id : {"a", "b", "c", "d"}) cl.cancel(id, "acme");
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(max_tokens_is_clamped_to_the_context) {
  const auto model = LlamaModel::load(it::kStories);
  const uint32_t ctx = static_cast<uint32_t>(model->config().ctx_len);
  it::ServerProcess srv({"--model", it::kStories, "--threads", "1"});
  client::Client cl(srv.endpoint());
  wire::Submit s;
  s.id = "hi";
  s.tenant = "acme";
  s.prompt = std::string("Hi");
  s.max_tokens = 4096;  // inside the documented range, beyond the context
  s.temperature = 0;
  s.ignore_eos = true;
  auto r = cl.run(s, 60s);
  BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("timed out")));
  BOOST_TEST(wire::to_string(r.done->finish_reason) == "length");
  BOOST_TEST(r.done->usage.prompt_tokens + r.done->usage.completion_tokens == ctx);
  // A prompt longer than the context is refused, naming the context length.
  std::string text;
  while (model->tokenizer().encode(text, true).size() <= ctx) text += "Once upon a time ";
  s.id = "long";
  s.prompt = text;
  s.max_tokens = 4;
  r = cl.run(s, 30s);
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(to_string(r.error->code) == "bad_request");
  BOOST_TEST(r.error->message.find("limit " + std::to_string(ctx) +
                                   " (the model's context length)") != std::string::npos,
             r.error->message);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(an_attached_client_gets_one_done_with_the_whole_completion) {
  // Greedy tokens of the real model, slowed (TEST ONLY flag) so that the job still runs when the
  // second client attaches.
  it::ServerProcess srv({"--model", it::kStories, "--threads", "1", "--step-delay-ms", "20"});
  client::Client first(srv.endpoint()), second(srv.endpoint()), late(srv.endpoint());
  wire::Submit s;
  s.id = "shared";
  s.tenant = "acme";
  s.prompt = std::string("Once upon a time");
  s.max_tokens = 100;
  s.temperature = 0;
  s.ignore_eos = true;
  s.stream = true;
  first.submit(s);
  const auto head = wait_for_chunk(first, "shared", 0);
  // Its own parameters are ignored: stream and max_tokens of the job stand.
  auto mine = s;
  mine.max_tokens = 3;
  second.submit(mine);
  auto r1 = first.wait("shared", 30s, "acme");
  BOOST_REQUIRE(r1.ok());
  BOOST_TEST(r1.done->text.empty());                        // streamed: the chunks carried it
  for (auto it = head.rbegin(); it != head.rend(); ++it) {  // the chunks read before wait()
    r1.ids.insert(r1.ids.begin(), it->ids.begin(), it->ids.end());
    r1.text.insert(0, it->text);
  }
  std::vector<wire::ServerMessage> seen;
  for (;;) {
    seen.push_back(next(second));
    BOOST_REQUIRE_MESSAGE(!std::holds_alternative<wire::Tokens>(seen.back()),
                          "an attached client got a chunk: " + client::describe(seen.back()));
    if (std::holds_alternative<wire::Done>(seen.back())) break;
  }
  BOOST_REQUIRE_EQUAL(seen.size(), 2u);
  BOOST_REQUIRE(std::holds_alternative<wire::Accepted>(seen[0]));
  BOOST_TEST(std::get<wire::Accepted>(seen[0]).tenant == "acme");
  const auto& d2 = std::get<wire::Done>(seen[1]);
  BOOST_TEST(d2.ids.size() == 100u);
  BOOST_TEST(d2.ids == r1.ids, boost::test_tools::per_element());
  BOOST_TEST(d2.text == r1.text);
  // Once it ended: the stored done, without an accepted.
  late.submit(mine);
  auto m = next(late);
  BOOST_REQUIRE_MESSAGE(std::holds_alternative<wire::Done>(m), client::describe(m));
  BOOST_TEST(std::get<wire::Done>(m).text == r1.text);
  BOOST_TEST(std::get<wire::Done>(m).ids == r1.ids, boost::test_tools::per_element());
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(cancelled_and_expired_keys_keep_their_outcome) {
  it::TempDir dir;
  it::ServerProcess srv({"--config", dir.write("a.yaml", kOneAtATime), "--step-delay-ms", "20"});
  client::Client cl(srv.endpoint()), other(srv.endpoint());
  auto a = job("a", "acme", 500);
  a.stream = true;
  cl.submit(a);
  wait_for_chunk(cl, "a", 0);
  // Behind the running job: one that must start within 50 ms, one that is cancelled.
  auto late = job("late", "acme", 4);
  late.deadline_ms = 50;
  auto r = cl.run(late, 30s);
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(to_string(r.error->code) == "deadline_exceeded");
  cl.submit(job("gone", "acme", 4));
  // The cancel goes on another socket: it could overtake the submit unless that is accepted.
  for (;;) {
    auto m = next(cl);
    if (auto* acc = std::get_if<wire::Accepted>(&m); acc && acc->id == "gone") break;
    BOOST_REQUIRE_MESSAGE(client::message_id(m) != "gone", client::describe(m));
  }
  // The cancel comes from another connection: the job's own client hears of it (done with
  // finish_reason cancelled); the connection that sent it gets nothing, so the first thing it
  // hears after it is the answer to its status request.
  other.cancel("gone", "acme");
  std::vector<wire::ServerMessage> others;
  BOOST_TEST(wire::to_string(status(other, "gone", "acme", others).state) == "cancelled");
  BOOST_TEST(others.empty());
  r = cl.wait("gone", 30s, "acme");
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(wire::to_string(r.done->finish_reason) == "cancelled");
  const auto dispatched = srv.stats()["dispatched"];
  // Resubmitted, each key answers the outcome it ended with, without an accepted, and neither
  // runs.
  auto again = other.run(late, 30s);
  BOOST_REQUIRE(again.error.has_value());
  BOOST_TEST(to_string(again.error->code) == "deadline_exceeded");
  BOOST_TEST(!again.accepted.has_value());
  again = other.run(job("gone", "acme", 4), 30s);
  BOOST_REQUIRE(again.ok());
  BOOST_TEST(wire::to_string(again.done->finish_reason) == "cancelled");
  BOOST_TEST(!again.accepted.has_value());
  BOOST_TEST(srv.stats()["dispatched"] == dispatched);
  cl.cancel("a", "acme");
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(every_reply_names_its_tenant) {
  // No tenants configured: open-tenant mode, any name is its own tenant.
  it::ServerProcess srv({"--backend", "null", "--step-delay-ms", "5"});
  client::Client cl(srv.endpoint());
  // The same id for two tenants on one connection: two jobs, told apart by `tenant`.
  for (const char* t : {"t1", "t2"}) {
    auto s = job("same", t, 3);
    s.stream = true;
    cl.submit(s);
  }
  std::map<std::string, std::vector<std::string>> kinds;  // tenant -> message types, in order
  int done = 0;
  while (done < 2) {
    auto m = next(cl);
    BOOST_REQUIRE_MESSAGE(!std::holds_alternative<wire::Error>(m), client::describe(m));
    const std::string tenant = client::message_tenant(m);
    BOOST_REQUIRE_MESSAGE(tenant == "t1" || tenant == "t2", client::describe(m));
    if (std::holds_alternative<wire::Accepted>(m)) kinds[tenant].push_back("accepted");
    if (std::holds_alternative<wire::Tokens>(m)) kinds[tenant].push_back("tokens");
    if (std::holds_alternative<wire::Done>(m)) {
      kinds[tenant].push_back("done");
      ++done;
    }
  }
  for (const char* t : {"t1", "t2"}) {
    BOOST_REQUIRE_EQUAL(kinds[t].size(), 5u);  // accepted, 3 chunks (one token each), done
    BOOST_TEST(kinds[t].front() == "accepted");
    BOOST_TEST(kinds[t].back() == "done");
  }
  std::vector<wire::ServerMessage> others;
  BOOST_TEST(status(cl, "same", "t2", others).tenant == "t2");
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(client_bytes_in_error_messages_are_escaped_one_way) {
  it::ServerProcess srv({"--backend", "null"});
  client::Client cl(srv.endpoint());
  auto s = job("p", "acme", 2);
  s.priority = "no\x01such'class";
  auto r = cl.run(s, 10s);
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(to_string(r.error->code) == "bad_request");
  BOOST_TEST(r.error->message == "unknown priority class 'no\\x01such\\x27class'");
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_protocol_rules
