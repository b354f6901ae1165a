// The journal with zero configuration: two servers on one host with fixed addresses and one state
// folder each get a journal of their own, survive kill -9 and replay exactly their own jobs; a
// server pointed at a journal in use is refused; a wildcard port gets no default journal.
#include <sys/stat.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_default)

using namespace std::chrono_literals;

namespace {

// Enough tokens that, at 20 ms a step, no job can finish between its acceptance and the kill.
constexpr uint32_t kTokens = 40;

const char* kConfig = R"(
router:
  classes:
    - {name: only, rank: 0, queue_limit: 1000}
batching:
  max_sequences: 8
executors:
  backend: "null"
)";

// The journal file a server named on stderr ("switchyard: journal PATH (fsync ...").
std::string journal_named(const std::string& stderr_text) {
  const std::string prefix = "switchyard: journal ";
  auto at = stderr_text.rfind(prefix);
  if (at == std::string::npos) return {};
  at += prefix.size();
  auto end = stderr_text.find(" (fsync", at);
  return end == std::string::npos ? std::string{} : stderr_text.substr(at, end - at);
}

// Polls the counters until `pred` holds (at most `limit`).
template <class Pred>
std::map<std::string, int64_t> wait_stats(sy::it::ServerProcess& srv, Pred pred,
                                          std::chrono::seconds limit = 30s) {
  auto until = std::chrono::steady_clock::now() + limit;
  auto st = srv.stats();
  while (!pred(st) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
    st = srv.stats();
  }
  return st;
}

// One server of the pair: its fixed ipc addresses, its jobs' id prefix and how many.
struct Node {
  std::string name;
  std::string bind, pull, results;
  int jobs = 0;
  std::string err;  // its stderr file
  std::unique_ptr<sy::it::ServerProcess> srv;

  void start(const std::string& cfg, const std::string& state, const std::string& delay) {
    srv = std::make_unique<sy::it::ServerProcess>(
        std::vector<std::string>{"--config", cfg, "--bind", bind, "--pull", pull, "--results",
                                 results, "--state-dir", state, "--step-delay-ms", delay},
        60s, err);
  }
  void push_all() {
    sy::client::Pusher push(pull);
    push.socket().set(zmq::sockopt::linger, 30000);
    for (int i = 0; i < jobs; ++i) {
      sy::wire::Submit s;
      s.id = name + "-" + std::to_string(i);
      s.tenant = "pipe";
      s.prompt = std::vector<int32_t>{1, 2, 3};
      s.max_tokens = kTokens;
      s.ignore_eos = true;
      if (!push.submit(s, 30s)) throw std::runtime_error("push blocked for 30 s");
    }
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(two_servers_on_one_host_keep_their_own_journals_through_kill_9) {
  sy::it::TempDir dir;
  const std::string cfg = dir.write("d.yaml", kConfig);
  const std::string state = dir.path() + "/state";  // made by the servers (mode 0700)
  Node nodes[2];
  for (int k = 0; k < 2; ++k) {
    Node& n = nodes[k];
    n.name = k == 0 ? "one" : "two";
    n.bind = "ipc://" + dir.path() + "/" + n.name + "-router.sock";
    n.pull = "ipc://" + dir.path() + "/" + n.name + "-pull.sock";
    n.results = "ipc://" + dir.path() + "/" + n.name + "-results.sock";
    n.jobs = k == 0 ? 12 : 20;  // different counts: a mix-up shows in the numbers
    n.err = dir.file(n.name + ".stderr");
    n.start(cfg, state, "20");
  }
  std::string journal[2];
  for (int k = 0; k < 2; ++k) {
    journal[k] = journal_named(sy::test::read_file(nodes[k].err));
    BOOST_TEST_MESSAGE("server " << nodes[k].name << ": journal " << journal[k]);
    BOOST_REQUIRE(!journal[k].empty());
    BOOST_TEST(journal[k].rfind(state + "/", 0) == 0u);
    BOOST_TEST(std::filesystem::exists(journal[k]));
  }
  BOOST_TEST(journal[0] != journal[1]);
  struct stat st {};
  BOOST_REQUIRE(::stat(state.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0700u);

  // Both accept their jobs (journaled) and are killed long before any could finish.
  for (auto& n : nodes) n.push_all();
  for (auto& n : nodes) {
    auto s = wait_stats(*n.srv, [&](auto& m) { return m["journal_accepted"] >= n.jobs; });
    BOOST_REQUIRE(s["journal_accepted"] == n.jobs);
    BOOST_TEST(s["journal_results"] == 0);
  }
  for (auto& n : nodes) BOOST_TEST(n.srv->stop(SIGKILL) == 128 + SIGKILL);
  for (auto& n : nodes) n.srv.reset();

  // (b) while server one runs again, a third server on its journal is refused.
  std::vector<std::unique_ptr<sy::client::Sink>> sinks;
  for (auto& n : nodes) {
    n.start(cfg, state, "0");
    sinks.push_back(std::make_unique<sy::client::Sink>(n.results));
    BOOST_TEST(journal_named(sy::test::read_file(n.err)) == journal[&n - nodes]);
  }
  auto third = sy::it::run_binary(
      "serve --backend null --bind 'tcp://127.0.0.1:*' --journal " + journal[0], "timeout 30 ");
  BOOST_TEST_MESSAGE("third server: exit " << third.status << ": " << third.out);
  BOOST_TEST(third.status == 1);
  const std::string in_use = "journal " + journal[0] + " is in use by another server (pid " +
                             std::to_string(nodes[0].srv->pid()) + ")";
  BOOST_TEST(third.out.find(in_use) != std::string::npos, third.out);
  BOOST_TEST(nodes[0].srv->alive());

  // Each replays exactly its own jobs: every id at its own sink, once, none of the other's.
  for (int k = 0; k < 2; ++k) {
    Node& n = nodes[k];
    std::map<std::string, int> seen;
    size_t errors = 0, foreign = 0, short_results = 0;
    auto take = [&](std::chrono::milliseconds wait) {
      auto m = sinks[static_cast<size_t>(k)]->next(wait);
      if (!m) return false;
      std::string id = sy::client::message_id(*m);
      if (id.rfind(n.name + "-", 0) != 0) ++foreign;
      if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
        ++seen[id];
        if (d->ids.size() != kTokens) ++short_results;
      } else {
        ++errors;
      }
      return true;
    };
    while (seen.size() < static_cast<size_t>(n.jobs) && take(30s)) {
    }
    while (take(300ms)) {
    }
    auto s = wait_stats(*n.srv, [](auto& m) { return m["active_jobs"] == 0; });
    BOOST_TEST_CONTEXT("server " << n.name) {
      BOOST_TEST(seen.size() == static_cast<size_t>(n.jobs));
      for (auto& [id, times] : seen) BOOST_TEST(times == 1, id);
      BOOST_TEST(foreign == 0u);
      BOOST_TEST(errors == 0u);
      BOOST_TEST(short_results == 0u);
      BOOST_TEST(s["journal_replayed"] == n.jobs);
      BOOST_TEST(s["journal_results"] == n.jobs);
    }
    BOOST_TEST_MESSAGE("server " << n.name << ": replayed " << s["journal_replayed"] << ", "
                                 << seen.size() << " results at its sink");
  }
  for (auto& n : nodes) BOOST_TEST(n.srv->stop(SIGTERM) == 0);
  // The refused server left server one's journal as it was: one more restart replays nothing.
  nodes[0].start(cfg, state, "0");
  auto s = nodes[0].srv->stats();
  BOOST_TEST(s["journal_replayed"] == 0);
  BOOST_TEST(nodes[0].srv->stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(no_flag_and_a_fixed_bind_journal_under_the_state_folder) {
  sy::it::TempDir dir;
  const std::string state = dir.path() + "/st";
  const std::string bind = "ipc://" + dir.path() + "/c.sock";
  const std::string err = dir.file("c.stderr");
  sy::it::ServerProcess srv({"--backend", "null", "--bind", bind, "--state-dir", state}, 60s, err);
  sy::client::Client c(srv.endpoint());
  sy::wire::Submit s;
  s.id = "x";
  s.tenant = "t";
  s.prompt = std::vector<int32_t>{1, 2};
  s.max_tokens = 3;
  BOOST_TEST(c.run(s, 30s).ok());
  const std::string named = journal_named(sy::test::read_file(err));
  BOOST_TEST_MESSAGE("default journal: " << named);
  BOOST_REQUIRE(!named.empty());
  BOOST_TEST(std::filesystem::path(named).parent_path().parent_path() == state);
  BOOST_TEST(std::filesystem::path(named).filename() == "switchyard.journal");
  BOOST_TEST(std::filesystem::file_size(named) > 8u);  // the header and the job's records
  BOOST_TEST(srv.stats()["journal_accepted"] == 1);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(a_wildcard_port_gets_no_default_journal_and_says_why) {
  sy::it::TempDir dir;
  const std::string state = dir.path() + "/st";
  const std::string err = dir.file("w.stderr");
  // No --bind: the harness binds tcp://127.0.0.1:*.
  sy::it::ServerProcess srv({"--backend", "null", "--state-dir", state}, 60s, err);
  auto text = sy::test::read_file(err);
  BOOST_TEST_MESSAGE(text);
  BOOST_TEST(text.find("switchyard: no journal: ") != std::string::npos);
  BOOST_TEST(text.find("wildcard") != std::string::npos);
  BOOST_TEST(journal_named(text).empty());
  bool any = false;
  std::error_code ec;
  if (std::filesystem::exists(state, ec))
    for (auto& e : std::filesystem::recursive_directory_iterator(state, ec))
      any |= e.path().filename() == "switchyard.journal";
  BOOST_TEST(!any);
  BOOST_TEST(srv.stats()["journal_accepted"] == 0);
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_journal_default
