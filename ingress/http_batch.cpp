// The Batch API (http_batch.hpp): files and batches kept in one folder, lines handed to the
// door's hooks round-robin, results appended and synced in groups, all of it resumed by recover().
#include "ingress/http_batch.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <unordered_map>
#include <unordered_set>

namespace sy::http_batch {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Results wait at most this long for their fdatasync: one sync covers a group of lines, and a
// crash loses at most the last group's records, whose lines then run again under the same keys.
constexpr std::chrono::milliseconds kSyncDelay{20};
// ...or until this many lines wait: a burst of results does not pile up unsynced.
constexpr size_t kSyncLines = 64;
// A 429 or 503 without a hint is tried again after a second; a hint beyond a minute is not
// followed, since the line would hold its batch back that long (expiry still bounds the retries).
constexpr int64_t kDefaultRetryMs = 1000, kMaxRetryMs = 60000;
// A job id is at most 128 bytes (the key admission journals); longer ones are hashed.
constexpr size_t kMaxKeyBytes = 128;
// JSON nested deeper than this is refused before parsing: nlohmann's dump recurses, and the
// request bodies OpenAI's endpoints take are a few levels deep.
constexpr int kMaxJsonDepth = 64;
// OpenAI's bounds on metadata: 16 pairs, keys of at most 64 characters, values of at most 512.
constexpr size_t kMaxMetadataPairs = 16, kMaxMetadataKey = 64, kMaxMetadataValue = 512;
// completion_window "<N>h": OpenAI takes only "24h"; up to a week is accepted here, so that an
// offline queue can be given longer without the batch holding its files forever.
constexpr int64_t kMaxWindowHours = 168;
// A failed batch's errors.data names at most this many lines: enough to find the problem, and
// the batch object stays small.
constexpr size_t kMaxErrorsListed = 16;
// A file name longer than most file systems allow is refused (it is only echoed, never a path).
constexpr size_t kMaxFilenameBytes = 255;
// Final batches are kept for GET and listing; past this many the oldest final one is forgotten,
// so the folder and the map stay bounded.
constexpr size_t kMaxBatchesKept = 10000;
// list limits: OpenAI's default and maximum page.
constexpr uint32_t kDefaultListLimit = 20, kMaxListLimit = 100;
// multipart: POST /v1/files sends two parts (file, purpose); a few more fields are tolerated.
constexpr size_t kMaxParts = 16;
// One part's header block; a part's data is bounded only by the body, which the door bounds.
constexpr size_t kMaxPartHeaderBytes = 8192;
// RFC 2046: a boundary is 1 to 70 characters.
constexpr size_t kMaxBoundaryBytes = 70;

// The batch object's timestamps, in the order of kTimeNames.
enum Time { created, in_progress, expires, finalizing, completed, failed, expired, cancelling };
constexpr int kTimes = 9;  // cancelled_at, the last
constexpr Time cancelled = Time(8);
constexpr const char* kTimeNames[kTimes] = {"created_at",    "in_progress_at", "expires_at",
                                            "finalizing_at", "completed_at",   "failed_at",
                                            "expired_at",    "cancelling_at",  "cancelled_at"};

enum class LineState : uint8_t { pending, in_flight, waiting, done };

/// A runnable input line: where it is in the input file (its body is read again at submit, so
/// an open batch holds offsets, not up to max_file_bytes of bodies).
struct Line {
  uint32_t number = 0;  // from 1
  uint64_t offset = 0;
  uint32_t length = 0;
  std::string custom_id;
  LineState state = LineState::pending;
};

/// What an open batch needs while it runs; gone once it is final.
struct Run {
  std::vector<Line> lines;    // file order
  size_t next = 0, done = 0;  // next line never submitted; lines with an outcome written
  std::deque<size_t> ready;   // lines whose retry delay has passed: they go first
  uint32_t in_flight = 0;
  std::string ending;               // "cancelled" or "expired" once the batch is being ended
  bool dirty = false;               // results written and not yet synced
  int in = -1, out = -1, err = -1;  // the input file, the output and error results

  Run() = default;
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  ~Run() {
    for (int fd : {in, out, err})
      if (fd >= 0) ::close(fd);
  }
};

/// A batch's meta file: the batch object's fields and the store's own.
struct BatchMeta {
  std::string id, tenant, input_file_id, endpoint, window, status;
  std::array<int64_t, kTimes> t = {-1, -1, -1, -1, -1, -1, -1, -1, -1};  // -1: null
  json metadata, errors;
  uint64_t seq = 0;  // creation order, for listing
  uint32_t total = 0, completed = 0, failed = 0;
  // The result files' ids, chosen when the batch ends and kept with `closing` (the final status
  // it is reaching) in the meta, so that a crash while publishing is finished by recover().
  std::string out_fid, err_fid, closing;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BatchMeta, id, tenant, input_file_id, endpoint, window, status,
                                   t, metadata, errors, seq, total, completed, failed, out_fid,
                                   err_fid, closing)

struct Batch : BatchMeta {
  openai::Endpoint ep = openai::Endpoint::chat_completions;
  std::unique_ptr<Run> run;  // open batches only
};

/// A file's meta file.
struct FileMeta {
  std::string id, tenant, purpose, filename;
  uint64_t bytes = 0;
  int64_t created_at = 0;
  uint64_t seq = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(FileMeta, id, tenant, purpose, filename, bytes, created_at, seq)

bool is_final(const std::string& s) {
  return s == "completed" || s == "failed" || s == "expired" || s == "cancelled";
}

// Ids become file names: only letters, digits, '-' and '_' (a damaged meta cannot name a path).
bool safe_id(const std::string& id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

std::string text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// False when brackets nest deeper than kMaxJsonDepth (strings skipped), so parse and dump stay
// shallow whatever a line holds.
bool depth_ok(std::string_view s) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      in_str = esc || c != '"';
      esc = !esc && c == '\\';
    } else if (c == '"') {
      in_str = true;
    } else if ((c == '[' || c == '{') && ++depth > kMaxJsonDepth) {
      return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// A parsed value, or a discarded one for bad or too deeply nested JSON; never throws.
json parse_json(std::string_view s) {
  if (!depth_ok(s)) return json(json::value_t::discarded);
  return json::parse(s, nullptr, false);
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The job id of a line: readable when it fits, else the custom_id hashed (batch ids hold
// neither '/' nor '#', so the two forms never meet; two long custom_ids of one batch share a
// key only on a 64-bit hash collision).
std::string job_key(const std::string& batch_id, const std::string& custom_id) {
  std::string key = batch_id + "/" + custom_id;
  if (key.size() <= kMaxKeyBytes) return key;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(custom_id)));
  return batch_id + "#" + hex;
}

bool write_all(int fd, std::string_view d) {
  while (!d.empty()) {
    ssize_t n = ::write(fd, d.data(), d.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    d.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

// Writes `path` whole or not at all: a temporary beside it, synced, renamed over it, and the
// folder synced, so a crash leaves the old content or the new, never a part.
bool write_atomic(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = write_all(fd, data) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  return sync_dir(fs::path(path).parent_path().string());
}

bool exists(const std::string& path) {
  std::error_code ec;  // an unreadable folder reads as "absent": recover() then rebuilds less
  return fs::exists(path, ec);
}

std::optional<std::string> read_whole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

Reply error_reply(int status, std::string message, std::string param = "", std::string code = "",
                  std::string type = "invalid_request_error") {
  openai::ApiError e{status, std::move(message), std::move(type), std::move(param),
                     std::move(code)};
  return {status, "application/json", openai::error_body(e)};
}
Reply bad(std::string message, std::string param, std::string code = "") {
  return error_reply(400, std::move(message), std::move(param), std::move(code));
}
Reply not_found(const char* what, const std::string& id, const char* param) {
  return error_reply(404, std::string("No such ") + what + " object: " + id, param);
}
Reply storage_error() {
  return error_reply(500, "the server could not write its storage", "", "storage_error",
                     "server_error");
}
Reply json_reply(const json& j) {
  return {200, "application/json", text(j)};
}

// A list object: the page's objects, its first and last ids, and whether more follow.
template <class T, class Object>
Reply list_reply(const std::vector<const T*>& page, Object object, bool has_more) {
  json data = json::array();
  for (const T* x : page) data.push_back(object(*x));
  return json_reply({{"object", "list"},
                     {"data", data},
                     {"first_id", page.empty() ? json() : json(page.front()->id)},
                     {"last_id", page.empty() ? json() : json(page.back()->id)},
                     {"has_more", has_more}});
}

json file_object(const FileMeta& f) {
  return {{"id", f.id},
          {"object", "file"},
          {"bytes", f.bytes},
          {"created_at", f.created_at},
          {"filename", f.filename},
          {"purpose", f.purpose},
          {"status", "processed"}};
}

// A meta file read back: nullopt when it does not parse or its ids could not be file names.
template <class T>
std::optional<T> meta_from(const std::string& path) {
  try {
    T m = parse_json(read_whole(path).value_or("")).get<T>();
    if (safe_id(m.id)) return m;
  } catch (const json::exception&) {
  }
  return std::nullopt;
}

json batch_object(const Batch& b) {
  const bool final = is_final(b.status);
  auto fid = [&](const std::string& id) { return final && !id.empty() ? json(id) : json(); };
  json j = {
      {"id", b.id},
      {"object", "batch"},
      {"endpoint", b.endpoint},
      {"errors", b.errors},
      {"input_file_id", b.input_file_id},
      {"completion_window", b.window},
      {"status", b.status},
      {"output_file_id", fid(b.out_fid)},
      {"error_file_id", fid(b.err_fid)},
      {"request_counts", {{"total", b.total}, {"completed", b.completed}, {"failed", b.failed}}},
      {"metadata", b.metadata}};
  for (int i = 0; i < kTimes; ++i) j[kTimeNames[i]] = b.t[i] < 0 ? json() : json(b.t[i]);
  return j;
}

// A batch read back from its meta; null when the meta is damaged.
std::unique_ptr<Batch> batch_from(const std::string& path) {
  auto m = meta_from<BatchMeta>(path);
  const auto ep = m ? openai::endpoint_from_path(m->endpoint) : std::nullopt;
  if (!ep || (!m->out_fid.empty() && !safe_id(m->out_fid)) ||
      (!m->err_fid.empty() && !safe_id(m->err_fid)) ||
      !(m->closing.empty() || (is_final(m->closing) && m->closing != "failed")))
    return nullptr;
  auto b = std::make_unique<Batch>();
  static_cast<BatchMeta&>(*b) = std::move(*m);
  b->ep = *ep;
  return b;
}

// "<N>h" with N in 1..kMaxWindowHours: N; anything else 0.
int64_t window_hours(const std::string& w) {
  if (w.size() < 2 || w.size() > 4 || w.back() != 'h') return 0;
  int64_t n = 0;
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    if (w[i] < '0' || w[i] > '9') return 0;
    n = n * 10 + (w[i] - '0');
  }
  return n >= 1 && n <= kMaxWindowHours ? n : 0;
}

bool metadata_ok(const json& m) {
  if (!m.is_object() || m.size() > kMaxMetadataPairs) return false;
  for (auto& [k, v] : m.items())
    if (k.size() > kMaxMetadataKey || !v.is_string() ||
        v.get_ref<const std::string&>().size() > kMaxMetadataValue)
      return false;
  return true;
}

/// An input file checked against a batch's endpoint: the runnable lines, the broken ones
/// (custom_id or null, and why), and the errors that fail the whole batch.
struct Scan {
  std::vector<Line> lines;
  std::vector<std::pair<json, std::string>> broken;
  uint32_t total = 0;
  json errors = json::array();
};

void add_error(Scan& s, const char* code, std::string message, const char* param, uint32_t line) {
  if (s.errors.size() < kMaxErrorsListed)
    s.errors.push_back({{"code", code},
                        {"message", std::move(message)},
                        {"param", param ? json(param) : json()},
                        {"line", line ? json(line) : json()}});
}

Scan scan_input(std::string_view content, std::string_view endpoint, const Limits& limits) {
  Scan s;
  std::unordered_map<std::string, uint32_t> seen;  // custom_id → its first line
  uint32_t number = 0;
  for (size_t pos = 0; pos < content.size();) {
    size_t end = std::min(content.find('\n', pos), content.size());
    const std::string_view line = content.substr(pos, end - pos);
    const uint64_t offset = pos;
    pos = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines
    if (++s.total > limits.max_lines) {
      add_error(s, "too_many_requests",
                "the file holds more than " + std::to_string(limits.max_lines) + " requests",
                nullptr, number);
      break;
    }
    json j = parse_json(line);
    json cid;
    std::string why;
    if (!j.is_object()) {
      why = "the line is not a JSON object";
    } else {
      auto is = [&](const char* key, std::string_view want) {
        auto v = j.find(key);
        return v != j.end() && v->is_string() && v->get_ref<const std::string&>() == want;
      };
      auto c = j.find("custom_id");
      auto b = j.find("body");
      if (line.size() > UINT32_MAX)
        why = "the line is longer than 4 GiB";
      else if (c == j.end() || !c->is_string())
        why = "'custom_id' must be a string";
      else if (c->get_ref<const std::string&>().size() > limits.max_custom_id_bytes)
        why = "'custom_id' is longer than " + std::to_string(limits.max_custom_id_bytes) + " bytes";
      else
        cid = *c;
      if (!why.empty()) {
      } else if (!is("method", "POST"))
        why = "'method' must be \"POST\"";
      else if (!is("url", endpoint))
        why = "'url' must be the batch's endpoint, " + std::string(endpoint);
      else if (b == j.end() || !b->is_object())
        why = "'body' must be an object";
    }
    if (cid.is_string()) {
      auto [it, fresh] = seen.emplace(cid.get<std::string>(), number);
      if (!fresh)
        add_error(s, "duplicate_custom_id",
                  "custom_id '" + it->first + "' is on lines " + std::to_string(it->second) +
                      " and " + std::to_string(number),
                  "custom_id", number);
    }
    if (!why.empty())
      s.broken.emplace_back(cid, why + " (line " + std::to_string(number) + ")");
    else
      s.lines.push_back(
          {number, offset, static_cast<uint32_t>(line.size()), cid.get<std::string>(), {}});
  }
  if (s.total == 0) add_error(s, "empty_file", "the input file holds no requests", nullptr, 0);
  return s;
}

// Counts the result lines of `path` and collects their custom_ids; a torn tail (a last line
// without its newline, or a line that does not parse, and all after it) is cut off the file.
uint32_t read_results(const std::string& path, std::unordered_set<std::string>& ids) {
  auto content = read_whole(path);
  if (!content) return 0;
  uint32_t n = 0;
  size_t good = 0;
  while (good < content->size()) {
    const size_t end = content->find('\n', good);
    if (end == std::string::npos) break;
    json j = parse_json(std::string_view(*content).substr(good, end - good));
    if (!j.is_object()) break;
    if (auto c = j.find("custom_id"); c != j.end() && c->is_string())
      ids.insert(c->get<std::string>());
    ++n;
    good = end + 1;
  }
  if (good < content->size()) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(good)) == 0) ::fdatasync(fd);
    if (fd >= 0) ::close(fd);
  }
  return n;
}

}  // namespace

struct Store::Impl : std::enable_shared_from_this<Store::Impl> {
  std::string dir, files_dir, batches_dir;
  Limits limits;
  Hooks hooks;
  std::map<std::string, FileMeta> files;
  std::map<std::string, std::unique_ptr<Batch>> batches;
  std::vector<std::string> ring;  // the open batches, served round-robin from rr
  size_t rr = 0;
  uint64_t in_flight = 0, seq = 0;
  Stats counters;
  std::vector<std::string> dirty;  // batches with results not yet synced
  size_t unsynced = 0;
  bool sync_armed = false, pumping = false, repump = false;
  std::mt19937_64 rng{(uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()};

  std::string file_path(const std::string& id) const { return files_dir + "/" + id + ".jsonl"; }
  std::string file_meta_path(const std::string& id) const { return files_dir + "/" + id + ".json"; }
  std::string meta_path(const std::string& id) const { return batches_dir + "/" + id + ".json"; }
  std::string result_path(const std::string& id, bool err) const {
    return batches_dir + "/" + id + (err ? ".err.jsonl" : ".out.jsonl");
  }

  int64_t now() const {
    if (hooks.now_s) return hooks.now_s();
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  std::string hex(size_t n) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s;
    while (s.size() < n) {
      uint64_t v = rng();
      for (int i = 0; i < 16 && s.size() < n; ++i, v >>= 4) s += digits[v & 15];
    }
    return s;
  }
  // 24 hex digits (96 bits), drawn again in the unlikely case the id is taken.
  std::string new_file_id() {
    for (;;) {
      std::string id = "file-" + hex(24);
      if (!files.count(id) && !exists(file_path(id))) return id;
    }
  }

  // Runs `f` after `d` on the door's thread, unless the store has gone by then.
  void later(std::chrono::milliseconds d, std::function<void(Impl&)> f) {
    if (!hooks.after) return;
    std::weak_ptr<Impl> w = weak_from_this();
    hooks.after(d, [w, f = std::move(f)] {
      if (auto self = w.lock()) f(*self);
    });
  }

  Batch* find_batch(const std::string& tenant, const std::string& id) const {
    auto it = batches.find(id);
    return it != batches.end() && it->second->tenant == tenant ? it->second.get() : nullptr;
  }
  Batch* find_open(const std::string& id) const {
    auto it = batches.find(id);
    return it != batches.end() && it->second->run ? it->second.get() : nullptr;
  }
  const FileMeta* find_file(const std::string& tenant, const std::string& id) const {
    auto it = files.find(id);
    return it != files.end() && it->second.tenant == tenant ? &it->second : nullptr;
  }

  bool write_meta(const Batch& b) {
    return write_atomic(meta_path(b.id), text(json(static_cast<const BatchMeta&>(b))));
  }

  void leave_ring(const std::string& id) {
    auto it = std::find(ring.begin(), ring.end(), id);
    if (it == ring.end()) return;
    if (static_cast<size_t>(it - ring.begin()) < rr) --rr;
    ring.erase(it);
  }

  // --- running ---

  // The job of a line; with its body read back from the input file ("" when it cannot be).
  LineJob make_job(const Batch& b, const Line& l, bool with_body) {
    LineJob job{b.id, l.number, l.custom_id, b.tenant, job_key(b.id, l.custom_id), b.ep, {}};
    if (!with_body) return job;
    std::string raw(l.length, '\0');
    if (::pread(b.run->in, raw.data(), raw.size(), static_cast<off_t>(l.offset)) ==
        static_cast<ssize_t>(raw.size())) {
      json j = parse_json(raw);
      if (j.is_object() && j.contains("body") && j["body"].is_object()) job.body = text(j["body"]);
    }
    return job;
  }

  void remove_results(const std::string& id) {
    std::error_code ec;
    fs::remove(result_path(id, false), ec);
    fs::remove(result_path(id, true), ec);
  }

  bool open_results(Batch& b, bool truncate) {
    const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
    Run& r = *b.run;
    r.in = ::open(file_path(b.input_file_id).c_str(), O_RDONLY | O_CLOEXEC);
    r.out = ::open(result_path(b.id, false).c_str(), flags, 0600);
    r.err = ::open(result_path(b.id, true).c_str(), flags, 0600);
    return r.in >= 0 && r.out >= 0 && r.err >= 0;
  }

  // Appends one result line; it is synced within kSyncDelay or kSyncLines lines.
  bool append(Batch& b, bool err, const json& custom_id, json response, json error) {
    json line = {{"id", "batch_req_" + hex(24)},
                 {"custom_id", custom_id},
                 {"response", std::move(response)},
                 {"error", std::move(error)}};
    Run& r = *b.run;
    if (!write_all(err ? r.err : r.out, text(line) + "\n")) return false;
    ++(err ? b.failed : b.completed);
    ++counters.lines_done;
    if (err) ++counters.lines_failed;
    if (!r.dirty) dirty.push_back(b.id);
    r.dirty = true;
    if (++unsynced >= kSyncLines || !hooks.after) {
      sync_all();
    } else if (!sync_armed) {
      sync_armed = true;
      later(kSyncDelay, [](Impl& s) {
        s.sync_armed = false;
        s.sync_all();
      });
    }
    return true;
  }

  // Syncs the results written since the last sync, on the offload thread where the door has
  // one: each file through a descriptor of its own (dup), so that a batch closing meanwhile
  // does not close it under the sync. A batch whose results cannot be synced fails.
  void sync_all() {
    struct Fds {
      std::string id;
      int out, err;
    };
    auto todo = std::make_shared<std::vector<Fds>>();
    for (const auto& id : std::exchange(dirty, {})) {
      Batch* b = find_open(id);
      if (!b || !b->run->dirty) continue;
      b->run->dirty = false;
      todo->push_back({id, ::dup(b->run->out), ::dup(b->run->err)});
    }
    unsynced = 0;
    if (todo->empty()) return;
    auto broken = std::make_shared<std::vector<std::string>>();
    auto work = [todo, broken] {
      for (const Fds& f : *todo) {
        const bool ok =
            f.out >= 0 && f.err >= 0 && ::fdatasync(f.out) == 0 && ::fdatasync(f.err) == 0;
        if (!ok) broken->push_back(f.id);
        if (f.out >= 0) ::close(f.out);
        if (f.err >= 0) ::close(f.err);
      }
    };
    std::weak_ptr<Impl> w = weak_from_this();
    auto done = [w, broken] {
      auto self = w.lock();
      if (!self) return;
      for (const auto& id : *broken)
        if (Batch* b = self->find_open(id))
          self->fail(*b, "storage_error", "the results could not be synced");
    };
    if (!hooks.offload) {
      work();
      done();
      return;
    }
    hooks.offload(std::move(work), std::move(done));
  }

  // The outcome of a line, to the output file (200) or the error file; false when the batch
  // failed because it could not be written.
  bool record(Batch& b, Line& l, const LineResult& res) {
    json body = parse_json(res.body);
    if (body.is_discarded()) body = res.body;  // kept as text when it is not JSON
    json response = {{"status_code", res.status},
                     {"request_id", res.request_id.empty() ? json() : json(res.request_id)},
                     {"body", body}};
    json error;
    if (res.status != 200) {
      std::string code = "http_" + std::to_string(res.status);
      std::string message = "the request failed with status " + std::to_string(res.status);
      if (body.is_object() && body.contains("error") && body["error"].is_object()) {
        const json& e = body["error"];
        if (e.contains("code") && e["code"].is_string())
          code = e["code"].get<std::string>();
        else if (e.contains("type") && e["type"].is_string())
          code = e["type"].get<std::string>();
        if (e.contains("message") && e["message"].is_string())
          message = e["message"].get<std::string>();
      }
      error = {{"code", code}, {"message", message}};
    }
    l.state = LineState::done;
    ++b.run->done;
    if (append(b, res.status != 200, l.custom_id, std::move(response), std::move(error)))
      return true;
    fail(b, "storage_error", "a result could not be written");
    return false;
  }

  // Hands the batch's next line to the door; false when it has none to hand now.
  bool submit_next(Batch& b) {
    Run& r = *b.run;
    if (!r.ending.empty()) return false;
    size_t idx;
    if (!r.ready.empty()) {
      idx = r.ready.front();
      r.ready.pop_front();
    } else {
      while (r.next < r.lines.size() && r.lines[r.next].state != LineState::pending) ++r.next;
      if (r.next == r.lines.size()) return false;
      idx = r.next++;
    }
    Line& l = r.lines[idx];
    LineJob job = make_job(b, l, true);
    if (job.body.empty()) {  // the input file changed under the batch: it cannot go on
      fail(b, "input_file_unreadable", "a line could not be read back from the input file");
      return false;
    }
    l.state = LineState::in_flight;
    ++r.in_flight;
    ++in_flight;
    if (hooks.submit) hooks.submit(job);
    return true;
  }

  // Fills the free slots, one line per open batch in turn. Reentrant calls (a hook that
  // answers at once) only ask the running loop to go round again.
  void pump() {
    if (pumping) {
      repump = true;
      return;
    }
    pumping = true;
    do {
      repump = false;
      size_t idle = 0;  // batches in a row that had nothing to hand
      while (in_flight < limits.max_in_flight && idle < ring.size()) {
        rr %= ring.size();
        Batch* b = find_open(ring[rr++]);
        if (b && submit_next(*b))
          idle = 0;
        else
          ++idle;
      }
    } while (repump);
    pumping = false;
  }

  void maybe_close(Batch& b) {
    if (!b.run) return;
    Run& r = *b.run;
    if (!r.ending.empty()) {
      if (r.in_flight == 0) close(b, r.ending);
    } else if (r.done == r.lines.size()) {
      close(b, "completed");
    }
  }

  // Stops submitting and cancels the lines in flight; the batch closes once none is.
  void start_ending(Batch& b, const std::string& what) {
    Run& r = *b.run;
    if (!r.ending.empty()) return;
    r.ending = what;
    r.ready.clear();
    std::vector<LineJob> jobs;
    for (auto& l : r.lines) {
      if (l.state == LineState::waiting) l.state = LineState::pending;
      if (l.state == LineState::in_flight) jobs.push_back(make_job(b, l, false));
    }
    const std::string id = b.id;  // a cancel hook that answers at once may close the batch
    for (const auto& j : jobs)
      if (hooks.cancel) hooks.cancel(j);
    if (Batch* open = find_open(id)) maybe_close(*open);
  }

  // Ends a batch with nothing in flight: expired lines written, results synced, the final file
  // ids and the status reached recorded (finalizing), then the files published.
  void close(Batch& b, const std::string& final) {
    Run& r = *b.run;
    if (final == "expired")
      for (auto& l : r.lines)
        if (l.state != LineState::done) {
          l.state = LineState::done;
          json e = {{"code", "batch_expired"},
                    {"message", "the batch expired before this request ran"}};
          if (!append(b, true, l.custom_id, nullptr, std::move(e)))
            return fail(b, "storage_error", "a result could not be written");
          if (!b.run) return;  // a sync on the way failed the batch
        }
    if (::fdatasync(r.out) != 0 || ::fdatasync(r.err) != 0)
      return fail(b, "storage_error", "the results could not be synced");
    r.dirty = false;
    if (b.completed) b.out_fid = new_file_id();
    if (b.failed) b.err_fid = new_file_id();
    if (b.err_fid == b.out_fid) b.err_fid = b.failed ? new_file_id() : "";
    b.closing = final;
    if (final == "completed") {
      b.status = "finalizing";
      b.t[finalizing] = now();
    }
    write_meta(b);
    finish_close(b);
  }

  // Publishes the result files as files of the batch's tenant and writes the final status;
  // every step can be done again, so recover() finishes a close that a crash cut short.
  void finish_close(Batch& b) {
    if (b.run) b.run.reset();  // closes the descriptors
    for (bool err : {false, true}) {
      std::string& fid = err ? b.err_fid : b.out_fid;
      const std::string src = result_path(b.id, err);
      std::error_code ec;
      if (!fid.empty() && !files.count(fid)) {
        const std::string dst = file_path(fid);
        if (!exists(dst)) fs::rename(src, dst, ec);
        sync_dir(files_dir);
        FileMeta m{fid,
                   b.tenant,
                   "batch_output",
                   b.id + (err ? "_error.jsonl" : "_output.jsonl"),
                   fs::file_size(dst, ec),
                   now(),
                   ++seq};
        if (!ec && write_atomic(file_meta_path(fid), text(json(m))))
          files[fid] = m;
        else
          fid.clear();
      }
      fs::remove(src, ec);
    }
    b.status = b.closing;
    b.t[b.status == "completed" ? completed : b.status == "expired" ? expired : cancelled] = now();
    b.closing.clear();
    write_meta(b);
    leave_ring(b.id);
  }

  // A batch that cannot go on: failed with one error, its lines in flight cancelled.
  void fail(Batch& b, const char* code, const char* message) {
    std::vector<LineJob> jobs;
    if (b.run) {
      for (const auto& l : b.run->lines)
        if (l.state == LineState::in_flight) jobs.push_back(make_job(b, l, false));
      in_flight -= b.run->in_flight;
      b.run.reset();
    }
    remove_results(b.id);
    b.status = "failed";
    b.t[failed] = now();
    b.errors = {
        {"object", "list"},
        {"data", {{{"code", code}, {"message", message}, {"param", nullptr}, {"line", nullptr}}}}};
    write_meta(b);
    leave_ring(b.id);
    for (const auto& j : jobs)
      if (hooks.cancel) hooks.cancel(j);
  }

  void arm_expiry(const Batch& b) {
    const int64_t left = std::clamp<int64_t>(b.t[expires] - now(), 0, kMaxWindowHours * 3600);
    later(std::chrono::seconds(left), [id = b.id](Impl& s) {
      Batch* open = s.find_open(id);
      if (!open) return;
      if (s.now() < open->t[expires]) return s.arm_expiry(*open);  // the clock was behind
      s.start_ending(*open, "expired");
    });
  }

  // Makes a batch read from disk run again: its lines from the input file, the ones with a
  // result in its files done, the counts taken from those files.
  bool resume(Batch& b) {
    auto f = files.find(b.input_file_id);
    auto content = f == files.end() ? std::nullopt : read_whole(file_path(b.input_file_id));
    if (!content) {
      fail(b, "input_file_missing", "the batch's input file is gone");
      return false;
    }
    Scan s = scan_input(*content, b.endpoint, limits);
    std::unordered_set<std::string> ids;
    b.total = s.total;
    b.completed = read_results(result_path(b.id, false), ids);
    b.failed = read_results(result_path(b.id, true), ids);
    b.run = std::make_unique<Run>();
    b.run->lines = std::move(s.lines);
    for (auto& l : b.run->lines)
      if (ids.count(l.custom_id)) {
        l.state = LineState::done;
        ++b.run->done;
      }
    ring.push_back(b.id);
    if (!open_results(b, false)) {
      fail(b, "storage_error", "the batch's files could not be opened");
      return false;
    }
    return true;
  }
};

// --- Store ---

Store::Store(std::string dir, Limits limits, Hooks hooks) : impl_(std::make_shared<Impl>()) {
  Impl& s = *impl_;
  s.dir = std::move(dir);
  s.files_dir = s.dir + "/files";
  s.batches_dir = s.dir + "/batches";
  s.limits = limits;
  s.hooks = std::move(hooks);
  for (const auto& d : {s.dir, s.files_dir, s.batches_dir}) {
    std::error_code ec;  // a folder that cannot be made shows as storage errors later
    fs::create_directories(d, ec);
    fs::permissions(d, fs::perms::owner_all, fs::perm_options::replace, ec);
  }
}

Store::~Store() = default;

void Store::recover() {
  Impl& s = *impl_;
  std::error_code ec;
  std::vector<fs::path> paths;
  for (const auto& d : {s.files_dir, s.batches_dir})
    for (auto it = fs::directory_iterator(d, ec); !ec && it != fs::directory_iterator();
         it.increment(ec))
      paths.push_back(it->path());
  for (const auto& p : paths) {
    if (p.extension() == ".tmp") {  // a write a crash cut short: the old file is intact
      fs::remove(p, ec);
      continue;
    }
    if (p.extension() != ".json") continue;
    if (p.parent_path() == s.files_dir) {
      auto f = meta_from<FileMeta>(p.string());
      if (f && f->id == p.stem().string() && exists(s.file_path(f->id))) {
        s.seq = std::max(s.seq, f->seq);
        s.files[f->id] = *f;
      }
    } else if (auto b = batch_from(p.string()); b && b->id == p.stem().string()) {
      s.seq = std::max(s.seq, b->seq);
      s.batches[b->id] = std::move(b);
    }
  }
  std::vector<Batch*> order;
  for (auto& [id, b] : s.batches) order.push_back(b.get());
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->seq < b->seq; });
  for (Batch* b : order) {
    if (!b->closing.empty()) {  // publishing was cut short: the counts from where the files are
      std::unordered_set<std::string> ids;
      auto count = [&](const std::string& fid, bool err) {
        return read_results(
            !fid.empty() && exists(s.file_path(fid)) ? s.file_path(fid) : s.result_path(b->id, err),
            ids);
      };
      b->completed = count(b->out_fid, false);
      b->failed = count(b->err_fid, true);
      s.finish_close(*b);
    } else if (!is_final(b->status) && s.resume(*b)) {
      if (b->status == "cancelling")
        b->run->ending = "cancelled";  // nothing is in flight now
      else if (s.now() >= b->t[expires])
        b->run->ending = "expired";
      else
        s.arm_expiry(*b);
      s.maybe_close(*b);
    }
  }
  // What no meta claims: a file whose meta was never written, results of a batch never created.
  for (const auto& p : paths) {
    const std::string stem = p.stem().stem().string();
    const bool claimed =
        p.parent_path() == s.files_dir ? s.files.count(stem) > 0 : s.find_open(stem) != nullptr;
    if (p.extension() == ".jsonl" && !claimed) fs::remove(p, ec);
  }
  s.pump();
}

Reply Store::upload(const std::string& tenant, const std::string& purpose,
                    const std::string& filename, std::string content) {
  Impl& s = *impl_;
  if (purpose != "batch") return bad("'purpose' must be 'batch'", "purpose");
  if (filename.size() > kMaxFilenameBytes)
    return bad("the file name is longer than 255 bytes", "file");
  if (content.size() > s.limits.max_file_bytes)
    return bad("the file is larger than " + std::to_string(s.limits.max_file_bytes) + " bytes",
               "file", "file_too_large");
  uint32_t lines = 0;
  for (size_t pos = 0; pos < content.size();) {
    const size_t end = std::min(content.find('\n', pos), content.size());
    if (content.find_first_not_of(" \t\r", pos) < end && ++lines > s.limits.max_lines)
      return bad("the file holds more than " + std::to_string(s.limits.max_lines) + " lines",
                 "file", "too_many_lines");
    pos = end + 1;
  }
  if (lines == 0) return bad("the file holds no lines", "file");
  if (s.files.size() + 2 * s.ring.size() >= s.limits.max_files)
    return bad("the server keeps no more files: delete some", "file", "file_limit_reached");
  FileMeta m{s.new_file_id(), tenant, purpose, filename, content.size(), s.now(), ++s.seq};
  if (!write_atomic(s.file_path(m.id), content) ||
      !write_atomic(s.file_meta_path(m.id), text(json(m)))) {
    std::error_code ec;
    fs::remove(s.file_path(m.id), ec);
    return storage_error();
  }
  s.files[m.id] = m;
  return json_reply(file_object(m));
}

Reply Store::file(const std::string& tenant, const std::string& id) const {
  const FileMeta* f = impl_->find_file(tenant, id);
  return f ? json_reply(file_object(*f)) : not_found("File", id, "id");
}

Reply Store::file_content(const std::string& tenant, const std::string& id) const {
  const FileMeta* f = impl_->find_file(tenant, id);
  if (!f) return not_found("File", id, "id");
  auto content = read_whole(impl_->file_path(id));
  if (!content) return storage_error();
  return {200, "application/jsonl", std::move(*content)};
}

Reply Store::delete_file(const std::string& tenant, const std::string& id) {
  Impl& s = *impl_;
  if (!s.find_file(tenant, id)) return not_found("File", id, "id");
  for (const auto& open : s.ring)
    if (s.batches.at(open)->input_file_id == id)
      return error_reply(409, "the file is the input of " + open + ", which is still running", "id",
                         "file_in_use");
  // The meta goes first: a crash between the two leaves content that recover() removes.
  std::error_code ec;
  fs::remove(s.file_meta_path(id), ec);
  fs::remove(s.file_path(id), ec);
  sync_dir(s.files_dir);
  s.files.erase(id);
  return json_reply({{"id", id}, {"object", "file"}, {"deleted", true}});
}

Reply Store::list_files(const std::string& tenant) const {
  std::vector<const FileMeta*> mine;
  for (const auto& [id, f] : impl_->files)
    if (f.tenant == tenant) mine.push_back(&f);
  std::sort(mine.begin(), mine.end(), [](auto* a, auto* b) { return a->seq > b->seq; });
  return list_reply(mine, file_object, false);
}

Reply Store::create_batch(const std::string& tenant, std::string_view body_json) {
  Impl& s = *impl_;
  const json req = parse_json(body_json);
  if (!req.is_object()) return bad("the body must be a JSON object", "");
  auto str = [&](const char* k) -> const std::string* {
    auto it = req.find(k);
    return it != req.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  const std::string* fid = str("input_file_id");
  if (!fid) return bad("'input_file_id' must be a string", "input_file_id");
  const std::string* ep = str("endpoint");
  const auto endpoint = ep ? openai::endpoint_from_path(*ep) : std::nullopt;
  if (!endpoint)
    return bad("'endpoint' must be '/v1/completions' or '/v1/chat/completions'", "endpoint");
  const std::string* window = str("completion_window");
  const int64_t hours = window ? window_hours(*window) : 0;
  if (!hours)
    return bad("'completion_window' must be '24h' (or '<N>h', N from 1 to 168)",
               "completion_window");
  json metadata;
  if (auto m = req.find("metadata"); m != req.end() && !m->is_null()) {
    if (!metadata_ok(*m))
      return bad(
          "'metadata' must be an object of at most 16 string values (keys up to 64 "
          "characters, values up to 512)",
          "metadata");
    metadata = *m;
  }
  const FileMeta* input = s.find_file(tenant, *fid);
  if (!input) return not_found("File", *fid, "input_file_id");
  if (input->purpose != "batch")
    return bad("the input file's purpose must be 'batch'", "input_file_id");
  if (s.ring.size() >= s.limits.max_open_batches)
    return error_reply(429, "too many batches are open; try again when one has finished", "",
                       "too_many_open_batches", "rate_limit_error");
  if (s.files.size() + 2 * (s.ring.size() + 1) > s.limits.max_files)
    return bad("the server keeps no more files: delete some", "", "file_limit_reached");
  auto content = read_whole(s.file_path(*fid));
  if (!content) return storage_error();

  auto b = std::make_unique<Batch>();
  do b->id = "batch_" + s.hex(24);
  while (s.batches.count(b->id));
  b->tenant = tenant;
  b->input_file_id = *fid;
  b->window = *window;
  b->endpoint = *ep;
  b->ep = *endpoint;
  b->metadata = std::move(metadata);
  b->seq = ++s.seq;
  b->t[created] = s.now();
  b->t[expires] = b->t[created] + hours * 3600;
  Scan scan = scan_input(*content, *ep, s.limits);
  content.reset();
  b->total = scan.total;
  Batch& ref = *b;
  if (!scan.errors.empty()) {
    b->status = "failed";
    b->t[failed] = b->t[created];
    b->errors = {{"object", "list"}, {"data", std::move(scan.errors)}};
    if (!s.write_meta(*b)) return storage_error();
  } else {
    // The broken lines are written and synced before the meta names the batch, so a batch
    // on disk always has them; results of a batch whose meta never got written are removed by
    // recover().
    b->run = std::make_unique<Run>();
    b->run->lines = std::move(scan.lines);
    bool stored = s.open_results(*b, true);
    for (auto& [cid, why] : scan.broken) {
      json e = {{"code", "invalid_request"}, {"message", why}};
      stored = stored && s.append(*b, true, cid, nullptr, std::move(e));
    }
    b->status = "in_progress";
    b->t[in_progress] = b->t[created];
    stored = stored && ::fdatasync(b->run->err) == 0;
    b->run->dirty = false;  // synced just now (and not yet in the map that sync_all reads)
    if (!stored || !s.write_meta(*b)) {
      b->run.reset();
      s.remove_results(b->id);
      return storage_error();
    }
    s.ring.push_back(b->id);
    s.arm_expiry(*b);
  }
  s.batches[b->id] = std::move(b);
  if (s.batches.size() > kMaxBatchesKept) {  // forget the oldest final batch
    Batch* oldest = nullptr;
    for (auto& [id, x] : s.batches)
      if (is_final(x->status) && x.get() != &ref && (!oldest || x->seq < oldest->seq))
        oldest = x.get();
    if (oldest) {
      std::error_code ec;
      fs::remove(s.meta_path(oldest->id), ec);
      s.batches.erase(oldest->id);
    }
  }
  s.maybe_close(ref);
  s.pump();
  return json_reply(batch_object(ref));
}

Reply Store::batch(const std::string& tenant, const std::string& id) const {
  const Batch* b = impl_->find_batch(tenant, id);
  return b ? json_reply(batch_object(*b)) : not_found("Batch", id, "batch_id");
}

Reply Store::list_batches(const std::string& tenant, const std::string& after,
                          uint32_t limit) const {
  limit = limit == 0 ? kDefaultListLimit : std::min(limit, kMaxListLimit);
  std::vector<const Batch*> mine;
  for (const auto& [id, b] : impl_->batches)
    if (b->tenant == tenant) mine.push_back(b.get());
  std::sort(mine.begin(), mine.end(), [](auto* a, auto* b) { return a->seq > b->seq; });
  size_t start = 0;
  if (!after.empty()) {  // an unknown cursor has nothing after it
    auto it = std::find_if(mine.begin(), mine.end(), [&](auto* b) { return b->id == after; });
    start = it == mine.end() ? mine.size() : static_cast<size_t>(it - mine.begin()) + 1;
  }
  const size_t end = std::min(mine.size(), start + limit);
  const std::vector<const Batch*> page(mine.begin() + start, mine.begin() + end);
  return list_reply(page, batch_object, end < mine.size());
}

Reply Store::cancel_batch(const std::string& tenant, const std::string& id) {
  Impl& s = *impl_;
  Batch* b = s.find_batch(tenant, id);
  if (!b) return not_found("Batch", id, "batch_id");
  if (b->run && b->run->ending.empty()) {
    b->status = "cancelling";
    b->t[cancelling] = s.now();
    s.write_meta(*b);
    s.start_ending(*b, "cancelled");
    s.pump();  // the slots it freed go to the other batches
  } else if (!b->run && b->status != "cancelled") {
    return error_reply(409, "a batch that is " + b->status + " cannot be cancelled", "batch_id",
                       "batch_not_cancellable");
  }
  return json_reply(batch_object(*b));
}

void Store::finished(const LineJob& job, const LineResult& result) {
  Impl& s = *impl_;
  Batch* b = s.find_open(job.batch_id);
  if (!b || b->tenant != job.tenant) return;
  Run& r = *b->run;
  auto it = std::lower_bound(r.lines.begin(), r.lines.end(), job.line,
                             [](const Line& l, uint32_t n) { return l.number < n; });
  if (it == r.lines.end() || it->number != job.line || it->custom_id != job.custom_id ||
      it->state != LineState::in_flight)
    return;  // not in flight: written already, or a result from before a restart
  --r.in_flight;
  --s.in_flight;
  const bool again = result.status == 429 || result.status == 503;
  if (!r.ending.empty() && (again || result.status == 499)) {
    it->state = LineState::pending;  // cancelled by the ending: not run
  } else if (again) {
    it->state = LineState::waiting;
    ++s.counters.lines_retried;
    const int64_t ms =
        result.retry_after_ms < 0 ? kDefaultRetryMs : std::min(result.retry_after_ms, kMaxRetryMs);
    s.later(std::chrono::milliseconds(ms), [id = b->id,
                                            idx = size_t(it - r.lines.begin())](Impl& self) {
      Batch* open = self.find_open(id);
      if (!open || !open->run->ending.empty() || open->run->lines[idx].state != LineState::waiting)
        return;
      open->run->lines[idx].state = LineState::pending;
      open->run->ready.push_back(idx);
      self.pump();
    });
  } else if (!s.record(*b, *it, result)) {
    return s.pump();
  }
  s.maybe_close(*b);
  s.pump();
}

Store::Stats Store::stats() const {
  Stats st = impl_->counters;
  st.batches_open = impl_->ring.size();
  st.lines_in_flight = impl_->in_flight;
  return st;
}

// --- multipart/form-data ---

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The parameter `want` of a header value such as `form-data; name="file"; filename="a.jsonl"`
// (a quoted string or a token); nullopt when it is absent.
std::optional<std::string> header_param(std::string_view v, std::string_view want) {
  size_t i = v.find(';');
  while (i < v.size()) {
    ++i;
    size_t eq = i;
    while (eq < v.size() && v[eq] != '=' && v[eq] != ';') ++eq;
    const std::string_view key = trim(v.substr(i, eq - i));
    std::string value;
    i = eq;
    if (i < v.size() && v[i] == '=') {
      ++i;
      while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
      if (i < v.size() && v[i] == '"') {
        for (++i; i < v.size() && v[i] != '"'; ++i) {
          if (v[i] == '\\' && i + 1 < v.size()) ++i;
          value += v[i];
        }
        i = v.find(';', i);
      } else {
        const size_t e = v.find(';', i);
        value = trim(v.substr(i, e == std::string_view::npos ? std::string_view::npos : e - i));
        i = e;
      }
    }
    if (iequals(key, want)) return value;
  }
  return std::nullopt;
}

}  // namespace

std::variant<std::vector<Part>, std::string> parse_multipart(std::string_view content_type_header,
                                                             std::string_view body) {
  const std::string_view media = trim(content_type_header.substr(0, content_type_header.find(';')));
  if (!iequals(media, "multipart/form-data")) return "the content type is not multipart/form-data";
  const auto boundary = header_param(content_type_header, "boundary");
  if (!boundary || boundary->empty() || boundary->size() > kMaxBoundaryBytes)
    return "the content type names no boundary (1 to 70 characters)";
  const std::string delim = "--" + *boundary, next_delim = "\r\n" + delim;
  size_t pos = 0;
  if (body.substr(0, delim.size()) != delim) {  // a preamble before the first boundary
    pos = body.find(next_delim);
    if (pos == std::string_view::npos) return "the body holds no boundary line";
    pos += 2;
  }
  std::vector<Part> parts;
  for (;;) {
    size_t after = pos + delim.size();
    if (body.substr(after, 2) == "--") return parts;  // the closing boundary
    while (after < body.size() && (body[after] == ' ' || body[after] == '\t')) ++after;
    if (after >= body.size()) return "the body is truncated";
    if (body.substr(after, 2) != "\r\n") return "a boundary line is followed by other text";
    if (parts.size() == kMaxParts) return "the body has more than 16 parts";
    // The headers end at the first empty line (found from the boundary line's own CRLF, so a
    // part without headers ends at once).
    const std::string_view window = body.substr(after, kMaxPartHeaderBytes + 4);
    const size_t head_end = window.find("\r\n\r\n");
    if (head_end == std::string_view::npos)
      return after + window.size() >= body.size() ? "the body is truncated"
                                                  : "a part's headers are longer than 8192 bytes";
    Part p;
    bool named = false;
    std::string_view headers = head_end > 2 ? window.substr(2, head_end - 2) : std::string_view();
    while (!headers.empty()) {
      const size_t eol = std::min(headers.find("\r\n"), headers.size());
      const std::string_view h = headers.substr(0, eol);
      headers.remove_prefix(std::min(eol + 2, headers.size()));
      const size_t colon = h.find(':');
      if (colon == std::string_view::npos) return "a part header has no colon";
      const std::string_view name = trim(h.substr(0, colon)), value = trim(h.substr(colon + 1));
      if (iequals(name, "content-disposition")) {
        if (auto n = header_param(value, "name")) {
          p.name = *n;
          named = true;
        }
        p.filename = header_param(value, "filename").value_or("");
      } else if (iequals(name, "content-type")) {
        p.content_type = value;
      }
    }
    if (!named) return "a part has no name (Content-Disposition: form-data; name=...)";
    const size_t data = after + head_end + 4;
    const size_t end = body.find(next_delim, data);
    if (end == std::string_view::npos) return "the body is truncated (no closing boundary)";
    p.data = body.substr(data, end - data);
    parts.push_back(std::move(p));
    pos = end + 2;
  }
}

}  // namespace sy::http_batch
