// The `cluster` config section onto ClusterConfig: every key read, one URL or a list, the bounds
// named in errors, unknown keys refused, and class names checked as subject tokens once a NATS
// server is named.
#include <boost/test/unit_test.hpp>
#include <string>

#include "server/config.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_config_cluster)

namespace {

std::string write_temp(const std::string& text) {
  static int n = 0;
  static const sy::test::TempDir dir("sy_config_cluster_");
  std::string name = "c";  // appended: g++ 12 warns falsely about "c" + std::to_string(n)
  name += std::to_string(n++);
  name += ".yaml";
  return dir.write(name, text);
}

sy::ServerConfig load(const std::string& text) {
  sy::ServerConfig c;
  sy::load_config_file(write_temp(text), c);
  sy::finalize_config(c);
  return c;
}

// The message of the exception that loading `text` raises ("" when none).
std::string load_error(const std::string& text) {
  try {
    load(text);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_key_is_read) {
  auto c = load(
      "cluster:\n"
      "  nats: [nats://a:4222, nats://b:4222]\n"
      "  node_name: gpu-7\n"
      "  replicas: 3\n"
      "  max_jobs: 5000\n"
      "  max_job_bytes: 1048576\n"
      "  results_max_age_s: 600\n"
      "  results_max_bytes: 2097152\n"
      "  ack_wait_ms: 5000\n"
      "  max_ack_pending: 256\n"
      "  max_in_flight: 8\n"
      "  duplicate_window_ms: 60000\n"
      "  reconnect_wait_ms: 50\n"
      "  reconnect_max_ms: 2000\n"
      "  cancels_max_age_s: 172800\n"
      "  max_cancels: 5000\n");
  const auto& k = c.cluster;
  BOOST_TEST(k.nats == (std::vector<std::string>{"nats://a:4222", "nats://b:4222"}),
             boost::test_tools::per_element());
  BOOST_TEST(k.node_name == "gpu-7");
  BOOST_TEST(k.replicas == 3);
  BOOST_TEST(k.max_jobs == 5000);
  BOOST_TEST(k.max_job_bytes == 1048576);
  BOOST_TEST(k.results_max_age_s == 600);
  BOOST_TEST(k.results_max_bytes == 2097152);
  BOOST_TEST(k.ack_wait_ms == 5000);
  BOOST_TEST(k.max_ack_pending == 256);
  BOOST_TEST(k.max_in_flight == 8);
  BOOST_TEST(k.duplicate_window_ms == 60000);
  BOOST_TEST(k.reconnect_wait_ms == 50);
  BOOST_TEST(k.reconnect_max_ms == 2000);
  BOOST_TEST(k.cancels_max_age_s == 172800);
  BOOST_TEST(k.max_cancels == 5000);
}

BOOST_AUTO_TEST_CASE(one_url_and_the_defaults) {
  auto c = load("cluster:\n  nats: nats://127.0.0.1:4222\n");
  BOOST_TEST(c.cluster.nats == (std::vector<std::string>{"nats://127.0.0.1:4222"}),
             boost::test_tools::per_element());
  const sy::ClusterConfig d;
  BOOST_TEST(c.cluster.ack_wait_ms == d.ack_wait_ms);
  BOOST_TEST(c.cluster.max_in_flight == d.max_in_flight);
  BOOST_TEST(load("").cluster.nats.empty());  // no section: no cluster
}

BOOST_AUTO_TEST_CASE(errors_name_the_key_and_the_bound) {
  auto e = load_error("cluster:\n  replicas: 6\n");
  BOOST_TEST(contains(e, "cluster.replicas"), e);
  BOOST_TEST(contains(e, "out of range [1, 5]"), e);
  e = load_error("cluster:\n  ack_wait_ms: 10\n");
  BOOST_TEST(contains(e, "cluster.ack_wait_ms"), e);
  BOOST_TEST(contains(e, "[1000, 86400000]"), e);
  // Cancels are kept at least as long as the longest deadline a job may name (a day).
  e = load_error("cluster:\n  cancels_max_age_s: 3600\n");
  BOOST_TEST(contains(e, "cluster.cancels_max_age_s"), e);
  BOOST_TEST(contains(e, "[86400, "), e);
  e = load_error("cluster:\n  nat: nats://x:1\n");
  BOOST_TEST(contains(e, "cluster.nat"), e);
  BOOST_TEST(contains(e, "unknown key"), e);
  e = load_error("cluster:\n  nats: [\"\"]\n");
  BOOST_TEST(contains(e, "a NATS URL is empty"), e);
  e = load_error(
      "cluster:\n  nats: nats://x:1\n  reconnect_wait_ms: 500\n  reconnect_max_ms: 100\n");
  BOOST_TEST(e == "config: cluster.reconnect_wait_ms must be <= reconnect_max_ms");
}

BOOST_AUTO_TEST_CASE(class_names_must_be_subject_tokens_in_a_cluster) {
  const std::string classes =
      "router:\n  classes:\n    - {name: fast.lane, rank: 0, weight: 1, queue_limit: 8}\n";
  BOOST_TEST(load_error(classes).empty());  // no cluster: any name
  auto e = load_error(classes + "cluster:\n  nats: nats://x:1\n");
  BOOST_TEST(e == "config: priority class 'fast.lane' cannot name a cluster subject "
                  "(switchyard.jobs.fast.lane): it contains '.'",
             e);
}

BOOST_AUTO_TEST_SUITE_END()  // test_config_cluster
