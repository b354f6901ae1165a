// The journal's disk fills while request-endpoint and pipeline jobs arrive, then has room again:
// no `accepted` for a job that is not on disk, refused jobs get `unavailable` and never run (not
// after a restart either), nothing torn is left mid-file, the server's memory stays flat, the
// pipeline input resumes, and a restart (kill -9, then a start on a full disk) loses no accepted
// job. The disk is a small tmpfs mounted for the test (root only: skipped elsewhere).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "clients/cpp/client.hpp"
#include "storage/journal_file.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_full_disk)

using namespace std::chrono_literals;

namespace {

// Small enough to fill in a moment, big enough for the jobs run while there is room.
constexpr const char* kDiskSize = "size=2m";

/// A tmpfs mounted on a fresh folder for the object's life.
class SmallDisk {
 public:
  SmallDisk() {
    ok_ = ::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, kDiskSize) == 0;
    if (!ok_) why_ = std::strerror(errno);
  }
  ~SmallDisk() {
    if (ok_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }

  /// Takes every free byte with a filler file (what another process filling the disk does).
  void fill() {
    int fd = ::open(path("filler").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    BOOST_REQUIRE(fd >= 0);
    // Big writes first, then ever smaller ones for what is left at the end of the last page.
    for (std::size_t chunk : {std::size_t{65536}, std::size_t{4096}, std::size_t{512},
                              std::size_t{64}, std::size_t{1}}) {
      const std::string block(chunk, 'f');
      while (::write(fd, block.data(), chunk) > 0) {
      }
    }
    ::close(fd);
  }
  /// Gives the space back.
  void free_space() { std::filesystem::remove(path("filler")); }

 private:
  sy::it::TempDir dir_;
  bool ok_ = false;
  std::string why_;
};

boost::test_tools::assertion_result can_mount(boost::unit_test::test_unit_id) {
  SmallDisk d;
  boost::test_tools::assertion_result r(d.ok());
  r.message() << "skipped: cannot mount a tmpfs for the full-disk test (" << d.why()
              << "; the test needs root or CAP_SYS_ADMIN)";
  return r;
}

// The null backend (no model), one class deep enough for every job, small slow steps so that
// jobs accepted before a kill are still running.
const char* kConfig = R"(
router:
  classes:
    - {name: only, rank: 0, queue_limit: 10000}
batching:
  max_sequences: 16
executors:
  backend: "null"
)";

sy::wire::Submit job(const std::string& id, std::size_t prompt_tokens = 5) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "t";
  // Ids above 65535 take five bytes each in msgpack: big records with few tokens.
  s.prompt = std::vector<int32_t>(prompt_tokens, 100000);
  s.max_tokens = 4;
  s.ignore_eos = true;
  return s;
}

// The value of an unlabelled series on a metrics page; -1 when absent.
double metric(const std::string& page, const std::string& name) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Polls the server's counters until `pred` holds (at most `limit`).
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

// Waits at the sink until `n` messages arrived (or 30 s passed between two): done ids, error ids.
void collect(sy::client::Sink& sink, std::size_t n, std::map<std::string, int>& done,
             std::map<std::string, sy::wire::Error>& errors) {
  std::size_t got = 0;
  while (got < n) {
    auto m = sink.next(30s);
    if (!m) return;
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      ++done[d->id];
      ++got;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      errors[e->id] = *e;
      ++got;
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_full_journal_disk_loses_nothing_and_leaks_nothing,
                     *boost::unit_test::precondition(can_mount)) {
  SmallDisk disk;
  BOOST_REQUIRE(disk.ok());
  sy::it::TempDir dir;
  const std::string cfg = dir.write("c.yaml", kConfig);
  const std::string journal = disk.path("switchyard.journal");
  const std::string log1 = dir.file("server1.log"), log2 = dir.file("server2.log");
  auto args = [&](const std::string& pull, const std::string& results) {
    return std::vector<std::string>{"--config",  cfg,           "--journal",       journal,
                                    "--pull",    pull,          "--results",       results,
                                    "--metrics", "127.0.0.1:0", "--step-delay-ms", "5"};
  };
  auto srv = std::make_unique<sy::it::ServerProcess>(args("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"),
                                                     60s, log1);
  BOOST_REQUIRE(!srv->pull_endpoint().empty());
  BOOST_REQUIRE(!srv->metrics_endpoint().empty());
  sy::client::Sink sink(srv->results_endpoint());
  sy::client::Pusher push(srv->pull_endpoint());
  sy::client::Client client(srv->endpoint());
  std::map<std::string, int> sink_done;
  std::map<std::string, sy::wire::Error> sink_errors;

  // 1. Room: pipeline and request-endpoint jobs run as usual (and warm the server up).
  for (int i = 0; i < 50; ++i) BOOST_REQUIRE(push.submit(job("room-p" + std::to_string(i)), 10s));
  std::set<std::string> accepted_keys;
  for (int i = 0; i < 20; ++i) {
    auto r = client.run(job("room-r" + std::to_string(i)), 30s);
    BOOST_REQUIRE(r.ok());
    accepted_keys.insert("room-r" + std::to_string(i));
  }
  collect(sink, 50, sink_done, sink_errors);
  BOOST_REQUIRE_EQUAL(sink_done.size(), 50u);
  BOOST_REQUIRE(sink_errors.empty());
  const long rss_before = srv->proc_status_kb("VmRSS");
  BOOST_REQUIRE(rss_before > 0);

  // 2. The disk fills. Request-endpoint jobs (about 12.5 KB each on disk, so no corner of a page
  // takes one) and more pipeline jobs than the PULL window arrive.
  disk.fill();
  constexpr int kRouterRefused = 4000, kPipeRefused = 300, kWindow = 64;
  const std::size_t big = 2500;
  // The journal grows its file ahead of its records (JournalFile::kPreallocBytes), and that room
  // takes jobs until it is used up: one pipeline job at a time until the first refusal. A job
  // whose accept record fitted and whose result record did not has its done held until there is
  // room again (phase 3).
  int drained = 0;
  bool drain_held = false, drain_refused = false;
  for (int i = 0; i < 400; ++i) {
    BOOST_REQUIRE(push.submit(job("drain-p" + std::to_string(i), big), 10s));
    std::map<std::string, int> d;
    std::map<std::string, sy::wire::Error> e;
    collect(sink, 1, d, e);
    if (!e.empty()) {
      drain_refused = true;
      break;
    }
    if (d.empty()) {
      drain_held = true;
      break;
    }
    ++drained;
  }
  BOOST_TEST_MESSAGE(drained << " jobs went into the journal's preallocated space");
  BOOST_REQUIRE(drained < 400);
  long rss_max = rss_before;
  int refused_unavailable = 0, refused_other = 0, accepted_while_full = 0, hints = 0;
  std::string first_message;
  for (int i = 0; i < kPipeRefused; ++i)
    BOOST_REQUIRE(push.submit(job("full-p" + std::to_string(i), big), 10s));
  {
    int sent = 0, answered = 0;
    while (answered < kRouterRefused) {
      // A window of submits in flight, as a busy client keeps, so that the server holds no
      // backlog of its own in the measurement.
      while (sent < kRouterRefused && sent - answered < kWindow)
        client.submit(job("full-r" + std::to_string(sent++), big));
      auto m = client.next(30s);
      BOOST_REQUIRE_MESSAGE(m, "no answer for a submit while the disk is full");
      if (std::get_if<sy::wire::Accepted>(&*m)) ++accepted_while_full;
      if (std::get_if<sy::wire::Done>(&*m)) ++answered;
      if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
        ++answered;
        if (e->code == sy::ErrorCode::unavailable)
          ++refused_unavailable;
        else
          ++refused_other;
        if (e->retry_after_ms && *e->retry_after_ms > 0) ++hints;
        if (first_message.empty()) first_message = e->message;
      }
      if (answered % 500 == 0) rss_max = std::max(rss_max, srv->proc_status_kb("VmRSS"));
    }
  }
  // Every pipeline job got its answer at the sink: refusals gave their PULL credit back.
  collect(sink, kPipeRefused, sink_done, sink_errors);
  rss_max = std::max(rss_max, srv->proc_status_kb("VmRSS"));
  BOOST_TEST(accepted_while_full == 0);
  BOOST_TEST(refused_unavailable == kRouterRefused);
  BOOST_TEST(refused_other == 0);
  BOOST_TEST(hints == kRouterRefused);
  BOOST_TEST(first_message.find("journal") != std::string::npos, first_message);
  BOOST_TEST(first_message.find(disk.path("")) == std::string::npos, first_message);
  BOOST_TEST(sink_errors.size() == static_cast<size_t>(kPipeRefused));
  for (auto& [id, e] : sink_errors) BOOST_TEST((e.code == sy::ErrorCode::unavailable), id);
  // The refused jobs were about 55 MB of records; the server kept none of them.
  BOOST_TEST_MESSAGE("VmRSS before the full period " << rss_before << " kB, at most " << rss_max
                                                     << " kB during it");
  BOOST_TEST(rss_max - rss_before < 32 * 1024);
  auto page = sy::it::http_get(srv->metrics_endpoint(), "/metrics").body;
  BOOST_TEST(metric(page, "switchyard_journal_failing") == 1);
  BOOST_TEST(metric(page, "switchyard_journal_write_errors_total") >= kRouterRefused);
  BOOST_TEST(metric(page, "switchyard_journal_refused_jobs_total") ==
             kRouterRefused + kPipeRefused + (drain_refused ? 1 : 0));
  BOOST_TEST(!std::filesystem::exists(journal + ".tmp"));

  // 3. Room again: the pipeline input and the request endpoint take jobs again.
  disk.free_space();
  for (int i = 0; i < 50; ++i) BOOST_REQUIRE(push.submit(job("again-p" + std::to_string(i)), 10s));
  collect(sink, drain_held ? 51 : 50, sink_done, sink_errors);
  for (int i = 0; i < 50; ++i) BOOST_TEST(sink_done.count("again-p" + std::to_string(i)) == 1u);
  // Jobs accepted just before a kill -9: some run, some wait.
  constexpr int kLast = 40;
  for (int i = 0; i < kLast; ++i) {
    auto s = job("last-r" + std::to_string(i));
    s.max_tokens = 64;
    client.submit(s);
  }
  int last_accepted = 0;
  while (last_accepted < kLast) {
    auto m = client.next(30s);
    BOOST_REQUIRE_MESSAGE(m, "no accepted for a job once the disk had room");
    if (auto* a = std::get_if<sy::wire::Accepted>(&*m)) {
      ++last_accepted;
      accepted_keys.insert(a->id);
    }
    BOOST_REQUIRE(!std::get_if<sy::wire::Error>(&*m));
  }
  auto st = srv->stats();
  BOOST_TEST(st["journal_failing"] == 0);
  BOOST_TEST(st["journal_write_errors"] >= kRouterRefused);
  BOOST_TEST(srv->stop(SIGKILL) == 128 + SIGKILL);
  srv.reset();
  // Logged once when the writes began to fail and once when they worked again, not per write.
  const std::string log = read_file(log1);
  BOOST_TEST(count(log, "switchyard: ERROR: journal") == 1u, log);
  BOOST_TEST(count(log, "is written again after") == 1u, log);

  // What a restart finds: nothing torn mid-file, no record of any refused job.
  {
    auto scan = sy::scan_journal(journal);
    BOOST_TEST(scan.skipped_ranges == 0u, scan.warning);
    std::size_t refused_records = 0;
    for (const auto& r : scan.records)
      if (r.find("full-") != std::string::npos) ++refused_records;
    BOOST_TEST(refused_records == 0u);
  }

  // 4. A restart on a full disk: the server starts on its journal as it is, leaves no PATH.tmp,
  // and once there is room every accepted job answers its resubmitted key.
  disk.fill();
  srv = std::make_unique<sy::it::ServerProcess>(args("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), 60s,
                                                log2);
  BOOST_TEST(!std::filesystem::exists(journal + ".tmp"));
  BOOST_TEST(read_file(log2).find("uncompacted") != std::string::npos, read_file(log2));
  sy::client::Sink sink2(srv->results_endpoint());
  disk.free_space();
  sy::client::Client client2(srv->endpoint());
  for (const auto& key : accepted_keys) {
    auto s = job(key);
    s.max_tokens = key.rfind("last-", 0) == 0 ? 64 : 4;
    auto r = client2.run(s, 30s);
    BOOST_TEST(r.ok(), key << ": " << (r.error ? r.error->message : "no answer"));
  }
  // Pipeline results delivered again after the restart are accepted jobs' only.
  std::map<std::string, int> again_done;
  std::map<std::string, sy::wire::Error> again_errors;
  while (auto m = sink2.next(500ms)) {
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) ++again_done[d->id];
    if (auto* e = std::get_if<sy::wire::Error>(&*m)) again_errors[e->id] = *e;
  }
  for (auto& [id, n] : again_done) BOOST_TEST(id.rfind("full-", 0) != 0, id);
  BOOST_TEST(again_errors.empty());
  auto st2 = wait_stats(*srv, [](auto& s) { return s["active_jobs"] == 0; });
  BOOST_TEST(st2["journal_failing"] == 0);
  BOOST_TEST(srv->stop() == 0);
  srv.reset();
  auto scan = sy::scan_journal(journal);
  BOOST_TEST(scan.warning.empty(), scan.warning);
  BOOST_TEST(scan.good_bytes == scan.file_bytes);
  for (const auto& r : scan.records) BOOST_TEST(r.find("full-") == std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()  // test_journal_full_disk
