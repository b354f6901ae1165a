// Security through the real server (issue 6, must show 6): `switchyard keygen`, key-file errors,
// CURVE on the ROUTER and on PULL -> PUSH (no key: no connection, nothing read; the key: end to
// end), and tenant isolation (another tenant's job can be neither cancelled nor seen; a wrong
// token or an unknown tenant is refused with `unauthorized` before anything is queued).
#define BOOST_TEST_MODULE it_security
#include <boost/test/unit_test.hpp>

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "clients/cpp/client.hpp"
#include "ingress/curve.hpp"
#include "tests/integration/server_process.hpp"

using namespace std::chrono_literals;
using sy::ErrorCode;
using sy::client::Client;
using sy::client::ClientOptions;

namespace {

// How long a client without the key waits for an answer that must not come. Loopback handshakes
// take milliseconds; this is long enough for several ZeroMQ reconnect attempts (100 ms apart).
constexpr auto kNoAnswerWait = 1500ms;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Keys for one test: the server's pair and an unrelated pair (a client with the wrong key).
struct Keys {
  sy::it::TempDir dir;
  std::string key, pub, other_pub;
  Keys() {
    auto r = sy::it::run_binary("keygen --out " + dir.file("server"), "timeout 30 ");
    BOOST_REQUIRE_MESSAGE(r.status == 0, r.out);
    r = sy::it::run_binary("keygen --out " + dir.file("other"), "timeout 30 ");
    BOOST_REQUIRE_MESSAGE(r.status == 0, r.out);
    key = dir.file("server.key");
    pub = dir.file("server.pub");
    other_pub = dir.file("other.pub");
  }
  ClientOptions with(const std::string& pub_file) const {
    ClientOptions o;
    o.server_key = sy::client::read_server_key(pub_file);
    return o;
  }
};

sy::wire::Submit job(const std::string& id, const std::string& tenant, uint32_t max_tokens,
                     const std::string& token = "") {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = tenant;
  s.token = token;
  s.prompt = std::vector<int32_t>{1, 42, 7};
  s.max_tokens = max_tokens;
  s.temperature = 0;
  s.ignore_eos = true;
  return s;
}

// The next message about job `id` (others are skipped), or nullopt after `wait`.
std::optional<sy::wire::ServerMessage> next_for(Client& c, const std::string& id,
                                                std::chrono::milliseconds wait = 20s) {
  auto until = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < until) {
    auto m = c.next(100ms);
    if (m && sy::client::message_id(*m) == id) return m;
  }
  return std::nullopt;
}

// The error a request got (fails the test when something else came).
sy::wire::Error expect_error(Client& c, const std::string& id, ErrorCode code) {
  auto m = next_for(c, id);
  BOOST_REQUIRE_MESSAGE(m.has_value(), "no answer for " << id);
  auto* e = std::get_if<sy::wire::Error>(&*m);
  BOOST_REQUIRE_MESSAGE(e, "expected error " << to_string(code) << ", got "
                                             << sy::client::describe(*m));
  BOOST_TEST(to_string(e->code) == to_string(code));
  BOOST_TEST_MESSAGE(id << ": " << to_string(e->code) << ": " << e->message);
  return *e;
}

}  // namespace

BOOST_AUTO_TEST_CASE(keygen_writes_a_private_pair_and_refuses_to_overwrite) {
  Keys k;
  struct stat st {};
  BOOST_REQUIRE(::stat(k.key.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  std::string secret = sy::curve::read_key_file(k.key, "secret");
  std::string pub = sy::curve::read_key_file(k.pub, "public");
  BOOST_TEST(secret.size() == 40u);
  BOOST_TEST(sy::curve::public_of(secret) == pub);
  BOOST_TEST(pub != sy::curve::read_key_file(k.other_pub, "public"));
  // The public key also goes to stdout; the secret never does.
  auto r = sy::it::run_binary("keygen --out " + k.dir.file("server"), "timeout 30 ");
  BOOST_TEST(r.status != 0);
  BOOST_TEST(r.out.find("server.key' exists already") != std::string::npos, r.out);
  BOOST_TEST(sy::curve::read_key_file(k.key, "secret") == secret);  // untouched
  r = sy::it::run_binary("keygen --out " + k.dir.file("again"), "timeout 30 ");
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.find(sy::curve::read_key_file(k.dir.file("again.pub"), "p")) != std::string::npos);
  BOOST_TEST(r.out.find(sy::curve::read_key_file(k.dir.file("again.key"), "s")) == std::string::npos);
  r = sy::it::run_binary("keygen", "timeout 30 ");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("--out PREFIX") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(bad_key_files_are_refused_naming_the_file) {
  Keys k;
  std::string bad = k.dir.write("bad.key", "# a comment\nnot-a-key\n");
  std::string two = k.dir.write("two.key", slurp(k.key) + slurp(k.key));
  const std::string serve = "serve --backend null --bind tcp://127.0.0.1:* ";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--curve-secret-key " + k.dir.file("missing.key"), "missing.key': cannot open"},
      {"--curve-secret-key " + bad, "bad.key': malformed"},
      {"--curve-secret-key " + two, "two.key': more than one key line"},
      {"--curve-secret-key " + k.key + " --curve-public-key " + k.other_pub,
       "other.pub' does not belong to the secret key"},
      {"--curve-public-key " + k.pub, "curve_public_key needs endpoints.curve_secret_key"},
  };
  for (const auto& c : cases) {
    auto r = sy::it::run_binary(serve + c.args, "timeout 30 ");
    BOOST_TEST(r.status == 1, c.args << ": " << r.out);
    BOOST_TEST(r.out.find(c.needle) != std::string::npos, c.args << ": " << r.out);
  }
  // A matching public key is accepted (checked by starting the server for real below); clients
  // report key errors naming the file too.
  BOOST_CHECK_EXCEPTION(sy::client::read_server_key(bad), std::runtime_error,
                        [&](const std::runtime_error& e) {
                          return std::string(e.what()).find("bad.key") != std::string::npos;
                        });
  auto r = sy::it::run_binary("ctl --server tcp://127.0.0.1:1 --server-key " + bad + " stats",
                              "timeout 30 ");
  BOOST_TEST(r.status == 1);
  BOOST_TEST(r.out.find("bad.key': malformed") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(curve_router_needs_the_server_key) {
  Keys k;
  // The config-file path for the keys, relative to the config's folder.
  std::string cfg = k.dir.write("curve.yaml",
                                "endpoints:\n  curve_secret_key: server.key\n"
                                "  curve_public_key: server.pub\n");
  sy::it::ServerProcess server({"--config", cfg, "--backend", "null", "--admin-token", "adm"});
  const std::string ep = server.endpoint();

  // No key, and the wrong key: the handshake fails, the server reads nothing, nobody answers.
  {
    Client plain(ep);
    plain.submit(job("plain-1", "t", 4));
    plain.ping(7);
    BOOST_TEST(!plain.next(kNoAnswerWait).has_value());
    Client wrong(ep, k.with(k.other_pub));
    wrong.submit(job("wrong-1", "t", 4));
    BOOST_TEST(!wrong.ping_wait(kNoAnswerWait));
  }
  auto before = server.stats();
  BOOST_TEST(before["received"] == 0);
  BOOST_TEST(before["admitted"] == 0);
  auto r = sy::it::run_binary("ctl --server " + ep + " --token adm --timeout-ms 1000 stats",
                              "timeout 30 ");
  BOOST_TEST(r.status == 1);
  BOOST_TEST(r.out.find("pass --server-key") != std::string::npos, r.out);

  // With the key: end to end, and `ctl` with --server-key.
  Client good(ep, k.with(k.pub));
  auto res = good.run(job("good-1", "t", 8), 30s);
  BOOST_REQUIRE_MESSAGE(res.ok(), "keyed job failed: " << (res.error ? res.error->message : "timeout"));
  BOOST_TEST(res.ids.size() == 8u);
  r = sy::it::run_binary("ctl --server " + ep + " --token adm --server-key " + k.pub + " stats",
                         "timeout 30 ");
  BOOST_TEST(r.status == 0, r.out);
  auto stats = sy::cli::JsonReader::parse(r.out);
  BOOST_TEST(stats.at("admitted").i == 1);
  // The submit and the ctl message; the refused clients' frames never reached the gateway.
  BOOST_TEST(stats.at("received").i == 2);
  BOOST_TEST(server.stop() == 0);
}

BOOST_AUTO_TEST_CASE(curve_pipeline_needs_the_server_key_on_both_sockets) {
  Keys k;
  sy::it::ServerProcess server({"--backend", "null", "--pull", "tcp://127.0.0.1:*", "--results",
                                "tcp://127.0.0.1:*", "--curve-secret-key", k.key});
  // A sink without the key is never a peer of the results socket: it cannot read the results.
  sy::client::Sink plain_sink(server.results_endpoint());
  sy::client::Sink sink(server.results_endpoint(), k.with(k.pub));
  {
    sy::client::Pusher plain(server.pull_endpoint());
    plain.socket().set(zmq::sockopt::linger, 0);  // its job can never leave: do not wait at exit
    BOOST_TEST(plain.submit(job("plain-p", "t", 4), 1000ms));
    std::this_thread::sleep_for(kNoAnswerWait);  // time to hand it over, were it allowed
  }
  BOOST_TEST(server.stats()["received"] == 0);

  sy::client::Pusher pusher(server.pull_endpoint(), k.with(k.pub));
  const int n = 5;
  for (int i = 0; i < n; ++i) {
    // Appended, not `"p" + to_string(i)`: that form trips a false -Wrestrict in GCC 12.
    std::string id = "p";
    id += std::to_string(i);
    BOOST_REQUIRE(pusher.submit(job(id, "t", 4), 10000ms));
  }
  std::set<std::string> done;
  auto until = std::chrono::steady_clock::now() + 30s;
  while (static_cast<int>(done.size()) < n && std::chrono::steady_clock::now() < until) {
    auto m = sink.next(200ms);
    if (!m) continue;
    auto* d = std::get_if<sy::wire::Done>(&*m);
    BOOST_REQUIRE_MESSAGE(d, "unexpected result: " << sy::client::describe(*m));
    BOOST_TEST(d->ids.size() == 4u);
    done.insert(d->id);
  }
  BOOST_TEST(static_cast<int>(done.size()) == n);
  BOOST_TEST(!done.count("plain-p"));
  BOOST_TEST(!plain_sink.next(300ms).has_value());
  BOOST_TEST(server.stats()["received"] == n);
  BOOST_TEST(server.stop() == 0);
}

BOOST_AUTO_TEST_CASE(tenants_cannot_reach_each_others_jobs) {
  sy::it::TempDir dir;
  std::string cfg = dir.write("tenants.yaml",
                              "admission:\n  allow_anonymous: false\n  tenants:\n"
                              "    - {name: alice, token: ta-secret}\n"
                              "    - {name: bob, token: tb-secret}\n");
  // Slow steps keep bob's job running while alice pokes at it.
  sy::it::ServerProcess server(
      {"--config", cfg, "--backend", "null", "--step-delay-ms", "20"});
  Client bob(server.endpoint()), alice(server.endpoint());

  bob.submit(job("job-b", "bob", 100, "tb-secret"));
  auto acc = next_for(bob, "job-b");
  BOOST_REQUIRE(acc.has_value());
  BOOST_REQUIRE_MESSAGE(std::get_if<sy::wire::Accepted>(&*acc), sy::client::describe(*acc));

  // Naming bob with alice's token: refused as unauthorized.
  alice.cancel("job-b", "bob", "ta-secret");
  auto e = expect_error(alice, "job-b", ErrorCode::unauthorized);
  BOOST_TEST(e.message.find("wrong token") != std::string::npos);
  alice.status("job-b", "bob", "ta-secret");
  expect_error(alice, "job-b", ErrorCode::unauthorized);
  // Naming herself: the key is (alice, job-b), which does not exist; bob's job is not reached.
  alice.cancel("job-b", "alice", "ta-secret");
  expect_error(alice, "job-b", ErrorCode::not_found);
  alice.status("job-b", "alice", "ta-secret");
  expect_error(alice, "job-b", ErrorCode::not_found);

  // Bob sees his job running, and it finishes uncancelled with all its tokens.
  bob.status("job-b", "bob", "tb-secret");
  auto st = next_for(bob, "job-b");
  BOOST_REQUIRE(st.has_value());
  auto* sr = std::get_if<sy::wire::StatusReply>(&*st);
  BOOST_REQUIRE_MESSAGE(sr, sy::client::describe(*st));
  BOOST_TEST((sr->state == sy::wire::JobState::queued || sr->state == sy::wire::JobState::running));
  auto res = bob.wait("job-b", 60s);
  BOOST_REQUIRE_MESSAGE(res.ok(), "bob's job failed: " << (res.error ? res.error->message : "timeout"));
  BOOST_TEST(sy::wire::to_string(res.done->finish_reason) == "length");
  BOOST_TEST(res.ids.size() == 100u);

  // Wrong tokens, a missing token and an unknown tenant: unauthorized, never queued.
  alice.submit(job("a-wrong", "alice", 4, "tb-secret"));
  expect_error(alice, "a-wrong", ErrorCode::unauthorized);
  alice.submit(job("a-none", "alice", 4, ""));
  expect_error(alice, "a-none", ErrorCode::unauthorized);
  alice.submit(job("m-1", "mallory", 4, "ta-secret"));
  e = expect_error(alice, "m-1", ErrorCode::unauthorized);
  BOOST_TEST(e.message.find("unknown tenant") != std::string::npos);

  // The owner can cancel: the refusals above were about the caller, not a broken cancel.
  bob.submit(job("job-b2", "bob", 1000, "tb-secret"));
  BOOST_REQUIRE(next_for(bob, "job-b2").has_value());  // accepted
  bob.cancel("job-b2", "bob", "tb-secret");
  auto res2 = bob.wait("job-b2", 60s);
  BOOST_REQUIRE(res2.ok());
  BOOST_TEST(sy::wire::to_string(res2.done->finish_reason) == "cancelled");

  auto s = server.stats();
  BOOST_TEST(s["admitted"] == 2);  // job-b and job-b2 only
  BOOST_TEST(server.stop() == 0);
}
