// Pieces of `switchyard submit` shared by its two transports: the server's ZeroMQ request
// endpoint (submit.cpp) and a cluster's NATS JetStream queue (submit_nats.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "core/wire.hpp"

namespace sy::cli {

/// Flags (options without a value) of `submit`.
extern const std::vector<std::string> kSubmitFlags;

/// Exit status of `submit --nats` when the cluster refused a publish because SWITCHYARD_JOBS is
/// full (its "overloaded"): the jobs before it are queued, the rest are not; a rerun resumes.
inline constexpr int kExitOverloaded = 3;

/// One result line of the output file: a done ({"id", "text", "ids", "finish_reason", "usage",
/// "timings"}, and a program's "vars" and "steps") or an error ({"id", "error": {"code",
/// "message"}}).
std::string done_line(const wire::Done& d);
std::string error_line(const std::string& id, const wire::Error& e);
/// A duration for people: "42s", "3m07s", "1h02m03s"; "?" when unknown.
std::string duration(double seconds);
/// The progress line: a bar of `finished` out of `total`, tokens/s, jobs/s, the ETA of `left`
/// jobs, in flight and failed counts.
std::string progress_text(std::size_t finished, std::size_t total, double seconds,
                          std::uint64_t tokens, double jobs_per_s, std::size_t left, bool final,
                          std::size_t in_flight, std::size_t failed);

/// What `submit` hands the NATS path once the input is read and checked.
struct NatsBatch {
  std::vector<wire::Submit> todo;  ///< jobs not yet in the output, in input order
  std::size_t total = 0;           ///< jobs in the input
  std::size_t skipped = 0;         ///< of them already in the output
  std::string in_path, out_path;   ///< out_path "" with --no-wait and no --output
  long long window = 64;           ///< published and not yet answered, at most
};

/// Publishes the batch to the cluster at --nats and, unless --no-wait, writes every result to
/// the output as the ZeroMQ path does. Returns the exit status (0, 1, kExitOverloaded).
int submit_over_nats(const Args& a, NatsBatch batch);
/// `submit --nats URL --cancel ID...`: publishes a cancel of each (tenant, ID) to
/// switchyard.cancel. Returns 0.
int cancel_over_nats(const Args& a);
/// The NATS server URLs of --nats (repeatable, or comma-separated).
std::vector<std::string> nats_urls(const Args& a);

}  // namespace sy::cli
