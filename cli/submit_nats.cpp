// `switchyard submit --nats URL`: the same JSONL batch published to a cluster's JetStream queue
// (switchyard.jobs.<class>, Nats-Msg-Id <tenant>/<id>) with a reply subject of its own, results
// written as the ZeroMQ path writes them; --no-wait only publishes, --cancel cancels.
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <unordered_map>

#include "cli/submit.hpp"
#include "clients/cpp/cluster_client.hpp"
#include "ingress/nats_link.hpp"

namespace sy::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::string key_of(const std::string& tenant, const std::string& id) {
  return tenant + "\n" + id;
}

client::ClusterOptions options_of(const Args& a, bool reply) {
  client::ClusterOptions o;
  o.nats = nats_urls(a);
  o.name = "switchyard-submit";
  o.reply = reply;
  return o;
}

}  // namespace

std::vector<std::string> nats_urls(const Args& a) {
  std::vector<std::string> urls;
  for (const auto& v : a.all("nats")) {
    std::stringstream ss(v);
    std::string u;
    while (std::getline(ss, u, ','))
      if (!u.empty()) urls.push_back(u);
  }
  if (urls.empty()) throw UsageError("--nats needs a URL (nats://HOST:PORT)");
  return urls;
}

int cancel_over_nats(const Args& a) {
  const std::string tenant = a.str("tenant", "default");
  client::ClusterClient cc(options_of(a, false));
  for (const auto& id : a.all("cancel")) {
    cc.cancel(id, tenant, a.str("token"));
    std::cerr << "switchyard: cancel of " << wire::quoted(cluster::job_msg_id(tenant, id))
              << " published on " << cluster::kCancelSubject << "\n";
  }
  return 0;
}

int submit_over_nats(const Args& a, NatsBatch b) {
  const bool wait = !a.has("no-wait");
  // A queued job may wait behind a long backlog: the default minute only bounds a cluster that
  // has no node fetching; a rerun resumes (the jobs stay queued, their keys make it safe).
  const long long timeout_ms = a.integer("timeout-ms", 60000);
  if (timeout_ms < 1 || timeout_ms > 86400000)
    throw UsageError("--timeout-ms must be in [1, 86400000]");
  // Class and tenant become subject tokens: a bad one is refused before anything is published.
  const std::string default_class = client::ClusterOptions{}.default_class;
  for (const auto& s : b.todo) {
    const std::string cls = s.priority.empty() ? default_class : s.priority;
    if (auto why = cluster::subject_token_problem(cls); !why.empty())
      throw UsageError("job " + wire::quoted(s.id) + ": priority class " + wire::quoted(cls) +
                       " cannot be a NATS subject token: it " + why);
    if (auto why = cluster::subject_token_problem(s.tenant); !why.empty())
      throw UsageError("job " + wire::quoted(s.id) + ": tenant " + wire::quoted(s.tenant) +
                       " cannot be a NATS subject token: it " + why);
  }
  const std::vector<std::string> urls = nats_urls(a);
  std::string where;
  for (const auto& u : urls) where += (where.empty() ? "" : ",") + u;
  std::cerr << "switchyard: " << b.total << " jobs in " << b.in_path << ", " << b.skipped
            << " already in " << (b.out_path.empty() ? "the output" : b.out_path) << ", "
            << b.todo.size() << " to publish to " << where << "\n";

  std::ofstream out;
  if (!b.out_path.empty()) {
    out.open(b.out_path, std::ios::app | std::ios::binary);
    if (!out) throw UsageError("cannot open --output " + b.out_path);
  }
  client::ClusterClient cc(options_of(a, wait));

  std::unordered_map<std::string, size_t> in_flight;  // tenant\nid -> index in b.todo
  std::set<std::string> following;                    // tenants whose stored results are read
  size_t next = 0, published = 0, duplicates = 0, done = 0, failed = 0;
  uint64_t tokens = 0;
  std::string refused;  // the overload error, once a publish was refused
  const auto t0 = Clock::now();
  auto last_result = t0;
  auto last_progress = t0 - std::chrono::seconds(10);
  const bool tty = isatty(2);

  // Publishes up to the window (all of them without waiting); stops at the first refusal.
  auto publish_more = [&] {
    while (refused.empty() && next < b.todo.size() &&
           (!wait || in_flight.size() < static_cast<size_t>(b.window))) {
      const wire::Submit& s = b.todo[next];
      client::Published p;
      try {
        p = cc.submit(s);
      } catch (const client::ClusterOverloaded& e) {
        refused = e.what();
        std::cerr << (tty ? "\n" : "") << "switchyard: error: " << refused << "\n";
        return;
      }
      ++next;
      ++published;
      if (p.duplicate) {
        ++duplicates;
        // Not queued again: its result is the earlier publish's, stored in SWITCHYARD_RESULTS
        // (or still to come there).
        std::cerr << (tty ? "\n" : "") << "switchyard: job "
                  << wire::quoted(cluster::job_msg_id(s.tenant, s.id))
                  << " is a duplicate of one published within the duplicate window: not queued "
                     "again"
                  << (wait ? "; reading its result from " + std::string(cluster::kResultsStream)
                           : std::string())
                  << "\n";
        if (wait && following.insert(s.tenant).second) cc.follow_results(s.tenant, true);
      }
      if (wait) in_flight[key_of(s.tenant, s.id)] = next - 1;
    }
  };

  auto progress = [&](bool final) {
    const auto now = Clock::now();
    // As on ZeroMQ: a terminal is redrawn 5 times a second, a log file gets a line every 5 s.
    if (!final &&
        now - last_progress < (tty ? std::chrono::milliseconds(200) : std::chrono::seconds(5)))
      return;
    last_progress = now;
    out.flush();
    const double secs = std::chrono::duration<double>(now - t0).count();
    const size_t finished = done + failed;
    const double rate = secs > 0 ? finished / secs : 0;
    const size_t left = b.todo.size() - finished;
    std::cerr << (tty ? "\r" : "")
              << progress_text(b.skipped + finished, b.total, secs, tokens, rate, left, final,
                               in_flight.size(), failed)
              << (tty && !final ? "" : "\n") << std::flush;
  };

  publish_more();
  bool gave_up = false;
  while (wait && !in_flight.empty()) {
    progress(false);
    auto m = cc.next(std::chrono::milliseconds(200));
    if (!m) {
      if (Clock::now() - last_result > std::chrono::milliseconds(timeout_ms)) {
        std::cerr << (tty ? "\n" : "") << "switchyard: no result within " << timeout_ms
                  << " ms with " << in_flight.size()
                  << " jobs in flight: giving up (they stay queued in the cluster; rerun to "
                     "resume)\n";
        gave_up = true;
        break;
      }
      continue;
    }
    const std::string id = client::message_id(*m);
    const std::string tenant = client::message_tenant(*m);
    auto it = in_flight.find(key_of(tenant, id));
    // A chunk, or a result of a job not in this batch (the client already drops a second result
    // of a key it delivered: reply subject and stream, or a job run twice): nothing to write.
    if (it == in_flight.end()) continue;
    if (auto* d = std::get_if<wire::Done>(&*m)) {
      in_flight.erase(it);
      tokens += d->usage.completion_tokens;
      out << done_line(*d) << '\n';
      ++done;
    } else if (auto* e = std::get_if<wire::Error>(&*m)) {
      in_flight.erase(it);
      if (e->code == ErrorCode::bad_request || e->code == ErrorCode::unauthorized ||
          e->code == ErrorCode::deadline_exceeded || e->code == ErrorCode::not_found) {
        // The job itself is at fault: recorded, so that a rerun does not repeat it.
        out << error_line(e->id, *e) << '\n';
      } else {
        std::cerr << (tty ? "\n" : "") << "switchyard: job " << e->id << " failed ("
                  << to_string(e->code) << ": " << e->message << "); rerun to retry it\n";
      }
      ++failed;
    } else {
      continue;
    }
    last_result = Clock::now();
    publish_more();
  }
  out.flush();
  const size_t unpublished = b.todo.size() - next;
  if (wait) {
    progress(true);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cerr << "switchyard: summary: " << done << " done, " << failed << " failed, " << b.skipped
              << " skipped (already in the output), " << in_flight.size() + unpublished
              << " not finished; " << tokens << " tokens in " << duration(secs) << " ("
              << (secs > 0 ? tokens / secs : 0.0) << " tok/s), " << duplicates << " duplicates, "
              << unpublished << " not published, " << cc.repeated_results()
              << " repeated results dropped\n";
  } else {
    std::cerr << "switchyard: summary: " << published << " published (" << duplicates
              << " duplicates), " << unpublished << " not published\n";
  }
  if (!refused.empty()) return kExitOverloaded;
  return failed == 0 && !gave_up && unpublished == 0 ? 0 : 1;
}

}  // namespace sy::cli
