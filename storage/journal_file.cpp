// The journal file format (see journal_file.hpp): header, then records framed as
// [u32 length LE][u32 CRC32 LE of the payload][payload]; a scan skips damaged regions in the
// middle and cuts a damaged tail.
#include "storage/journal_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace sy {
namespace {

// "SYJRNL" then a NUL and the format version (1): a file of another kind, or of a future format,
// is refused instead of being read as damage and cut.
constexpr char kHeader[8] = {'S', 'Y', 'J', 'R', 'N', 'L', '\0', '\1'};
constexpr size_t kFrameBytes = 8;  // length + CRC

// Slicing by 8: t[0] is the byte-at-a-time table; t[k][i] is the CRC of byte i followed by k
// zero bytes, so eight bytes fold in with eight look-ups and no chain of shifts between them
// (about five times the speed of byte at a time). Records are CRC'd when written and at every
// offset the damage search tries, so this is the speed of recovering a damaged journal too.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;
CrcTables make_crc_tables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  return t;
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("journal " + path + ": " + what + ": " + std::strerror(errno));
}

// A refused write or sync: the errno travels with it, so that callers can tell clients why
// without naming the path.
[[noreturn]] void fail_write(const std::string& path, const std::string& what) {
  const int e = errno;
  throw JournalWriteError("journal " + path + ": " + what + ": " + std::strerror(e), e);
}

void write_all(int fd, const std::string& path, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_write(path, "write");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// write_all at a file offset (the journal's records end before its preallocated zeros).
void pwrite_all(int fd, const std::string& path, const char* p, size_t n, uint64_t at) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_write(path, "write");
    }
    p += w;
    at += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

// Makes a rename or a creation in `dir` durable (the entry lives in the folder, not the file).
void sync_dir(const std::string& file) {
  auto dir = std::filesystem::path(file).parent_path();
  int d = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (d < 0) return;  // best effort: some file systems refuse to open folders
  ::fsync(d);
  ::close(d);
}

// Creates the missing folders of `dir` with mode 0700: a journal holds prompts and results,
// which are nobody else's business. Folders that exist keep their mode.
void make_private_dirs(const std::filesystem::path& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return;
  make_private_dirs(dir.parent_path());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    fail(dir.string(), "cannot create the folder");
}

}  // namespace

std::optional<FsyncPolicy> parse_fsync_policy(std::string_view text) {
  if (text == "always") return FsyncPolicy::always;
  if (text == "batch") return FsyncPolicy::batch;
  if (text == "never") return FsyncPolicy::never;
  return std::nullopt;
}

const char* to_string(FsyncPolicy p) {
  switch (p) {
    case FsyncPolicy::always:
      return "always";
    case FsyncPolicy::batch:
      return "batch";
    case FsyncPolicy::never:
      return "never";
  }
  return "batch";
}

uint32_t crc32(std::string_view data, uint32_t crc) {
  static const CrcTables t = make_crc_tables();
  crc = ~crc;
  const char* p = data.data();
  size_t n = data.size();
  for (; n >= 8; p += 8, n -= 8) {
    const uint32_t a = get_u32(p) ^ crc, b = get_u32(p + 4);
    crc = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24] ^
          t[3][b & 0xFF] ^ t[2][(b >> 8) & 0xFF] ^ t[1][(b >> 16) & 0xFF] ^ t[0][b >> 24];
  }
  for (; n > 0; ++p, --n) crc = t[0][(crc ^ static_cast<unsigned char>(*p)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::string_view journal_header() {
  return {kHeader, sizeof kHeader};
}

void frame_record(std::string& out, std::string_view payload) {
  put_u32(out, static_cast<uint32_t>(payload.size()));
  put_u32(out, crc32(payload));
  out.append(payload);
}

JournalScan scan_journal(const std::string& path) {
  JournalScan s;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return s;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("journal " + path + ": cannot open for reading");
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw std::runtime_error("journal " + path + ": read error");
  s.file_bytes = data.size();
  if (data.empty()) return s;
  if (data.size() < sizeof kHeader) {
    // A crash while the header itself was being written: nothing was ever journaled.
    s.warning = "journal " + path + ": " + std::to_string(data.size()) +
                "-byte file shorter than the header; treated as empty";
    return s;
  }
  if (data.compare(0, sizeof kHeader, kHeader, sizeof kHeader) != 0)
    throw std::runtime_error("journal " + path + ": not a Switchyard journal (bad header)");
  size_t pos = sizeof kHeader;
  s.good_bytes = pos;
  // The length of the good record at `at`, 0 when there is none there (`why` says why). A
  // resynchronizing search (`resync`) also refuses empty records: eight zero bytes frame a valid
  // empty record, and zero-filled blocks are exactly what a crashed file system leaves behind.
  auto record_at = [&](size_t at, bool resync, std::string* why) -> size_t {
    if (data.size() - at < kFrameBytes) {
      if (why) *why = "record header cut short";
      return 0;
    }
    uint32_t len = get_u32(data.data() + at);
    if (len > JournalFile::kMaxRecordBytes) {
      if (why) *why = "record length " + std::to_string(len) + " beyond the limit";
      return 0;
    }
    if (data.size() - at - kFrameBytes < len) {
      if (why)
        *why = "record of " + std::to_string(len) + " bytes cut short at " +
               std::to_string(data.size() - at - kFrameBytes);
      return 0;
    }
    if (resync && len == 0) return 0;
    if (crc32(std::string_view(data.data() + at + kFrameBytes, len)) !=
        get_u32(data.data() + at + 4)) {
      if (why) *why = "record CRC mismatch";
      return 0;
    }
    return kFrameBytes + len;
  };
  // The resynchronizing search checks a CRC at every offset whose length field fits; its total
  // work is bounded so that a large damaged region costs a few passes over the file, not a
  // quadratic scan. Past the bound the rest is treated as a damaged tail.
  uint64_t budget = 16 * static_cast<uint64_t>(data.size()) + (1u << 20);
  auto add_warning = [&](const std::string& w) {
    s.warning += (s.warning.empty() ? "journal " + path + ": " : std::string("; ")) + w;
  };
  while (pos < data.size()) {
    // Nothing but zeros to the end: space JournalFile preallocated and has not written yet.
    if (data[pos] == 0 && std::all_of(data.begin() + static_cast<std::ptrdiff_t>(pos), data.end(),
                                      [](char c) { return c == 0; })) {
      s.zero_tail = data.size() - pos;
      break;
    }
    std::string why;
    if (size_t n = record_at(pos, false, &why)) {
      s.records.emplace_back(data.data() + pos + kFrameBytes, n - kFrameBytes);
      pos += n;
      s.good_bytes = pos;
      continue;
    }
    // Damage. A later good record means damage in the middle (a bad sector, a stray write):
    // skip to it rather than lose every record after one bad one.
    size_t next = std::string::npos;
    for (size_t q = pos + 1; q + kFrameBytes <= data.size() && budget > 0; ++q) {
      uint32_t len = get_u32(data.data() + q);
      if (len == 0 || len > JournalFile::kMaxRecordBytes || data.size() - q - kFrameBytes < len)
        continue;
      budget -= std::min<uint64_t>(budget, len);
      if (record_at(q, true, nullptr)) {
        next = q;
        break;
      }
    }
    if (next == std::string::npos) {
      add_warning(why + " at offset " + std::to_string(pos) + "; recovered " +
                  std::to_string(s.records.size()) + " records, dropping the last " +
                  std::to_string(data.size() - pos) + " bytes");
      break;
    }
    add_warning(why + " at offset " + std::to_string(pos) + "; skipped bytes " +
                std::to_string(pos) + " to " + std::to_string(next) + " (" +
                std::to_string(next - pos) + " bytes) up to the next good record");
    s.skipped_bytes += next - pos;
    ++s.skipped_ranges;
    pos = next;
  }
  return s;
}

JournalFile::JournalFile(const std::string& path, JournalScan& scan) : path_(path) {
  make_private_dirs(std::filesystem::path(path).parent_path());
  lock();
  try {
    scan = scan_journal(path);
    open_for_append();
    if (scan.good_bytes + scan.zero_tail < scan.file_bytes || scan.file_bytes < sizeof kHeader) {
      // Cut the damaged tail (or a partial header) so that new records follow the last good one.
      uint64_t keep = scan.good_bytes;
      if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0) fail(path_, "truncate");
      size_ = synced_ = allocated_ = keep;
      if (keep == 0) {
        buf_.assign(kHeader, sizeof kHeader);
        sync();
        sync_dir(path_);
      } else {
        ::fdatasync(fd_);
      }
    } else {
      size_ = synced_ = scan.good_bytes;  // new records go over the preallocated zeros
    }
  } catch (...) {
    // No destructor runs for a half-built object: release the lock here, or this process would
    // keep the journal locked against its own next attempt.
    if (fd_ >= 0) ::close(fd_);
    ::close(lock_fd_);
    fd_ = lock_fd_ = -1;
    throw;
  }
}

std::string JournalFile::lock_path(const std::string& path) {
  return path + ".lock";
}

void JournalFile::lock() {
  // The lock lives on a file of its own rather than on the journal: compaction renames a new
  // journal over the old one, and a lock on the old file would be lost with it.
  const std::string lp = lock_path(path_);
  lock_fd_ = ::open(lp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) fail(lp, "open the lock file");
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    std::string holder;
    if (e == EWOULDBLOCK) {
      // The holder wrote its pid into the lock file; it may be missing when it is just starting.
      char buf[32] = {};
      ssize_t n = ::pread(lock_fd_, buf, sizeof buf - 1, 0);
      long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
      if (pid > 0) holder = " (pid " + std::to_string(pid) + ")";
    }
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (e == EWOULDBLOCK)
      throw std::runtime_error("journal " + path_ + " is in use by another server" + holder +
                               "; one journal has one server: give this one another --journal, "
                               "--state-dir or bind address");
    errno = e;
    fail(lp, "lock");
  }
  // Best effort: the pid only makes the refusal message of a second server more useful.
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) == 0) {
    ssize_t w = ::pwrite(lock_fd_, pid.data(), pid.size(), 0);
    (void)w;
  }
}

void JournalFile::open_for_append() {
  // Writes go at size_ (pwrite): the end of the records, before any preallocated zeros.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) fail(path_, "open");
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(path_, "stat");
  size_ = allocated_ = static_cast<uint64_t>(st.st_size);
  synced_ = size_;  // what is there already is the baseline a failed sync cuts back to
}

// Grows the file ahead of the records in kPreallocBytes steps (zeros, read back as the end of
// the journal): a record written inside the file's size changes no size on disk, so its
// fdatasync need not commit the file system's metadata. A refusal leaves the write to find out
// whether the record itself fits; a file system without fallocate is not asked again.
void JournalFile::reserve(uint64_t end) {
  if (!prealloc_ || end <= allocated_) return;
  const uint64_t want = (end + kPreallocBytes - 1) / kPreallocBytes * kPreallocBytes;
  if (::fallocate(fd_, 0, static_cast<off_t>(allocated_), static_cast<off_t>(want - allocated_)) ==
      0) {
    allocated_ = want;
    return;
  }
  if (errno == EOPNOTSUPP || errno == ENOSYS) prealloc_ = false;
  struct stat st {};
  if (::fstat(fd_, &st) == 0) allocated_ = std::max(size_, static_cast<uint64_t>(st.st_size));
}

JournalFile::~JournalFile() {
  if (fd_ >= 0) {
    try {
      flush();
    } catch (...) {
      // A destructor must not throw; what was not written is lost like in a crash.
    }
    ::close(fd_);
  }
  // Closing releases the lock; the lock file stays (removing it could race with a server that
  // is opening it right now and split the lock in two).
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void JournalFile::append(std::string_view payload) {
  if (payload.size() > kMaxRecordBytes)
    throw std::runtime_error("journal " + path_ + ": record of " + std::to_string(payload.size()) +
                             " bytes beyond the limit");
  frame_record(buf_, payload);
}

// Truncates the file back to `offset` after a refused write or sync (a full disk can take part
// of a write: that prefix must not stay in front of the next record). A truncation that fails
// is retried before the next write, and no write goes out until it succeeds.
void JournalFile::cut_back(uint64_t offset) {
  size_ = offset;
  cut_pending_ = true;
  finish_cut();
}

void JournalFile::finish_cut() {
  if (!cut_pending_) return;
  if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) return;
  cut_pending_ = false;
  allocated_ = size_;
  synced_ = std::min(synced_, size_);
}

void JournalFile::flush() {
  if (buf_.empty()) return;
  finish_cut();
  if (cut_pending_) {
    buf_.clear();
    fail_write(path_, "cut back a refused write");
  }
  reserve(size_ + buf_.size());
  try {
    pwrite_all(fd_, path_, buf_.data(), buf_.size(), size_);
  } catch (const JournalWriteError&) {
    buf_.clear();
    cut_back(size_);
    throw;
  }
  size_ += buf_.size();
  buf_.clear();
}

void JournalFile::sync() {
  flush();
  if (::fdatasync(fd_) != 0) {
    const int e = errno;
    // After a failed fdatasync the kernel may already have dropped the dirty pages: what was
    // written since the last good sync is of unknown fate, so none of it is kept.
    cut_back(synced_);
    errno = e;
    fail_write(path_, "fdatasync");
  }
  synced_ = size_;
  ++syncs_;
}

void JournalFile::rewrite(const std::vector<std::string>& records) {
  flush();
  const std::string tmp = path_ + ".tmp";
  int t = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (t < 0) fail_write(tmp, "open");
  // A new file that cannot be written whole (a full disk) is removed: the old journal, intact
  // since rename is atomic, stays in use, and no partial PATH.tmp is left lying around.
  auto give_up = [&](const char* what) {
    const int e = errno;
    ::close(t);
    ::unlink(tmp.c_str());
    errno = e;
    fail_write(tmp, what);
  };
  std::string out(kHeader, sizeof kHeader);
  for (const auto& r : records) frame_record(out, r);
  try {
    write_all(t, tmp, out.data(), out.size());
  } catch (const JournalWriteError& e) {
    errno = e.code;
    give_up("write");
  }
  if (::fsync(t) != 0) give_up("fsync");
  ::close(t);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail_write(path_, "rename");
  }
  sync_dir(path_);
  ::close(fd_);
  fd_ = -1;
  open_for_append();
}

}  // namespace sy
