// journal_location(): where a server keeps its journal by default (one folder per bind address
// under the state folder), when it keeps none (off, wildcard port, no state folder) and why.
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "server/config.hpp"

BOOST_AUTO_TEST_SUITE(test_config_journal_location)

namespace {

struct Row {
  const char* bind;
  const char* pull;
  const char* journal;  // journal.path
  const char* state_dir;
  const char* expected;  // exact path; "" = no journal
  const char* why_has;   // a word `why` must contain when there is no journal; "" = why stays empty
};

sy::ServerConfig config(const std::string& bind, const std::string& pull,
                        const std::string& journal, const std::string& state) {
  sy::ServerConfig c;
  c.endpoints.bind = bind;
  c.endpoints.pull = pull;
  c.journal.path = journal;
  c.state_dir = state;
  return c;
}

// The folder name journal_location() chose for `bind` under /s.
std::string slug_of(const std::string& bind) {
  auto p = std::filesystem::path(sy::journal_location(config(bind, "", "", "/s")));
  BOOST_REQUIRE(p.filename() == "switchyard.journal");
  BOOST_REQUIRE(p.parent_path().parent_path() == "/s");  // exactly one folder level: no '/' leaks
  return p.parent_path().filename().string();
}

}  // namespace

BOOST_AUTO_TEST_CASE(table) {
  const std::vector<Row> rows = {
      // An explicit path wins over everything, also over a wildcard port.
      {"tcp://127.0.0.1:*", "", "/var/j/", "/s", "/var/j/", ""},
      {"tcp://127.0.0.1:5555", "", "/var/j/x.journal", "", "/var/j/x.journal", ""},
      // "off" (--no-journal): none, and nothing to explain.
      {"tcp://127.0.0.1:5555", "", "off", "/s", "", ""},
      // The default: STATE/<bind spelled as a folder>/switchyard.journal.
      {"tcp://127.0.0.1:5555", "", "", "/s", "/s/tcp-127.0.0.1-5555/switchyard.journal", ""},
      {"tcp://localhost:7000", "", "", "/st/x", "/st/x/tcp-localhost-7000/switchyard.journal", ""},
      {"ipc:///run/sy/a.sock", "", "", "/s", "/s/ipc--run-sy-a.sock/switchyard.journal", ""},
      // No ROUTER endpoint: the pull address names it.
      {"", "tcp://10.0.0.1:6000", "", "/s", "/s/tcp-10.0.0.1-6000/switchyard.journal", ""},
      // Wildcard ports change at every start: no default journal, and why.
      {"tcp://127.0.0.1:*", "", "", "/s", "", "wildcard"},
      {"tcp://127.0.0.1:0", "", "", "/s", "", "wildcard"},
      {"tcp://*:*", "", "", "/s", "", "wildcard"},
      {"ipc://*", "", "", "/s", "", "wildcard"},
      {"", "tcp://127.0.0.1:*", "", "/s", "", "wildcard"},
      // No state folder (no HOME, no XDG_STATE_HOME, no --state-dir).
      {"tcp://127.0.0.1:5555", "", "", "", "", "state"},
  };
  for (const auto& r : rows) {
    std::string why;
    auto got = sy::journal_location(config(r.bind, r.pull, r.journal, r.state_dir), &why);
    BOOST_TEST_CONTEXT("bind '" << r.bind << "' pull '" << r.pull << "' journal '" << r.journal
                                << "' state '" << r.state_dir << "'") {
      BOOST_TEST(got == r.expected);
      if (*r.why_has)
        BOOST_TEST(why.find(r.why_has) != std::string::npos, "why: " << why);
      else
        BOOST_TEST(why.empty(), "why: " << why);
    }
  }
  // `why` is optional.
  BOOST_TEST(sy::journal_location(config("tcp://127.0.0.1:*", "", "", "/s")).empty());
}

BOOST_AUTO_TEST_CASE(ambiguous_or_odd_names_get_a_hash_and_stay_apart) {
  // Pairs whose plain spelling would be the same folder.
  const std::vector<std::string> endpoints = {
      "ipc:///tmp/a-b",     "ipc:///tmp/a/b",       "ipc:///tmp/a:b",       "tcp://[::1]:5555",
      "tcp://[::2]:5555",   "tcp://*:5555",         "tcp://any:5555",       "tcp://my-host:5555",
      "ipc:///tmp/my-host", "tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556", "ipc:///tmp/a b",
      "ipc:///tmp/a?b",     "ipc://@abstract-name", "ipc://@abstract/name",
  };
  std::set<std::string> slugs;
  for (const auto& e : endpoints) {
    auto s = slug_of(e);
    BOOST_TEST_MESSAGE(e << " -> " << s);
    BOOST_TEST(
        s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
            std::string::npos,
        s);
    slugs.insert(s);
  }
  BOOST_TEST(slugs.size() == endpoints.size());
  // Readable where it can be: the common forms carry no hash.
  BOOST_TEST(slug_of("tcp://127.0.0.1:5555") == "tcp-127.0.0.1-5555");
  BOOST_TEST(slug_of("tcp://*:5555").rfind("tcp-any-5555-", 0) == 0u);
  // The same endpoint always gives the same folder (a restart finds its journal).
  BOOST_TEST(slug_of("ipc:///tmp/a-b") == slug_of("ipc:///tmp/a-b"));
}

BOOST_AUTO_TEST_CASE(long_names_are_cut_and_hashed) {
  std::string dir(300, 'd');
  auto a = slug_of("ipc:///tmp/" + dir + "/one.sock");
  auto b = slug_of("ipc:///tmp/" + dir + "/two.sock");
  BOOST_TEST(a != b);
  // Far below a file system's name limit (255).
  BOOST_TEST(a.size() <= 80u);
  BOOST_TEST(a.rfind("ipc--tmp-ddd", 0) == 0u);
}

BOOST_AUTO_TEST_CASE(a_relative_ipc_path_is_read_from_the_working_folder) {
  auto cwd = std::filesystem::current_path().string();
  BOOST_TEST(slug_of("ipc://sy.sock") == slug_of("ipc://" + cwd + "/sy.sock"));
  BOOST_TEST(slug_of("ipc://sub/../sy.sock") == slug_of("ipc://" + cwd + "/sy.sock"));
}

BOOST_AUTO_TEST_SUITE_END()  // test_config_journal_location
