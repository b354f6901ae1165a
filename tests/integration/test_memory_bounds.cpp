// Memory an anonymous client can make the real server hold stays bounded: many distinct tenant
// names (open-tenant mode) leave a capped number of /metrics series, and many long results leave
// a result cache bounded by bytes. The server's VmRSS is read from /proc before and after.
// SY_MEMORY_BOUNDS_JOBS=50000 runs the full-size measurement by hand (the default is smaller).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_memory_bounds)

using namespace std::chrono_literals;

namespace {

// Jobs per test: enough that an unbounded table or cache stands out well above the bounds
// below, few enough to run in seconds on two cores. The environment variable raises it.
int job_count(int fallback) {
  const char* v = std::getenv("SY_MEMORY_BOUNDS_JOBS");
  return v && *v ? std::atoi(v) : fallback;
}

// Sample lines of one metric family on a /metrics page (name followed by '{' or ' ').
size_t series(const std::string& page, const std::string& name) {
  size_t n = 0, at = 0;
  while (at < page.size()) {
    size_t end = page.find('\n', at);
    if (end == std::string::npos) end = page.size();
    if (page.compare(at, name.size(), name) == 0 && at + name.size() < end &&
        (page[at + name.size()] == '{' || page[at + name.size()] == ' '))
      ++n;
    at = end + 1;
  }
  return n;
}

// The value of one sample line given in full up to its value ("name{labels}"), or -1.
double sample(const std::string& page, const std::string& head) {
  auto p = ("\n" + page).find("\n" + head + " ");
  if (p == std::string::npos) return -1;
  return std::strtod(page.c_str() + p + head.size() + 1, nullptr);
}

struct Outcome {
  int done = 0, errors = 0, wrong = 0;
  std::string first_problem;
};

// Runs `n` jobs made by `make(i)` through one DEALER with at most `window` unanswered; a job's
// answer is its done (carrying `tokens` ids) or an error. Overloaded is resent after its wait.
Outcome run_jobs(const std::string& endpoint, int n, int window, uint32_t tokens,
                 const std::function<sy::wire::Submit(int)>& make) {
  Outcome o;
  sy::client::Client cl(endpoint);
  std::map<std::string, sy::wire::Submit> open;  // id -> what was sent
  int next = 0;
  while (next < n || !open.empty()) {
    while (next < n && static_cast<int>(open.size()) < window) {
      auto s = make(next++);
      cl.submit(s);
      open.emplace(s.id, std::move(s));
    }
    // The null backend answers in milliseconds: 30 s of silence means a lost job.
    auto m = cl.next(30s);
    if (!m) break;
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      if (open.erase(d->id) == 0) continue;
      ++o.done;
      if (d->ids.size() != tokens) {
        ++o.wrong;
        if (o.first_problem.empty())
          o.first_problem = d->id + ": " + std::to_string(d->ids.size()) + " ids";
      }
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      if (e->code == sy::ErrorCode::overloaded && open.count(e->id)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(e->retry_after_ms.value_or(20)));
        cl.submit(open.at(e->id));
        continue;
      }
      if (open.erase(e->id) == 0) continue;
      ++o.errors;
      if (o.first_problem.empty()) o.first_problem = e->id + ": " + e->message;
    }
  }
  o.errors += static_cast<int>(open.size()) + (n - next);  // never answered
  return o;
}

sy::wire::Submit job(std::string id, std::string tenant, uint32_t tokens) {
  sy::wire::Submit s;
  s.id = std::move(id);
  s.tenant = std::move(tenant);
  s.prompt = std::vector<int32_t>{1, 2};
  s.max_tokens = tokens;
  s.ignore_eos = true;
  s.temperature = 0;
  s.priority = "batch";  // the deep queue: a window of hundreds is never refused
  return s;
}

std::string numbered(std::string prefix, int i) {
  prefix += std::to_string(i);  // appended: GCC 12 warns (-Wrestrict) on "lit" + string&&
  return prefix;
}

std::string write_config(const sy::it::TempDir& dir, const std::string& text) {
  const std::string path = dir.path() + "/memory.yaml";
  std::ofstream(path) << text;
  return path;
}

}  // namespace

// Every job under a tenant name of its own: the tenant table forgets the idle ones, and
// switchyard_jobs_total keeps max_tenant_labels names plus "_other".
BOOST_AUTO_TEST_CASE(distinct_tenants_leave_bounded_series_and_memory) {
  const int n = job_count(20000);
  constexpr size_t kLabels = 100;
  sy::it::TempDir dir;
  const std::string cfg = write_config(dir,
                                       "admission:\n"
                                       "  max_idle_tenants: 1000\n"
                                       "  result_cache_bytes: 1048576\n"
                                       "metrics:\n"
                                       "  bind: 127.0.0.1:0\n"
                                       "  max_tenant_labels: 100\n");
  sy::it::ServerProcess srv(
      {"--config", cfg, "--backend", "null", "--executors", "2", "--no-journal"});
  // Warm-up under the same names the measured run does not use: the allocator's arenas, the
  // sockets' buffers and the first labels exist before the baseline is read.
  auto warm = run_jobs(srv.endpoint(), 2000, 500, 1,
                       [](int i) { return job(numbered("w", i), numbered("warm", i), 1); });
  BOOST_REQUIRE_EQUAL(warm.done, 2000);
  const long before_kb = srv.proc_status_kb("VmRSS");
  auto out = run_jobs(srv.endpoint(), n, 1000, 1,
                      [](int i) { return job(numbered("j", i), numbered("tenant-", i), 1); });
  const long after_kb = srv.proc_status_kb("VmRSS");
  BOOST_TEST_CONTEXT(out.first_problem) {
    BOOST_TEST(out.done == n);
    BOOST_TEST(out.errors == 0);
  }
  const std::string page = sy::it::http_get(srv.metrics_endpoint(), "/metrics").body;
  BOOST_REQUIRE(!page.empty());
  const size_t jobs_series = series(page, "switchyard_jobs_total");
  BOOST_TEST_MESSAGE(n << " tenants: RSS " << before_kb << " kB -> " << after_kb << " kB, "
                       << jobs_series << " switchyard_jobs_total series, /metrics " << page.size()
                       << " bytes");
  // One class and one outcome: the labelled names and "_other".
  BOOST_TEST(jobs_series == kLabels + 1);
  BOOST_TEST(sample(page,
                    "switchyard_jobs_total{class=\"batch\",tenant=\"_other\",outcome="
                    "\"done\"}") == static_cast<double>(2000 + n - kLabels));
  // Unbounded, 50,000 tenants gave a 4.6 MB page; bounded, it stays near its fixed size.
  BOOST_TEST(page.size() < 256u * 1024);
  // Unbounded tables, queue flows and series cost about 1 KB per tenant (17 MB for 20,000,
  // 50 MB for 50,000); bounded, the growth is the allocator's slack (4-5 MB measured).
  BOOST_TEST(after_kb - before_kb < 10 * 1024);
  BOOST_TEST(srv.stop() == 0);
}

// Results of 1,024 tokens each, all remembered for resubmission: the result cache holds
// result_cache_bytes of them, oldest forgotten first; memory stays flat past that.
BOOST_AUTO_TEST_CASE(long_results_leave_a_cache_bounded_by_bytes) {
  const int n = job_count(20000);
  constexpr uint32_t kTokens = 1024;
  constexpr long kCacheMb = 16;
  sy::it::TempDir dir;
  const std::string cfg = write_config(dir,
                                       "admission:\n"
                                       "  result_cache_bytes: 16777216\n"
                                       "batching:\n"
                                       "  max_sequences: 256\n"
                                       "  kv_memory_mb: 1024\n");
  // The journal on (its own folder): it keeps the same results for compaction, bounded alike.
  sy::it::ServerProcess srv({"--config", cfg, "--backend", "null", "--executors", "2", "--journal",
                             dir.path() + "/journal"});
  // Warm-up: fills the cache to its byte limit, so the baseline holds a full cache.
  const int warm_n = 8000;
  auto warm = run_jobs(srv.endpoint(), warm_n, 512, kTokens,
                       [](int i) { return job(numbered("w", i), "t", kTokens); });
  BOOST_REQUIRE_EQUAL(warm.done, warm_n);
  const long before_kb = srv.proc_status_kb("VmRSS");
  auto out = run_jobs(srv.endpoint(), n, 512, kTokens,
                      [](int i) { return job(numbered("j", i), "t", kTokens); });
  const long after_kb = srv.proc_status_kb("VmRSS");
  const long peak_kb = srv.proc_status_kb("VmHWM");
  BOOST_TEST_CONTEXT(out.first_problem) {
    BOOST_TEST(out.done == n);
    BOOST_TEST(out.errors == 0);
    BOOST_TEST(out.wrong == 0);
  }
  BOOST_TEST_MESSAGE(n << " results of " << kTokens << " tokens: RSS " << before_kb << " kB -> "
                       << after_kb << " kB (peak " << peak_kb << " kB), cache limit " << kCacheMb
                       << " MiB");
  // Unbounded, each result holds 4 KiB of ids in admission and about 3 KiB in the journal:
  // 20,000 of them are over 130 MB. Bounded, the cache was already full at the baseline.
  BOOST_TEST(after_kb - before_kb < 2 * kCacheMb * 1024);
  // The newest key is still answered from the cache; the oldest was forgotten and runs again.
  const int64_t admitted = srv.stats().at("admitted");
  auto again = run_jobs(srv.endpoint(), 1, 1, kTokens,
                        [&](int) { return job(numbered("j", n - 1), "t", kTokens); });
  BOOST_TEST(again.done == 1);
  BOOST_TEST(srv.stats().at("admitted") == admitted);
  auto rerun = run_jobs(srv.endpoint(), 1, 1, kTokens, [](int) { return job("w0", "t", kTokens); });
  BOOST_TEST(rerun.done == 1);
  BOOST_TEST(srv.stats().at("admitted") == admitted + 1);
  BOOST_TEST(srv.stop() == 0);
}

BOOST_AUTO_TEST_SUITE_END()  // test_memory_bounds
