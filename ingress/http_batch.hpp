// The OpenAI Batch API as plain code (docs/http.md): files (/v1/files) and batches (/v1/batches)
// kept in a folder so that a batch survives kill -9 with no line run twice and none lost. No
// sockets, threads or actors: the HTTP door calls it on its event loop and runs the lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ingress/openai.hpp"

namespace sy::http_batch {

/// The named limits of the Batch API (docs/http.md).
struct Limits {
  /// One uploaded file: OpenAI's bound on a batch input file.
  uint64_t max_file_bytes = 100ull << 20;
  /// Requests in one batch input file: OpenAI's bound.
  uint32_t max_lines = 50000;
  /// Batches not yet in a final state, all tenants: each holds an open input file, two result
  /// files and its lines' custom_ids in memory.
  uint32_t max_open_batches = 64;
  /// Files kept, all tenants; two are held back for each open batch's output and error files.
  uint32_t max_files = 10000;
  /// Line jobs submitted and not finished, all batches together: the batch work the server holds
  /// at once, so that interactive requests still find room.
  uint32_t max_in_flight = 64;
  /// A custom_id longer than this makes its line a broken line.
  size_t max_custom_id_bytes = 256;
};

/// One input line to run.
struct LineJob {
  std::string batch_id;
  uint32_t line = 0;  ///< its line number in the input file, from 1
  std::string custom_id;
  std::string tenant;
  /// The job id ((tenant, key) is the job key): "<batch id>/<custom_id>" when that fits in 128
  /// bytes, else "<batch id>#<FNV-1a 64 of custom_id, 16 hex>". The same line always gets the
  /// same key, across restarts too.
  std::string key;
  openai::Endpoint endpoint = openai::Endpoint::chat_completions;
  std::string body;  ///< the line's "body" object as JSON text ("" in Hooks::cancel)
};

/// The outcome of a line's job, as the door hands it back.
struct LineResult {
  int status = 200;
  std::string body;  ///< JSON text: the response, or the error body ({"error": {...}})
  std::string request_id;
  int64_t retry_after_ms = -1;  ///< with 429 or 503: when to try again (-1: one second)
};

/// What the store needs from the door; all of it is called on the caller's thread.
struct Hooks {
  /// Runs a line; the door calls Store::finished() later, on the same thread.
  std::function<void(const LineJob&)> submit;
  /// Cancels a submitted line's job (its finished() still comes).
  std::function<void(const LineJob&)> cancel;
  /// Calls the function once after the delay, on the same thread (timers for syncs, retries and
  /// expiry); it may fire after the Store is gone, which then ignores it.
  std::function<void(std::chrono::milliseconds, std::function<void()>)> after;
  /// Wall-clock seconds since the epoch (tests move time); empty: the system clock.
  std::function<int64_t()> now_s;
  /// Runs `work` on a thread of its own, then `done` on the caller's thread: the results'
  /// fdatasync, which can take milliseconds, stays off the door's thread. Empty: both at once.
  std::function<void(std::function<void()> work, std::function<void()> done)> offload;
};

/// An HTTP response: status, content type and body.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

/// The files and batches of all tenants, kept in one folder: dir/files/<id>.jsonl (content)
/// and <id>.json (meta); dir/batches/<id>.json (meta), <id>.out.jsonl and <id>.err.jsonl (the
/// results written so far). Errors are OpenAI's error bodies; nothing throws on bad input.
class Store {
 public:
  /// `dir` is the folder it owns (created 0700 when missing).
  Store(std::string dir, Limits limits, Hooks hooks);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Reads what is on disk and resumes the batches that were running: their finished lines are
  /// kept, the others submitted again with the same keys. Call once, before serving.
  void recover();

  /// POST /v1/files: purpose must be "batch"; the content is kept as it is.
  Reply upload(const std::string& tenant, const std::string& purpose, const std::string& filename,
               std::string content);
  /// GET /v1/files/{id}: the file object (404 for an unknown id or another tenant's).
  Reply file(const std::string& tenant, const std::string& id) const;
  /// GET /v1/files/{id}/content: the bytes, as application/jsonl.
  Reply file_content(const std::string& tenant, const std::string& id) const;
  /// DELETE /v1/files/{id} (409 while an open batch reads it).
  Reply delete_file(const std::string& tenant, const std::string& id);
  /// GET /v1/files: the tenant's files, newest first.
  Reply list_files(const std::string& tenant) const;

  /// POST /v1/batches: validates the input file at once and answers the batch in_progress, or
  /// failed (duplicate custom_ids); 429 when max_open_batches are open.
  Reply create_batch(const std::string& tenant, std::string_view body_json);
  /// GET /v1/batches/{id}.
  Reply batch(const std::string& tenant, const std::string& id) const;
  /// GET /v1/batches?after=&limit=: newest first; limit 0 is 20, more than 100 is 100.
  Reply list_batches(const std::string& tenant, const std::string& after, uint32_t limit) const;
  /// POST /v1/batches/{id}/cancel: cancelling (then cancelled once nothing is in flight); a
  /// completed, failed or expired batch is a 409.
  Reply cancel_batch(const std::string& tenant, const std::string& id);

  /// A submitted line's outcome. 429 and 503 are tried again later; a result for a line that is
  /// not in flight (already written, or of a batch that ended) is ignored.
  void finished(const LineJob& job, const LineResult& result);

  /// Counters since construction (lines_done counts every outcome written, lines_failed those
  /// that went to an error file among them).
  struct Stats {
    uint64_t batches_open = 0, lines_in_flight = 0, lines_done = 0, lines_failed = 0,
             lines_retried = 0;
  };
  /// The counters now.
  Stats stats() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared so that timers can hold a weak reference
};

/// One part of a multipart/form-data body.
struct Part {
  std::string name, filename, content_type, data;
};

/// multipart/form-data parsing for POST /v1/files: the parts (name, filename, content) or an
/// error naming the problem; bounded (part count, header bytes).
std::variant<std::vector<Part>, std::string> parse_multipart(std::string_view content_type_header,
                                                             std::string_view body);

}  // namespace sy::http_batch
