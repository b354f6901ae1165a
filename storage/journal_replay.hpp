// The journal's replay at start (docs/durability.md): what a journal's records say the server
// must do (run again, remember, deliver again) and the compacted records carrying that state.
// Plain functions of the records and the clocks; no CAF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/job.hpp"
#include "storage/journal_config.hpp"

namespace sy {

class JournalFile;

/// What a journal held when the server started (see replay_records).
struct JournalReplay {
  /// Accepted, no result: run again (oldest first). A ROUTER client's routing id is emptied: that
  /// client is gone, and ZeroMQ may give the same id to a new one.
  std::vector<Job> pending;
  std::vector<JobOutcome> results;    ///< finished with a result: kept for resubmissions
  std::vector<JobOutcome> redeliver;  ///< pipeline results (any outcome) not known delivered
  uint64_t next_uid = 1;              ///< above every uid in the journal
  uint64_t records = 0;               ///< good records read
  uint64_t undecodable = 0;           ///< records with a good CRC that did not decode (skipped)
  std::string warning;                ///< damage was skipped or a damaged tail cut (empty: none)
};

/// The two clocks a replay reads, in µs: this process's steady clock (the base of every *_us
/// field) and the wall clock (the one clock two processes share: deadlines across a restart).
struct ReplayClock {
  int64_t steady_us = 0;
  int64_t wall_us = 0;
};

/// Where an outcome's replies go: its error's client for an error, else its done's.
const ClientRef& reply_client(const JobOutcome& o);

/// An accept record for `job` whose deadline (steady clock) is kept as wall-clock time.
std::string encode_accept(const Job& job, ReplayClock clock);

/// Folds a journal's records into what the server must do: pending jobs, results to remember
/// (the newest `keep_results` done ones), pipeline results to deliver again. `compacted` gets the
/// records that carry that same state (what the journal is rewritten to).
void replay_records(const std::vector<std::string>& records, std::size_t keep_results,
                    JournalReplay& out, std::vector<std::string>& compacted, ReplayClock clock);

/// The journal file named by cfg.path: a folder (existing, or written with a trailing '/')
/// holds it as FOLDER/switchyard.journal.
std::string journal_file_path(const std::string& path);

/// Opens and locks the journal (cfg.path must be set), skips damage (out.warning says so), replays
/// it into `out` and rewrites it compacted. Throws std::runtime_error on I/O errors or a lock
/// held by another process.
std::shared_ptr<JournalFile> open_journal(const JournalConfig& cfg, std::size_t keep_results,
                                          JournalReplay& out, ReplayClock clock);

}  // namespace sy
