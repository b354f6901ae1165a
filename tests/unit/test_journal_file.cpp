// The journal file format: framing round trip, recovery of a truncated or corrupt tail (with a
// warning), empty and foreign files, the exclusive lock, compaction, and the fsync policies.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "storage/journal_file.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_file)

using namespace sy;

namespace {

void write_all(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

std::vector<std::string> sample_records() {
  std::string binary("\0\1\2\xff record", 12);
  return {"first", "", binary, std::string(100000, 'x'), "last"};
}

// Writes the sample records through JournalFile and returns the path. The file ends where the
// records do (the preallocated zeros after them are cut), so that the damage tests below cut and
// flip the records' own bytes.
std::string make_journal(const test::TempDir& dir) {
  std::string path = dir.file("j.journal");
  uint64_t end = 0;
  {
    JournalScan scan;
    JournalFile f(path, scan);
    for (auto& r : sample_records()) f.append(r);
    f.sync();
    end = f.size();
  }
  std::filesystem::resize_file(path, end);
  return path;
}

}  // namespace

BOOST_AUTO_TEST_CASE(crc32_matches_the_standard_check_value) {
  // The CRC-32 check value of "123456789" (IEEE 802.3) is 0xCBF43926.
  BOOST_TEST(crc32("123456789") == 0xCBF43926u);
  BOOST_TEST(crc32("") == 0u);
  // Continuing a CRC over a split input equals the CRC of the whole.
  BOOST_TEST(crc32("6789", crc32("12345")) == 0xCBF43926u);
}

BOOST_AUTO_TEST_CASE(crc32_matches_a_bit_at_a_time_crc_at_every_length_and_alignment) {
  // The definition, one bit at a time, against the table-driven one (eight bytes a step and a
  // byte-wise tail) for lengths 0..100 at offsets 0..7 of a buffer of varied bytes.
  const auto bitwise = [](std::string_view d) {
    uint32_t c = 0xFFFFFFFFu;
    for (unsigned char b : d) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
  };
  std::string buf;
  for (int i = 0; i < 128; ++i) buf.push_back(static_cast<char>((i * 167 + 13) & 0xFF));
  for (size_t off = 0; off < 8; ++off)
    for (size_t len = 0; len <= 100; ++len) {
      const std::string_view d(buf.data() + off, len);
      BOOST_TEST(crc32(d) == bitwise(d), "offset " << off << " length " << len);
    }
}

BOOST_AUTO_TEST_CASE(records_round_trip) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto scan = scan_journal(path);
  BOOST_TEST(scan.warning.empty());
  BOOST_TEST(scan.records == sample_records());
  BOOST_TEST(scan.good_bytes == scan.file_bytes);
  // Reopening appends after the existing records.
  {
    JournalScan s2;
    JournalFile f(path, s2);
    BOOST_TEST(s2.records.size() == sample_records().size());
    f.append("after reopen");
    f.flush();
  }
  auto again = scan_journal(path);
  BOOST_REQUIRE(again.records.size() == sample_records().size() + 1);
  BOOST_TEST(again.records.back() == "after reopen");
}

BOOST_AUTO_TEST_CASE(the_file_grows_ahead_of_its_records_and_the_zeros_are_no_damage) {
  test::TempDir dir("sy_jf_");
  const std::string path = dir.file("j.journal");
  uint64_t end = 0;
  {
    JournalScan scan;
    JournalFile f(path, scan);
    f.append("one");
    f.sync();
    end = f.size();
  }
  // One step of preallocation: the size on disk changes once per many records, not per sync.
  BOOST_TEST(std::filesystem::file_size(path) == JournalFile::kPreallocBytes);
  auto scan = scan_journal(path);
  BOOST_TEST(scan.warning.empty(), scan.warning);
  BOOST_TEST(scan.records == std::vector<std::string>{"one"});
  BOOST_TEST(scan.good_bytes == end);
  BOOST_TEST(scan.zero_tail == JournalFile::kPreallocBytes - end);
  // Reopened, the journal writes over the zeros, right after its last record; the file grows by
  // another step only when the records outgrow the first.
  {
    JournalScan s2;
    JournalFile f(path, s2);
    BOOST_TEST(s2.warning.empty(), s2.warning);
    BOOST_TEST(f.size() == end);
    f.append("two");
    f.sync();
    BOOST_TEST(std::filesystem::file_size(path) == JournalFile::kPreallocBytes);
    f.append(std::string(JournalFile::kPreallocBytes, 'b'));
    f.sync();
    BOOST_TEST(std::filesystem::file_size(path) == 2 * JournalFile::kPreallocBytes);
  }
  auto again = scan_journal(path);
  BOOST_TEST(again.warning.empty(), again.warning);
  BOOST_REQUIRE(again.records.size() == 3u);
  BOOST_TEST(again.records[1] == "two");
  BOOST_TEST(again.good_bytes + again.zero_tail == again.file_bytes);
}

BOOST_AUTO_TEST_CASE(zeros_in_the_middle_are_not_the_end) {
  // A zero-filled block with records after it (what a crashed file system can leave) does not
  // end the scan: only zeros that run to the end of the file are the preallocated space.
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto data = sy::test::read_file(path);
  const size_t second = journal_header().size() + 8 + sample_records()[0].size();
  data.insert(second, std::string(4096, '\0'));
  data.append(4096, '\0');
  write_all(path, data);
  auto scan = scan_journal(path);
  BOOST_REQUIRE(!scan.records.empty());
  BOOST_TEST(scan.records.front() == "first");
  BOOST_TEST(scan.records.back() == "last");
  BOOST_TEST(scan.records[scan.records.size() - 2] == sample_records()[3]);
  BOOST_TEST(scan.zero_tail == 4096u);
  BOOST_TEST(scan.good_bytes + scan.zero_tail == scan.file_bytes);
}

BOOST_AUTO_TEST_CASE(truncated_mid_record_tail_is_recovered_with_a_warning) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto whole = sy::test::read_file(path);
  // Cut the file in the middle of the last record's payload ("last": 4 bytes).
  std::filesystem::resize_file(path, whole.size() - 2);
  JournalScan scan;
  {
    JournalFile f(path, scan);
    BOOST_TEST(!scan.warning.empty());
    BOOST_TEST(scan.warning.find("cut short") != std::string::npos);
    BOOST_TEST_MESSAGE("warning: " << scan.warning);
    auto expected = sample_records();
    expected.pop_back();
    BOOST_TEST(scan.records == expected);
    // The damaged tail is gone from the file: new records follow the last good one.
    BOOST_TEST(std::filesystem::file_size(path) == scan.good_bytes);
    f.append("new");
    f.sync();
  }
  auto after = scan_journal(path);
  BOOST_TEST(after.warning.empty());
  BOOST_REQUIRE(after.records.size() == sample_records().size());
  BOOST_TEST(after.records.back() == "new");
}

BOOST_AUTO_TEST_CASE(truncated_inside_a_record_header_is_recovered) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto whole = sy::test::read_file(path);
  // Keep 3 of the last record's 8 frame bytes (length + CRC): the record header itself is cut.
  std::filesystem::resize_file(path, whole.size() - 4 - 5);
  auto scan = scan_journal(path);
  BOOST_TEST(scan.warning.find("record header cut short") != std::string::npos);
  BOOST_TEST(scan.records.size() == sample_records().size() - 1);
}

BOOST_AUTO_TEST_CASE(corrupt_crc_of_the_last_record_ends_the_good_part) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto data = sy::test::read_file(path);
  data[data.size() - 1] ^= 0x20;  // one bit of the last record's payload
  write_all(path, data);
  JournalScan scan;
  JournalFile f(path, scan);
  BOOST_TEST(scan.warning.find("CRC mismatch") != std::string::npos);
  BOOST_TEST(scan.records.size() == sample_records().size() - 1);
  BOOST_TEST(std::filesystem::file_size(path) == scan.good_bytes);
}

// Offsets of each sample record's frame in a journal written by make_journal.
std::vector<size_t> frame_offsets() {
  std::vector<size_t> at;
  size_t pos = journal_header().size();
  for (auto& r : sample_records()) {
    at.push_back(pos);
    pos += 8 + r.size();
  }
  return at;
}

BOOST_AUTO_TEST_CASE(a_corrupt_record_in_the_middle_is_skipped_not_the_end_of_the_scan) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto data = sy::test::read_file(path);
  const auto at = frame_offsets();
  data[at[2] + 8 + 3] ^= 0x01;  // one bit of the third record's payload
  write_all(path, data);
  JournalScan scan;
  {
    JournalFile f(path, scan);
    BOOST_TEST_MESSAGE("warning: " << scan.warning);
    auto expected = sample_records();
    expected.erase(expected.begin() + 2);
    BOOST_TEST(scan.records == expected);
    BOOST_TEST(scan.skipped_ranges == 1u);
    BOOST_TEST(scan.skipped_bytes == at[3] - at[2]);
    const std::string range =
        "skipped bytes " + std::to_string(at[2]) + " to " + std::to_string(at[3]);
    BOOST_TEST(scan.warning.find("CRC mismatch at offset " + std::to_string(at[2])) !=
               std::string::npos);
    BOOST_TEST(scan.warning.find(range) != std::string::npos, scan.warning);
    // The end was good: nothing is cut, and appends follow the last record.
    BOOST_TEST(std::filesystem::file_size(path) == data.size());
    f.append("after");
    f.sync();
  }
  auto again = scan_journal(path);
  BOOST_TEST(again.records.size() == sample_records().size());  // 4 old + 1 new
  BOOST_TEST(again.records.back() == "after");
}

BOOST_AUTO_TEST_CASE(a_damaged_length_field_and_two_regions_are_skipped) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto data = sy::test::read_file(path);
  const auto at = frame_offsets();
  // The empty record's length says 5: its 8 frame bytes then read as a bad 5-byte record, and
  // the zero CRC field must not pass for an empty record during the search.
  data[at[1]] = 5;
  data[at[3] + 8 + 50000] = 'y';  // inside the 100,000-byte record
  write_all(path, data);
  auto scan = scan_journal(path);
  BOOST_TEST_MESSAGE("warning: " << scan.warning);
  auto expected = sample_records();
  expected.erase(expected.begin() + 3);
  expected.erase(expected.begin() + 1);
  BOOST_TEST(scan.records == expected);
  BOOST_TEST(scan.skipped_ranges == 2u);
  BOOST_TEST(scan.good_bytes == data.size());
}

BOOST_AUTO_TEST_CASE(a_zero_filled_tail_is_cut_not_read_as_empty_records) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  auto data = sy::test::read_file(path);
  const auto at = frame_offsets();
  // The last record's length field damaged, followed by a zero-filled block.
  data[at[4]] = 0x7f;
  data += std::string(4096, '\0');
  write_all(path, data);
  auto scan = scan_journal(path);
  BOOST_TEST(scan.records.size() == sample_records().size() - 1);
  BOOST_TEST(scan.skipped_ranges == 0u);
  BOOST_TEST(scan.good_bytes == at[4]);
  BOOST_TEST(scan.warning.find("dropping the last") != std::string::npos, scan.warning);
}

BOOST_AUTO_TEST_CASE(absurd_length_is_damage_not_an_allocation) {
  test::TempDir dir("sy_jf_");
  std::string data(journal_header());
  frame_record(data, "good");
  data += std::string("\xff\xff\xff\x7f\0\0\0\0", 8);  // length 2 GiB
  write_all(dir.file("j"), data);
  auto scan = scan_journal(dir.file("j"));
  BOOST_TEST(scan.records.size() == 1u);
  BOOST_TEST(scan.warning.find("beyond the limit") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(empty_missing_and_partial_header_files) {
  test::TempDir dir("sy_jf_");
  // Missing: an empty journal, no warning.
  auto missing = scan_journal(dir.file("none"));
  BOOST_TEST(missing.records.empty());
  BOOST_TEST(missing.warning.empty());
  // Empty file: the same; opening it writes the header.
  write_all(dir.file("empty"), "");
  auto empty = scan_journal(dir.file("empty"));
  BOOST_TEST(empty.records.empty());
  BOOST_TEST(empty.warning.empty());
  {
    JournalScan s;
    JournalFile f(dir.file("empty"), s);
    BOOST_TEST(s.records.empty());
  }
  // The header, then the preallocated zeros.
  const std::string written = sy::test::read_file(dir.file("empty"));
  BOOST_TEST(written.substr(0, journal_header().size()) == std::string(journal_header()));
  BOOST_TEST(written.find_first_not_of('\0', journal_header().size()) == std::string::npos);
  // A crash while writing the header: treated as empty, with a warning, and repaired.
  write_all(dir.file("partial"), std::string(journal_header().substr(0, 3)));
  JournalScan s;
  {
    JournalFile f(dir.file("partial"), s);
    f.append("x");
    f.flush();
  }
  BOOST_TEST(!s.warning.empty());
  BOOST_TEST(scan_journal(dir.file("partial")).records == std::vector<std::string>{"x"});
}

BOOST_AUTO_TEST_CASE(a_foreign_file_is_refused_not_cut) {
  test::TempDir dir("sy_jf_");
  write_all(dir.file("config.yaml"), "model: stories260K.gguf\nendpoints: {}\n");
  BOOST_CHECK_THROW(scan_journal(dir.file("config.yaml")), std::runtime_error);
  JournalScan s;
  BOOST_CHECK_THROW(JournalFile(dir.file("config.yaml"), s), std::runtime_error);
  BOOST_TEST(sy::test::read_file(dir.file("config.yaml")).find("model:") == 0u);
}

// True when opening `path` again is refused with the in-use message naming this process.
static bool refused_as_in_use(const std::string& path) {
  JournalScan s;
  try {
    JournalFile second(path, s);
  } catch (const std::runtime_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    const std::string want =
        "journal " + path + " is in use by another server (pid " + std::to_string(::getpid()) + ")";
    return std::string(e.what()).find(want) != std::string::npos;
  }
  return false;
}

BOOST_AUTO_TEST_CASE(a_second_writer_is_locked_out_and_told_the_holder) {
  test::TempDir dir("sy_jf_");
  JournalScan s1;
  {
    JournalFile first(dir.file("j"), s1);
    BOOST_TEST(refused_as_in_use(dir.file("j")));
    // Compaction renames a new file over the journal: the lock must not go with the old one.
    first.rewrite({"a"});
    BOOST_TEST(refused_as_in_use(dir.file("j")));
  }
  // Released with its owner: the next one opens it (the lock file stays behind, harmlessly).
  BOOST_TEST(std::filesystem::exists(JournalFile::lock_path(dir.file("j"))));
  JournalFile again(dir.file("j"), s1);
  BOOST_TEST(s1.records == std::vector<std::string>{"a"});
}

BOOST_AUTO_TEST_CASE(a_refused_open_does_not_keep_the_lock) {
  test::TempDir dir("sy_jf_");
  write_all(dir.file("foreign"), "not a journal at all");
  JournalScan s;
  BOOST_CHECK_THROW(JournalFile(dir.file("foreign"), s), std::runtime_error);
  // Had the failed constructor kept its lock, this would say "in use" instead of "not a journal".
  try {
    JournalFile(dir.file("foreign"), s);
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("not a Switchyard journal") != std::string::npos,
               e.what());
  }
}

BOOST_AUTO_TEST_CASE(missing_folders_are_made_private) {
  test::TempDir dir("sy_jf_");
  const std::string path = dir.path() + "/state/server/j.journal";
  JournalScan s;
  JournalFile f(path, s);
  for (auto* d : {"/state", "/state/server"}) {
    auto perms = std::filesystem::status(dir.path() + d).permissions();
    BOOST_TEST(((perms & std::filesystem::perms::all) == std::filesystem::perms::owner_all), d);
  }
}

BOOST_AUTO_TEST_CASE(rewrite_replaces_the_records_and_keeps_appending) {
  test::TempDir dir("sy_jf_");
  auto path = make_journal(dir);
  JournalScan s;
  JournalFile f(path, s);
  f.rewrite({"kept 1", "kept 2"});
  f.append("appended");
  f.sync();
  BOOST_TEST(scan_journal(path).records ==
             (std::vector<std::string>{"kept 1", "kept 2", "appended"}));
  BOOST_TEST(!std::filesystem::exists(path + ".tmp"));
}

BOOST_AUTO_TEST_CASE(fsync_policies_parse_and_group_commit_syncs_less) {
  BOOST_TEST((parse_fsync_policy("always") == FsyncPolicy::always));
  BOOST_TEST((parse_fsync_policy("batch") == FsyncPolicy::batch));
  BOOST_TEST((parse_fsync_policy("never") == FsyncPolicy::never));
  BOOST_TEST(!parse_fsync_policy("sometimes"));
  BOOST_TEST(std::string(to_string(FsyncPolicy::batch)) == "batch");

  // The three ways the journal actor drives the file, over the same 400 job-sized records:
  // always = one fdatasync per record; batch = one per group of 50; never = write(2) only.
  test::TempDir dir("sy_jf_");
  const int n = 400, group = 50;
  const std::string rec(300, 'j');  // about an accept record of a short prompt
  double per_s[3] = {0, 0, 0};
  uint64_t syncs[3] = {0, 0, 0};
  for (int mode = 0; mode < 3; ++mode) {
    std::string path = dir.file("p" + std::to_string(mode));
    JournalScan s;
    JournalFile f(path, s);
    uint64_t base = f.syncs();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      f.append(rec);
      if (mode == 0)
        f.sync();
      else if (mode == 1 && (i + 1) % group == 0)
        f.sync();
      else
        f.flush();
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    per_s[mode] = n / std::max(secs, 1e-9);
    syncs[mode] = f.syncs() - base;
    BOOST_TEST(scan_journal(path).records.size() == static_cast<size_t>(n));
  }
  BOOST_TEST(syncs[0] == static_cast<uint64_t>(n));
  BOOST_TEST(syncs[1] == static_cast<uint64_t>(n / group));
  BOOST_TEST(syncs[2] == 0u);
  BOOST_TEST_MESSAGE("records/s: always " << per_s[0] << ", batch(" << group << ") " << per_s[1]
                                          << ", never " << per_s[2]);
}

BOOST_AUTO_TEST_SUITE_END()  // test_journal_file
