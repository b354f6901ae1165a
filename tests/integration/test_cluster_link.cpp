// A node's link to NATS JetStream against a real nats-server: the contract's streams and
// consumers, duplicate publishes dropped by Nats-Msg-Id, fetching no more than asked, acks,
// redelivery of a dead link's jobs to another, the stream limit as "overloaded", results with
// their ids, differing settings reported by name, reconnects counted, jobs taken out of a pull
// subscription's buffer, and cancels read back from SWITCHYARD_CANCELS.
#include <nats/nats.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <thread>

#include "ingress/nats_link.hpp"
#include "tests/support/nats_server.hpp"

BOOST_AUTO_TEST_SUITE(test_cluster_link)

using namespace sy;
using namespace sy::cluster;

namespace {

ClusterConfig config_for(const test::NatsServer& ns) {
  ClusterConfig c;
  c.nats = {ns.url()};
  c.node_name = "test-node";
  c.reconnect_wait_ms = 20;
  c.reconnect_max_ms = 200;
  return c;
}

const std::vector<std::string> kClasses = {"interactive", "batch"};

std::unique_ptr<NatsLink> joined(const ClusterConfig& c) {
  auto l = std::make_unique<NatsLink>(c, kClasses);
  l->ensure_streams();
  l->bind_consumers();
  return l;
}

// Fetches until `n` jobs came or `tries` fetches of `wait_ms` came back empty.
std::vector<Delivery> fetch_n(NatsLink& l, uint32_t cls, int n, int64_t wait_ms = 2000,
                              int tries = 5) {
  std::vector<Delivery> got;
  while (static_cast<int>(got.size()) < n && tries > 0) {
    auto more = l.fetch(cls, n - static_cast<int>(got.size()), wait_ms);
    if (more.empty()) --tries;
    for (auto& d : more) got.push_back(std::move(d));
  }
  return got;
}

}  // namespace

BOOST_AUTO_TEST_CASE(streams_consumers_and_duplicates) {
  test::NatsServer ns;
  auto link = joined(config_for(ns));
  // A second node finds everything as configured.
  NatsLink other(config_for(ns), kClasses);
  BOOST_TEST(other.ensure_streams().empty());
  BOOST_TEST(other.bind_consumers().empty());

  bool dup = true;
  uint64_t s1 = link->publish_job("batch", "acme", "j1", "body-1", "my.inbox", &dup);
  BOOST_TEST(!dup);
  uint64_t s2 = link->publish_job("batch", "acme", "j1", "body-1 again", "", &dup);
  BOOST_TEST(dup);  // same <tenant>/<id> inside the duplicate window
  BOOST_TEST(s1 == s2);
  link->publish_job("batch", "acme", "j2", "body-2");
  link->publish_job("batch", "acme", "j3", "body-3");
  link->publish_job("interactive", "lab", "i1", "body-i");

  BOOST_TEST(link->lag(1).pending == 3u);
  auto two = link->fetch(1, 2, 2000);
  BOOST_REQUIRE(two.size() == 2u);  // never more than asked
  BOOST_TEST(two[0].data == "body-1");
  BOOST_TEST(two[0].msg_id == "acme/j1");
  BOOST_TEST(two[0].reply_to == "my.inbox");
  BOOST_TEST(two[0].delivered == 1u);
  BOOST_TEST(two[1].reply_to == "");
  auto lag = link->lag(1);
  BOOST_TEST(lag.pending == 1u);
  BOOST_TEST(lag.ack_pending == 2);
  BOOST_TEST(link->ack(two[0]));
  BOOST_TEST(link->ack(two[1]));
  BOOST_TEST(link->lag(1).ack_pending == 0);
  // The other class's consumer gives only its own subject.
  auto i = link->fetch(0, 10, 2000);
  BOOST_REQUIRE(i.size() == 1u);
  BOOST_TEST(i[0].data == "body-i");
  BOOST_TEST(i[0].class_index == 0u);
  auto c = link->counters();
  BOOST_TEST(c.fetched == 3u);
  BOOST_TEST(c.acked == 2u);
  BOOST_TEST(c.connected);
}

BOOST_AUTO_TEST_CASE(a_dead_links_jobs_go_to_another_and_naks_come_back) {
  test::NatsServer ns;
  ClusterConfig c = config_for(ns);
  c.ack_wait_ms = 1000;  // short, so the dead link's job comes back soon
  auto a = joined(c);
  auto b = joined(c);
  a->publish_job("batch", "t", "x", "job-x");
  a->publish_job("batch", "t", "y", "job-y");
  auto taken = fetch_n(*a, 1, 1);
  BOOST_REQUIRE(taken.size() == 1u);
  const std::string first = taken[0].data;
  taken.clear();
  a.reset();  // the node dies without acknowledging: the job stays with JetStream
  auto got = fetch_n(*b, 1, 2, 3000);
  BOOST_REQUIRE(got.size() == 2u);
  int redelivered = 0;
  for (const auto& d : got)
    if (d.data == first) {
      BOOST_TEST(d.delivered == 2u);
      ++redelivered;
    }
  BOOST_TEST(redelivered == 1);
  BOOST_TEST(b->counters().redelivered == 1u);
  // A nak gives a job back at once.
  b->nak(got[0]);
  auto again = fetch_n(*b, 1, 1);
  BOOST_REQUIRE(again.size() == 1u);
  BOOST_TEST(again[0].data == got[0].data);
  BOOST_TEST(again[0].delivered >= 2u);
  for (auto& d : again) BOOST_TEST(b->ack(d));
  BOOST_TEST(b->ack(got[1]));
  BOOST_TEST(b->lag(1).pending == 0u);
  BOOST_TEST(b->lag(1).ack_pending == 0);
}

BOOST_AUTO_TEST_CASE(a_full_queue_refuses_publishes_and_results_are_stored) {
  test::NatsServer ns;
  ClusterConfig c = config_for(ns);
  c.max_jobs = 3;
  auto link = joined(c);
  for (int k = 0; k < 3; ++k) link->publish_job("batch", "t", "k" + std::to_string(k), "b");
  try {
    link->publish_job("batch", "t", "k3", "b");
    BOOST_FAIL("a publish past max_jobs was accepted");
  } catch (const NatsError& e) {
    BOOST_TEST(std::string(e.what()).find("t/k3") != std::string::npos);
    BOOST_TEST(e.code != 0);  // JetStream's own refusal, not a transport error
  }

  // Results land in SWITCHYARD_RESULTS under the tenant's subject, de-duplicated by id.
  natsSubscription* sub = nullptr;
  BOOST_REQUIRE(natsConnection_SubscribeSync(&sub, link->connection(), "switchyard.results.>") ==
                NATS_OK);
  link->publish_result("acme", "acme/j9", "result-bytes");
  link->publish_result("acme", "acme/j9", "result-bytes");  // a duplicate inside the window
  natsMsg* m = nullptr;
  BOOST_REQUIRE(natsSubscription_NextMsg(&m, sub, 5000) == NATS_OK);
  BOOST_TEST(std::string(natsMsg_GetSubject(m)) == "switchyard.results.acme");
  BOOST_TEST(std::string(natsMsg_GetData(m), natsMsg_GetDataLength(m)) == "result-bytes");
  natsMsg_Destroy(m);
  // The stream holds one copy.
  jsCtx* js = nullptr;
  BOOST_REQUIRE(natsConnection_JetStream(&js, link->connection(), nullptr) == NATS_OK);
  jsStreamInfo* si = nullptr;
  BOOST_REQUIRE(js_GetStreamInfo(&si, js, kResultsStream, nullptr, nullptr) == NATS_OK);
  BOOST_TEST(si->State.Msgs == 1u);
  jsStreamInfo_Destroy(si);
  jsCtx_Destroy(js);
  natsSubscription_Destroy(sub);
  BOOST_TEST(link->counters().results_published == 2u);
}

BOOST_AUTO_TEST_CASE(differing_settings_are_named_and_bad_names_refused) {
  test::NatsServer ns;
  auto link = joined(config_for(ns));
  ClusterConfig c = config_for(ns);
  c.max_jobs = 5;
  c.ack_wait_ms = 7000;
  NatsLink other(c, {"interactive", "batch", "bulk"});
  auto notes = other.ensure_streams();
  auto has = [&](const std::vector<std::string>& v, const std::string& what) {
    for (const auto& n : v)
      if (n.find(what) != std::string::npos) return true;
    return false;
  };
  BOOST_TEST(has(notes, "stream SWITCHYARD_JOBS: max_msgs is 1000000, the config says 5"));
  BOOST_TEST(has(notes, "stream SWITCHYARD_JOBS: subjects are"));
  BOOST_TEST(!has(notes, "SWITCHYARD_RESULTS"));
  BOOST_CHECK_THROW(other.bind_consumers(), NatsError);  // no subject for "bulk" in the stream
  ClusterConfig d = config_for(ns);
  d.ack_wait_ms = 7000;
  NatsLink third(d, kClasses);
  auto cn = third.bind_consumers();
  BOOST_TEST(has(cn,
                 "consumer switchyard-batch: ack_wait_ns is 30000000000, the config says "
                 "7000000000"));
  try {
    NatsLink bad(config_for(ns), {"inter.active"});
    BOOST_FAIL("a class name with a dot was accepted");
  } catch (const NatsError& e) {
    BOOST_TEST(std::string(e.what()).find("'inter.active' cannot be a subject token") !=
               std::string::npos);
  }
  ClusterConfig none;
  none.nats = {"nats://127.0.0.1:1"};
  none.reconnect_wait_ms = 10;
  try {
    NatsLink nobody(none, kClasses, 100);
    BOOST_FAIL("a link without a server connected");
  } catch (const NatsError& e) {
    BOOST_TEST(std::string(e.what()).find("cannot connect to NATS at nats://127.0.0.1:1") !=
               std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(reconnects_are_counted_and_work_resumes) {
  test::NatsServer ns;
  auto link = joined(config_for(ns));
  link->publish_job("batch", "t", "before", "b1");
  ns.restart();  // same port, same store: JetStream still holds the job
  // Wait (bounded) for the link to notice and come back; the counts are what is asserted.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until &&
         !(link->counters().reconnects >= 1 && link->counters().connected))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto c = link->counters();
  BOOST_TEST(c.disconnects >= 1u);
  BOOST_TEST(c.reconnects >= 1u);
  BOOST_TEST(c.connected);
  auto got = fetch_n(*link, 1, 1);
  BOOST_REQUIRE(got.size() == 1u);
  BOOST_TEST(got[0].data == "b1");
  BOOST_TEST(link->ack(got[0]));
}

// Jobs delivered into a pull subscription's buffer with no fetch waiting for them (what a fetch
// that returned before its jobs came leaves behind) are counted by buffered() and taken out by
// take_buffered(), every one of them; and SWITCHYARD_CANCELS keeps the cancels published on
// switchyard.cancel, read back in order from any sequence.
BOOST_AUTO_TEST_CASE(buffered_jobs_are_taken_and_stored_cancels_read) {
  test::NatsServer ns;
  auto link = joined(config_for(ns));
  for (int i = 0; i < 5; ++i) {
    std::string id = "b";
    id += std::to_string(i);
    link->publish_job("batch", "acme", id, "job " + id);
  }
  link->request_into_buffer(1, 3);
  // The three arrive within milliseconds; 10 s only bounds a broken server.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (link->buffered(1) < 3 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  BOOST_REQUIRE_GE(link->buffered(1), 3);
  auto held = link->take_buffered(1);
  BOOST_REQUIRE_GE(held.size(), 3u);
  BOOST_TEST(held[0].data == "job b0");
  BOOST_TEST(held[1].data == "job b1");
  BOOST_TEST(held[2].data == "job b2");
  BOOST_TEST(link->buffered(1) == 0);
  for (auto& d : held) BOOST_TEST(link->ack(d));
  auto rest = fetch_n(*link, 1, 5 - static_cast<int>(held.size()));
  BOOST_TEST(held.size() + rest.size() == 5u);
  for (auto& d : rest) BOOST_TEST(link->ack(d));

  // Cancels: a plain publish and a stored one with a publish-ack both end up in the stream.
  BOOST_TEST(link->publish(kCancelSubject, "first"));
  link->publish_cancel("second");
  link->publish_cancel("third");
  std::vector<std::string> read;
  std::vector<int64_t> at;
  uint64_t next = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (read.size() < 3 && std::chrono::steady_clock::now() < deadline)
    next = link->read_cancels(next, [&](const std::string& body, int64_t ms) {
      read.push_back(body);
      at.push_back(ms);
    });
  BOOST_TEST(read == (std::vector<std::string>{"first", "second", "third"}),
             boost::test_tools::per_element());
  BOOST_TEST(next == 4u);
  for (auto ms : at) BOOST_TEST(ms > 0);
  read.clear();
  BOOST_TEST(
      link->read_cancels(3, [&](const std::string& body, int64_t) { read.push_back(body); }) == 4u);
  BOOST_TEST(read == (std::vector<std::string>{"third"}), boost::test_tools::per_element());
  read.clear();
  BOOST_TEST(link->read_cancels(4, [&](const std::string& body, int64_t) {
    read.push_back(body);
  }) == 4u);  // nothing new: nothing read
  BOOST_TEST(read.empty());
}

BOOST_AUTO_TEST_SUITE_END()  // test_cluster_link
