// Programs survive kill -9 (docs/programs.md, Durability): 50 greedy programs (half on the request
// endpoint, half on the pipeline) run on a journaled server that is killed with SIGKILL at random
// moments 20 times and restarted on the same journal and ports. Every program ends with one done
// whose vars equal those of the same program on a clean server, and the journal, read between a
// kill and the next start, shows that no step durable before a kill is recorded again after it.
#include <boost/test/unit_test.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "clients/cpp/client.hpp"
#include "storage/journal_codec.hpp"
#include "storage/journal_file.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_programs_durability)

using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

constexpr int kPrograms = 50;
constexpr int kKills = 20;
const std::string kTenant = "dur";

// Few sequences per engine step and slowed steps (TEST ONLY flag): the 50 programs take about as
// many kill intervals as there are kills, so that kills find them in the middle of their steps.
// Pipeline results are marked delivered 100 ms after they left (default 2 s, longer than most
// runs here), so that a restart sends few of them again.
const char* kConfig = R"(
batching:
  max_sequences: 6
journal:
  delivered_lag_ms: 100
)";
const char* kStepDelayMs = "30";
// A kill comes this long after the server is ready (uniformly drawn): long enough that steps
// (a gen of 5 tokens is 6 engine steps) finish between kills, short enough that most kills land
// in the middle of programs.
constexpr int kKillAfterMinMs = 200, kKillAfterMaxMs = 800;
// Gen, gen, select, gen, gen: the steps of each program that produce an output.
constexpr uint32_t kSteps = 5;

json text(const std::string& t) {
  return {{"type", "text"}, {"text", t}};
}
json gen(const std::string& name, uint32_t max_tokens) {
  return {{"type", "gen"}, {"name", name}, {"max_tokens", max_tokens}};
}

// Program i's id (its key, with kTenant).
std::string key(int i) {
  std::string k = "p";
  k += std::to_string(i);
  return k;
}

// Program i: text, gen, text, gen, select, text, gen, gen, on input `who`.
sy::wire::Submit program(int i) {
  static const char* names[] = {"Tim",  "Sue", "Max", "Lily", "Ben",
                                "Anna", "Sam", "Mia", "Tom",  "Zoe"};
  static const char* kinds[] = {"little", "big", "happy", "sad", "kind"};
  const json steps = json::array({text("Once upon a time, {{who}} went to the"), gen("place", 5),
                                  text(". There {{who}} saw"), gen("thing", 5),
                                  json{{"type", "select"},
                                       {"name", "mood"},
                                       {"choices", json::array({" happy", " sad", " angry"})}},
                                  text(". Then"), gen("then", 5), gen("last", 4)});
  sy::wire::Submit s = sy::client::program_submit(
      key(i), kTenant, steps.dump(),
      {{"who", std::string("the ") + kinds[(i / 10) % 5] + " " + names[i % 10]}});
  s.temperature = 0;
  return s;
}

bool on_pipeline(int i) {
  return i % 2 == 1;
}

// What the journal file holds between a kill and the next start.
struct JournalView {
  std::set<std::pair<uint64_t, std::string>> durable;   // (program uid, path): S or program_done
  std::vector<std::pair<uint64_t, std::string>> steps;  // the S records, in file order
  std::map<uint64_t, std::string> programs;             // uid -> id, of every program accept
  std::set<uint64_t> ended;                             // uids with a result record
  std::map<uint64_t, std::size_t> restored;  // uid -> steps folded into its accept at start
  std::string warning;
};

JournalView read_journal(const std::string& path) {
  JournalView v;
  const sy::JournalScan scan = sy::scan_journal(path);
  v.warning = scan.warning;
  for (const auto& payload : scan.records) {
    const sy::journal::Record r = sy::journal::decode(payload);
    switch (r.kind) {
      case sy::journal::RecordKind::accept:
        if (!r.job.is_program()) break;
        v.programs[r.uid] = r.job.id;
        if (!r.job.program_done.empty()) v.restored[r.uid] = r.job.program_done.size();
        for (const auto& [p, out] : r.job.program_done) v.durable.emplace(r.uid, p);
        break;
      case sy::journal::RecordKind::step:
        v.steps.emplace_back(r.uid, r.path);
        v.durable.emplace(r.uid, r.path);
        break;
      case sy::journal::RecordKind::result:
        v.ended.insert(r.uid);
        break;
      default:
        break;
    }
  }
  return v;
}

// Every program's outcome, gathered from the request endpoint and the results sink.
struct Outcomes {
  std::map<std::string, sy::wire::Done> done;
  std::vector<std::string> problems;  // errors, and dones that disagree with an earlier one
  int duplicates = 0;

  void take(const sy::wire::ServerMessage& m) {
    if (auto* d = std::get_if<sy::wire::Done>(&m)) {
      auto [it, fresh] = done.emplace(d->id, *d);
      if (fresh) return;
      ++duplicates;
      if (it->second.vars != d->vars) problems.push_back(d->id + ": a second done differs");
    } else if (auto* e = std::get_if<sy::wire::Error>(&m)) {
      problems.push_back(e->id + ": " + std::string(to_string(e->code)) + " " + e->message);
    }
  }
};

std::string describe_vars(const std::vector<sy::wire::Var>& vars) {
  json j = json::object();
  for (const auto& v : vars) j[v.name] = v.list ? json(v.values) : json(v.values.at(0));
  return j.dump();
}

}  // namespace

BOOST_AUTO_TEST_CASE(kill_9_twenty_times_runs_every_step_once) {
  const auto t0 = std::chrono::steady_clock::now();

  // The reference: every program on a clean server without journal, delay or kills.
  std::map<std::string, std::vector<sy::wire::Var>> want;
  {
    sy::it::ServerProcess clean({"--model", sy::it::kStories, "--threads", "1", "--no-journal"});
    sy::client::Client c(clean.endpoint());
    BOOST_REQUIRE(c.ping_wait(10s));
    for (int i = 0; i < kPrograms; ++i) c.submit(program(i));
    Outcomes ref;
    while (ref.done.size() + ref.problems.size() < static_cast<std::size_t>(kPrograms)) {
      auto m = c.next(60s);
      BOOST_REQUIRE_MESSAGE(m, "the clean server went silent");
      ref.take(*m);
    }
    BOOST_REQUIRE_MESSAGE(ref.problems.empty(), ref.problems.front());
    for (auto& [id, d] : ref.done) {
      BOOST_TEST(d.steps == kSteps, id);
      want[id] = d.vars;
    }
    BOOST_TEST(clean.stop(SIGTERM) == 0);
  }
  BOOST_TEST_MESSAGE("reference p0: " << describe_vars(want.at("p0")));

  sy::it::TempDir dir;
  const std::string cfg = dir.write("d.yaml", kConfig);
  const std::string journal_dir = dir.path() + "/journal/";
  const std::string journal = journal_dir + "switchyard.journal";
  std::string bind = "tcp://127.0.0.1:*", pull = "tcp://127.0.0.1:*", results = "tcp://127.0.0.1:*";
  auto start = [&] {
    return std::make_unique<sy::it::ServerProcess>(std::vector<std::string>{
        "--model", sy::it::kStories, "--threads", "1", "--config", cfg, "--bind", bind, "--pull",
        pull, "--results", results, "--journal", journal_dir, "--journal-fsync", "batch",
        "--step-delay-ms", kStepDelayMs});
  };
  auto srv = start();
  bind = srv->endpoint();
  pull = srv->pull_endpoint();
  results = srv->results_endpoint();
  BOOST_REQUIRE(!pull.empty());
  BOOST_REQUIRE(!results.empty());

  Outcomes got;
  sy::client::Sink sink(results);  // reconnects to every restarted server by itself
  auto client = std::make_unique<sy::client::Client>(bind);
  auto pump = [&](std::chrono::steady_clock::time_point until) {
    do {
      while (auto m = client->next(2ms)) got.take(*m);
      while (auto m = sink.next(2ms)) got.take(*m);
    } while (std::chrono::steady_clock::now() < until);
  };
  auto all_done = [&] { return got.done.size() == static_cast<std::size_t>(kPrograms); };

  // Submit all 50 and wait until each is journaled: a pushed program the server never read is
  // not the server's to keep.
  {
    sy::client::Pusher push(pull);
    push.socket().set(zmq::sockopt::linger, 30000);
    for (int i = 0; i < kPrograms; ++i) {
      if (on_pipeline(i))
        BOOST_REQUIRE(push.submit(program(i), 30s));
      else
        client->submit(program(i));
    }
  }
  for (auto until = std::chrono::steady_clock::now() + 30s;
       srv->stats()["journal_accepted"] < kPrograms && std::chrono::steady_clock::now() < until;)
    pump(std::chrono::steady_clock::now() + 20ms);
  BOOST_REQUIRE_EQUAL(srv->stats()["journal_accepted"], kPrograms);

  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> after(kKillAfterMinMs, kKillAfterMaxMs);
  std::set<std::pair<uint64_t, std::string>> durable_before;  // at the previous kill
  std::size_t new_steps = 0, repeated = 0, restored_steps = 0, resumed_programs = 0;
  int kills_mid_flight = 0, kills_mid_program = 0, kills = 0;
  int64_t stats_resumed = 0;
  bool resumed_counted = false;
  std::vector<std::string> repeats;
  auto check_new_steps = [&](const JournalView& v, int run) {
    // The file was compacted at this run's start (steps folded into the accepts): each S record
    // in it was written by this run, so none may repeat a step durable at the previous kill, or
    // another of this run.
    std::set<std::pair<uint64_t, std::string>> seen;
    for (const auto& s : v.steps) {
      ++new_steps;
      if (durable_before.count(s) || !seen.insert(s).second) {
        ++repeated;
        const std::string who =
            v.programs.count(s.first) ? v.programs.at(s.first) : std::to_string(s.first);
        if (repeats.size() < 5)
          repeats.push_back("run " + std::to_string(run) + ": program " + who + " step " +
                            s.second);
      }
    }
    for (const auto& [uid, n] : v.restored) {
      restored_steps += n;
      ++resumed_programs;
    }
  };

  for (int k = 1; k <= kKills; ++k) {
    pump(std::chrono::steady_clock::now() + std::chrono::milliseconds(after(rng)));
    BOOST_REQUIRE_EQUAL(srv->stop(SIGKILL), 128 + SIGKILL);
    srv.reset();
    ++kills;
    pump(std::chrono::steady_clock::now() + 100ms);  // what was on its way before the kill
    client.reset();

    // Between the kill and the next start (which compacts the file): read what is durable.
    const JournalView v = read_journal(journal);
    check_new_steps(v, k);
    int pending = 0, mid = 0;
    for (const auto& [uid, id] : v.programs) {
      if (v.ended.count(uid)) continue;
      ++pending;
      bool some = false;
      for (const auto& d : v.durable) some = some || d.first == uid;
      mid += some;
    }
    kills_mid_flight += pending > 0;
    kills_mid_program += mid > 0;
    BOOST_TEST_MESSAGE(
        "kill " << k << ": " << pending << " programs pending (" << mid << " with durable steps), "
                << v.steps.size() << " step records written since the start, " << got.done.size()
                << " dones received" << (v.warning.empty() ? "" : "; journal: " + v.warning));
    durable_before = v.durable;

    srv = start();
    BOOST_REQUIRE_EQUAL(srv->endpoint(), bind);
    // Admission's count of programs resumed from the journal, where the stats carry it.
    const auto st = srv->stats();
    if (auto it = st.find("programs_resumed"); it != st.end()) {
      resumed_counted = true;
      stats_resumed += it->second;
    }
    client = std::make_unique<sy::client::Client>(bind);
    // Request-endpoint programs without a done: resubmitting the key attaches (or returns the
    // stored done of one that ended before the kill).
    for (int i = 0; i < kPrograms; ++i)
      if (!on_pipeline(i) && !got.done.count(key(i))) client->submit(program(i));
  }

  // The last run goes to its end.
  for (auto last = std::chrono::steady_clock::now();
       !all_done() && std::chrono::steady_clock::now() - last < 90s;) {
    const std::size_t before = got.done.size();
    pump(std::chrono::steady_clock::now() + 50ms);
    if (got.done.size() != before) last = std::chrono::steady_clock::now();
  }
  pump(std::chrono::steady_clock::now() + 300ms);  // late duplicates
  client.reset();
  auto st = srv->stats();
  BOOST_TEST(st["active_jobs"] == 0);
  BOOST_TEST(st["programs_active"] == 0);
  BOOST_TEST(srv->stop(SIGTERM) == 0);
  srv.reset();
  check_new_steps(read_journal(journal), kKills + 1);

  BOOST_TEST(got.done.size() == static_cast<std::size_t>(kPrograms));
  BOOST_TEST(got.problems.empty(), (got.problems.empty() ? "" : got.problems.front()));
  int equal = 0;
  for (int i = 0; i < kPrograms; ++i) {
    const std::string id = key(i);
    auto it = got.done.find(id);
    if (it == got.done.end()) continue;
    BOOST_TEST_CONTEXT(id << (on_pipeline(i) ? " (pipeline)" : " (request)")) {
      BOOST_TEST(sy::wire::to_string(it->second.finish_reason) == "stop");
      BOOST_TEST(it->second.steps == kSteps);
      BOOST_TEST(describe_vars(it->second.vars) == describe_vars(want.at(id)));
      equal += it->second.vars == want.at(id);
    }
  }
  BOOST_TEST(repeated == 0u, (repeats.empty() ? "" : repeats.front()));
  // Each kill's journal was read before the next start, and the last one after the last run:
  // every step record ever written was seen, so with no repeats each step was recorded once.
  BOOST_TEST(new_steps == std::size_t{kPrograms} * kSteps);
  // The kills must have found programs in the middle of their steps, and restarts resumed them.
  BOOST_TEST(kills_mid_program > 0);
  BOOST_TEST(resumed_programs > 0u);
  if (resumed_counted)
    BOOST_TEST(stats_resumed > 0);
  else
    BOOST_TEST_MESSAGE("the stats carry no programs_resumed: resumptions counted from the journal");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE(kills << " kills (" << kills_mid_flight << " with programs pending, "
                           << kills_mid_program << " with programs part-way done); "
                           << resumed_programs << " program resumptions restoring "
                           << restored_steps << " durable steps; " << new_steps
                           << " step records written, " << repeated << " of them repeats; " << equal
                           << "/" << kPrograms << " programs equal the clean run; "
                           << got.duplicates << " dones delivered twice; " << secs << " s");
}

BOOST_AUTO_TEST_SUITE_END()  // test_programs_durability
