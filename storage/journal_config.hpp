// Configuration of the durable journal of accepted jobs and results.
#pragma once

#include <cstdint>
#include <string>
#include <cstddef>

namespace sy {

/// The durable journal of accepted jobs and results (docs/durability.md).
struct JournalConfig {
  // Journal file; a folder (or a path ending in '/') gets FOLDER/switchyard.journal. "" = the
  // default location (journal_location()), "off" = no journal.
  std::string path;
  std::string fsync = "batch";  // always | batch | never (storage/journal_file.hpp)
  // Group commit: acks wait at most this for the fsync. 0 (the default): no window; the journal
  // syncs as soon as it has written the records waiting in its mailbox, so groups grow by
  // themselves while a sync runs. A window only adds latency unless the disk's sync is slow.
  int64_t batch_ms = 0;
  // A result handed to egress this long ago is marked delivered (not redelivered after a crash);
  // two seconds is far beyond the gateway's usual hand-off time to the socket.
  int64_t delivered_lag_ms = 2000;
  int64_t compact_bytes = 64 << 20;  // rewrite the file once it outgrows this and is mostly dead
  // The results kept in memory for compaction (the ones admission keeps for resubmissions) take
  // this many bytes at most; set by finalize_config from admission.result_cache_bytes.
  size_t keep_result_bytes = size_t{256} << 20;
};

}  // namespace sy
