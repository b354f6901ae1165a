// The journal file format (see journal_file.hpp): header, then records framed as
// [u32 length LE][u32 CRC32 LE of the payload][payload]; scanning stops at the first bad record.
#include "policies/journal_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
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

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
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

void write_all(int fd, const std::string& path, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, "write");
    }
    p += w;
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

}  // namespace

std::optional<FsyncPolicy> parse_fsync_policy(std::string_view text) {
  if (text == "always") return FsyncPolicy::always;
  if (text == "batch") return FsyncPolicy::batch;
  if (text == "never") return FsyncPolicy::never;
  return std::nullopt;
}

const char* to_string(FsyncPolicy p) {
  switch (p) {
    case FsyncPolicy::always: return "always";
    case FsyncPolicy::batch: return "batch";
    case FsyncPolicy::never: return "never";
  }
  return "batch";
}

uint32_t crc32(std::string_view data, uint32_t crc) {
  static const auto table = make_crc_table();
  crc = ~crc;
  for (unsigned char b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::string_view journal_header() { return {kHeader, sizeof kHeader}; }

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
  while (pos < data.size()) {
    std::string why;
    if (data.size() - pos < kFrameBytes) {
      why = "record header cut short";
    } else {
      uint32_t len = get_u32(data.data() + pos);
      uint32_t crc = get_u32(data.data() + pos + 4);
      if (len > JournalFile::kMaxRecordBytes) {
        why = "record length " + std::to_string(len) + " beyond the limit";
      } else if (data.size() - pos - kFrameBytes < len) {
        why = "record of " + std::to_string(len) + " bytes cut short at " +
              std::to_string(data.size() - pos - kFrameBytes);
      } else {
        std::string_view payload(data.data() + pos + kFrameBytes, len);
        if (crc32(payload) != crc) {
          why = "record CRC mismatch";
        } else {
          s.records.emplace_back(payload);
          pos += kFrameBytes + len;
          s.good_bytes = pos;
          continue;
        }
      }
    }
    s.warning = "journal " + path + ": " + why + " at offset " + std::to_string(pos) +
                "; recovered " + std::to_string(s.records.size()) + " records, dropping the last " +
                std::to_string(data.size() - pos) + " bytes";
    break;
  }
  return s;
}

JournalFile::JournalFile(const std::string& path, JournalScan& scan) : path_(path) {
  auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  scan = scan_journal(path);
  open_for_append();
  if (scan.good_bytes < scan.file_bytes || scan.file_bytes < sizeof kHeader) {
    // Cut the damaged tail (or a partial header) so that new records follow the last good one.
    uint64_t keep = scan.good_bytes;
    if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0) fail(path_, "truncate");
    size_ = keep;
    if (keep == 0) {
      buf_.assign(kHeader, sizeof kHeader);
      sync();
      sync_dir(path_);
    } else {
      ::fdatasync(fd_);
    }
  }
}

void JournalFile::open_for_append() {
  // O_APPEND: every write lands at the end, also after a damaged tail was cut off.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) fail(path_, "open");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    ::close(fd_);
    fd_ = -1;
    errno = e;
    fail(path_, "locked by another process (is a second server using this journal?)");
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(path_, "stat");
  size_ = static_cast<uint64_t>(st.st_size);
  if (::lseek(fd_, 0, SEEK_END) < 0) fail(path_, "seek");
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
}

void JournalFile::append(std::string_view payload) {
  if (payload.size() > kMaxRecordBytes)
    throw std::runtime_error("journal " + path_ + ": record of " + std::to_string(payload.size()) +
                             " bytes beyond the limit");
  frame_record(buf_, payload);
}

void JournalFile::flush() {
  if (buf_.empty()) return;
  write_all(fd_, path_, buf_.data(), buf_.size());
  size_ += buf_.size();
  buf_.clear();
}

void JournalFile::sync() {
  flush();
  if (::fdatasync(fd_) != 0) fail(path_, "fdatasync");
  ++syncs_;
}

void JournalFile::rewrite(const std::vector<std::string>& records) {
  flush();
  const std::string tmp = path_ + ".tmp";
  int t = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (t < 0) fail(tmp, "open");
  std::string out(kHeader, sizeof kHeader);
  for (const auto& r : records) frame_record(out, r);
  write_all(t, tmp, out.data(), out.size());
  if (::fsync(t) != 0) fail(tmp, "fsync");
  ::close(t);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) fail(path_, "rename");
  sync_dir(path_);
  ::close(fd_);
  fd_ = -1;
  open_for_append();
}

}  // namespace sy
