// Security through the real server (issue 6, must show 6): `switchyard keygen`, key-file errors,
// CURVE on the ROUTER and on PULL -> PUSH (no key: no connection, nothing read; the key: end to
// end), and tenant isolation (another tenant's job can be neither cancelled nor seen; a wrong
// token or an unknown tenant is refused with `unauthorized` before anything is queued), the
// CURVE client allow-list (ZAP): listed keys get results, unlisted ones are refused and counted,
// and connection caps strangers cannot exhaust: a flood from one address gets
// max_connections_per_address places, and with an allow-list strangers never take the places of
// clients that passed it (docs/security.md, Connections).
#include <sys/stat.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "ingress/curve.hpp"
#include "tests/integration/raw_peer.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_security)

using namespace std::chrono_literals;
using sy::ErrorCode;
using sy::client::Client;
using sy::client::ClientOptions;
using sy::it::RawPeer;

namespace {

// How long a client without the key waits for an answer that must not come. Loopback handshakes
// take milliseconds; this is long enough for several ZeroMQ reconnect attempts (100 ms apart).
constexpr auto kNoAnswerWait = 1500ms;

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
  BOOST_REQUIRE_MESSAGE(
      e, "expected error " << to_string(code) << ", got " << sy::client::describe(*m));
  BOOST_TEST(to_string(e->code) == to_string(code));
  BOOST_TEST_MESSAGE(id << ": " << to_string(e->code) << ": " << e->message);
  return *e;
}

// A raw socket that is a CURVE client with a keypair of its own (the client library makes an
// ephemeral one per connection, which an allow-list can never name).
zmq::socket_t keyed_socket(zmq::context_t& ctx, zmq::socket_type type, const std::string& endpoint,
                           const std::string& server_pub_file, const sy::curve::KeyPair& mine) {
  zmq::socket_t sock(ctx, type);
  sock.set(zmq::sockopt::linger, 0);
  // A refused send must not block the test forever (PUSH waits for a peer that never comes).
  sock.set(zmq::sockopt::sndtimeo, 1000);
  auto server = sy::curve::decode(sy::client::read_server_key(server_pub_file));
  auto pub = sy::curve::decode(mine.public_key), sec = sy::curve::decode(mine.secret_key);
  sock.set(zmq::sockopt::curve_serverkey, zmq::const_buffer(server.data(), server.size()));
  sock.set(zmq::sockopt::curve_publickey, zmq::const_buffer(pub.data(), pub.size()));
  sock.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(sec.data(), sec.size()));
  sock.connect(endpoint);
  return sock;
}

bool send_submit(zmq::socket_t& sock, const sy::wire::Submit& s) {
  std::string bytes = sy::wire::encode_client(sy::wire::ClientMessage{s});
  return sock.send(zmq::buffer(bytes), zmq::send_flags::none).has_value();
}

// The next decoded server message on `sock`, or nullopt after `wait`.
std::optional<sy::wire::ServerMessage> recv_message(zmq::socket_t& sock,
                                                    std::chrono::milliseconds wait) {
  zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, wait) <= 0) return std::nullopt;
  zmq::message_t msg;
  if (!sock.recv(msg, zmq::recv_flags::dontwait)) return std::nullopt;
  auto d = sy::wire::decode_server(msg.data(), msg.size());
  if (auto* m = std::get_if<sy::wire::ServerMessage>(&d)) return std::move(*m);
  return std::nullopt;
}

// Waits for the `done` of `id` (other messages skipped) for up to 30 s.
std::optional<sy::wire::Done> wait_done(zmq::socket_t& sock, const std::string& id) {
  auto until = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < until) {
    auto m = recv_message(sock, 200ms);
    if (!m) continue;
    if (auto* d = std::get_if<sy::wire::Done>(&*m); d && d->id == id) return *d;
  }
  return std::nullopt;
}

// The ids of the `done`s that `next` yields (each of 4 tokens; anything else fails the test),
// until there are n or 30 s have passed.
template <class Next>
std::set<std::string> collect_dones(int n, Next next) {
  std::set<std::string> done;
  auto until = std::chrono::steady_clock::now() + 30s;
  while (static_cast<int>(done.size()) < n && std::chrono::steady_clock::now() < until) {
    auto m = next();
    if (!m) continue;
    auto* d = std::get_if<sy::wire::Done>(&*m);
    BOOST_REQUIRE_MESSAGE(d, "unexpected result: " << sy::client::describe(*m));
    BOOST_TEST(d->ids.size() == 4u);
    done.insert(d->id);
  }
  return done;
}

// The value of one series ("name{labels}") on the server's /metrics page; -1 when absent.
double metric(sy::it::ServerProcess& srv, const std::string& series) {
  const auto page = sy::it::http_get(srv.metrics_endpoint(), "/metrics");
  const std::string needle = "\n" + series + " ";
  const auto at = page.body.find(needle);
  return at == std::string::npos ? -1 : std::stod(page.body.substr(at + needle.size()));
}

// Reads a series until it shows `want` (what the test caused, once the gateway has read every
// accept); the last value read when 20 s pass first.
double metric_reaching(sy::it::ServerProcess& srv, const std::string& series, double want) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  double v = metric(srv, series);
  while (v != want && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
    v = metric(srv, series);
  }
  return v;
}

std::string refused(const std::string& reason) {
  return "switchyard_connections_refused_total{reason=\"" + reason + "\"}";
}

// A ZeroMQ connect endpoint that leaves from `source` (any 127/8 address is this host's
// loopback): "tcp://SOURCE:0;HOST:PORT".
std::string from(const std::string& source, const std::string& endpoint) {
  return "tcp://" + source + ":0;" + endpoint.substr(6);
}

// A ping on a raw DEALER answered with a pong: the connection is past its handshake and served.
bool pinged(zmq::socket_t& sock) {
  const std::string ping = sy::wire::encode_client(sy::wire::ClientMessage{sy::wire::Ping{}});
  if (!sock.send(zmq::buffer(ping), zmq::send_flags::none)) return false;
  auto m = recv_message(sock, 10s);
  return m && std::holds_alternative<sy::wire::Pong>(*m);
}

// The first 10 bytes of a ZMTP greeting: a peer that idles there.
const std::string kHalfGreeting("\xff\0\0\0\0\0\0\0\x01\x7f", 10);

// A TCP relay for one connection, to hold a client's handshake back: it listens on
// 127.0.0.1, and when a client connects it connects to `target` from `source` at once (the
// server accepts that connection) but forwards bytes either way only after release().
class HeldRelay {
 public:
  HeldRelay(const std::string& target, const std::string& source) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    BOOST_REQUIRE(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    BOOST_REQUIRE(::listen(listen_, 1) == 0);
    BOOST_REQUIRE(::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    endpoint_ = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this, target, source] { run(target, source); });
  }
  ~HeldRelay() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  const std::string& endpoint() const { return endpoint_; }
  bool connected() const { return connected_; }
  void release() { released_ = true; }

 private:
  void run(const std::string& target, const std::string& source) {
    int client = -1;
    while (!stop_ && client < 0) {
      pollfd p{listen_, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) client = ::accept(listen_, nullptr, nullptr);
    }
    if (client < 0) return;
    RawPeer server(target, source);  // the server accepts it now
    connected_ = true;
    while (!stop_ && !released_) std::this_thread::sleep_for(5ms);
    const int fds[2] = {client, server.fd()};
    bool open = true;
    while (!stop_ && open) {
      pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[4096];
        const ssize_t n = ::recv(fds[i], buf, sizeof buf, 0);
        open = n > 0 && ::send(fds[1 - i], buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n;
      }
    }
    ::close(client);
  }

  int listen_ = -1;
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, released_{false}, connected_{false};
};

constexpr int kFlood = 200;     // raw peers from one address
constexpr int kMax = 16;        // --max-connections
constexpr int kPerAddress = 4;  // --max-connections-per-address

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
  BOOST_TEST(r.out.find(sy::curve::read_key_file(k.dir.file("again.pub"), "p")) !=
             std::string::npos);
  BOOST_TEST(r.out.find(sy::curve::read_key_file(k.dir.file("again.key"), "s")) ==
             std::string::npos);
  r = sy::it::run_binary("keygen", "timeout 30 ");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("--out PREFIX") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(bad_key_files_are_refused_naming_the_file) {
  Keys k;
  std::string bad = k.dir.write("bad.key", "# a comment\nnot-a-key\n");
  std::string two = k.dir.write("two.key", sy::test::read_file(k.key) + sy::test::read_file(k.key));
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
  BOOST_REQUIRE_MESSAGE(res.ok(),
                        "keyed job failed: " << (res.error ? res.error->message : "timeout"));
  BOOST_TEST(res.ids.size() == 8u);
  r = sy::it::run_binary("ctl --server " + ep + " --token adm --server-key " + k.pub + " stats",
                         "timeout 30 ");
  BOOST_TEST(r.status == 0, r.out);
  auto stats = nlohmann::json::parse(r.out);
  BOOST_TEST(stats.at("admitted").get<int64_t>() == 1);
  // The submit and the ctl message; the refused clients' frames never reached the gateway.
  BOOST_TEST(stats.at("received").get<int64_t>() == 2);
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
  auto done = collect_dones(n, [&] { return sink.next(200ms); });
  BOOST_TEST(static_cast<int>(done.size()) == n);
  BOOST_TEST(!done.count("plain-p"));
  BOOST_TEST(!plain_sink.next(300ms).has_value());
  BOOST_TEST(server.stats()["received"] == n);
  BOOST_TEST(server.stop() == 0);
}

BOOST_AUTO_TEST_CASE(allow_list_file_errors_name_file_and_line) {
  Keys k;
  auto client = sy::curve::generate();
  const std::string serve = "serve --backend null --bind tcp://127.0.0.1:* ";
  std::string bad = k.dir.write("bad.allow", "# clients\n\n" + client.public_key + "\nshort-key\n");
  std::string empty = k.dir.write("empty.allow", "# nobody yet\n");
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--curve-secret-key " + k.key + " --curve-allowed-keys " + bad,
       "bad.allow' line 4: malformed"},
      {"--curve-secret-key " + k.key + " --curve-allowed-keys " + empty,
       "empty.allow' lists no key"},
      {"--curve-secret-key " + k.key + " --curve-allowed-keys " + k.dir.file("none.allow"),
       "none.allow': cannot open"},
      {"--curve-allowed-keys " + bad,
       "curve_allowed_keys ('" + bad + "') needs endpoints.curve_secret_key"},
  };
  for (const auto& c : cases) {
    auto r = sy::it::run_binary(serve + c.args, "timeout 30 ");
    BOOST_TEST(r.status == 1, c.args << ": " << r.out);
    BOOST_TEST(r.out.find(c.needle) != std::string::npos, c.args << ": " << r.out);
  }
}

BOOST_AUTO_TEST_CASE(allow_list_on_the_router) {
  Keys k;
  auto listed = sy::curve::generate(), unlisted = sy::curve::generate();
  std::string allow =
      k.dir.write("clients.allow", "# who may connect\n\n  " + listed.public_key + "  \n# " +
                                       unlisted.public_key + " (revoked)\n");
  sy::it::ServerProcess server(
      {"--backend", "null", "--curve-secret-key", k.key, "--curve-allowed-keys", allow});
  const std::string ep = server.endpoint();
  zmq::context_t ctx;

  // Knows the server key, but is not listed: the handshake is refused, nothing is read.
  {
    auto stranger = keyed_socket(ctx, zmq::socket_type::dealer, ep, k.pub, unlisted);
    send_submit(stranger, job("stranger-1", "t", 4));
    BOOST_TEST(!recv_message(stranger, kNoAnswerWait).has_value());
    // The client library's ephemeral keys are never listed either.
    Client ephemeral(ep, k.with(k.pub));
    ephemeral.submit(job("ephemeral-1", "t", 4));
    BOOST_TEST(!ephemeral.ping_wait(kNoAnswerWait));
  }
  auto before = server.stats();
  BOOST_TEST(before["received"] == 0);
  BOOST_TEST(before["admitted"] == 0);
  BOOST_TEST(before["curve_refused"] > 0);

  auto member = keyed_socket(ctx, zmq::socket_type::dealer, ep, k.pub, listed);
  BOOST_REQUIRE(send_submit(member, job("member-1", "t", 6)));
  auto d = wait_done(member, "member-1");
  BOOST_REQUIRE_MESSAGE(d.has_value(), "the listed client got no result");
  BOOST_TEST(d->ids.size() == 6u);
  auto after = server.stats();
  BOOST_TEST(after["received"] == 1);
  BOOST_TEST(after["admitted"] == 1);
  BOOST_TEST(after["curve_refused"] >= before["curve_refused"]);
  BOOST_TEST_MESSAGE("refused handshakes: " << after["curve_refused"]);
  BOOST_TEST(server.stop() == 0);
}

// The shipped clients with a key pair of their own from `switchyard keygen`: the C++ library,
// `switchyard ctl` and the Python client each pass the allow-list with --client-key/client_key.
BOOST_AUTO_TEST_CASE(allow_list_admits_the_clients_with_their_own_keys) {
  Keys k;
  auto r = sy::it::run_binary("keygen --out " + k.dir.file("client"), "timeout 30 ");
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.out);
  const std::string client_pub = sy::curve::read_key_file(k.dir.file("client.pub"), "client key");
  std::string allow = k.dir.write("clients.allow", client_pub + "\n");
  sy::it::ServerProcess server({"--backend", "null", "--curve-secret-key", k.key,
                                "--curve-allowed-keys", allow, "--admin-token", "adm"});
  const std::string ep = server.endpoint();

  ClientOptions o = k.with(k.pub);
  o.client_key = sy::client::read_client_key(k.dir.file("client.key"));
  Client c(ep, o);
  c.submit(job("lib-1", "t", 5));
  auto m = next_for(c, "lib-1");
  while (m && !std::holds_alternative<sy::wire::Done>(*m)) m = next_for(c, "lib-1");
  BOOST_REQUIRE_MESSAGE(m.has_value(), "the C++ client with a listed key got no result");
  BOOST_TEST(std::get<sy::wire::Done>(*m).ids.size() == 5u);

  r = sy::it::run_binary("ctl --server " + ep + " --server-key " + k.pub + " --client-key " +
                             k.dir.file("client.key") + " --token adm --timeout-ms 10000 stats",
                         "timeout 30 ");
  BOOST_TEST(r.status == 0, r.out);
  BOOST_TEST(r.out.find("batchers") != std::string::npos, r.out);
  // Without its own key, ctl is refused at the handshake and times out.
  r = sy::it::run_binary(
      "ctl --server " + ep + " --server-key " + k.pub + " --token adm --timeout-ms 1500 stats",
      "timeout 30 ");
  BOOST_TEST(r.status != 0, r.out);
  // --client-key alone makes no sense without CURVE.
  r = sy::it::run_binary(
      "ctl --server " + ep + " --client-key " + k.dir.file("client.key") + " --token adm stats",
      "timeout 30 ");
  BOOST_TEST(r.status != 0);
  BOOST_TEST(r.out.find("--client-key needs --server-key") != std::string::npos, r.out);

  // The Python client (Debian's interpreter has pyzmq and msgpack).
  std::string script = k.dir.write(
      "py_client.py",
      "import sys\n"
      "sys.path.insert(0, sys.argv[1])\n"
      "import switchyard_client as sc\n"
      "c = sc.Client(sys.argv[2], server_key=sc.read_key_file(sys.argv[3]),\n"
      "              client_key=sc.read_key_file(sys.argv[4]))\n"
      "res = c.run('py-1', 't', [1, 42, 7], max_tokens=3, temperature=0, ignore_eos=True,\n"
      "                 timeout_ms=20000)\n"
      "print('ids', len(res.ids))\n");
  std::string cmd = "timeout 60 /usr/bin/python3 " + script + " " + SY_SOURCE_DIR +
                    "/clients/python " + ep + " " + k.pub + " " + k.dir.file("client.key") +
                    " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(p);
  std::string out;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  BOOST_TEST(pclose(p) == 0, out);
  BOOST_TEST(out.find("ids 3") != std::string::npos, out);

  auto s = server.stats();
  BOOST_TEST(s["admitted"] == 2);  // lib-1 and py-1
  BOOST_TEST(server.stop() == 0);
}

BOOST_AUTO_TEST_CASE(allow_list_on_pull_and_push) {
  Keys k;
  auto producer = sy::curve::generate(), sink_keys = sy::curve::generate(),
       stranger = sy::curve::generate();
  std::string allow =
      k.dir.write("clients.allow", producer.public_key + "\n" + sink_keys.public_key + "\n");
  sy::it::ServerProcess server({"--backend", "null", "--pull", "tcp://127.0.0.1:*", "--results",
                                "tcp://127.0.0.1:*", "--curve-secret-key", k.key,
                                "--curve-allowed-keys", allow});
  zmq::context_t ctx;
  auto sink =
      keyed_socket(ctx, zmq::socket_type::pull, server.results_endpoint(), k.pub, sink_keys);
  // An unlisted sink that knows the server key never becomes a peer of the results socket.
  auto stranger_sink =
      keyed_socket(ctx, zmq::socket_type::pull, server.results_endpoint(), k.pub, stranger);
  {
    auto push = keyed_socket(ctx, zmq::socket_type::push, server.pull_endpoint(), k.pub, stranger);
    send_submit(push, job("stranger-p", "t", 4));  // times out: no peer ever completes
    std::this_thread::sleep_for(kNoAnswerWait);
  }
  auto before = server.stats();
  BOOST_TEST(before["received"] == 0);
  BOOST_TEST(before["curve_refused"] > 0);

  auto push = keyed_socket(ctx, zmq::socket_type::push, server.pull_endpoint(), k.pub, producer);
  const int n = 3;
  for (int i = 0; i < n; ++i) {
    std::string id = "p";
    id += std::to_string(i);
    BOOST_REQUIRE(send_submit(push, job(id, "t", 4)));
  }
  auto done = collect_dones(n, [&] { return recv_message(sink, 200ms); });
  BOOST_TEST(static_cast<int>(done.size()) == n);
  BOOST_TEST(!done.count("stranger-p"));
  BOOST_TEST(!recv_message(stranger_sink, 300ms).has_value());
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
  sy::it::ServerProcess server({"--config", cfg, "--backend", "null", "--step-delay-ms", "20"});
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
  BOOST_REQUIRE_MESSAGE(res.ok(),
                        "bob's job failed: " << (res.error ? res.error->message : "timeout"));
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

// Plain TCP: 200 raw peers from one address, half idling in their greeting and half holding a
// finished handshake, get max_connections_per_address places between them; a client from
// another address connects and runs its job. What remains: strangers from several addresses can
// still fill max_connections, which counts every connection of a plain endpoint.
BOOST_AUTO_TEST_CASE(a_flood_from_one_address_gets_only_its_share) {
  sy::it::ServerProcess server({"--backend", "null", "--max-connections", std::to_string(kMax),
                                "--max-connections-per-address", std::to_string(kPerAddress),
                                "--handshake-timeout-ms", "0", "--metrics", "127.0.0.1:0"});
  const std::string ep = server.endpoint();
  std::vector<std::unique_ptr<RawPeer>> flood;
  for (int i = 0; i < kFlood; ++i) {
    flood.push_back(std::make_unique<RawPeer>(ep, "127.0.0.1"));
    if (i % 2)
      flood.back()->send(kHalfGreeting);
    else
      flood.back()->send_handshake();  // greeting and READY: a finished NULL handshake
  }
  BOOST_REQUIRE_EQUAL(metric_reaching(server, refused("per_address"), kFlood - kPerAddress),
                      kFlood - kPerAddress);
  int kept = 0;
  for (auto& p : flood) kept += !p->closed_within(200ms);
  BOOST_TEST(kept == kPerAddress);

  Client client(from("127.0.0.2", ep));
  auto r = client.run(job("from-elsewhere", "t", 4), 30s);
  BOOST_REQUIRE_MESSAGE(r.ok(), "the client from 127.0.0.2 got no result: "
                                    << (r.error ? r.error->message : "timeout"));
  BOOST_TEST(r.done->id == "from-elsewhere");
  BOOST_TEST(r.ids.size() == 4u);

  // Eleven strangers from three more addresses fill the cap (4 + 1 + 11 = 16); the next
  // connection, from a fifth address, is refused as `total`.
  std::vector<std::unique_ptr<RawPeer>> spread;
  for (int i = 0; i < kMax - kPerAddress - 1; ++i)
    spread.push_back(std::make_unique<RawPeer>(ep, "127.0.0." + std::to_string(3 + i / 4)));
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_open", kMax), kMax);
  RawPeer one_more(ep, "127.0.0.9");
  BOOST_TEST(one_more.closed_within(10s));
  BOOST_TEST(client.ping_wait(10s));  // the client's connection was not the one closed

  BOOST_TEST(metric(server, refused("per_address")) == kFlood - kPerAddress);
  BOOST_TEST(metric_reaching(server, refused("total"), 1) == 1);
  BOOST_TEST(metric(server, refused("handshaking")) == 0);
  BOOST_TEST(metric(server, "switchyard_connections_handshaking") == 0);
  auto st = server.stats();
  BOOST_TEST(st["connections_refused"] == kFlood - kPerAddress + 1);
  BOOST_TEST(st["connections_refused_per_address"] == kFlood - kPerAddress);
  BOOST_TEST(st["connections_open"] == kMax);
  BOOST_TEST(server.stop() == 0);
}

// CURVE with an allow-list: the same flood idling in the CURVE handshake, and keyless peers
// that retry; a listed client from another address gets its job done. Only connections past
// the allow-list count toward max_connections, so strangers cannot take those places; those in
// their handshake have max_handshaking, which strangers from enough addresses can fill (new
// clients then wait; connected ones are untouched).
BOOST_AUTO_TEST_CASE(strangers_cannot_take_the_places_of_listed_clients) {
  Keys k;
  const auto listed = sy::curve::generate(), unlisted = sy::curve::generate();
  const std::string allow = k.dir.write("clients.allow", listed.public_key + "\n");
  constexpr int kHandshaking = 8;
  // No handshake timeout within the test: only the caps close connections.
  sy::it::ServerProcess server(
      {"--backend", "null", "--curve-secret-key", k.key, "--curve-allowed-keys", allow,
       "--max-connections", std::to_string(kMax), "--max-connections-per-address",
       std::to_string(kPerAddress), "--max-handshaking", std::to_string(kHandshaking),
       "--handshake-timeout-ms", "60000", "--metrics", "127.0.0.1:0"});
  const std::string ep = server.endpoint();
  zmq::context_t ctx;

  // 200 raw peers from 127.0.0.1 that never present a key: four stay, in their handshake.
  std::vector<std::unique_ptr<RawPeer>> flood;
  for (int i = 0; i < kFlood; ++i) {
    flood.push_back(std::make_unique<RawPeer>(ep, "127.0.0.1"));
    if (i % 2)
      flood.back()->send(kHalfGreeting);
    else
      flood.back()->send_greeting_v3("CURVE");  // and never a HELLO
  }
  BOOST_REQUIRE_EQUAL(metric_reaching(server, refused("per_address"), kFlood - kPerAddress),
                      kFlood - kPerAddress);
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_handshaking", kPerAddress),
                      kPerAddress);

  // Two ZeroMQ clients with unlisted keys from 127.0.0.3 retry all along (every 100 ms).
  std::vector<zmq::socket_t> keyless;
  for (int i = 0; i < 2; ++i) {
    keyless.push_back(
        keyed_socket(ctx, zmq::socket_type::dealer, from("127.0.0.3", ep), k.pub, unlisted));
    send_submit(keyless.back(), job("keyless-" + std::to_string(i), "t", 4));
  }
  BOOST_REQUIRE(metric_reaching(server, "switchyard_curve_refused_total", 2) >= 2);

  // The listed client from 127.0.0.2 connects and gets its job done.
  auto member = keyed_socket(ctx, zmq::socket_type::dealer, from("127.0.0.2", ep), k.pub, listed);
  BOOST_REQUIRE(send_submit(member, job("member", "t", 6)));
  auto d = wait_done(member, "member");
  BOOST_REQUIRE_MESSAGE(d.has_value(), "the listed client from 127.0.0.2 got no result");
  BOOST_TEST(d->ids.size() == 6u);
  BOOST_TEST(server.stats()["curve_refused"] >= 2);
  keyless.clear();
  // The flood's four and nothing else are in their handshake; the member passed.
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_handshaking", kPerAddress),
                      kPerAddress);
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_open", kPerAddress + 1),
                      kPerAddress + 1);

  // Strangers from a second address fill max_handshaking (4 + 4 = 8): one from a third is
  // refused as `handshaking`, and the member is still served.
  std::vector<std::unique_ptr<RawPeer>> more;
  for (int i = 0; i < kPerAddress; ++i) {
    more.push_back(std::make_unique<RawPeer>(ep, "127.0.0.4"));
    more.back()->send_greeting_v3("CURVE");
  }
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_handshaking", kHandshaking),
                      kHandshaking);
  RawPeer past_handshaking(ep, "127.0.0.5");
  BOOST_TEST(past_handshaking.closed_within(10s));
  BOOST_TEST(metric_reaching(server, refused("handshaking"), 1) == 1);
  BOOST_TEST(pinged(member));
  more.clear();
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_handshaking", kPerAddress),
                      kPerAddress);

  // Fifteen more listed clients from four addresses take the remaining places (1 + 15 = 16)
  // while the flood still holds its four in the handshake; the next connection is refused as
  // `total`.
  std::vector<zmq::socket_t> members;
  for (int i = 0; i < kMax - 1; ++i) {
    members.push_back(keyed_socket(ctx, zmq::socket_type::dealer,
                                   from("127.0.0." + std::to_string(6 + i / 4), ep), k.pub,
                                   listed));
    BOOST_REQUIRE_MESSAGE(pinged(members.back()), "listed client " << i << " was not served");
  }
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_open", kMax + kPerAddress),
                      kMax + kPerAddress);
  RawPeer past_total(ep, "127.0.0.10");
  BOOST_TEST(past_total.closed_within(10s));
  BOOST_TEST(metric_reaching(server, refused("total"), 1) == 1);
  BOOST_TEST(pinged(member));

  // Every refusal is one the test caused: the flood's 196, one past max_handshaking, one past
  // max_connections; the keyless clients were refused by the allow-list, never by a cap.
  BOOST_TEST(metric(server, refused("per_address")) == kFlood - kPerAddress);
  BOOST_TEST(metric(server, refused("handshaking")) == 1);
  BOOST_TEST(metric(server, refused("total")) == 1);
  auto st = server.stats();
  BOOST_TEST(st["connections_refused"] == kFlood - kPerAddress + 2);
  BOOST_TEST(st["connections_handshaking"] == kPerAddress);
  BOOST_TEST(server.stop() == 0);
}

// With an allow-list, max_connections is checked again when a listed client's handshake reaches
// the allow-list: a connection accepted while there was room, whose handshake comes after the
// last place was taken, is answered ZAP 500 (closed, counted as `total`) and the client that
// holds the place keeps it.
BOOST_AUTO_TEST_CASE(a_listed_client_past_max_connections_is_refused_at_its_handshake) {
  Keys k;
  const auto listed = sy::curve::generate();
  const std::string allow = k.dir.write("clients.allow", listed.public_key + "\n");
  sy::it::ServerProcess server({"--backend", "null", "--curve-secret-key", k.key,
                                "--curve-allowed-keys", allow, "--max-connections", "1",
                                "--handshake-timeout-ms", "60000", "--metrics", "127.0.0.1:0"});
  const std::string ep = server.endpoint();
  zmq::context_t ctx;
  // The late client's connection is accepted first, its handshake held back by the relay.
  HeldRelay relay(ep, "127.0.0.3");
  auto late = keyed_socket(ctx, zmq::socket_type::dealer, relay.endpoint(), k.pub, listed);
  BOOST_REQUIRE(send_submit(late, job("late", "t", 4)));
  BOOST_REQUIRE_EQUAL(metric_reaching(server, "switchyard_connections_handshaking", 1), 1);
  // Then the first client passes and takes the one place.
  auto first = keyed_socket(ctx, zmq::socket_type::dealer, from("127.0.0.2", ep), k.pub, listed);
  BOOST_REQUIRE(pinged(first));
  relay.release();
  BOOST_TEST(metric_reaching(server, refused("total"), 1) == 1);
  BOOST_TEST(!recv_message(late, kNoAnswerWait).has_value());
  BOOST_TEST(pinged(first));
  BOOST_TEST(metric(server, refused("per_address")) == 0);
  BOOST_TEST(metric(server, refused("handshaking")) == 0);
  BOOST_TEST(metric_reaching(server, "switchyard_connections_open", 1) == 1);
  BOOST_TEST(server.stats()["received"] == 2);  // the first client's two pings only
  BOOST_TEST(server.stop() == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_security
