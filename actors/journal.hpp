// The journal actor: makes accepted jobs and their results durable (storage/journal_file.hpp)
// before they are acknowledged or delivered, and the replay of a journal when a server starts.
#pragma once

#include <caf/fwd.hpp>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/protocol.hpp"
#include "storage/journal_config.hpp"
#include "storage/journal_replay.hpp"

namespace sy {

/// Record payloads (storage/journal_codec) stamped with this process's clocks. Exposed for tests.
std::string encode_accept(const Job& job);
std::string encode_result(const JobOutcome& outcome);
std::string encode_delivered(uint64_t uid);

/// replay_records and open_journal (storage/journal_replay.hpp) on this process's clocks.
void replay_records(const std::vector<std::string>& records, std::size_t keep_results,
                    JournalReplay& out, std::vector<std::string>& compacted);
std::shared_ptr<JournalFile> open_journal(const JournalConfig& cfg, std::size_t keep_results,
                                          JournalReplay& out);

/// Spawns the journal actor over an opened file. It stands in front of `egress` (give it to the
/// router, batchers and admission as their egress): TokensEvent and other events pass straight
/// through; a journaled job's DoneEvent/ErrorEvent is held until admission reports the job's end
/// ((journal_atom, JobOutcome)) and that result record is durable. `replay` seeds the live jobs
/// (events to a ROUTER client with an empty routing id, i.e. of a replayed job, are dropped) and its
/// `redeliver` results are sent to egress at once. Its interface (JournalActor, actors/protocol.hpp)
/// extends egress's, so every egress message is handled here too. Beyond those it handles:
///   (journal_atom, Job) -> uint8 0 once the accept record is durable (per the fsync policy); when
///       it could not be written, the caf::error ErrorCode::unavailable whose context is the
///       errno's text (admission answers `unavailable` with it);
///   (journal_atom, JobOutcome)  a journaled job ended: its result record (no reply); its held
///       done/error go out after the commit;
///   (stats_atom) -> JournalStats (actors/stats.hpp, docs/durability.md).
/// `own_thread`: a detached actor (the server: a group commit's fdatasync then holds that thread,
/// never one of the scheduler's workers that admit, route and deliver every other job); false
/// runs it on the scheduler (tests on CAF's test_coordinator step it there).
JournalActor spawn_journal(caf::actor_system& sys, JournalConfig cfg,
                           std::shared_ptr<JournalFile> file, const JournalReplay& replay,
                           std::size_t keep_results, EgressActor egress, bool own_thread = false);

}  // namespace sy
