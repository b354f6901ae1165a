// CURVE configuration and key files: the YAML keys (paths relative to the config file), the
// public/secret check, and the key-file reader's errors, each naming the file.
#include <sys/stat.h>

#include <boost/test/unit_test.hpp>

#include "ingress/curve.hpp"
#include "server/config.hpp"
#include "ingress/gateway.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_config_curve)

namespace {

bool throws_with(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const std::exception& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(yaml_keys_are_relative_to_the_config_file) {
  sy::test::TempDir d;
  auto path = d.write(
      "s.yaml", "endpoints:\n  curve_secret_key: keys/a.key\n  curve_public_key: /abs/a.pub\n");
  sy::ServerConfig cfg;
  sy::load_config_file(path, cfg);
  BOOST_TEST(cfg.endpoints.curve_secret_key == d.path() + "/keys/a.key");
  BOOST_TEST(cfg.endpoints.curve_public_key == "/abs/a.pub");
  sy::ServerConfig only_pub;
  only_pub.endpoints.curve_public_key = "x.pub";
  BOOST_TEST(throws_with([&] { sy::finalize_config(only_pub); }, "curve_secret_key"));
}

BOOST_AUTO_TEST_CASE(keypairs_round_trip_through_files) {
  BOOST_REQUIRE(sy::curve::available());
  sy::test::TempDir d;
  auto kp = sy::curve::generate();
  BOOST_TEST(sy::curve::is_z85_key(kp.public_key));
  BOOST_TEST(sy::curve::public_of(kp.secret_key) == kp.public_key);
  sy::curve::write_key_files(d.file("s"), kp);
  struct stat st {};
  BOOST_REQUIRE(::stat(d.file("s.key").c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  BOOST_TEST(!sy::curve::readable_by_others(d.file("s.key")));
  BOOST_TEST(sy::curve::read_key_file(d.file("s.key"), "k") == kp.secret_key);
  BOOST_TEST(sy::curve::read_key_file(d.file("s.pub"), "k") == kp.public_key);
  // No half-written pair: an existing .pub stops the .key from being written as well.
  BOOST_TEST(throws_with([&] { sy::curve::write_key_files(d.file("s"), sy::curve::generate()); },
                         "exists already"));
  BOOST_TEST(sy::curve::read_key_file(d.file("s.key"), "k") == kp.secret_key);
  sy::curve::write_key_files(d.file("s"), sy::curve::generate(), true);
  BOOST_TEST(sy::curve::read_key_file(d.file("s.key"), "k") != kp.secret_key);
}

BOOST_AUTO_TEST_CASE(bad_key_files_name_the_file) {
  sy::test::TempDir d;
  auto kp = sy::curve::generate();
  std::string bad_alpha = kp.public_key;
  bad_alpha[3] = '"';  // not in the Z85 alphabet
  struct Case {
    std::string name, text, needle;
  } cases[] = {
      {"empty.key", "# only a comment\n\n", "empty"},
      {"short.key", "abc\n", "found 3 characters"},
      {"alpha.key", bad_alpha + "\n", "outside the Z85 alphabet"},
      {"two.key", kp.public_key + "\n" + kp.secret_key + "\n", "more than one key line"},
      {"big.key", std::string(5000, '#') + "\n", "too large"},
  };
  for (const auto& c : cases) {
    auto path = d.write(c.name, c.text);
    BOOST_TEST(throws_with([&] { sy::curve::read_key_file(path, "CURVE secret key"); },
                           "CURVE secret key file '" + path + "': "),
               c.name);
    BOOST_TEST(throws_with([&] { sy::curve::read_key_file(path, "x"); }, c.needle), c.name);
  }
  BOOST_TEST(
      throws_with([&] { sy::curve::read_key_file(d.file("none.key"), "x"); }, "cannot open"));
  // Whitespace and a comment around the key are fine.
  auto ok = d.write("ok.pub", "# c\n  " + kp.public_key + " \r\n\n");
  BOOST_TEST(sy::curve::read_key_file(ok, "x") == kp.public_key);
}

BOOST_AUTO_TEST_CASE(gateway_checks_the_pair_at_construction) {
  sy::test::TempDir d;
  auto a = sy::curve::generate(), b = sy::curve::generate();
  sy::curve::write_key_files(d.file("a"), a);
  sy::curve::write_key_files(d.file("b"), b);
  sy::EndpointConfig ep;
  ep.bind = "tcp://127.0.0.1:*";
  ep.curve_secret_key = d.file("a.key");
  ep.curve_public_key = d.file("b.pub");
  BOOST_TEST(throws_with([&] { sy::Gateway g(ep); }, "does not belong to the secret key"));
  ep.curve_public_key = d.file("a.pub");
  sy::Gateway g(ep);
  g.start();
  BOOST_TEST(!g.endpoint().empty());
  g.stop();
  ep.curve_secret_key = d.file("missing.key");
  BOOST_TEST(throws_with([&] { sy::Gateway g2(ep); }, "missing.key': cannot open"));
}

BOOST_AUTO_TEST_SUITE_END()  // test_config_curve
