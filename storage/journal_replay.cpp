// The journal's replay at start: folds the records of a journal file into the jobs to run again,
// the results to remember and the pipeline results to deliver again, and the compacted records
// that carry the same state (see journal_replay.hpp and docs/durability.md).
#include "storage/journal_replay.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "storage/journal_codec.hpp"
#include "storage/journal_file.hpp"

namespace sy {

const ClientRef& reply_client(const JobOutcome& o) {
  return o.outcome == Outcome::error ? o.error.to : o.done.to;
}

std::string encode_accept(const Job& j, ReplayClock clock) {
  // arrival_us and deadline_us are steady-clock times of this process, meaningless after a
  // restart: a replayed job arrives anew, and its deadline is kept as wall-clock time (the one
  // clock two processes share) so that it still bounds the job after a restart.
  return journal::encode_accept(
      j, j.deadline_us > 0 ? clock.wall_us + (j.deadline_us - clock.steady_us) : 0);
}

void replay_records(const std::vector<std::string>& records, std::size_t keep_results,
                    JournalReplay& out, std::vector<std::string>& compacted, ReplayClock clock) {
  std::map<uint64_t, Job> accepted;  // by uid: the order jobs were admitted in
  std::vector<JobOutcome> results;   // in journal order
  std::unordered_map<uint64_t, std::size_t> result_at;
  std::unordered_set<uint64_t> delivered;
  uint64_t max_uid = 0;
  for (const auto& r : records) {
    journal::Record d;
    try {
      d = journal::decode(r);
    } catch (const std::exception&) {
      // A good CRC over an unreadable payload: written by an incompatible version. Skipping it
      // beats refusing to start; the count is reported.
      ++out.undecodable;
      continue;
    }
    ++out.records;
    max_uid = std::max(max_uid, d.uid);
    if (d.kind == journal::RecordKind::accept) {
      d.job.deadline_us = d.deadline_wall_us;  // converted below, once per pending job
      accepted[d.uid] = std::move(d.job);
    } else if (d.kind == journal::RecordKind::step) {
      // A program's finished step: kept with its accept (a step is recorded once; a second
      // record of a path, written by no version, would be ignored).
      auto it = accepted.find(d.uid);
      if (it == accepted.end()) continue;
      auto& done = it->second.program_done;
      const bool seen =
          std::any_of(done.begin(), done.end(), [&](const auto& x) { return x.first == d.path; });
      if (!seen) done.emplace_back(std::move(d.path), std::move(d.output));
    } else if (d.kind == journal::RecordKind::result) {
      if (result_at.count(d.uid)) continue;  // the first result of a job is the one delivered
      result_at[d.uid] = results.size();
      results.push_back(std::move(d.outcome));
    } else {
      delivered.insert(d.uid);
    }
  }
  out.next_uid = max_uid + 1;
  const int64_t now = clock.steady_us, wall = clock.wall_us;
  for (auto& [uid, job] : accepted) {
    if (result_at.count(uid)) continue;
    job.arrival_us = now;
    // Back to this process's steady clock. A deadline that passed while the server was down
    // stays in the past (never 0, which means none): the router then ends the job with
    // deadline_exceeded before it runs, as it would have without the restart.
    if (job.deadline_us > 0) job.deadline_us = std::max<int64_t>(1, now + (job.deadline_us - wall));
    // A ROUTER client's routing id (an HTTP request's handle) died with the old process, and a
    // new client may well be given the same one: the job now belongs to nobody (empty id);
    // resubmitting its key attaches.
    if (is_connected(job.client)) job.client.identity.clear();
    out.pending.push_back(std::move(job));
  }
  // Newest first: the result cache keeps the newest done results; every pipeline result that
  // may not have reached its sink is kept until it is marked delivered.
  std::vector<const JobOutcome*> kept;
  std::size_t kept_done = 0;
  for (auto it = results.rbegin(); it != results.rend(); ++it) {
    bool undelivered = reply_client(*it).kind == ClientRef::pipeline && !delivered.count(it->uid);
    bool cache = it->outcome == Outcome::done && kept_done < keep_results;
    if (!cache && !undelivered) continue;
    if (cache) ++kept_done;
    kept.push_back(&*it);
  }
  std::reverse(kept.begin(), kept.end());
  compacted.clear();
  for (const auto& j : out.pending) compacted.push_back(encode_accept(j, clock));
  for (const auto* o : kept) {
    compacted.push_back(journal::encode_result(*o));
    if (delivered.count(o->uid)) compacted.push_back(journal::encode_delivered(o->uid));
    if (o->outcome == Outcome::done) out.results.push_back(*o);
    if (reply_client(*o).kind == ClientRef::pipeline && !delivered.count(o->uid))
      out.redeliver.push_back(*o);
  }
}

std::string journal_file_path(const std::string& path) {
  std::error_code ec;
  if (!path.empty() && (path.back() == '/' || std::filesystem::is_directory(path, ec)))
    return (std::filesystem::path(path) / "switchyard.journal").string();
  return path;
}

std::shared_ptr<JournalFile> open_journal(const JournalConfig& cfg, std::size_t keep_results,
                                          JournalReplay& out, ReplayClock clock) {
  JournalScan scan;
  auto file = std::make_shared<JournalFile>(journal_file_path(cfg.path), scan);
  out.warning = scan.warning;
  std::vector<std::string> compacted;
  replay_records(scan.records, keep_results, out, compacted, clock);
  try {
    file->rewrite(compacted);
  } catch (const JournalWriteError& e) {
    // A full disk at start: the journal as it is holds the same state (replay folds it the same
    // way next time), so the server starts on it uncompacted; rewrite() removed its PATH.tmp.
    out.warning += std::string(out.warning.empty() ? "" : "; ") + e.what() +
                   "; the journal is used uncompacted";
  }
  return file;
}

}  // namespace sy
