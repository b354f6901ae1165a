// The gateway and egress with real sockets on loopback and a real actor system: a test actor
// stands in for admission, records what the gateway decoded and answers through the egress.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "actors/control.hpp"
#include "actors/messages.hpp"
#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "ingress/egress.hpp"
#include "ingress/gateway.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/stand_in.hpp"

// Printers for Boost.Test messages (found by argument-dependent lookup).
namespace sy {
inline std::ostream& operator<<(std::ostream& o, const ClientRef& c) {
  return o << int(c.kind) << ":" << c.identity.size() << "B";
}
}  // namespace sy

BOOST_AUTO_TEST_SUITE(test_actors_gateway)

using namespace std::chrono_literals;
using sy::client::Client;

namespace {

// Hang guard for every wait: generous, never a timing assertion.
constexpr auto kGuard = 20s;

// What the stand-in admission actor saw.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<sy::SubmitRequest> submits;
  std::vector<sy::KeyRequest> keys;

  template <class Pred>
  bool wait(Pred p, std::chrono::milliseconds timeout = kGuard) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, timeout, [&] { return p(*this); });
  }
  size_t pipeline_submits() {
    size_t n = 0;
    for (auto& s : submits) n += s.client.kind == sy::ClientRef::pipeline;
    return n;
  }
};

// Admission stand-in. Submits whose id starts with "hold" get only `accepted`; others get
// accepted, two chunks when streamed, and done. Status requests get a status reply.
caf::behavior fake_admission(caf::event_based_actor*, std::shared_ptr<Recorder> rec,
                             sy::EgressActor egress) {
  return {
      [=](sy::submit_atom, const sy::SubmitRequest& r) {
        {
          std::lock_guard<std::mutex> lk(rec->mu);
          rec->submits.push_back(r);
        }
        rec->cv.notify_all();
        caf::anon_send(egress, sy::out_atom::value, sy::AcceptedEvent{r.client, r.id, 0});
        if (r.id.rfind("hold", 0) == 0) return;
        if (r.stream) {
          sy::TokensEvent t;
          t.to = r.client;
          t.id = r.id;
          t.ids = {5};
          t.text = "a";
          caf::anon_send(egress, sy::out_atom::value, t);
          t.index = 1;
          t.ids = {6};
          t.text = "b";
          caf::anon_send(egress, sy::out_atom::value, t);
        }
        sy::DoneEvent d;
        d.to = r.client;
        d.id = r.id;
        d.tenant = r.tenant;
        d.finish = sy::FinishReason::length;
        if (!r.stream) {
          d.text = "ab";
          d.ids = {5, 6};
        }
        d.prompt_tokens = 3;
        d.completion_tokens = 2;
        caf::anon_send(egress, sy::out_atom::value, d);
      },
      [=](sy::cancel_atom, const sy::KeyRequest& k) {
        {
          std::lock_guard<std::mutex> lk(rec->mu);
          rec->keys.push_back(k);
        }
        rec->cv.notify_all();
      },
      [=](sy::status_atom, const sy::KeyRequest& k) {
        {
          std::lock_guard<std::mutex> lk(rec->mu);
          rec->keys.push_back(k);
        }
        rec->cv.notify_all();
        caf::anon_send(egress, sy::out_atom::value,
                       sy::StatusEvent{k.client, k.id, sy::JobState::running, 0, 7});
      },
  };
}

struct Config : caf::actor_system_config {
  Config() { sy::register_message_types(*this); }
};

sy::EndpointConfig loopback(bool pipeline = false) {
  sy::EndpointConfig ep;
  ep.bind = "tcp://127.0.0.1:*";
  if (pipeline) {
    ep.pull = "tcp://127.0.0.1:*";
    ep.results = "tcp://127.0.0.1:*";
  }
  return ep;
}

// A started gateway wired to the egress and the stand-in admission.
struct Server {
  Config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<Recorder> rec = std::make_shared<Recorder>();
  std::shared_ptr<sy::Gateway> gw;
  sy::EgressActor egress;
  caf::actor admission;

  explicit Server(sy::EndpointConfig ep = loopback(), sy::GatewayOptions opt = {}) {
    gw = std::make_shared<sy::Gateway>(ep, opt);
    egress = sy::spawn_egress(sys, gw);
    admission = sys.spawn(fake_admission, rec, egress);
    gw->set_admission(sy::test::stand_in<sy::AdmissionActor>(admission));
    gw->start();
  }
  ~Server() {
    gw->stop(0ms);
    caf::anon_send_exit(admission, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(egress, caf::exit_reason::user_shutdown);
  }
};

sy::wire::Submit job(const std::string& id, bool stream = false) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "t1";
  s.prompt = std::string("Hello");
  s.max_tokens = 2;
  s.stream = stream;
  return s;
}

// The next message must be an error; returns it.
sy::wire::Error expect_error(Client& c) {
  auto m = c.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  auto* e = std::get_if<sy::wire::Error>(&*m);
  BOOST_REQUIRE_MESSAGE(e != nullptr, "expected an error, got " << sy::client::describe(*m));
  return *e;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ping_is_answered_by_the_gateway) {
  Server srv;
  Client c(srv.gw->endpoint());
  c.ping(42);
  auto m = c.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  auto* p = std::get_if<sy::wire::Pong>(&*m);
  BOOST_REQUIRE(p != nullptr);
  BOOST_TEST(p->seq == 42u);
  BOOST_TEST(srv.rec->submits.empty());
}

BOOST_AUTO_TEST_CASE(submit_reaches_admission_and_replies_stream_back) {
  Server srv;
  Client c(srv.gw->endpoint());
  auto s = job("j1", true);
  s.temperature = 0;
  s.top_k = 40;
  s.seed = 9;
  s.stop = {"\n"};
  s.priority = "batch";
  s.deadline_ms = 500;
  s.logprobs = 2;
  auto r = c.run(s, kGuard);
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(r.accepted.has_value());
  BOOST_TEST(r.chunks.size() == 2u);
  BOOST_TEST(r.text == "ab");
  BOOST_TEST((r.ids == std::vector<int32_t>{5, 6}));
  BOOST_TEST(r.done->finish_reason == sy::wire::FinishReason::length);
  BOOST_TEST(r.done->usage.completion_tokens == 2u);

  std::lock_guard<std::mutex> lk(srv.rec->mu);
  BOOST_REQUIRE(srv.rec->submits.size() == 1u);
  const auto& q = srv.rec->submits[0];
  BOOST_TEST(q.client.kind == sy::ClientRef::router);
  BOOST_TEST(!q.client.identity.empty());
  BOOST_TEST(q.id == "j1");
  BOOST_TEST(q.tenant == "t1");
  BOOST_TEST(!q.prompt_is_ids);
  BOOST_TEST(q.prompt_text == "Hello");
  BOOST_TEST(q.temperature == 0.0);
  BOOST_TEST(q.top_k == 40u);
  BOOST_TEST(q.has_seed);
  BOOST_TEST(q.seed == 9u);
  BOOST_TEST(q.stop.size() == 1u);
  BOOST_TEST(q.priority == "batch");
  BOOST_TEST(q.deadline_ms == 500u);
  BOOST_TEST(q.stream);
  BOOST_TEST(q.logprobs == 2u);
  BOOST_TEST(q.arrival_us > 0);
}

BOOST_AUTO_TEST_CASE(token_prompts_and_non_streamed_done) {
  Server srv;
  Client c(srv.gw->endpoint());
  auto s = job("j2");
  s.prompt = std::vector<int32_t>{1, 15043};
  auto r = c.run(s, kGuard);
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(r.chunks.empty());
  BOOST_TEST(r.text == "ab");
  BOOST_TEST(r.done->tenant == "t1");
  std::lock_guard<std::mutex> lk(srv.rec->mu);
  BOOST_REQUIRE(srv.rec->submits.size() == 1u);
  BOOST_TEST(srv.rec->submits[0].prompt_is_ids);
  BOOST_TEST((srv.rec->submits[0].prompt_ids == std::vector<int32_t>{1, 15043}));
}

BOOST_AUTO_TEST_CASE(malformed_messages_get_errors_naming_the_problem) {
  Server srv;
  Client c(srv.gw->endpoint());

  // Random bytes (fixed seed; 0xc1 first: a byte msgpack never uses).
  std::mt19937 rng(7);
  std::string noise(64, '\0');
  for (auto& ch : noise) ch = static_cast<char>(rng());
  noise[0] = '\xc1';
  c.send_raw(noise.data(), noise.size());
  auto e = expect_error(c);
  BOOST_TEST(e.code == sy::ErrorCode::bad_request);
  BOOST_TEST(contains(e.message, "bad msgpack"), e.message);

  // Truncated msgpack: half of a valid submit.
  auto full = sy::wire::encode_client(job("t"));
  c.send_raw(full.data(), full.size() / 2);
  e = expect_error(c);
  BOOST_TEST(e.code == sy::ErrorCode::bad_request);
  BOOST_TEST(contains(e.message, "truncated"), e.message);

  // An array32 header claiming 4 GiB elements.
  const unsigned char huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
  c.send_raw(huge, sizeof huge);
  e = expect_error(c);
  BOOST_TEST(e.code == sy::ErrorCode::bad_request);
  BOOST_TEST(contains(e.message, "array of 4294967295 elements exceeds limit"), e.message);

  // Nesting depth 1000.
  std::string deep(1000, '\x91');
  deep.push_back('\x00');
  c.send_raw(deep.data(), deep.size());
  e = expect_error(c);
  BOOST_TEST(e.code == sy::ErrorCode::bad_request);
  BOOST_TEST(contains(e.message, "nesting deeper than"), e.message);

  // A wrong field type: max_tokens as a string. The error names the field and the job.
  {
    const char bad[] =
        "\x86\xa1v\x01\xa4type\xa6submit\xa2id\xa2j9\xa6tenant\xa2t1\xa6prompt\xa2Hi"
        "\xaamax_tokens\xa3ten";
    c.send_raw(bad, sizeof bad - 1);
    e = expect_error(c);
    BOOST_TEST(e.code == sy::ErrorCode::bad_request);
    BOOST_TEST(contains(e.message, "max_tokens"), e.message);
    BOOST_TEST(contains(e.message, "integer"), e.message);
    BOOST_TEST(e.id == "j9");
  }

  // A multi-part message (what a REQ socket would send).
  {
    zmq::message_t empty, body(full.data(), full.size());
    c.socket().send(empty, zmq::send_flags::sndmore);
    c.socket().send(body, zmq::send_flags::none);
    e = expect_error(c);
    BOOST_TEST(e.code == sy::ErrorCode::bad_request);
    BOOST_TEST(contains(e.message, "multi-part"), e.message);
  }

  // None of it reached admission, and the gateway still serves.
  BOOST_TEST(srv.rec->submits.empty());
  BOOST_TEST(srv.gw->stats().decode_errors == 6u);
  auto r = c.run(job("after"), kGuard);
  BOOST_TEST(r.ok());
}

BOOST_AUTO_TEST_CASE(oversized_frame_disconnects_and_the_next_client_works) {
  auto ep = loopback();
  ep.max_message_bytes = 4096;
  Server srv(ep);
  {
    // The server drops the connection: the client's socket monitor sees it.
    struct Watch : zmq::monitor_t {
      bool disconnected = false;
      void on_event_disconnected(const zmq_event_t&, const char*) override { disconnected = true; }
    };
    Client big(srv.gw->endpoint());
    Watch watch;  // after `big`: its socket must close before big's context ends
    watch.init(big.socket(), "inproc://watch-big", ZMQ_EVENT_DISCONNECTED);
    BOOST_REQUIRE(big.ping_wait(kGuard));  // connected
    auto s = job("big");
    s.prompt = std::string(8192, 'x');
    big.submit(s);
    auto until = std::chrono::steady_clock::now() + kGuard;
    while (!watch.disconnected && std::chrono::steady_clock::now() < until) watch.check_event(100);
    BOOST_TEST(watch.disconnected);
  }
  Client c(srv.gw->endpoint());
  BOOST_TEST(c.ping_wait(kGuard));
  auto r = c.run(job("small"), kGuard);
  BOOST_TEST(r.ok());
  std::lock_guard<std::mutex> lk(srv.rec->mu);
  BOOST_REQUIRE(srv.rec->submits.size() == 1u);
  BOOST_TEST(srv.rec->submits[0].id == "small");
}

BOOST_AUTO_TEST_CASE(cancel_and_status_are_forwarded) {
  Server srv;
  Client c(srv.gw->endpoint());
  c.cancel("x1", "t1", "secret");
  c.status("x2", "t1");
  auto m = c.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  auto* st = std::get_if<sy::wire::StatusReply>(&*m);
  BOOST_REQUIRE(st != nullptr);
  BOOST_TEST(st->id == "x2");
  BOOST_TEST(st->state == sy::wire::JobState::running);
  BOOST_TEST(st->completion_tokens == 7u);
  BOOST_REQUIRE(srv.rec->wait([](Recorder& r) { return r.keys.size() == 2; }));
  std::lock_guard<std::mutex> lk(srv.rec->mu);
  BOOST_TEST(srv.rec->keys[0].kind == sy::KeyRequest::cancel);
  BOOST_TEST(srv.rec->keys[0].id == "x1");
  BOOST_TEST(srv.rec->keys[0].token == "secret");
  BOOST_TEST(!srv.rec->keys[0].internal);
  BOOST_TEST(srv.rec->keys[1].kind == sy::KeyRequest::status);
}

BOOST_AUTO_TEST_CASE(streaming_to_a_vanished_client_cancels_its_job) {
  Server srv;
  sy::ClientRef who;
  {
    Client c(srv.gw->endpoint());
    c.submit(job("hold-1", true));
    auto m = c.next(kGuard);
    BOOST_REQUIRE(m.has_value());
    BOOST_REQUIRE(std::holds_alternative<sy::wire::Accepted>(*m));
    std::lock_guard<std::mutex> lk(srv.rec->mu);
    BOOST_REQUIRE(srv.rec->submits.size() == 1u);
    who = srv.rec->submits[0].client;
  }  // the client goes away with its job running
  // Keep streaming until the ROUTER notices the peer is gone (asynchronous in ZeroMQ).
  bool cancelled = false;
  auto until = std::chrono::steady_clock::now() + kGuard;
  for (uint32_t i = 0; !cancelled && std::chrono::steady_clock::now() < until; ++i) {
    sy::TokensEvent t;
    t.to = who;
    t.id = "hold-1";
    t.index = i;
    t.ids = {1};
    caf::anon_send(srv.egress, sy::out_atom::value, t);
    cancelled = srv.rec->wait([](Recorder& r) { return !r.keys.empty(); }, 20ms);
  }
  BOOST_REQUIRE(cancelled);
  std::lock_guard<std::mutex> lk(srv.rec->mu);
  BOOST_REQUIRE(srv.rec->keys.size() >= 1u);
  const auto& k = srv.rec->keys[0];
  BOOST_TEST(k.kind == sy::KeyRequest::cancel);
  BOOST_TEST(k.internal);
  BOOST_TEST(k.id == "hold-1");
  BOOST_TEST(k.tenant == "t1");  // remembered by the gateway: chunks do not carry it
  BOOST_TEST(k.client == who);
  BOOST_TEST(srv.gw->stats().internal_cancels == 1u);
}

BOOST_AUTO_TEST_CASE(pull_is_read_only_against_credit) {
  Server srv(loopback(true));
  sy::client::Sink sink(srv.gw->results_endpoint());
  sy::client::Pusher push(srv.gw->pull_endpoint());
  Client c(srv.gw->endpoint());
  for (int i = 0; i < 5; ++i)
    BOOST_REQUIRE(push.submit(job("p" + std::to_string(i), true), kGuard));

  // No credit: the gateway keeps serving the ROUTER but reads nothing from PULL.
  for (int i = 0; i < 3; ++i) BOOST_REQUIRE(c.ping_wait(kGuard));
  std::this_thread::sleep_for(100ms);  // let the pushes arrive (no assertion on time)
  BOOST_REQUIRE(c.ping_wait(kGuard));
  BOOST_TEST(srv.rec->pipeline_submits() == 0u);
  BOOST_TEST(srv.gw->stats().pull_credit == 0);

  caf::anon_send(srv.egress, sy::pull_atom::value, uint32_t{2});
  BOOST_REQUIRE(srv.rec->wait([](Recorder& r) { return r.pipeline_submits() >= 2; }));
  std::this_thread::sleep_for(100ms);
  BOOST_REQUIRE(c.ping_wait(kGuard));
  BOOST_TEST(srv.rec->pipeline_submits() == 2u);
  BOOST_TEST(srv.gw->stats().pull_credit == 0);

  caf::anon_send(srv.egress, sy::pull_atom::value, uint32_t{10});
  BOOST_REQUIRE(srv.rec->wait([](Recorder& r) { return r.pipeline_submits() == 5; }));

  // Results: only done (accepted and chunks are not for pipelines), each once, streaming off.
  std::set<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto m = sink.next(kGuard);
    BOOST_REQUIRE(m.has_value());
    auto* d = std::get_if<sy::wire::Done>(&*m);
    BOOST_REQUIRE_MESSAGE(d != nullptr, sy::client::describe(*m));
    BOOST_TEST(d->tenant == "t1");
    BOOST_TEST(d->text == "ab");
    ids.insert(d->id);
  }
  BOOST_TEST(ids.size() == 5u);
  {
    std::lock_guard<std::mutex> lk(srv.rec->mu);
    for (auto& s : srv.rec->submits) BOOST_TEST(!s.stream);
  }

  // A ping on the pipeline input is refused on the results socket.
  BOOST_REQUIRE(push.send(sy::wire::Ping{1}, kGuard));
  auto m = sink.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  auto* e = std::get_if<sy::wire::Error>(&*m);
  BOOST_REQUIRE(e != nullptr);
  BOOST_TEST(e->code == sy::ErrorCode::bad_request);
  BOOST_TEST(contains(e->message, "request endpoint"), e->message);
}

BOOST_AUTO_TEST_CASE(stop_flushes_what_is_queued) {
  Server srv;
  Client c(srv.gw->endpoint());
  c.submit(job("hold-2"));
  auto m = c.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  sy::ClientRef who;
  {
    std::lock_guard<std::mutex> lk(srv.rec->mu);
    BOOST_REQUIRE(srv.rec->submits.size() == 1u);
    who = srv.rec->submits[0].client;
  }
  sy::DoneEvent d;
  d.to = who;
  d.id = "hold-2";
  d.finish = sy::FinishReason::cancelled;
  srv.gw->post(sy::encode_event(d));
  srv.gw->stop(2000ms);
  m = c.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  auto* done = std::get_if<sy::wire::Done>(&*m);
  BOOST_REQUIRE(done != nullptr);
  BOOST_TEST(done->finish_reason == sy::wire::FinishReason::cancelled);
  srv.gw->post(sy::encode_event(d));  // after stop: dropped, no crash
}

BOOST_AUTO_TEST_CASE(egress_encodes_errors_and_logprobs) {
  sy::ErrorEvent e;
  e.id = "j";
  e.tenant = "t";
  e.code = sy::ErrorCode::overloaded;
  e.message = "queue full";
  e.retry_after_ms = 120;
  auto out = sy::encode_event(e);
  BOOST_TEST(out.terminal);
  BOOST_TEST(out.tenant == "t");
  auto d = sy::wire::decode_server(out.bytes.data(), out.bytes.size());
  auto* msg = std::get_if<sy::wire::ServerMessage>(&d);
  BOOST_REQUIRE(msg != nullptr);
  auto* err = std::get_if<sy::wire::Error>(msg);
  BOOST_REQUIRE(err != nullptr);
  BOOST_TEST(err->code == sy::ErrorCode::overloaded);
  BOOST_REQUIRE(err->retry_after_ms.has_value());
  BOOST_TEST(*err->retry_after_ms == 120u);

  e.retry_after_ms = -1;
  out = sy::encode_event(e);
  d = sy::wire::decode_server(out.bytes.data(), out.bytes.size());
  BOOST_TEST(!std::get<sy::wire::Error>(std::get<sy::wire::ServerMessage>(d)).retry_after_ms);

  sy::TokensEvent t;
  t.id = "j";
  t.ids = {3, 4};
  t.logprob = {-0.5f, -1.0f};
  t.n_top = 2;
  t.top_ids = {3, 7, 4, 8};
  t.top_logprobs = {-0.5f, -2.0f, -1.0f, -3.0f};
  out = sy::encode_event(t);
  BOOST_TEST(!out.terminal);
  d = sy::wire::decode_server(out.bytes.data(), out.bytes.size());
  auto& tok = std::get<sy::wire::Tokens>(std::get<sy::wire::ServerMessage>(d));
  BOOST_REQUIRE(tok.logprobs.size() == 2u);
  BOOST_TEST(tok.logprobs[1].logprob == -1.0f);
  BOOST_REQUIRE(tok.logprobs[1].top.size() == 2u);
  BOOST_TEST(tok.logprobs[1].top[1].id == 8);
}

BOOST_AUTO_TEST_CASE(egress_text_is_always_valid_utf8) {
  // A random model can emit any byte (byte-fallback tokens); the wire's text is a msgpack str.
  sy::TokensEvent t;
  t.id = "j";
  t.ids = {3};
  t.text = std::string("a\xff\xc3") + "\xc3\xa9";  // stray byte, torn lead byte, then "é"
  auto out = sy::encode_event(t);
  auto d = sy::wire::decode_server(out.bytes.data(), out.bytes.size());
  auto& tok = std::get<sy::wire::Tokens>(std::get<sy::wire::ServerMessage>(d));
  BOOST_TEST(tok.text == "a\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9");

  sy::DoneEvent e;
  e.id = "j";
  e.text = "\xed\xa0\x80ok";  // an encoded surrogate is not valid UTF-8 either
  out = sy::encode_event(e);
  d = sy::wire::decode_server(out.bytes.data(), out.bytes.size());
  BOOST_TEST(std::get<sy::wire::Done>(std::get<sy::wire::ServerMessage>(d)).text ==
             "\xef\xbf\xbdok");
}

namespace {

// Posts `n` big chunks of job `id` to a client that is not reading, so that its pipe reaches the
// high-water mark (the payload is large enough to fill the kernel's socket buffers as well).
void flood(sy::Gateway& gw, const sy::ClientRef& who, const std::string& id, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    sy::TokensEvent t;
    t.to = who;
    t.id = id;
    t.index = i;
    t.ids = {1};
    t.text = std::string(256 << 10, 'x');
    gw.post(sy::encode_event(t));
  }
}

sy::ClientRef submit_and_hold(Server& srv, Client& c, const std::string& id) {
  c.submit(job(id, true));
  auto m = c.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  std::lock_guard<std::mutex> lk(srv.rec->mu);
  BOOST_REQUIRE(!srv.rec->submits.empty());
  return srv.rec->submits.back().client;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_slow_reader_gets_everything_in_order) {
  auto ep = loopback();
  ep.sndhwm = 4;
  Server srv(ep);
  // A one-message receive queue and a small kernel buffer: the server's sends back up as soon
  // as this client stops reading, however fast its I/O thread is.
  Client c(srv.gw->endpoint(), sy::client::ClientOptions{1, 64 << 10});
  auto who = submit_and_hold(srv, c, "hold-3");
  const uint32_t n = 200;  // 50 MiB: more than ZeroMQ's pipes and the kernel buffers hold
  flood(*srv.gw, who, "hold-3", n);
  auto until = std::chrono::steady_clock::now() + kGuard;
  while (srv.gw->stats().hwm_deferrals == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  BOOST_REQUIRE(srv.gw->stats().hwm_deferrals > 0);
  for (uint32_t i = 0; i < n; ++i) {
    auto m = c.next(kGuard);
    BOOST_REQUIRE(m.has_value());
    auto* t = std::get_if<sy::wire::Tokens>(&*m);
    BOOST_REQUIRE(t != nullptr);
    BOOST_REQUIRE_EQUAL(t->index, i);
  }
  BOOST_TEST(srv.gw->stats().internal_cancels == 0u);
}

BOOST_AUTO_TEST_CASE(a_reader_too_far_behind_has_its_job_cancelled) {
  auto ep = loopback();
  ep.sndhwm = 4;
  sy::GatewayOptions opt;
  opt.peer_backlog_limit = 8;
  Server srv(ep, opt);
  // A one-message receive queue and a small kernel buffer: the server's sends back up as soon
  // as this client stops reading, however fast its I/O thread is.
  Client c(srv.gw->endpoint(), sy::client::ClientOptions{1, 64 << 10});
  auto who = submit_and_hold(srv, c, "hold-4");
  const uint32_t n = 200;
  flood(*srv.gw, who, "hold-4", n);
  BOOST_REQUIRE(srv.rec->wait([](Recorder& r) { return !r.keys.empty(); }));
  {
    std::lock_guard<std::mutex> lk(srv.rec->mu);
    BOOST_TEST(srv.rec->keys[0].internal);
    BOOST_TEST(srv.rec->keys[0].id == "hold-4");
  }
  // The job's end still arrives, after a gap-free prefix of its chunks.
  sy::DoneEvent d;
  d.to = who;
  d.id = "hold-4";
  d.tenant = "t1";
  d.finish = sy::FinishReason::cancelled;
  srv.gw->post(sy::encode_event(d));
  uint32_t chunks = 0;
  for (;;) {
    auto m = c.next(kGuard);
    BOOST_REQUIRE(m.has_value());
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) {
      BOOST_REQUIRE_EQUAL(t->index, chunks);
      ++chunks;
      continue;
    }
    auto* done = std::get_if<sy::wire::Done>(&*m);
    BOOST_REQUIRE(done != nullptr);
    BOOST_TEST(done->finish_reason == sy::wire::FinishReason::cancelled);
    break;
  }
  BOOST_TEST(chunks < n);
  BOOST_TEST(srv.gw->stats().internal_cancels == 1u);
}

BOOST_AUTO_TEST_CASE(pipeline_results_wait_for_a_sink) {
  sy::GatewayOptions opt;
  opt.initial_pull_credit = 100;
  Server srv(loopback(true), opt);
  sy::client::Pusher push(srv.gw->pull_endpoint());
  for (int i = 0; i < 3; ++i) {
    // Built by appending: GCC 12 warns (-Wrestrict, a false positive) on "lit" + string&&.
    std::string id = "w";
    id += std::to_string(i);
    BOOST_REQUIRE(push.submit(job(id), kGuard));
  }
  BOOST_REQUIRE(srv.rec->wait([](Recorder& r) { return r.pipeline_submits() == 3; }));
  // No sink yet: the results wait in the gateway (PUSH has no peer to take them).
  sy::client::Sink sink(srv.gw->results_endpoint());
  std::set<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto m = sink.next(kGuard);
    BOOST_REQUIRE(m.has_value());
    BOOST_REQUIRE(std::holds_alternative<sy::wire::Done>(*m));
    ids.insert(sy::client::message_id(*m));
  }
  BOOST_TEST(ids.size() == 3u);
  BOOST_TEST(srv.gw->stats().pull_credit == 97);
}

BOOST_AUTO_TEST_CASE(a_busy_or_bad_address_is_named) {
  Server srv;
  sy::EndpointConfig ep;
  ep.bind = srv.gw->endpoint();  // taken
  sy::Gateway second(ep);
  try {
    second.start();
    BOOST_FAIL("binding a busy address succeeded");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(contains(e.what(), srv.gw->endpoint()), e.what());
  }
  ep.bind = "nonsense";
  sy::Gateway third(ep);
  BOOST_CHECK_THROW(third.start(), std::runtime_error);
  BOOST_TEST(Client(srv.gw->endpoint()).ping_wait(kGuard));  // the first one is unaffected
}

// ---- control messages ----

namespace {

// Control stand-in: records requests and answers each with a ControlEvent echoing the policy.
caf::behavior fake_control(caf::event_based_actor*,
                           std::shared_ptr<std::vector<sy::ControlRequest>> seen,
                           std::shared_ptr<std::mutex> mu, sy::EgressActor egress) {
  return {
      [=](sy::control_atom, const sy::ControlRequest& r) {
        {
          std::lock_guard<std::mutex> lk(*mu);
          seen->push_back(r);
        }
        caf::anon_send(egress, sy::out_atom::value,
                       sy::ControlEvent{r.client, r.command, "{\"policy\": \"" + r.policy + "\"}"});
      },
  };
}

// A batcher stand-in for the control actor: answers kvpolicy with `refusal` ("" = swapped) and
// stats with a few counters; `silent` leaves kvpolicy requests unanswered (a wedged batcher).
caf::behavior fake_batcher(caf::event_based_actor* self, std::string refusal, bool silent,
                           int64_t used) {
  auto policy = std::make_shared<std::string>("full");
  auto held = std::make_shared<std::vector<caf::response_promise>>();
  return {
      [=](sy::kvpolicy_atom, const sy::policy::KvPolicy& p) -> caf::result<std::string> {
        if (silent) {
          held->push_back(self->make_response_promise());  // kept, never delivered
          return held->back();
        }
        if (refusal.empty()) *policy = sy::policy::to_string(p);
        return refusal;
      },
      [=](sy::stats_atom) {
        sy::BatcherStats s;
        s.kv_policy = *policy;
        s.blocks_used = used;
        s.blocks_total = 100;
        s.policy_swaps = *policy == "full" ? 0 : 1;
        s.prefix_hit_tokens = 32;
        return s;
      },
  };
}

// Answers stats_atom with `record`.
template <class R>
caf::behavior fake_stats(caf::event_based_actor*, R record) {
  return {
      [=](sy::stats_atom) { return record; },
  };
}

}  // namespace

BOOST_AUTO_TEST_CASE(control_goes_to_the_control_actor_on_the_router_only) {
  Server srv(loopback(true));
  Client c(srv.gw->endpoint());
  // Not wired yet: refused, never dropped.
  auto early = c.control("stats", "", "tok", kGuard);
  BOOST_REQUIRE(early.error.has_value());
  BOOST_TEST(early.error->code == sy::ErrorCode::unavailable);

  auto seen = std::make_shared<std::vector<sy::ControlRequest>>();
  auto mu = std::make_shared<std::mutex>();
  auto ctl = srv.sys.spawn(fake_control, seen, mu, srv.egress);
  srv.gw->set_control(sy::test::stand_in<sy::ControlActor>(ctl));
  auto r = c.control("kv_policy", "sinks:4:60", "tok", kGuard);
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(r.reply->command == "kv_policy");
  BOOST_TEST(r.reply->result == "{\"policy\": \"sinks:4:60\"}");
  {
    std::lock_guard<std::mutex> lk(*mu);
    BOOST_REQUIRE(seen->size() == 1u);
    BOOST_TEST((*seen)[0].token == "tok");
    BOOST_TEST((*seen)[0].command == "kv_policy");
    BOOST_TEST((*seen)[0].policy == "sinks:4:60");
    BOOST_TEST((*seen)[0].client.kind == sy::ClientRef::router);
  }
  BOOST_TEST(srv.gw->stats().controls == 1u);

  // On the pipeline input: refused on the results socket, the control actor never sees it.
  sy::client::Sink sink(srv.gw->results_endpoint());
  sy::client::Pusher push(srv.gw->pull_endpoint());
  caf::anon_send(srv.egress, sy::pull_atom::value, uint32_t{4});
  BOOST_REQUIRE(push.send(sy::wire::Control{"tok", "stats", ""}, kGuard));
  auto m = sink.next(kGuard);
  BOOST_REQUIRE(m.has_value());
  auto* e = std::get_if<sy::wire::Error>(&*m);
  BOOST_REQUIRE(e != nullptr);
  BOOST_TEST(e->code == sy::ErrorCode::bad_request);
  BOOST_TEST(e->message == "control needs the request endpoint");
  {
    std::lock_guard<std::mutex> lk(*mu);
    BOOST_TEST(seen->size() == 1u);
  }
  caf::anon_send_exit(ctl, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(control_actor_checks_the_token_and_swaps_every_batcher) {
  Server srv;
  auto b1 = srv.sys.spawn(fake_batcher, std::string(), false, int64_t{3});
  auto b2 = srv.sys.spawn(fake_batcher, std::string(), false, int64_t{4});
  sy::ControlWiring w;
  w.admin_token = "adm";
  sy::AdmissionStats admission;
  admission.active = 7;
  w.admission = sy::test::stand_in<sy::AdmissionActor>(
      srv.sys.spawn(fake_stats<sy::AdmissionStats>, admission));
  sy::RouterStats router;
  router.queued = 5;
  w.router =
      sy::test::stand_in<sy::RouterActor>(srv.sys.spawn(fake_stats<sy::RouterStats>, router));
  w.egress = srv.egress;
  w.batchers = {sy::test::stand_in<sy::BatcherActor>(b1), sy::test::stand_in<sy::BatcherActor>(b2)};
  w.edge_stats = [] {
    sy::EdgeStats e;
    e.received = 11;
    return e;
  };
  auto ctl = sy::spawn_control(srv.sys, w);
  srv.gw->set_control(ctl);
  Client c(srv.gw->endpoint());

  auto none = c.control("stats", "", "", kGuard);
  BOOST_REQUIRE(none.error.has_value());
  BOOST_TEST(none.error->code == sy::ErrorCode::unauthorized);
  BOOST_TEST(none.error->message == "control commands need the admin token");
  auto wrong = c.control("stats", "", "adx", kGuard);
  BOOST_REQUIRE(wrong.error.has_value());
  BOOST_TEST(wrong.error->message == "wrong admin token");
  auto bad = c.control("kv_policy", "window:3", "adm", kGuard);
  BOOST_REQUIRE(bad.error.has_value());
  BOOST_TEST(bad.error->code == sy::ErrorCode::bad_request);
  BOOST_TEST(contains(bad.error->message, "'window:3'"), bad.error->message);

  auto ok = c.control("kv_policy", "sliding_window:512", "adm", kGuard);
  BOOST_REQUIRE(ok.ok());
  BOOST_TEST(ok.reply->result == "{\"kv_policy\": \"sliding_window:512\", \"batchers\": 2}");

  auto st = c.control("stats", "", "adm", kGuard);
  BOOST_REQUIRE(st.ok());
  auto j = nlohmann::json::parse(st.reply->result);
  BOOST_TEST(j.at("active_jobs").get<int64_t>() == 7);
  BOOST_TEST(j.at("queued").get<int64_t>() == 5);
  BOOST_TEST(j.at("blocks_used").get<int64_t>() == 7);
  BOOST_TEST(j.at("blocks_total").get<int64_t>() == 200);
  BOOST_TEST(j.at("policy_swaps").get<int64_t>() == 2);
  BOOST_TEST(j.at("prefix_hit_tokens").get<int64_t>() == 64);
  BOOST_TEST(j.at("blocks_cached").get<int64_t>() == 0);  // absent counters read 0
  BOOST_TEST(j.at("received").get<int64_t>() == 11);
  BOOST_REQUIRE(j.at("batchers").size() == 2u);
  BOOST_TEST(j.at("batchers")[1].at("kv_policy").get<std::string>() == "sliding_window:512");
  BOOST_TEST(j.at("batchers")[1].at("blocks_used").get<int64_t>() == 4);
  sy::test::stop_all(ctl, b1, b2, w.admission, w.router);
}

BOOST_AUTO_TEST_CASE(control_actor_reports_refusals_and_silent_batchers) {
  Server srv;
  Client c(srv.gw->endpoint());
  auto run = [&](std::vector<caf::actor> batchers, const std::string& admin) {
    sy::ControlWiring w;
    w.admin_token = admin;
    w.egress = srv.egress;
    for (const auto& b : batchers) w.batchers.push_back(sy::test::stand_in<sy::BatcherActor>(b));
    // Short, so the silent batcher's case ends soon; nothing asserts on the time itself.
    w.ask_timeout = 200ms;
    auto ctl = sy::spawn_control(srv.sys, w);
    srv.gw->set_control(ctl);
    auto r = c.control("kv_policy", "sinks:4:60", "adm", kGuard);
    caf::anon_send_exit(ctl, caf::exit_reason::user_shutdown);
    for (auto& b : w.batchers) caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
    return r;
  };
  auto off = run({}, "");
  BOOST_REQUIRE(off.error.has_value());
  BOOST_TEST(off.error->code == sy::ErrorCode::unauthorized);

  auto refused = run({srv.sys.spawn(fake_batcher, std::string(), false, int64_t{0}),
                      srv.sys.spawn(fake_batcher, std::string("too big"), false, int64_t{0})},
                     "adm");
  BOOST_REQUIRE(refused.error.has_value());
  BOOST_TEST(refused.error->code == sy::ErrorCode::bad_request);
  BOOST_TEST(refused.error->message == "too big");

  auto silent = run({srv.sys.spawn(fake_batcher, std::string(), true, int64_t{0})}, "adm");
  BOOST_REQUIRE(silent.error.has_value());
  BOOST_TEST(silent.error->code == sy::ErrorCode::unavailable);
  BOOST_TEST(contains(silent.error->message, "batcher 0"), silent.error->message);

  // A batcher that does not know the message at all: an error reply, not a hang.
  auto unaware = run({srv.sys.spawn(fake_stats<sy::RouterStats>, sy::RouterStats{})}, "adm");
  BOOST_REQUIRE(unaware.error.has_value());
  BOOST_TEST((unaware.error->code == sy::ErrorCode::internal ||
              unaware.error->code == sy::ErrorCode::unavailable));

  auto zero = run({}, "adm");
  BOOST_REQUIRE(zero.ok());
  BOOST_TEST(zero.reply->result == "{\"kv_policy\": \"sinks:4:60\", \"batchers\": 0}");
}

BOOST_AUTO_TEST_CASE(egress_encodes_control_replies_and_cached_tokens) {
  sy::ControlEvent ce;
  ce.to.identity = "id";
  ce.command = "stats";
  ce.result = "{}";
  auto m = sy::encode_event(ce);
  BOOST_TEST(!m.terminal);
  auto d = sy::wire::decode_server(m.bytes.data(), m.bytes.size());
  auto& reply = std::get<sy::wire::ControlReply>(std::get<sy::wire::ServerMessage>(d));
  BOOST_TEST(reply.command == "stats");
  BOOST_TEST(reply.result == "{}");
  sy::DoneEvent de;
  de.id = "j";
  de.prompt_tokens = 40;
  de.completion_tokens = 2;
  de.cached_tokens = 32;
  auto dm = sy::encode_event(de);
  auto dd = sy::wire::decode_server(dm.bytes.data(), dm.bytes.size());
  BOOST_TEST(std::get<sy::wire::Done>(std::get<sy::wire::ServerMessage>(dd)).usage.cached_tokens ==
             32u);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_gateway
