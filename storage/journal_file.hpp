// The journal's file format: an append-only log of opaque records, each framed by its length and
// a CRC32, with a configurable fsync policy. Knows nothing of jobs or actors (actors/journal.*).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
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
  uint64_t good_bytes = 0;      ///< where the last good record ends (what a damaged tail is cut to)
  uint64_t file_bytes = 0;      ///< the file's size
  uint64_t skipped_bytes = 0;   ///< damaged bytes skipped in the middle of the file
  uint64_t skipped_ranges = 0;  ///< how many damaged regions were skipped
  uint64_t zero_tail = 0;       ///< zeros after the last record: preallocated, not damage
  std::string warning;          ///< non-empty: damage was found (what, where, what was lost)
};

/// Reads a journal file. A missing or empty file is an empty journal. A record that is cut
/// short, longer than kMaxRecordBytes, or fails its CRC is damage: the scan looks for the next
/// offset that holds a good non-empty record (length that fits and a matching CRC) and goes on
/// from there, reporting the skipped byte range in `warning`; when there is none, the rest is a
/// damaged tail, reported and excluded from good_bytes. Zeros from where a record would start to
/// the end of the file are space the writer preallocated (zero_tail), not damage. Throws
/// std::runtime_error when the file exists but cannot be read, or its header is not a journal's.
JournalScan scan_journal(const std::string& path);

/// A write or sync the file system refused (disk full, quota, I/O error). The file has been cut
/// back to its last good record and the buffer emptied: nothing of what failed stays behind, so a
/// record refused now is never written later. what() names the path (for the operator's log);
/// `code` is the errno, whose text (std::strerror) names no path (for clients).
class JournalWriteError : public std::runtime_error {
 public:
  JournalWriteError(const std::string& what, int code) : std::runtime_error(what), code(code) {}
  int code;
};

/// An open journal file, appended to by one owner. Not thread-safe.
class JournalFile {
 public:
  /// The largest record accepted: a length field above it can only be damage (a job with a
  /// context-sized prompt and its completion is far below a megabyte).
  static constexpr uint32_t kMaxRecordBytes = 64u << 20;
  /// The file grows ahead of its records by this much at a time (zeros, see reserve()): one
  /// size change, and one metadata commit, per few thousand records instead of per sync.
  static constexpr uint64_t kPreallocBytes = 1u << 20;

  /// Takes an exclusive lock on PATH.lock (so that two servers never write one journal; the
  /// refusal names the holder's pid), then opens (creating it and its folders, mode 0700, if
  /// missing) the journal at `path`, scans it and cuts a damaged tail off (the scan's warning
  /// says what was cut). Throws std::runtime_error naming the path and the problem; a journal
  /// locked by another owner gives "journal PATH is in use by another server (pid N)...".
  JournalFile(const std::string& path, JournalScan& scan);
  ~JournalFile();
  JournalFile(const JournalFile&) = delete;
  JournalFile& operator=(const JournalFile&) = delete;

  /// Frames `payload` into the write buffer (no system call).
  void append(std::string_view payload);
  /// Writes the buffer to the OS (write(2)): from now on the records survive a process crash.
  /// On failure (JournalWriteError) the file is truncated back to where this write began and the
  /// whole buffer is dropped: a partial record never stays mid-file, and the refused records are
  /// not written by a later flush.
  void flush();
  /// flush() then fdatasync: the records survive a power loss. When fdatasync fails, what was
  /// written since the last good sync may or may not be on disk: the file is cut back to that
  /// sync, so that what was never acknowledged is not replayed (JournalWriteError).
  void sync();
  /// Bytes of records in the file, buffered ones included (not the preallocated zeros after).
  uint64_t size() const { return size_ + buf_.size(); }
  /// Number of fdatasync calls so far (group commit shows as far fewer syncs than records).
  uint64_t syncs() const { return syncs_; }
  const std::string& path() const { return path_; }
  /// The lock file that marks a journal at `path` as owned (it holds the owner's pid).
  static std::string lock_path(const std::string& path);

  /// Replaces the whole journal by `records` (compaction): writes PATH.tmp, syncs it, renames it
  /// over PATH, syncs the folder, and continues appending to the new file. When the new file
  /// cannot be written (JournalWriteError), PATH.tmp is removed and the old journal stays in use.
  void rewrite(const std::vector<std::string>& records);

 private:
  void open_for_append();
  void lock();
  void cut_back(uint64_t offset);
  void reserve(uint64_t end);
  void finish_cut();
  std::string path_;
  int fd_ = -1;
  int lock_fd_ = -1;          // held (flock) for the object's life
  uint64_t size_ = 0;         // where the records end (the next write goes there)
  uint64_t allocated_ = 0;    // the file's size: size_ and preallocated zeros after it
  bool prealloc_ = true;      // false once the file system said it has no fallocate
  uint64_t synced_ = 0;       // where the last good fdatasync left the file
  bool cut_pending_ = false;  // a cut back to size_ failed: retried before the next write
  uint64_t syncs_ = 0;
  std::string buf_;
};

/// Frames one record (length, CRC32, payload) onto `out`; exposed for tests that forge files.
void frame_record(std::string& out, std::string_view payload);
/// The 8 bytes every journal file starts with (magic and format version).
std::string_view journal_header();

}  // namespace sy
