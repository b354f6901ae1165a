// A full disk for unit tests: while a FullDisk lives, every file this process writes stops at a
// size limit (RLIMIT_FSIZE), so real writes fail part-way as they do on a full file system.
#pragma once

#include <signal.h>
#include <sys/resource.h>

#include <cstdint>

namespace sy::test {

/// Limits the size of every file this process writes to `bytes` for its lifetime. Writes past it
/// fail with EFBIG (SIGXFSZ, which would kill the process, is ignored meanwhile). Checks that
/// print go after its scope: the test log may be a file too.
class FullDisk {
 public:
  explicit FullDisk(uint64_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit r = old_;
    r.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &r) == 0;
  }
  ~FullDisk() { lift(); }
  FullDisk(const FullDisk&) = delete;
  FullDisk& operator=(const FullDisk&) = delete;
  /// Frees the space again.
  void lift() {
    if (lifted_) return;
    lifted_ = true;
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false, lifted_ = false;
};

}  // namespace sy::test
