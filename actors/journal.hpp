// The journal actor: makes accepted jobs and their results durable (storage/journal_file.hpp)
// before they are acknowledged or delivered, and the replay of a journal when a server starts.
#pragma once

#include <caf/fwd.hpp>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/journal_config.hpp"

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

/// Record payloads (msgpack maps with named fields, so a later version can add fields and
/// still read older journals). Exposed for tests.
std::string encode_accept(const Job& job);
std::string encode_result(const JobOutcome& outcome);
std::string encode_delivered(uint64_t uid);

/// Folds a journal's records into what the server must do: pending jobs, results to remember
/// (the newest `keep_results` done ones), pipeline results to deliver again. `compacted` gets the
/// records that carry that same state (what the journal is rewritten to).
void replay_records(const std::vector<std::string>& records, std::size_t keep_results,
                    JournalReplay& out, std::vector<std::string>& compacted);

/// The journal file named by cfg.path: a folder (existing, or written with a trailing '/')
/// holds it as FOLDER/switchyard.journal.
std::string journal_file_path(const std::string& path);

/// Opens and locks the journal (cfg.path must be set), skips damage (out.warning says so), replays
/// it into `out` and rewrites it compacted. Throws std::runtime_error on I/O errors or a lock
/// held by another process.
std::shared_ptr<JournalFile> open_journal(const JournalConfig& cfg, std::size_t keep_results,
                                          JournalReplay& out);

/// Spawns the journal actor over an opened file. It stands in front of `egress` (give it to the
/// router, batchers and admission as their egress): TokensEvent and other events pass straight
/// through; a journaled job's DoneEvent/ErrorEvent is held until admission reports the job's end
/// ((journal_atom, JobOutcome)) and that result record is durable. `replay` seeds the live jobs
/// (events to a ROUTER client with an empty routing id, i.e. of a replayed job, are dropped) and its
/// `redeliver` results are sent to egress at once. Protocol: actors/messages.hpp, "Journal shapes".
caf::actor spawn_journal(caf::actor_system& sys, JournalConfig cfg,
                         std::shared_ptr<JournalFile> file, const JournalReplay& replay,
                         std::size_t keep_results, caf::actor egress);

}  // namespace sy
