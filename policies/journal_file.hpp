// The journal's file format: an append-only log of opaque records, each framed by its length and
// a CRC32, with a configurable fsync policy. Knows nothing of jobs or actors (actors/journal.*).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sy {

/// When appended records are forced to stable storage (fdatasync).
enum class FsyncPolicy : uint8_t {
  always,  ///< after every record, before it is acknowledged
  batch,   ///< group commit: one fdatasync every batch_ms for all records appended meanwhile
  never,   ///< never: records reach the OS (they survive a process crash, not a power loss)
};

/// "always" | "batch" | "never"; nullopt for anything else.
std::optional<FsyncPolicy> parse_fsync_policy(std::string_view text);
/// The policy's name as parse_fsync_policy reads it.
const char* to_string(FsyncPolicy p);

/// CRC-32 (IEEE 802.3, reflected, the zlib/PNG one) of `data`, continuing from `crc`.
uint32_t crc32(std::string_view data, uint32_t crc = 0);

/// What a scan of a journal file found: every good record in order, and where the good part ends.
struct JournalScan {
  std::vector<std::string> records;  ///< payloads, in append order
  uint64_t good_bytes = 0;           ///< the file's valid prefix (header + whole good records)
  uint64_t file_bytes = 0;           ///< the file's size
  std::string warning;               ///< non-empty: a damaged tail was found (what and where)
};

/// Reads a journal file. A missing or empty file is an empty journal. The first record that is
/// cut short, longer than kMaxRecordBytes, or fails its CRC ends the scan: it and everything
/// after it are reported in `warning` and excluded from good_bytes. Throws std::runtime_error
/// when the file exists but cannot be read, or its header is not a journal's.
JournalScan scan_journal(const std::string& path);

/// An open journal file, appended to by one owner. Not thread-safe.
class JournalFile {
 public:
  /// The largest record accepted: a length field above it can only be damage (a job with a
  /// context-sized prompt and its completion is far below a megabyte).
  static constexpr uint32_t kMaxRecordBytes = 64u << 20;

  /// Opens (creating it if missing) the journal at `path`, scans it, cuts a damaged tail off
  /// (the scan's warning says what was cut) and takes an exclusive lock, so that two servers
  /// never write one journal. Throws std::runtime_error naming the path and the problem.
  JournalFile(const std::string& path, JournalScan& scan);
  ~JournalFile();
  JournalFile(const JournalFile&) = delete;
  JournalFile& operator=(const JournalFile&) = delete;

  /// Frames `payload` into the write buffer (no system call).
  void append(std::string_view payload);
  /// Writes the buffer to the OS (write(2)): from now on the records survive a process crash.
  void flush();
  /// flush() then fdatasync: the records survive a power loss.
  void sync();
  /// Bytes in the file, buffered ones included.
  uint64_t size() const { return size_ + buf_.size(); }
  /// Number of fdatasync calls so far (group commit shows as far fewer syncs than records).
  uint64_t syncs() const { return syncs_; }
  const std::string& path() const { return path_; }

  /// Replaces the whole journal by `records` (compaction): writes PATH.tmp, syncs it, renames it
  /// over PATH, syncs the folder, and continues appending to the new file.
  void rewrite(const std::vector<std::string>& records);

 private:
  void open_for_append();
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t syncs_ = 0;
  std::string buf_;
};

/// Frames one record (length, CRC32, payload) onto `out`; exposed for tests that forge files.
void frame_record(std::string& out, std::string_view payload);
/// The 8 bytes every journal file starts with (magic and format version).
std::string_view journal_header();

}  // namespace sy
