// The journal's record codec: accept, result and delivered records as maps with named fields, so
// a later version can add fields and still read older journals (docs/durability.md). The encoding
// (msgpack) stays behind this header.
#pragma once

#include <cstdint>
#include <string>

#include "core/job.hpp"

namespace sy::journal {

/// The `t` field of every record.
enum class RecordKind : char { accept = 'A', result = 'R', delivered = 'D', step = 'S' };

/// One decoded record: `job` for accept records, `outcome` for result records.
struct Record {
  RecordKind kind = RecordKind::delivered;
  uint64_t uid = 0;
  Job job;
  int64_t deadline_wall_us = 0;  ///< accept: the job's deadline in wall-clock µs; 0: none
  JobOutcome outcome;
  std::string path, output;  ///< step: a program step's path and output
};

/// An accept record for `job`. Its steady-clock times mean nothing after a restart, so they are
/// not written; a deadline travels as `deadline_wall_us` (wall-clock µs, 0: none).
std::string encode_accept(const Job& job, int64_t deadline_wall_us);
/// A result record; only the event that ended the job (its error, else its done) is kept.
std::string encode_result(const JobOutcome& outcome);
/// A program step's output (its program's uid, the step's path).
std::string encode_step(const ProgramStep& step);
/// A delivered mark: the job's pipeline result reached the results socket.
std::string encode_delivered(uint64_t uid);

/// Decodes one record payload; absent fields keep their defaults (older records). Throws
/// std::runtime_error naming what is wrong with a payload it cannot read.
Record decode(const std::string& payload);

}  // namespace sy::journal
