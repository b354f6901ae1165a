// The journal file on a disk that refuses writes: a refused write leaves nothing behind (no torn
// record, no refused record written later, no growing buffer), and a compaction that cannot be
// written leaves no PATH.tmp. The full disk is this process's file-size limit (RLIMIT_FSIZE),
// which refuses writes past it with EFBIG and takes a partial prefix of a write across it, as a
// full file system does with ENOSPC.
#include <signal.h>
#include <sys/resource.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "actors/journal.hpp"
#include "storage/journal_file.hpp"
#include "tests/support/full_disk.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_full_disk)

using namespace sy;

namespace {

using test::FullDisk;

uint64_t file_size(const std::string& path) {
  return std::filesystem::file_size(path);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_refused_write_is_cut_back_and_never_written_later) {
  test::TempDir dir("sy_jfull_");
  const std::string path = dir.file("j.journal");
  JournalScan scan;
  JournalFile f(path, scan);
  f.append("accepted before the disk filled");
  f.sync();
  // Where the records end (the file goes on with preallocated zeros, which a full disk still
  // takes: the limit is put at the records' end).
  const uint64_t good = f.size();
  bool refused = false, refused_again = false;
  int code = 0;
  uint64_t size_after_refusal = 0, size_in_object = 0;
  {
    // Room for the start of the next record only: the write takes a partial prefix, then fails.
    FullDisk full(good + 20);
    BOOST_REQUIRE(full.ok());
    f.append(std::string(200, 'r'));  // refused: must leave no trace
    try {
      f.flush();
    } catch (const JournalWriteError& e) {
      refused = true;
      code = e.code;
    }
    size_after_refusal = file_size(path);
    // A second refused record, as the next submit during the full period brings.
    f.append(std::string(300, 's'));
    try {
      f.sync();
    } catch (const JournalWriteError&) {
      refused_again = true;
    }
    size_in_object = f.size();
  }
  BOOST_TEST(refused);
  BOOST_TEST(refused_again);
  BOOST_TEST(code == EFBIG);
  // Cut back to the last good record: no partial prefix mid-file, and no buffered copy either.
  BOOST_TEST(size_after_refusal == good);
  BOOST_TEST(size_in_object == good);
  // Room again: the next record follows the last good one, and the refused ones never appear.
  f.append("accepted after space came back");
  f.sync();
  auto after = scan_journal(path);
  BOOST_TEST(after.warning.empty(), after.warning);
  BOOST_TEST(after.good_bytes + after.zero_tail == after.file_bytes);
  BOOST_TEST(after.records == (std::vector<std::string>{"accepted before the disk filled",
                                                        "accepted after space came back"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(refused_writes_do_not_grow_the_buffer) {
  // Every refused record is dropped with its write: a thousand refusals of a 4 KiB record leave
  // the object as big as before (the old buffer kept them all and rewrote them at every try).
  test::TempDir dir("sy_jfull_");
  const std::string path = dir.file("j.journal");
  JournalScan scan;
  JournalFile f(path, scan);
  f.sync();
  const uint64_t good = f.size();
  uint64_t refusals = 0, biggest = 0;
  {
    FullDisk full(good);
    BOOST_REQUIRE(full.ok());
    for (int i = 0; i < 1000; ++i) {
      f.append(std::string(4096, 'x'));
      try {
        f.flush();
      } catch (const JournalWriteError&) {
        ++refusals;
      }
      biggest = std::max(biggest, f.size());
    }
  }
  BOOST_TEST(refusals == 1000u);
  BOOST_TEST(biggest == good);
  BOOST_TEST(file_size(path) == good);
}

BOOST_AUTO_TEST_CASE(a_compaction_on_a_full_disk_leaves_no_tmp_and_keeps_the_journal) {
  test::TempDir dir("sy_jfull_");
  const std::string path = dir.file("j.journal");
  JournalScan scan;
  JournalFile f(path, scan);
  f.append("one");
  f.append("two");
  f.sync();
  bool refused = false;
  {
    // The new file needs 8 + 8 + 9000 bytes; 8 KiB fit (a page: what a full disk leaves).
    FullDisk full(8192);
    BOOST_REQUIRE(full.ok());
    try {
      f.rewrite({std::string(9000, 'c')});
    } catch (const JournalWriteError&) {
      refused = true;
    }
  }
  BOOST_TEST(refused);
  BOOST_TEST(!std::filesystem::exists(path + ".tmp"));
  // The old journal stays in use.
  f.append("three");
  f.sync();
  auto s = scan_journal(path);
  BOOST_TEST(s.warning.empty(), s.warning);
  BOOST_TEST(s.records == (std::vector<std::string>{"one", "two", "three"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_restart_on_a_full_disk_starts_on_the_journal_as_it_is) {
  // The start-up compaction cannot be written: no PATH.tmp is left, the server gets a journal
  // that replays the same state, and a warning says why it is not compacted.
  test::TempDir dir("sy_jfull_");
  const std::string path = dir.file("j.journal");
  Job job;
  job.uid = 7;
  job.id = std::string("pending");
  job.tenant = std::string("t");
  // About 6 KB: the compacted file is bigger than the limit below, which the old file already
  // exceeds (a limit refuses writes past it, not reads, like a disk that filled since).
  job.prompt = std::vector<int32_t>(6000, 5);
  {
    JournalScan scan;
    JournalFile f(path, scan);
    f.append(encode_accept(job));
    f.append(encode_delivered(99));  // dead: compaction would drop it
    f.sync();
  }
  JournalConfig cfg;
  cfg.path = path;
  JournalReplay replay;
  std::shared_ptr<JournalFile> file;
  std::string error;
  {
    FullDisk full(4096);
    BOOST_REQUIRE(full.ok());
    try {
      file = open_journal(cfg, 16, replay);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  BOOST_TEST(error.empty(), error);
  BOOST_REQUIRE(file);
  BOOST_TEST(!std::filesystem::exists(path + ".tmp"));
  BOOST_TEST(replay.warning.find("uncompacted") != std::string::npos, replay.warning);
  BOOST_REQUIRE(replay.pending.size() == 1u);
  BOOST_TEST(replay.pending[0].id == "pending");
  file.reset();
  JournalReplay again;
  auto reopened = open_journal(cfg, 16, again);
  BOOST_TEST(again.pending.size() == 1u);
  BOOST_TEST(again.warning.empty(), again.warning);
}

BOOST_AUTO_TEST_SUITE_END()  // test_journal_full_disk
