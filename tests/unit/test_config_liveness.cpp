// The connection-liveness keys of the endpoints section: defaults (handshake limit on,
// heartbeats off, connections capped), values read, and out-of-range values refused with the key
// named.
#include <boost/test/unit_test.hpp>
#include <string>

#include "server/config.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_config_liveness)

namespace {

// Loads `text` as a config file; returns the error message ("" when it loads).
std::string load(const std::string& text, sy::ServerConfig& cfg) {
  static int n = 0;
  static const sy::test::TempDir dir("sy_liveness_");
  std::string name = std::to_string(n++);
  name += ".yaml";
  std::string path = dir.write(name, text);
  try {
    sy::load_config_file(path, cfg);
    sy::finalize_config(cfg);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(defaults_limit_the_handshake_and_the_intake_and_keep_connections_alive) {
  sy::EndpointConfig e;
  BOOST_TEST(e.handshake_timeout_ms == 10000);
  BOOST_TEST(e.tcp_keepalive_idle_s == 60);
  BOOST_TEST(e.max_waiting_requests == 4096);
  BOOST_TEST(e.max_waiting_bytes == int64_t{64} << 20);
  BOOST_TEST(e.heartbeat_ivl_ms == 0);
  BOOST_TEST(e.heartbeat_timeout_ms == 30000);
  BOOST_TEST(e.heartbeat_ttl_ms == 30000);
  BOOST_TEST(e.max_connections == 1024);
  BOOST_TEST(e.max_connections_per_address == 64);
  BOOST_TEST(e.max_handshaking == 256);
}

BOOST_AUTO_TEST_CASE(keys_are_read) {
  sy::ServerConfig cfg;
  std::string err = load(R"(
endpoints:
  handshake_timeout_ms: 500
  heartbeat_ivl_ms: 1000
  heartbeat_timeout_ms: 2500
  heartbeat_ttl_ms: 4000
  tcp_keepalive_idle_s: 5
  max_waiting_requests: 7
  max_waiting_bytes: 9000
  max_connections: 3
  max_connections_per_address: 2
  max_handshaking: 5
)",
                         cfg);
  BOOST_TEST(err == "");
  BOOST_TEST(cfg.endpoints.handshake_timeout_ms == 500);
  BOOST_TEST(cfg.endpoints.heartbeat_ivl_ms == 1000);
  BOOST_TEST(cfg.endpoints.heartbeat_timeout_ms == 2500);
  BOOST_TEST(cfg.endpoints.heartbeat_ttl_ms == 4000);
  BOOST_TEST(cfg.endpoints.tcp_keepalive_idle_s == 5);
  BOOST_TEST(cfg.endpoints.max_waiting_requests == 7);
  BOOST_TEST(cfg.endpoints.max_waiting_bytes == 9000);
  BOOST_TEST(cfg.endpoints.max_connections == 3);
  BOOST_TEST(cfg.endpoints.max_connections_per_address == 2);
  BOOST_TEST(cfg.endpoints.max_handshaking == 5);
}

BOOST_AUTO_TEST_CASE(max_connections_zero_means_unlimited_and_its_range_is_enforced) {
  sy::ServerConfig cfg;
  BOOST_TEST(load("endpoints:\n  max_connections: 0\n", cfg) == "");
  BOOST_TEST(cfg.endpoints.max_connections == 0);
  BOOST_TEST(load("endpoints:\n  max_connections: 1048576\n", cfg) == "");
  BOOST_TEST(cfg.endpoints.max_connections == 1048576);
  for (const char* bad : {"-1", "1048577"}) {
    std::string err = load(std::string("endpoints:\n  max_connections: ") + bad + "\n", cfg);
    BOOST_TEST(err.find("endpoints.max_connections") != std::string::npos, err);
    BOOST_TEST(err.find("out of range [0, 1048576]") != std::string::npos, err);
  }
  std::string err = load("endpoints:\n  max_connections: many\n", cfg);
  BOOST_TEST(err.find("endpoints.max_connections") != std::string::npos, err);
  BOOST_TEST(err.find("expected an integer") != std::string::npos, err);
  // Its companions: 0 = unlimited too, the same range, errors naming the key.
  for (const std::string key : {"max_connections_per_address", "max_handshaking"}) {
    BOOST_TEST(load("endpoints:\n  " + key + ": 0\n", cfg) == "");
    for (const char* bad : {"-1", "1048577", "lots"}) {
      err = load("endpoints:\n  " + key + ": " + bad + "\n", cfg);
      BOOST_TEST(err.find("endpoints." + key) != std::string::npos, err);
    }
  }
  BOOST_TEST(cfg.endpoints.max_connections_per_address == 0);
  BOOST_TEST(cfg.endpoints.max_handshaking == 0);
}

BOOST_AUTO_TEST_CASE(out_of_range_values_are_refused_by_name) {
  sy::ServerConfig cfg;
  std::string err = load("endpoints:\n  heartbeat_ttl_ms: 7000000\n", cfg);
  BOOST_TEST(err.find("endpoints.heartbeat_ttl_ms") != std::string::npos, err);
  BOOST_TEST(err.find("out of range [0, 6553500]") != std::string::npos, err);
  err = load("endpoints:\n  handshake_timeout_ms: -1\n", cfg);
  BOOST_TEST(err.find("endpoints.handshake_timeout_ms") != std::string::npos, err);
  err = load("endpoints:\n  max_waiting_requests: 0\n", cfg);
  BOOST_TEST(err.find("endpoints.max_waiting_requests") != std::string::npos, err);
  err = load("endpoints:\n  heartbeat_ivl_ms: 1.5\n", cfg);
  BOOST_TEST(err.find("expected an integer") != std::string::npos, err);
}

BOOST_AUTO_TEST_SUITE_END()  // test_config_liveness
