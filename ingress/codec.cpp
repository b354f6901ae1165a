// The wire codec: a bounds-checking pre-scan of the raw msgpack, msgpack-c unpacking under explicit
// limits, then field-by-field conversion into protocol.hpp structs with precise error messages.
#include "ingress/codec.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/trace.hpp"

namespace sy::wire {

namespace {

// A refusal raised anywhere inside decoding; caught at the two public entry points only.
struct Reject {
  std::string message;
};

[[noreturn]] void reject(std::string message) {
  throw Reject{std::move(message)};
}

std::string num(std::uint64_t v) {
  return std::to_string(v);
}
std::string num(std::int64_t v) {
  return std::to_string(v);
}

// Shortest round-trip-ish rendering of a double for messages ("0.5", "150", "nan").
std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Prefer the short form when it reads back the same.
  char shorter[32];
  std::snprintf(shorter, sizeof shorter, "%g", v);
  return std::strtod(shorter, nullptr) == v ? shorter : buf;
}

std::string quote(std::string_view s) {
  return quoted(s);
}

// The offset of the first byte of `s` that is not part of well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos when all of it is.
std::size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // overlong below U+0800
      if (c == 0xed) hi = 0x9f;  // U+D800..U+DFFF are surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;  // overlong below U+10000
      if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
    } else {
      return i;  // a continuation byte without a lead, 0xc0/0xc1 (overlong) or 0xf5..0xff
    }
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xc0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

// ---- pre-scan ---------------------------------------------------------------------------------
//
// msgpack-c allocates an array or map as soon as it reads its header, so a 5-byte message can make
// it reserve gigabytes, and every open container along a nesting chain allocates. This scan walks
// the raw bytes without allocating and refuses a message before msgpack-c sees it when:
//  - a str/bin/ext/array/map exceeds its size limit, or the nesting exceeds max_depth;
//  - the elements still owed by all open containers exceed the bytes left (each needs >= 1 byte),
//    so everything msgpack-c later allocates is bounded by a small multiple of the message size;
//  - the bytes end early, contain the never-used byte 0xc1, or continue after the first object.

// Deepest nesting the scan can track; max_depth above this is clamped (v1 needs 5).
constexpr std::size_t kScanStackDepth = 64;

std::uint64_t read_be(const std::uint8_t* p, std::size_t k) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < k; ++i) v = (v << 8) | p[i];
  return v;
}

void scan_msgpack(const std::uint8_t* p, std::size_t n, const DecodeLimits& lim) {
  if (n == 0) reject("bad msgpack: empty message");
  const std::size_t max_depth = std::min(lim.max_depth, kScanStackDepth);
  std::array<std::uint64_t, kScanStackDepth> owed{};  // elements still owed per open container
  std::size_t depth = 0;
  std::uint64_t owed_total = 0;
  std::size_t off = 0;
  do {
    if (off >= n) reject("bad msgpack: truncated at offset " + num(std::uint64_t{off}));
    if (depth > 0) {
      --owed[depth - 1];
      --owed_total;
    }
    const std::size_t at = off;
    const std::uint8_t b = p[off++];
    std::uint64_t payload = 0;   // bytes of str/bin/ext/number data after the header
    std::uint64_t elements = 0;  // for containers: objects inside (maps: keys + values)
    std::uint64_t count = 0;     // for containers: as the header states (maps: pairs)
    const char* kind = nullptr;  // non-null for containers and sized values
    std::size_t len_bytes = 0;   // width of an explicit length field
    std::uint64_t extra = 0;     // ext type byte

    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
      // fixint, nil, bool: the byte is the whole object
    } else if ((b & 0xf0) == 0x80) {
      kind = "map";
      count = b & 0x0f;
    } else if ((b & 0xf0) == 0x90) {
      kind = "array";
      count = b & 0x0f;
    } else if ((b & 0xe0) == 0xa0) {
      kind = "str";
      payload = b & 0x1f;
    } else {
      switch (b) {
        case 0xc4:
          kind = "bin";
          len_bytes = 1;
          break;
        case 0xc5:
          kind = "bin";
          len_bytes = 2;
          break;
        case 0xc6:
          kind = "bin";
          len_bytes = 4;
          break;
        case 0xc7:
          kind = "ext";
          len_bytes = 1;
          extra = 1;
          break;
        case 0xc8:
          kind = "ext";
          len_bytes = 2;
          extra = 1;
          break;
        case 0xc9:
          kind = "ext";
          len_bytes = 4;
          extra = 1;
          break;
        case 0xca:
          payload = 4;
          break;
        case 0xcb:
          payload = 8;
          break;
        case 0xcc:
        case 0xd0:
          payload = 1;
          break;
        case 0xcd:
        case 0xd1:
          payload = 2;
          break;
        case 0xce:
        case 0xd2:
          payload = 4;
          break;
        case 0xcf:
        case 0xd3:
          payload = 8;
          break;
        case 0xd4:
          kind = "ext";
          payload = 1;
          extra = 1;
          break;
        case 0xd5:
          kind = "ext";
          payload = 2;
          extra = 1;
          break;
        case 0xd6:
          kind = "ext";
          payload = 4;
          extra = 1;
          break;
        case 0xd7:
          kind = "ext";
          payload = 8;
          extra = 1;
          break;
        case 0xd8:
          kind = "ext";
          payload = 16;
          extra = 1;
          break;
        case 0xd9:
          kind = "str";
          len_bytes = 1;
          break;
        case 0xda:
          kind = "str";
          len_bytes = 2;
          break;
        case 0xdb:
          kind = "str";
          len_bytes = 4;
          break;
        case 0xdc:
          kind = "array";
          len_bytes = 2;
          break;
        case 0xdd:
          kind = "array";
          len_bytes = 4;
          break;
        case 0xde:
          kind = "map";
          len_bytes = 2;
          break;
        case 0xdf:
          kind = "map";
          len_bytes = 4;
          break;
        default: {  // only 0xc1 remains: reserved, never valid
          char buf[64];
          std::snprintf(buf, sizeof buf, "bad msgpack: invalid byte 0x%02x at offset %zu", b, at);
          reject(buf);
        }
      }
      if (len_bytes > 0) {
        if (n - off < len_bytes)
          reject(std::string("bad msgpack: truncated ") + kind + " header at offset " +
                 num(std::uint64_t{at}));
        const std::uint64_t len = read_be(p + off, len_bytes);
        off += len_bytes;
        if (std::strcmp(kind, "array") == 0 || std::strcmp(kind, "map") == 0)
          count = len;
        else
          payload = len;
      }
    }

    const bool is_array = kind && std::strcmp(kind, "array") == 0;
    const bool is_map = kind && std::strcmp(kind, "map") == 0;
    if (is_array || is_map) {
      const std::size_t limit = is_array ? lim.max_array : lim.max_map;
      if (count > limit)
        reject(std::string("bad msgpack: ") + kind + " of " + num(count) +
               (is_array ? " elements" : " entries") + " exceeds limit " +
               num(std::uint64_t{limit}));
      if (depth + 1 > max_depth)
        reject("bad msgpack: nesting deeper than " + num(std::uint64_t{max_depth}));
      elements = is_map ? 2 * count : count;
      if (owed_total + elements > n - off)
        reject(std::string("bad msgpack: ") + kind + " header at offset " + num(std::uint64_t{at}) +
               " claims " + num(count) + (is_array ? " elements" : " entries") + " but only " +
               num(std::uint64_t{n - off}) + " bytes follow");
    } else {
      if (kind && payload > lim.max_string_bytes)
        reject(std::string("bad msgpack: ") + kind + " of " + num(payload) +
               " bytes exceeds limit " + num(std::uint64_t{lim.max_string_bytes}));
      if (payload + extra > n - off)
        reject("bad msgpack: truncated value at offset " + num(std::uint64_t{at}) + " (needs " +
               num(payload + extra) + " bytes, " + num(std::uint64_t{n - off}) + " follow)");
      off += static_cast<std::size_t>(payload + extra);
    }

    if (elements > 0) {
      owed[depth++] = elements;
      owed_total += elements;
    } else {
      while (depth > 0 && owed[depth - 1] == 0) --depth;  // this object closed its containers
    }
  } while (depth > 0);
  if (off != n)
    reject("bad msgpack: trailing data after the message (" + num(std::uint64_t{n - off}) +
           " bytes)");
}

// Lets msgpack-c point strings into the caller's buffer instead of copying them: every string is
// copied into a struct before decode_* returns, while the buffer is still alive.
bool reference_strings(msgpack::type::object_type, std::size_t, void*) {
  return true;
}

msgpack::object_handle unpack_checked(const void* data, std::size_t size, const DecodeLimits& lim) {
  if (size > lim.max_message_bytes)
    reject("message of " + num(std::uint64_t{size}) + " bytes exceeds limit " +
           num(std::uint64_t{lim.max_message_bytes}));
  scan_msgpack(static_cast<const std::uint8_t*>(data), size, lim);
  // The same limits again, now as msgpack-c's own guard; the scan makes these throws unreachable
  // for any input it passed, but they stay as a second line.
  const msgpack::unpack_limit limit(lim.max_array, lim.max_map, lim.max_string_bytes,
                                    lim.max_string_bytes, lim.max_string_bytes, lim.max_depth);
  try {
    std::size_t off = 0;
    msgpack::object_handle h;
    msgpack::unpack(h, static_cast<const char*>(data), size, off, reference_strings, nullptr,
                    limit);
    if (off != size) reject("bad msgpack: trailing bytes after the message");
    return h;
  } catch (const msgpack::depth_size_overflow&) {
    reject("bad msgpack: nesting deeper than " + num(std::uint64_t{lim.max_depth}));
  } catch (const msgpack::size_overflow& e) {
    reject(std::string("bad msgpack: ") + e.what());
  } catch (const msgpack::insufficient_bytes&) {
    reject("bad msgpack: truncated");
  } catch (const msgpack::parse_error&) {
    reject("bad msgpack: parse error");
  } catch (const std::bad_alloc&) {
    reject("bad msgpack: out of memory");
  }
}

// ---- reading fields ------------------------------------------------------------------------------

const char* type_name(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL:
      return "nil";
    case msgpack::type::BOOLEAN:
      return "boolean";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER:
      return "integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return "float";
    case msgpack::type::STR:
      return "string";
    case msgpack::type::BIN:
      return "binary";
    case msgpack::type::ARRAY:
      return "array";
    case msgpack::type::MAP:
      return "map";
    case msgpack::type::EXT:
      return "ext";
  }
  return "unknown";
}

std::string_view str_of(const msgpack::object& o) {
  return {o.via.str.ptr, o.via.str.size};
}

// The keys of one msgpack map. `where` prefixes field names in messages ("" at top level,
// "usage." inside usage) so that a nested problem reads "field 'usage.prompt_tokens' ...".
class Fields {
 public:
  Fields(const msgpack::object& map, std::string where) : where_(std::move(where)) {
    const auto& m = map.via.map;
    entries_.reserve(m.size);
    for (std::uint32_t i = 0; i < m.size; ++i) {
      const auto& kv = m.ptr[i];
      if (kv.key.type != msgpack::type::STR)
        reject(std::string("map keys must be strings, got ") + type_name(kv.key) + where_suffix());
      const std::string_view k = str_of(kv.key);
      for (const auto& e : entries_)
        if (e.first == k) reject("duplicate field " + quote(where_ + std::string(k)));
      entries_.emplace_back(k, &kv.val);
    }
  }

  // The value of a key, or nullptr when absent or nil (nil means "use the default").
  const msgpack::object* get(std::string_view key) const {
    for (const auto& e : entries_)
      if (e.first == key) return e.second->type == msgpack::type::NIL ? nullptr : e.second;
    return nullptr;
  }

  std::string name(std::string_view key) const { return "'" + where_ + std::string(key) + "'"; }
  std::string bare(std::string_view key) const { return where_ + std::string(key); }

  const msgpack::object& need(std::string_view key) const {
    const msgpack::object* o = get(key);
    if (!o) reject("missing field " + name(key));
    return *o;
  }

  std::string str(std::string_view key, std::size_t max_bytes, bool required,
                  bool allow_empty = true) const {
    const msgpack::object* o = required ? &need(key) : get(key);
    if (!o) return {};
    if (o->type != msgpack::type::STR)
      reject("field " + name(key) + " must be a string, got " + type_name(*o));
    const std::string_view s = str_of(*o);
    if (s.empty() && !allow_empty) reject("field " + name(key) + " must not be empty");
    if (s.size() > max_bytes)
      reject("field " + name(key) + " has " + num(std::uint64_t{s.size()}) + " bytes, limit " +
             num(std::uint64_t{max_bytes}));
    return std::string(s);
  }

  // An unsigned integer in [lo, hi]; negative values are reported as out of range.
  std::uint64_t uint(std::string_view key, std::uint64_t def, std::uint64_t lo, std::uint64_t hi,
                     bool required = false) const {
    const msgpack::object* o = required ? &need(key) : get(key);
    if (!o) return def;
    return uint_value(*o, bare(key), lo, hi);
  }

  // A number (float or integer) in [lo, hi], or (lo, hi] when lo_open.
  double number(std::string_view key, double def, double lo, double hi, bool lo_open = false,
                bool required = false) const {
    const msgpack::object* o = required ? &need(key) : get(key);
    if (!o) return def;
    return number_value(*o, bare(key), lo, hi, lo_open);
  }

  bool boolean(std::string_view key, bool def) const {
    const msgpack::object* o = get(key);
    if (!o) return def;
    if (o->type != msgpack::type::BOOLEAN)
      reject("field " + name(key) + " must be a boolean, got " + type_name(*o));
    return o->via.boolean;
  }

  // Refuses a key outside `known`: a client that asks for something this server does not do
  // (a field of a newer version, a misspelling) hears so instead of getting a result without it.
  template <class Known>
  void only(const Known& known, std::string_view type) const {
    for (const auto& e : entries_)
      if (std::find(std::begin(known), std::end(known), e.first) == std::end(known))
        reject("unknown field " + quote(where_ + std::string(e.first)) + " in a " +
               std::string(type) + " (docs/protocol.md lists the fields this server knows)");
  }

  const msgpack::object* typed(std::string_view key, msgpack::type::object_type t, const char* what,
                               bool required) const {
    const msgpack::object* o = required ? &need(key) : get(key);
    if (o && o->type != t)
      reject("field " + name(key) + " must be " + what + ", got " + type_name(*o));
    return o;
  }

  static std::uint64_t uint_value(const msgpack::object& o, const std::string& what,
                                  std::uint64_t lo, std::uint64_t hi) {
    const std::string range = " out of range [" + num(lo) + ", " + num(hi) + "]";
    if (o.type == msgpack::type::NEGATIVE_INTEGER)
      reject(what + " " + num(std::int64_t{o.via.i64}) + range);
    if (o.type != msgpack::type::POSITIVE_INTEGER)
      reject("field '" + what + "' must be an integer, got " + type_name(o));
    if (o.via.u64 < lo || o.via.u64 > hi)
      reject(what + " " + num(std::uint64_t{o.via.u64}) + range);
    return o.via.u64;
  }

  static double number_value(const msgpack::object& o, const std::string& what, double lo,
                             double hi, bool lo_open) {
    double v = 0;
    switch (o.type) {
      case msgpack::type::FLOAT32:
      case msgpack::type::FLOAT64:
        v = o.via.f64;
        break;
      case msgpack::type::POSITIVE_INTEGER:
        v = static_cast<double>(o.via.u64);
        break;
      case msgpack::type::NEGATIVE_INTEGER:
        v = static_cast<double>(o.via.i64);
        break;
      default:
        reject("field '" + what + "' must be a number, got " + type_name(o));
    }
    const bool ok = !std::isnan(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
    if (!ok)
      reject(what + " " + num(v) + " out of range " + (lo_open ? "(" : "[") + num(lo) + ", " +
             num(hi) + "]");
    return v;
  }

 private:
  std::string where_suffix() const {
    return where_.empty() ? "" : " in '" + where_.substr(0, where_.size() - 1) + "'";
  }

  std::string where_;
  std::vector<std::pair<std::string_view, const msgpack::object*>> entries_;
};

constexpr std::uint64_t kMaxTokenId = std::numeric_limits<std::int32_t>::max();
constexpr std::uint64_t kU32 = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t kU64 = std::numeric_limits<std::uint64_t>::max();

// Token ids as an array of non-negative int32 (prompt, ids of tokens/done).
std::vector<std::int32_t> token_ids(const msgpack::object& arr, const std::string& what) {
  std::vector<std::int32_t> ids;
  ids.reserve(arr.via.array.size);
  for (std::uint32_t i = 0; i < arr.via.array.size; ++i) {
    const msgpack::object& e = arr.via.array.ptr[i];
    const std::string at = what + " token at index " + num(std::uint64_t{i});
    if (e.type == msgpack::type::NEGATIVE_INTEGER)
      reject(at + " is " + num(std::int64_t{e.via.i64}) + ", must be in [0, " + num(kMaxTokenId) +
             "]");
    if (e.type != msgpack::type::POSITIVE_INTEGER)
      reject(at + " must be an integer, got " + type_name(e));
    if (e.via.u64 > kMaxTokenId)
      reject(at + " is " + num(std::uint64_t{e.via.u64}) + ", must be in [0, " + num(kMaxTokenId) +
             "]");
    ids.push_back(static_cast<std::int32_t>(e.via.u64));
  }
  return ids;
}

// Reads "v" and "type" and returns the type; the common head of every message.
std::string_view message_type(const Fields& f) {
  const msgpack::object* v = f.get("v");
  if (!v) reject("missing field 'v'");
  if (v->type != msgpack::type::POSITIVE_INTEGER && v->type != msgpack::type::NEGATIVE_INTEGER)
    reject(std::string("field 'v' must be an integer, got ") + type_name(*v));
  if (v->type == msgpack::type::NEGATIVE_INTEGER || v->via.u64 != kProtocolVersion)
    reject("unsupported protocol version " +
           (v->type == msgpack::type::NEGATIVE_INTEGER ? num(std::int64_t{v->via.i64})
                                                       : num(std::uint64_t{v->via.u64})) +
           " (this side speaks " + num(std::uint64_t{kProtocolVersion}) + ")");
  const msgpack::object& t = f.need("type");
  if (t.type != msgpack::type::STR)
    reject(std::string("field 'type' must be a string, got ") + type_name(t));
  return str_of(t);
}

// Refuses a key field that is not UTF-8: the key comes back in every reply, pipeline result and
// metrics label for the job, where a strict decoder (another producer's sink, a Prometheus
// scraper) would fail on it. The bytes are echoed escaped, never raw.
void need_utf8(const Fields& f, std::string_view key, const std::string& value) {
  const std::size_t at = invalid_utf8_at(value);
  if (at != std::string_view::npos)
    reject("field " + f.name(key) + " is not valid UTF-8 (byte " + num(std::uint64_t{at}) +
           "): " + quote(value));
}

// The job key of cancel/status/submit, read first so errors can name the job.
void read_key(const Fields& f, const DecodeLimits& lim, std::string& id, std::string& tenant,
              std::string& token) {
  id = f.str("id", lim.max_id_bytes, true, false);
  need_utf8(f, "id", id);
  tenant = f.str("tenant", lim.max_name_bytes, true, false);
  need_utf8(f, "tenant", tenant);
  token = f.str("token", lim.max_token_bytes, false);
}

// Every field a submit may carry; any other is refused (Fields::only).
constexpr std::string_view kSubmitFields[] = {"v",
                                              "type",
                                              "id",
                                              "tenant",
                                              "token",
                                              "prompt",
                                              "messages",
                                              "max_tokens",
                                              "temperature",
                                              "top_k",
                                              "top_p",
                                              "seed",
                                              "stop",
                                              "ignore_eos",
                                              "speculative",
                                              "priority",
                                              "deadline_ms",
                                              "stream",
                                              "logprobs",
                                              "parse_special",
                                              "min_p",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "repetition_penalty",
                                              "repeat_last_n",
                                              "logit_bias",
                                              "grammar",
                                              "json_schema",
                                              "regex",
                                              "choices",
                                              "n",
                                              "prompt_logprobs",
                                              "program",
                                              "inputs",
                                              "trace"};

// Every field a score request may carry.
constexpr std::string_view kScoreFields[] = {
    "v",        "type",          "id",       "tenant",      "token",        "prompt",
    "messages", "parse_special", "priority", "deadline_ms", "continuations"};

// Samples of one prompt in one job: each holds its own KV past the shared prompt, so the bound
// keeps one job's memory within what a handful of ordinary jobs take.
constexpr std::uint64_t kMaxSamples = 16;
// Continuations of one score request: scored in one batched step, so bounded like a batch.
constexpr std::uint32_t kMaxContinuations = 64;

// A float field of the sampler, checked as the 32-bit float it becomes (see as_float below).
float float_field(const Fields& f, std::string_view key, double def, double lo, double hi,
                  bool lo_open = false) {
  const double v = f.number(key, def, lo, hi, lo_open);
  const float x = static_cast<float>(v);
  if (!std::isfinite(x) || (lo_open ? !(x > lo) : !(x >= lo)) || x > hi)
    reject(std::string(key) + " " + num(v) + " out of range once narrowed to a 32-bit float");
  return x;
}

// min_p, the penalties and logit_bias, with OpenAI's ranges (vLLM's for the ones OpenAI lacks).
void decode_controls(const Fields& f, const DecodeLimits& lim, SamplingControls& c) {
  c.min_p = float_field(f, "min_p", 0.0, 0.0, 1.0);
  c.presence_penalty = float_field(f, "presence_penalty", 0.0, -2.0, 2.0);
  c.frequency_penalty = float_field(f, "frequency_penalty", 0.0, -2.0, 2.0);
  // (0, 10]: 1 is off; llama.cpp and vLLM accept any positive value, but beyond 10 a penalised
  // token is as good as banned, which logit_bias says more plainly.
  c.repetition_penalty = float_field(f, "repetition_penalty", 1.0, 0.0, 10.0, true);
  if (const msgpack::object* o = f.get("repeat_last_n")) {
    if (o->type == msgpack::type::NEGATIVE_INTEGER) {
      if (o->via.i64 != -1)
        reject("repeat_last_n " + num(std::int64_t{o->via.i64}) + " out of range [-1, " +
               num(kMaxTokenId) + "] (-1: every token)");
      c.repeat_last_n = -1;
    } else {
      c.repeat_last_n =
          static_cast<std::int32_t>(Fields::uint_value(*o, "repeat_last_n", 0, kMaxTokenId));
    }
  }
  const msgpack::object* lb = f.typed("logit_bias", msgpack::type::MAP, "a map", false);
  if (!lb) return;
  if (lb->via.map.size > lim.max_logit_bias)
    reject("logit_bias has " + num(std::uint64_t{lb->via.map.size}) + " entries, limit " +
           num(std::uint64_t{lim.max_logit_bias}));
  for (std::uint32_t i = 0; i < lb->via.map.size; ++i) {
    const msgpack::object& k = lb->via.map.ptr[i].key;
    std::uint64_t id = 0;
    // JSON producers (OpenAI's format) can only send the ids as strings: "1234" is accepted too.
    if (k.type == msgpack::type::POSITIVE_INTEGER) {
      id = k.via.u64;
    } else if (k.type == msgpack::type::STR) {
      const std::string_view t = str_of(k);
      if (t.empty() || t.size() > 10 ||
          !std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        reject("logit_bias key " + quote(std::string(t)) + " is not a token id");
      id = std::stoull(std::string(t));
    } else {
      reject(std::string("logit_bias keys must be token ids, got ") + type_name(k));
    }
    if (id > kMaxTokenId)
      reject("logit_bias token id " + num(id) + " out of range [0, " + num(kMaxTokenId) + "]");
    const double b =
        Fields::number_value(lb->via.map.ptr[i].val, "logit_bias." + num(id), -100.0, 100.0, false);
    c.logit_bias.emplace_back(static_cast<std::int32_t>(id), static_cast<float>(b));
  }
  std::sort(c.logit_bias.begin(), c.logit_bias.end());
  for (std::size_t i = 1; i < c.logit_bias.size(); ++i)
    if (c.logit_bias[i].first == c.logit_bias[i - 1].first)
      reject("logit_bias names token id " + num(std::int64_t{c.logit_bias[i].first}) + " twice");
}

// A msgpack value as JSON text (a json_schema sent as a map). Binary and ext values have no JSON
// form and are refused; map keys must be strings.
void to_json(const msgpack::object& o, std::string& out, const std::string& at,
             std::string_view label = "json_schema") {
  const std::string what(label);
  switch (o.type) {
    case msgpack::type::NIL:
      out += "null";
      return;
    case msgpack::type::BOOLEAN:
      out += o.via.boolean ? "true" : "false";
      return;
    case msgpack::type::POSITIVE_INTEGER:
      out += std::to_string(o.via.u64);
      return;
    case msgpack::type::NEGATIVE_INTEGER:
      out += std::to_string(o.via.i64);
      return;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: {
      if (!std::isfinite(o.via.f64)) reject(what + at + ": a number is not finite");
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", o.via.f64);
      out += buf;
      return;
    }
    case msgpack::type::STR: {
      const std::string_view t = str_of(o);
      if (invalid_utf8_at(t) != std::string_view::npos)
        reject(what + at + ": a string is not valid UTF-8");
      out += '"';
      for (unsigned char ch : t) {
        if (ch == '"' || ch == '\\') {
          out += '\\';
          out += static_cast<char>(ch);
        } else if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
      }
      out += '"';
      return;
    }
    case msgpack::type::ARRAY:
      out += '[';
      for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
        if (i) out += ',';
        to_json(o.via.array.ptr[i], out, at + "/" + num(std::uint64_t{i}), label);
      }
      out += ']';
      return;
    case msgpack::type::MAP:
      out += '{';
      for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
        const msgpack::object& k = o.via.map.ptr[i].key;
        if (k.type != msgpack::type::STR)
          reject(what + at + ": map keys must be strings, got " + type_name(k));
        if (i) out += ',';
        to_json(k, out, at, label);
        out += ':';
        to_json(o.via.map.ptr[i].val, out, at + "/" + std::string(str_of(k)), label);
      }
      out += '}';
      return;
    default:
      reject(what + at + ": a " + type_name(o) + " value has no JSON form");
  }
}

// The one constraint of a submit (grammar, json_schema, regex or choices). Only its form and
// size are checked here; admission compiles it and refuses what does not compile.
void decode_constraint(const Fields& f, const DecodeLimits& lim, Constraint& c) {
  static constexpr std::string_view kinds[] = {"grammar", "json_schema", "regex", "choices"};
  std::string given;
  for (std::string_view k : kinds)
    if (f.get(k)) given += (given.empty() ? "" : ", ") + std::string(k);
  if (given.find(',') != std::string::npos)
    reject("fields " + given + " exclude each other: a job takes one constraint");
  const auto text = [&](std::string_view key, std::uint8_t kind) {
    if (!f.get(key)) return false;
    c.kind = kind;
    c.source = f.str(key, lim.max_constraint_bytes, true, false);
    return true;
  };
  if (text("grammar", Constraint::grammar) || text("regex", Constraint::regex)) return;
  if (const msgpack::object* js = f.get("json_schema")) {
    c.kind = Constraint::json_schema;
    if (js->type == msgpack::type::STR) {
      c.source = f.str("json_schema", lim.max_constraint_bytes, true, false);
    } else if (js->type == msgpack::type::MAP || js->type == msgpack::type::BOOLEAN) {
      to_json(*js, c.source, "");
      if (c.source.size() > lim.max_constraint_bytes)
        reject("field 'json_schema' has " + num(std::uint64_t{c.source.size()}) +
               " bytes as JSON, limit " + num(std::uint64_t{lim.max_constraint_bytes}));
    } else {
      reject(std::string("field 'json_schema' must be a map or a string of JSON, got ") +
             type_name(*js));
    }
    return;
  }
  if (const msgpack::object* ch = f.typed("choices", msgpack::type::ARRAY, "an array", false)) {
    c.kind = Constraint::choices;
    if (ch->via.array.size == 0) reject("field 'choices' must not be empty");
    if (ch->via.array.size > lim.max_choices)
      reject("choices has " + num(std::uint64_t{ch->via.array.size}) + " entries, limit " +
             num(std::uint64_t{lim.max_choices}));
    std::size_t bytes = 0;
    for (std::uint32_t i = 0; i < ch->via.array.size; ++i) {
      const msgpack::object& e = ch->via.array.ptr[i];
      if (e.type != msgpack::type::STR)
        reject("choice at index " + num(std::uint64_t{i}) + " must be a string, got " +
               type_name(e));
      bytes += e.via.str.size;
      if (bytes > lim.max_constraint_bytes)
        reject("choices have more than " + num(std::uint64_t{lim.max_constraint_bytes}) +
               " bytes in all");
      c.options.emplace_back(str_of(e));
    }
  }
}

// The prompt of a submit or score: `prompt` (text or ids) or `messages`. Returns whether it was
// `messages`.
bool decode_prompt(const Fields& f, const DecodeLimits& lim, Submit& s) {
  const msgpack::object* msgs = f.get("messages");
  if (msgs && f.get("prompt"))
    reject("fields 'prompt' and 'messages' exclude each other: send one of them");
  if (msgs) {
    if (msgs->type != msgpack::type::ARRAY)
      reject(std::string("field 'messages' must be an array of maps, got ") + type_name(*msgs));
    if (msgs->via.array.size == 0) reject("field 'messages' must not be empty");
    if (msgs->via.array.size > lim.max_messages)
      reject("messages has " + num(std::uint64_t{msgs->via.array.size}) + " entries, limit " +
             num(std::uint64_t{lim.max_messages}));
    std::size_t bytes = 0;
    for (std::uint32_t i = 0; i < msgs->via.array.size; ++i) {
      const msgpack::object& e = msgs->via.array.ptr[i];
      const std::string at = "messages." + num(std::uint64_t{i}) + ".";
      if (e.type != msgpack::type::MAP)
        reject("message at index " + num(std::uint64_t{i}) + " must be a map, got " + type_name(e));
      const Fields mf(e, at);
      ChatMessage m;
      m.role = mf.str("role", lim.max_name_bytes, true, false);
      m.content = mf.str("content", lim.max_prompt_bytes, true, true);
      mf.only(std::initializer_list<std::string_view>{"role", "content"}, "message");
      bytes += m.role.size() + m.content.size();
      s.messages.push_back(std::move(m));
    }
    if (bytes > lim.max_prompt_bytes)
      reject("messages have " + num(std::uint64_t{bytes}) + " bytes of text, limit " +
             num(std::uint64_t{lim.max_prompt_bytes}));
    s.prompt = std::string();
  } else if (const msgpack::object& p = f.need("prompt"); p.type == msgpack::type::STR) {
    const std::string_view text = str_of(p);
    if (text.empty()) reject("field 'prompt' must not be empty");
    if (text.size() > lim.max_prompt_bytes)
      reject("prompt text has " + num(std::uint64_t{text.size()}) + " bytes, limit " +
             num(std::uint64_t{lim.max_prompt_bytes}));
    s.prompt = std::string(text);
  } else if (p.type == msgpack::type::ARRAY) {
    if (p.via.array.size == 0) reject("field 'prompt' must not be empty");
    if (p.via.array.size > lim.max_prompt_tokens)
      reject("prompt has " + num(std::uint64_t{p.via.array.size}) + " tokens, limit " +
             num(std::uint64_t{lim.max_prompt_tokens}));
    s.prompt = token_ids(p, "prompt");
  } else {
    reject(std::string("field 'prompt' must be a string or an array of token ids, got ") +
           type_name(p));
  }
  return msgs != nullptr;
}

// parse_special only goes with a text prompt.
void check_parse_special(const Submit& s, bool msgs) {
  if (s.parse_special && (msgs || s.prompt_is_tokens()))
    reject(std::string("field 'parse_special' applies to a text 'prompt' only (") +
           (msgs ? "a chat template's control tokens are always parsed, message text never is)"
                 : "token ids are used as given)"));
}

// A program submit's `program` (kept as JSON text: admission parses and checks its steps,
// programs/program.hpp) and `inputs`; the fields that belong to a single generation are refused
// beside it (docs/programs.md).
void decode_program(const Fields& f, const DecodeLimits& lim, Submit& s) {
  for (std::string_view k : {"prompt", "messages"})
    if (f.get(k))
      reject("fields 'program' and " + quote(k) +
             " exclude each other: a program's steps make its "
             "context");
  for (std::string_view k : {"n", "logprobs", "prompt_logprobs", "ignore_eos", "parse_special",
                             "grammar", "json_schema", "regex", "choices"})
    if (f.get(k))
      reject("field " + quote(k) +
             " does not go with 'program' (docs/programs.md: a constraint "
             "belongs to a gen step)");
  const msgpack::object* p = f.typed("program", msgpack::type::ARRAY, "an array of steps", true);
  if (p->via.array.size == 0) reject("field 'program' must not be empty");
  to_json(*p, s.program, "", "program");
  if (s.program.size() > lim.max_message_bytes)
    reject("field 'program' has " + num(std::uint64_t{s.program.size()}) + " bytes as JSON");
  if (const msgpack::object* in = f.typed("inputs", msgpack::type::MAP, "a map", false)) {
    for (std::uint32_t i = 0; i < in->via.map.size; ++i) {
      const auto& kv = in->via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR)
        reject(std::string("inputs: names must be strings, got ") + type_name(kv.key));
      const std::string name(str_of(kv.key));
      if (kv.val.type != msgpack::type::STR)
        reject("input " + quote(name) + " must be a string, got " + type_name(kv.val));
      const std::string value(str_of(kv.val));
      if (invalid_utf8_at(name) != std::string_view::npos ||
          invalid_utf8_at(value) != std::string_view::npos)
        reject("input " + quote(name) + " is not valid UTF-8");
      s.inputs.emplace_back(name, value);
    }
  }
}

Submit decode_submit(const Fields& f, const DecodeLimits& lim) {
  Submit s;
  read_key(f, lim, s.id, s.tenant, s.token);
  bool msgs = false;
  if (f.get("program"))
    decode_program(f, lim, s);
  else if (f.get("inputs"))
    reject("field 'inputs' goes with 'program' only");
  else
    msgs = decode_prompt(f, lim, s);

  s.max_tokens = static_cast<std::uint32_t>(f.uint("max_tokens", 16, 1, lim.max_new_tokens));
  // The sampler takes temperature and top_p as 32-bit floats: each is checked again as that
  // float, so that no value valid as sent becomes invalid on the way (top_p 1e-46 is > 0 as a
  // double but 0 as a float). A positive temperature below the smallest float becomes 0, greedy,
  // which is where a vanishing temperature tends anyway.
  const auto as_float = [](const char* field, double v, double lo, double hi, bool lo_open) {
    const float x = static_cast<float>(v);
    const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
    if (!ok)
      reject(std::string(field) + " " + num(v) + " out of range " + (lo_open ? "(" : "[") +
             num(lo) + ", " + num(hi) +
             "] once narrowed to the sampler's 32-bit float (it becomes " +
             num(static_cast<double>(x)) + "; the smallest positive float is " +
             num(static_cast<double>(std::numeric_limits<float>::denorm_min())) + ")");
  };
  // 100: far beyond any useful temperature (the distribution is flat long before) yet finite.
  s.temperature = f.number("temperature", 1.0, 0.0, 100.0);
  as_float("temperature", s.temperature, 0.0, 100.0, false);
  // kMaxTokenId keeps top_k inside the sampler's int32 (a larger one means "off" there anyway).
  s.top_k = static_cast<std::uint32_t>(f.uint("top_k", 0, 0, kMaxTokenId));
  s.top_p = f.number("top_p", 1.0, 0.0, 1.0, true);
  as_float("top_p", s.top_p, 0.0, 1.0, true);
  if (const msgpack::object* seed = f.get("seed"))
    s.seed = Fields::uint_value(*seed, "seed", 0, kU64);

  if (const msgpack::object* stop = f.get("stop")) {
    auto one = [&](const msgpack::object& e, std::uint64_t i) {
      const std::string at = "stop string at index " + num(i);
      if (e.type != msgpack::type::STR) reject(at + " must be a string, got " + type_name(e));
      const std::string_view sv = str_of(e);
      if (sv.empty()) reject(at + " must not be empty");
      if (sv.size() > lim.max_stop_bytes)
        reject(at + " has " + num(std::uint64_t{sv.size()}) + " bytes, limit " +
               num(std::uint64_t{lim.max_stop_bytes}));
      s.stop.emplace_back(sv);
    };
    if (stop->type == msgpack::type::STR) {
      one(*stop, 0);  // a single string is accepted as a list of one
    } else if (stop->type == msgpack::type::ARRAY) {
      if (stop->via.array.size > lim.max_stop)
        reject("stop has " + num(std::uint64_t{stop->via.array.size}) + " strings, limit " +
               num(std::uint64_t{lim.max_stop}));
      for (std::uint32_t i = 0; i < stop->via.array.size; ++i) one(stop->via.array.ptr[i], i);
    } else {
      reject(std::string("field 'stop' must be a string or an array of strings, got ") +
             type_name(*stop));
    }
  }

  s.ignore_eos = f.boolean("ignore_eos", false);
  s.speculative = f.str("speculative", 8, false);
  if (!s.speculative.empty() && s.speculative != "auto" && s.speculative != "always" &&
      s.speculative != "off")
    reject("field 'speculative' must be \"auto\", \"always\" or \"off\", got " +
           quote(s.speculative));
  s.priority = f.str("priority", lim.max_name_bytes, false);
  s.deadline_ms = static_cast<std::uint32_t>(f.uint("deadline_ms", 0, 0, lim.max_deadline_ms));
  // A W3C traceparent: 55 characters in version 00; later versions may append fields.
  s.trace = f.str("trace", 256, false);
  if (!s.trace.empty()) {
    TraceContext tc;
    if (auto bad = parse_traceparent(s.trace, tc)) reject("field 'trace' " + *bad);
  }
  s.stream = f.boolean("stream", false);
  s.logprobs = static_cast<std::uint32_t>(f.uint("logprobs", 0, 0, lim.max_logprobs));
  s.parse_special = f.boolean("parse_special", false);
  decode_controls(f, lim, s.controls);
  decode_constraint(f, lim, s.constraint);
  s.n = static_cast<std::uint32_t>(f.uint("n", 1, 1, kMaxSamples));
  if (f.get("prompt_logprobs"))
    s.prompt_logprobs =
        static_cast<std::uint32_t>(f.uint("prompt_logprobs", 0, 0, lim.max_logprobs));
  f.only(kSubmitFields, "submit");
  check_parse_special(s, msgs);
  return s;
}

// A score request: a prompt and the continuations to score after it.
Submit decode_score(const Fields& f, const DecodeLimits& lim) {
  Submit s;
  s.score = true;
  read_key(f, lim, s.id, s.tenant, s.token);
  const bool msgs = decode_prompt(f, lim, s);
  s.parse_special = f.boolean("parse_special", false);
  s.priority = f.str("priority", lim.max_name_bytes, false);
  s.deadline_ms = static_cast<std::uint32_t>(f.uint("deadline_ms", 0, 0, lim.max_deadline_ms));
  const msgpack::object* c = f.typed("continuations", msgpack::type::ARRAY, "an array", true);
  const std::uint32_t n = c->via.array.size;
  if (n == 0) reject("field 'continuations' must not be empty");
  if (n > kMaxContinuations)
    reject("continuations has " + num(std::uint64_t{n}) + " entries, limit " +
           num(std::uint64_t{kMaxContinuations}));
  std::size_t bytes = 0, ids = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const msgpack::object& e = c->via.array.ptr[i];
    const std::string at = "continuation at index " + num(std::uint64_t{i});
    if (e.type == msgpack::type::STR) {
      if (e.via.str.size == 0) reject(at + " must not be empty");
      bytes += e.via.str.size;
      s.continuations.emplace_back(std::string(str_of(e)));
    } else if (e.type == msgpack::type::ARRAY) {
      if (e.via.array.size == 0) reject(at + " must not be empty");
      ids += e.via.array.size;
      s.continuations.emplace_back(token_ids(e, "continuations." + num(std::uint64_t{i})));
    } else {
      reject(at + " must be a string or an array of token ids, got " + type_name(e));
    }
  }
  if (bytes > lim.max_prompt_bytes)
    reject("continuations have " + num(std::uint64_t{bytes}) + " bytes of text, limit " +
           num(std::uint64_t{lim.max_prompt_bytes}));
  if (ids > lim.max_prompt_tokens)
    reject("continuations have " + num(std::uint64_t{ids}) + " token ids, limit " +
           num(std::uint64_t{lim.max_prompt_tokens}));
  f.only(kScoreFields, "score");
  check_parse_special(s, msgs);
  return s;
}

// An operator command: the command must be one this version knows, and kv_policy needs the
// policy text (parsed by the server, which names a malformed one).
Control decode_control(const Fields& f, const DecodeLimits& lim) {
  Control c;
  c.token = f.str("token", lim.max_token_bytes, false);
  c.command = f.str("command", lim.max_name_bytes, true, false);
  if (std::find(std::begin(kControlCommands), std::end(kControlCommands), c.command) ==
      std::end(kControlCommands))
    reject("unknown control command " + quote(c.command) + " (kv_policy, stats, drain or resume)");
  const bool needs_policy = c.command == "kv_policy";
  c.policy = f.str("policy", lim.max_name_bytes, needs_policy, !needs_policy);
  return c;
}

ClientMessage decode_client_object(const msgpack::object& root, const DecodeLimits& lim,
                                   DecodeError& partial) {
  if (root.type != msgpack::type::MAP)
    reject(std::string("message must be a map, got ") + type_name(root));
  const Fields f(root, "");
  // Best effort, before anything can fail: lets the error reply name the job.
  // Only valid UTF-8 is echoed: the reply is a msgpack str that strict decoders check.
  if (const msgpack::object* id = f.get("id");
      id && id->type == msgpack::type::STR && id->via.str.size <= lim.max_id_bytes &&
      invalid_utf8_at(str_of(*id)) == std::string_view::npos)
    partial.id = std::string(str_of(*id));
  if (const msgpack::object* t = f.get("tenant");
      t && t->type == msgpack::type::STR && t->via.str.size <= lim.max_name_bytes &&
      invalid_utf8_at(str_of(*t)) == std::string_view::npos)
    partial.tenant = std::string(str_of(*t));

  const std::string_view type = message_type(f);
  if (type == "submit") return decode_submit(f, lim);
  if (type == "score") return decode_score(f, lim);
  if (type == "cancel") {
    Cancel c;
    read_key(f, lim, c.id, c.tenant, c.token);
    f.only(std::initializer_list<std::string_view>{"v", "type", "id", "tenant", "token"}, "cancel");
    return c;
  }
  if (type == "status") {
    Status s;
    read_key(f, lim, s.id, s.tenant, s.token);
    f.only(std::initializer_list<std::string_view>{"v", "type", "id", "tenant", "token"}, "status");
    return s;
  }
  if (type == "ping") {
    Ping p{f.uint("seq", 0, 0, kU64)};
    f.only(std::initializer_list<std::string_view>{"v", "type", "seq"}, "ping");
    return p;
  }
  if (type == "tool_result") {
    ToolResult t;
    read_key(f, lim, t.id, t.tenant, t.token);
    t.call = f.str("call", lim.max_id_bytes, true, false);
    t.content = f.str("content", lim.max_prompt_bytes, true);
    need_utf8(f, "content", t.content);
    f.only(std::initializer_list<std::string_view>{"v", "type", "id", "tenant", "token", "call",
                                                   "content"},
           "tool_result");
    return t;
  }
  if (type == "control") {
    Control c = decode_control(f, lim);
    f.only(std::initializer_list<std::string_view>{"v", "type", "token", "command", "policy"},
           "control");
    return c;
  }
  reject("unknown message type " + quote(type));
}

std::vector<TokenLogprobs> decode_logprobs(const msgpack::object& arr) {
  std::vector<TokenLogprobs> out;
  out.reserve(arr.via.array.size);
  for (std::uint32_t i = 0; i < arr.via.array.size; ++i) {
    const msgpack::object& e = arr.via.array.ptr[i];
    const std::string at = "logprobs." + num(std::uint64_t{i});
    if (e.type != msgpack::type::MAP)
      reject("field '" + at + "' must be a map, got " + type_name(e));
    const Fields f(e, at + ".");
    TokenLogprobs t;
    const double inf = std::numeric_limits<double>::infinity();
    t.logprob = static_cast<float>(f.number("logprob", 0.0, -inf, 0.0, false, true));
    if (const msgpack::object* top = f.typed("top", msgpack::type::ARRAY, "an array", false)) {
      for (std::uint32_t j = 0; j < top->via.array.size; ++j) {
        const msgpack::object& pair = top->via.array.ptr[j];
        const std::string pat = at + ".top." + num(std::uint64_t{j});
        if (pair.type != msgpack::type::ARRAY || pair.via.array.size != 2)
          reject("field '" + pat + "' must be an [id, logprob] pair");
        TopLogprob tl;
        tl.id = static_cast<std::int32_t>(
            Fields::uint_value(pair.via.array.ptr[0], pat + ".id", 0, kMaxTokenId));
        tl.logprob = static_cast<float>(
            Fields::number_value(pair.via.array.ptr[1], pat + ".logprob", -inf, 0.0, false));
        t.top.push_back(tl);
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

// A done's `choices`: one map per sample.
std::vector<Choice> decode_choices(const msgpack::object& arr, const DecodeLimits& lim) {
  std::vector<Choice> out;
  for (std::uint32_t i = 0; i < arr.via.array.size; ++i) {
    const msgpack::object& e = arr.via.array.ptr[i];
    const std::string at = "choices." + num(std::uint64_t{i});
    if (e.type != msgpack::type::MAP)
      reject("field '" + at + "' must be a map, got " + type_name(e));
    const Fields f(e, at + ".");
    Choice c;
    c.index = static_cast<std::uint32_t>(f.uint("index", 0, 0, kU32));
    const std::string fr = f.str("finish_reason", lim.max_name_bytes, true);
    const auto reason = finish_reason_from_string(fr);
    if (!reason) reject("unknown finish_reason " + quote(fr));
    c.finish_reason = *reason;
    c.text = f.str("text", lim.max_string_bytes, false);
    if (const msgpack::object* ids = f.typed("ids", msgpack::type::ARRAY, "an array", false))
      c.ids = token_ids(*ids, at + ".ids");
    if (const msgpack::object* lp = f.typed("logprobs", msgpack::type::ARRAY, "an array", false))
      c.logprobs = decode_logprobs(*lp);
    out.push_back(std::move(c));
  }
  return out;
}

// A done's `prompt_logprobs`: {"id", "logprob", "top"} per prompt position after the first.
std::vector<PromptLogprob> decode_prompt_logprobs(const msgpack::object& arr) {
  std::vector<PromptLogprob> out;
  const std::vector<TokenLogprobs> lps = decode_logprobs(arr);
  for (std::uint32_t i = 0; i < arr.via.array.size; ++i) {
    const Fields f(arr.via.array.ptr[i], "prompt_logprobs." + num(std::uint64_t{i}) + ".");
    PromptLogprob p;
    p.id = static_cast<std::int32_t>(f.uint("id", 0, 0, kMaxTokenId, true));
    p.logprob = lps[i].logprob;
    p.top = lps[i].top;
    out.push_back(std::move(p));
  }
  return out;
}

// A done's `scores`: one map per continuation.
std::vector<Score> decode_scores(const msgpack::object& arr) {
  std::vector<Score> out;
  const double inf = std::numeric_limits<double>::infinity();
  for (std::uint32_t i = 0; i < arr.via.array.size; ++i) {
    const msgpack::object& e = arr.via.array.ptr[i];
    const std::string at = "scores." + num(std::uint64_t{i});
    if (e.type != msgpack::type::MAP)
      reject("field '" + at + "' must be a map, got " + type_name(e));
    const Fields f(e, at + ".");
    Score sc;
    sc.index = static_cast<std::uint32_t>(f.uint("index", 0, 0, kU32));
    sc.logprob = f.number("logprob", 0.0, -inf, 0.0, false, true);
    sc.mean = f.number("mean", 0.0, -inf, 0.0, false, true);
    sc.tokens = static_cast<std::uint32_t>(f.uint("tokens", 0, 0, kU32, true));
    out.push_back(sc);
  }
  return out;
}

ServerMessage decode_server_object(const msgpack::object& root, const DecodeLimits& lim,
                                   DecodeError& partial) {
  if (root.type != msgpack::type::MAP)
    reject(std::string("message must be a map, got ") + type_name(root));
  const Fields f(root, "");
  if (const msgpack::object* id = f.get("id");
      id && id->type == msgpack::type::STR && id->via.str.size <= lim.max_id_bytes)
    partial.id = std::string(str_of(*id));
  const std::string_view type = message_type(f);
  // A timing is a non-negative duration; a day bounds it like deadline_ms.
  const double max_ms = 86'400'000.0;
  if (type == "accepted") {
    Accepted a;
    a.id = f.str("id", lim.max_id_bytes, true, false);
    a.queue_position = static_cast<std::uint32_t>(f.uint("queue_position", 0, 0, kU32));
    a.tenant = f.str("tenant", lim.max_name_bytes, false);
    return a;
  }
  if (type == "tokens") {
    Tokens t;
    t.id = f.str("id", lim.max_id_bytes, true, false);
    t.index = static_cast<std::uint32_t>(f.uint("index", 0, 0, kU32));
    if (const msgpack::object* ids = f.typed("ids", msgpack::type::ARRAY, "an array", false))
      t.ids = token_ids(*ids, "ids");
    t.text = f.str("text", lim.max_string_bytes, false);
    if (const msgpack::object* lp = f.typed("logprobs", msgpack::type::ARRAY, "an array", false))
      t.logprobs = decode_logprobs(*lp);
    t.tenant = f.str("tenant", lim.max_name_bytes, false);
    t.choice = static_cast<std::uint32_t>(f.uint("choice", 0, 0, kU32));
    t.step = f.str("step", lim.max_id_bytes, false);
    return t;
  }
  if (type == "done") {
    Done d;
    d.id = f.str("id", lim.max_id_bytes, true, false);
    d.tenant = f.str("tenant", lim.max_name_bytes, false);
    const std::string fr = f.str("finish_reason", lim.max_name_bytes, true);
    const auto reason = finish_reason_from_string(fr);
    if (!reason) reject("unknown finish_reason " + quote(fr));
    d.finish_reason = *reason;
    d.text = f.str("text", lim.max_string_bytes, false);
    if (const msgpack::object* ids = f.typed("ids", msgpack::type::ARRAY, "an array", false))
      d.ids = token_ids(*ids, "ids");
    if (const msgpack::object* u = f.typed("usage", msgpack::type::MAP, "a map", false)) {
      const Fields uf(*u, "usage.");
      d.usage.prompt_tokens = static_cast<std::uint32_t>(uf.uint("prompt_tokens", 0, 0, kU32));
      d.usage.completion_tokens =
          static_cast<std::uint32_t>(uf.uint("completion_tokens", 0, 0, kU32));
      d.usage.cached_tokens = static_cast<std::uint32_t>(uf.uint("cached_tokens", 0, 0, kU32));
    }
    if (const msgpack::object* t = f.typed("timings", msgpack::type::MAP, "a map", false)) {
      const Fields tf(*t, "timings.");
      d.timings.queue_ms = tf.number("queue_ms", 0.0, 0.0, max_ms);
      d.timings.ttft_ms = tf.number("ttft_ms", 0.0, 0.0, max_ms);
      d.timings.total_ms = tf.number("total_ms", 0.0, 0.0, max_ms);
    }
    if (const msgpack::object* lp = f.typed("logprobs", msgpack::type::ARRAY, "an array", false))
      d.logprobs = decode_logprobs(*lp);
    if (const msgpack::object* cs = f.typed("choices", msgpack::type::ARRAY, "an array", false))
      d.choices = decode_choices(*cs, lim);
    if (const msgpack::object* pl =
            f.typed("prompt_logprobs", msgpack::type::ARRAY, "an array", false))
      d.prompt_logprobs = decode_prompt_logprobs(*pl);
    if (const msgpack::object* sc = f.typed("scores", msgpack::type::ARRAY, "an array", false))
      d.scores = decode_scores(*sc);
    if (const msgpack::object* vs = f.typed("vars", msgpack::type::MAP, "a map", false)) {
      for (std::uint32_t i = 0; i < vs->via.map.size; ++i) {
        const auto& kv = vs->via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) reject("vars: names must be strings");
        Var v;
        v.name = std::string(str_of(kv.key));
        if (kv.val.type == msgpack::type::STR) {
          v.values.emplace_back(str_of(kv.val));
        } else if (kv.val.type == msgpack::type::ARRAY) {
          v.list = true;
          for (std::uint32_t k = 0; k < kv.val.via.array.size; ++k) {
            const msgpack::object& e = kv.val.via.array.ptr[k];
            if (e.type != msgpack::type::STR) reject("vars." + v.name + ": items must be strings");
            v.values.emplace_back(str_of(e));
          }
        } else {
          reject("vars." + v.name + " must be a string or an array of strings");
        }
        d.vars.push_back(std::move(v));
      }
    }
    d.steps = static_cast<std::uint32_t>(f.uint("steps", 0, 0, kU32));
    return d;
  }
  if (type == "error") {
    Error e;
    e.id = f.str("id", lim.max_id_bytes, false);
    e.tenant = f.str("tenant", lim.max_name_bytes, false);
    const std::string code = f.str("code", lim.max_name_bytes, true);
    // A code from a newer server is kept as internal; the message still says what happened.
    e.code = error_code_from_string(code).value_or(ErrorCode::internal);
    e.message = f.str("message", lim.max_string_bytes, false);
    if (f.get("retry_after_ms"))
      e.retry_after_ms = static_cast<std::uint32_t>(f.uint("retry_after_ms", 0, 0, kU32));
    return e;
  }
  if (type == "pong") return Pong{f.uint("seq", 0, 0, kU64)};
  if (type == "status_reply") {
    StatusReply s;
    s.id = f.str("id", lim.max_id_bytes, true, false);
    const std::string st = f.str("state", lim.max_name_bytes, true);
    const auto state = job_state_from_string(st);
    if (!state) reject("unknown state " + quote(st));
    s.state = *state;
    s.queue_position = static_cast<std::uint32_t>(f.uint("queue_position", 0, 0, kU32));
    s.completion_tokens = static_cast<std::uint32_t>(f.uint("completion_tokens", 0, 0, kU32));
    s.tenant = f.str("tenant", lim.max_name_bytes, false);
    return s;
  }
  if (type == "step") {
    Step s;
    s.id = f.str("id", lim.max_id_bytes, true, false);
    s.tenant = f.str("tenant", lim.max_name_bytes, false);
    s.step = f.str("step", lim.max_id_bytes, true, false);
    s.name = f.str("name", lim.max_name_bytes, false);
    s.kind = f.str("kind", lim.max_name_bytes, false);
    s.output = f.str("output", lim.max_string_bytes, false);
    return s;
  }
  if (type == "tool_call") {
    ToolCall t;
    t.id = f.str("id", lim.max_id_bytes, true, false);
    t.tenant = f.str("tenant", lim.max_name_bytes, false);
    t.call = f.str("call", lim.max_id_bytes, true, false);
    t.name = f.str("name", lim.max_name_bytes, false);
    t.arguments = f.str("arguments", lim.max_string_bytes, false);
    return t;
  }
  if (type == "control_reply") {
    ControlReply c;
    c.command = f.str("command", lim.max_name_bytes, true, false);
    c.result = f.str("result", lim.max_string_bytes, false);
    return c;
  }
  reject("unknown message type " + quote(type));
}

template <class Message, class Body>
std::variant<Message, DecodeError> decode_with(const void* data, std::size_t size,
                                               const DecodeLimits& lim, Body body) {
  DecodeError err;
  try {
    if (!data && size > 0) reject("bad msgpack: null buffer");
    msgpack::object_handle h = unpack_checked(data, size, lim);
    return body(h.get(), lim, err);
  } catch (const Reject& r) {
    err.message = r.message;
  } catch (const std::bad_alloc&) {
    err.message = "message too large to decode";
  } catch (const std::exception& e) {
    err.code = ErrorCode::internal;
    err.message = std::string("decoder failure: ") + e.what();
  }
  return err;
}

// ---- encoding ---------------------------------------------------------------------------------

// msgpack-c's packer needs a stream with write(); this one appends to a string.
struct StringSink {
  std::string s;
  void write(const char* d, std::size_t n) { s.append(d, n); }
};

using Packer = msgpack::packer<StringSink>;

void pack_str(Packer& p, std::string_view s) {
  p.pack_str(static_cast<std::uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

// Writes a map whose size is known only at the end: fields go to a body, the header is prepended.
// Note: msgpack-c packs a double with an integral value (0.0, 1.0) as an integer; decoders accept
// integers wherever a number is expected.
class MapOut {
 public:
  MapOut() : p_(body_) {}
  Packer& key(std::string_view k) {
    ++n_;
    pack_str(p_, k);
    return p_;
  }
  void str(std::string_view k, std::string_view v) { pack_str(key(k), v); }
  void uint(std::string_view k, std::uint64_t v) { key(k).pack_uint64(v); }
  void number(std::string_view k, double v) { key(k).pack_double(v); }
  void boolean(std::string_view k, bool v) { v ? key(k).pack_true() : key(k).pack_false(); }
  void ids(std::string_view k, const std::vector<std::int32_t>& v) {
    Packer& p = key(k);
    p.pack_array(static_cast<std::uint32_t>(v.size()));
    for (std::int32_t x : v) p.pack_int32(x);
  }
  void raw(std::string_view k, const std::string& encoded) {
    key(k);
    body_.write(encoded.data(), encoded.size());
  }
  void head(std::string_view type) {
    uint("v", kProtocolVersion);
    str("type", type);
  }
  std::string finish() {
    StringSink out;
    Packer(out).pack_map(n_);
    out.s += body_.s;
    return std::move(out.s);
  }

 private:
  StringSink body_;
  Packer p_;
  std::uint32_t n_ = 0;
};

std::string encode_logprobs(const std::vector<TokenLogprobs>& v) {
  StringSink out;
  Packer p(out);
  p.pack_array(static_cast<std::uint32_t>(v.size()));
  for (const TokenLogprobs& t : v) {
    MapOut m;
    m.key("logprob").pack_float(t.logprob);  // float32: logprobs need no more, and they are many
    if (!t.top.empty()) {
      Packer& tp = m.key("top");
      tp.pack_array(static_cast<std::uint32_t>(t.top.size()));
      for (const TopLogprob& tl : t.top) {
        tp.pack_array(2);
        tp.pack_int32(tl.id);
        tp.pack_float(tl.logprob);
      }
    }
    out.s += m.finish();
  }
  return std::move(out.s);
}

struct ServerEncoder {
  std::string operator()(const Accepted& a) const {
    MapOut m;
    m.head("accepted");
    m.str("id", a.id);
    if (!a.tenant.empty()) m.str("tenant", a.tenant);
    m.uint("queue_position", a.queue_position);
    return m.finish();
  }
  std::string operator()(const Tokens& t) const {
    MapOut m;
    m.head("tokens");
    m.str("id", t.id);
    if (!t.tenant.empty()) m.str("tenant", t.tenant);
    m.uint("index", t.index);
    m.ids("ids", t.ids);
    m.str("text", t.text);
    if (!t.logprobs.empty()) m.raw("logprobs", encode_logprobs(t.logprobs));
    if (t.choice != 0) m.uint("choice", t.choice);
    if (!t.step.empty()) m.str("step", t.step);
    return m.finish();
  }
  std::string operator()(const Done& d) const {
    MapOut m;
    m.head("done");
    m.str("id", d.id);
    if (!d.tenant.empty()) m.str("tenant", d.tenant);
    m.str("finish_reason", to_string(d.finish_reason));
    m.str("text", d.text);
    if (!d.ids.empty()) m.ids("ids", d.ids);
    MapOut u;
    u.uint("prompt_tokens", d.usage.prompt_tokens);
    u.uint("completion_tokens", d.usage.completion_tokens);
    // Left out when 0 (no prefix cache hit), like every optional field at its default.
    if (d.usage.cached_tokens != 0) u.uint("cached_tokens", d.usage.cached_tokens);
    m.raw("usage", u.finish());
    MapOut t;
    t.number("queue_ms", d.timings.queue_ms);
    t.number("ttft_ms", d.timings.ttft_ms);
    t.number("total_ms", d.timings.total_ms);
    m.raw("timings", t.finish());
    if (!d.logprobs.empty()) m.raw("logprobs", encode_logprobs(d.logprobs));
    if (!d.choices.empty()) {
      StringSink arr;
      Packer(arr).pack_array(static_cast<std::uint32_t>(d.choices.size()));
      for (const Choice& c : d.choices) {
        MapOut cm;
        cm.uint("index", c.index);
        cm.str("finish_reason", to_string(c.finish_reason));
        cm.str("text", c.text);
        if (!c.ids.empty()) cm.ids("ids", c.ids);
        if (!c.logprobs.empty()) cm.raw("logprobs", encode_logprobs(c.logprobs));
        arr.s += cm.finish();
      }
      m.raw("choices", arr.s);
    }
    if (!d.prompt_logprobs.empty()) {
      StringSink arr;
      Packer(arr).pack_array(static_cast<std::uint32_t>(d.prompt_logprobs.size()));
      for (const PromptLogprob& p : d.prompt_logprobs) {
        MapOut pm;
        pm.key("id").pack_int32(p.id);
        pm.key("logprob").pack_float(p.logprob);
        if (!p.top.empty()) {
          Packer& tp = pm.key("top");
          tp.pack_array(static_cast<std::uint32_t>(p.top.size()));
          for (const TopLogprob& tl : p.top) {
            tp.pack_array(2);
            tp.pack_int32(tl.id);
            tp.pack_float(tl.logprob);
          }
        }
        arr.s += pm.finish();
      }
      m.raw("prompt_logprobs", arr.s);
    }
    if (!d.scores.empty()) {
      StringSink arr;
      Packer(arr).pack_array(static_cast<std::uint32_t>(d.scores.size()));
      for (const Score& sc : d.scores) {
        MapOut sm;
        sm.uint("index", sc.index);
        sm.number("logprob", sc.logprob);  // float64: sums of many tokens keep their digits
        sm.number("mean", sc.mean);
        sm.uint("tokens", sc.tokens);
        arr.s += sm.finish();
      }
      m.raw("scores", arr.s);
    }
    if (!d.vars.empty()) {
      Packer& p = m.key("vars");
      p.pack_map(static_cast<std::uint32_t>(d.vars.size()));
      for (const Var& v : d.vars) {
        pack_str(p, v.name);
        if (v.list) {
          p.pack_array(static_cast<std::uint32_t>(v.values.size()));
          for (const std::string& x : v.values) pack_str(p, x);
        } else {
          pack_str(p, v.values.empty() ? std::string_view() : std::string_view(v.values[0]));
        }
      }
    }
    if (d.steps != 0) m.uint("steps", d.steps);
    return m.finish();
  }
  std::string operator()(const Step& s) const {
    MapOut m;
    m.head("step");
    m.str("id", s.id);
    if (!s.tenant.empty()) m.str("tenant", s.tenant);
    m.str("step", s.step);
    m.str("name", s.name);
    m.str("kind", s.kind);
    m.str("output", s.output);
    return m.finish();
  }
  std::string operator()(const ToolCall& t) const {
    MapOut m;
    m.head("tool_call");
    m.str("id", t.id);
    if (!t.tenant.empty()) m.str("tenant", t.tenant);
    m.str("call", t.call);
    m.str("name", t.name);
    m.str("arguments", t.arguments);
    return m.finish();
  }
  std::string operator()(const Error& e) const {
    MapOut m;
    m.head("error");
    if (!e.id.empty()) m.str("id", e.id);
    if (!e.tenant.empty()) m.str("tenant", e.tenant);
    m.str("code", to_string(e.code));
    m.str("message", e.message);
    if (e.retry_after_ms) m.uint("retry_after_ms", *e.retry_after_ms);
    return m.finish();
  }
  std::string operator()(const Pong& p) const {
    MapOut m;
    m.head("pong");
    m.uint("seq", p.seq);
    return m.finish();
  }
  std::string operator()(const StatusReply& s) const {
    MapOut m;
    m.head("status_reply");
    m.str("id", s.id);
    if (!s.tenant.empty()) m.str("tenant", s.tenant);
    m.str("state", to_string(s.state));
    m.uint("queue_position", s.queue_position);
    m.uint("completion_tokens", s.completion_tokens);
    return m.finish();
  }
  std::string operator()(const ControlReply& c) const {
    MapOut m;
    m.head("control_reply");
    m.str("command", c.command);
    m.str("result", c.result);
    return m.finish();
  }
};

void encode_key(MapOut& m, const std::string& id, const std::string& tenant,
                const std::string& token) {
  m.str("id", id);
  m.str("tenant", tenant);
  if (!token.empty()) m.str("token", token);
}

struct ClientEncoder {
  std::string operator()(const Submit& s) const {
    MapOut m;
    m.head(s.score ? "score" : "submit");
    encode_key(m, s.id, s.tenant, s.token);
    if (s.is_program()) {
      // The steps travel as msgpack, not as JSON text: the server reads a map like any other.
      const auto bytes = nlohmann::json::to_msgpack(nlohmann::json::parse(s.program));
      m.raw("program", std::string(bytes.begin(), bytes.end()));
      if (!s.inputs.empty()) {
        Packer& p = m.key("inputs");
        p.pack_map(static_cast<std::uint32_t>(s.inputs.size()));
        for (const auto& [k, v] : s.inputs) {
          pack_str(p, k);
          pack_str(p, v);
        }
      }
    } else if (s.has_messages()) {
      Packer& p = m.key("messages");
      p.pack_array(static_cast<std::uint32_t>(s.messages.size()));
      for (const ChatMessage& x : s.messages) {
        p.pack_map(2);
        pack_str(p, "role");
        pack_str(p, x.role);
        pack_str(p, "content");
        pack_str(p, x.content);
      }
    } else if (const auto* text = std::get_if<std::string>(&s.prompt)) {
      m.str("prompt", *text);
    } else {
      m.ids("prompt", std::get<std::vector<std::int32_t>>(s.prompt));
    }
    if (s.score) {
      if (s.parse_special) m.boolean("parse_special", true);
      if (!s.priority.empty()) m.str("priority", s.priority);
      if (s.deadline_ms != 0) m.uint("deadline_ms", s.deadline_ms);
      Packer& p = m.key("continuations");
      p.pack_array(static_cast<std::uint32_t>(s.continuations.size()));
      for (const auto& c : s.continuations) {
        if (const auto* text = std::get_if<std::string>(&c)) {
          pack_str(p, *text);
        } else {
          const auto& ids = std::get<std::vector<std::int32_t>>(c);
          p.pack_array(static_cast<std::uint32_t>(ids.size()));
          for (std::int32_t id : ids) p.pack_int32(id);
        }
      }
      return m.finish();
    }
    if (s.max_tokens != 16) m.uint("max_tokens", s.max_tokens);
    if (s.temperature != 1.0) m.number("temperature", s.temperature);
    if (s.top_k != 0) m.uint("top_k", s.top_k);
    if (s.top_p != 1.0) m.number("top_p", s.top_p);
    if (s.seed) m.uint("seed", *s.seed);
    if (!s.stop.empty()) {
      Packer& p = m.key("stop");
      p.pack_array(static_cast<std::uint32_t>(s.stop.size()));
      for (const std::string& x : s.stop) pack_str(p, x);
    }
    if (s.ignore_eos) m.boolean("ignore_eos", true);
    if (!s.speculative.empty()) m.str("speculative", s.speculative);
    if (!s.priority.empty()) m.str("priority", s.priority);
    if (s.deadline_ms != 0) m.uint("deadline_ms", s.deadline_ms);
    if (!s.trace.empty()) m.str("trace", s.trace);
    if (s.stream) m.boolean("stream", true);
    if (s.logprobs != 0) m.uint("logprobs", s.logprobs);
    if (s.parse_special) m.boolean("parse_special", true);
    const SamplingControls& c = s.controls;
    if (c.min_p != 0.0f) m.number("min_p", c.min_p);
    if (c.presence_penalty != 0.0f) m.number("presence_penalty", c.presence_penalty);
    if (c.frequency_penalty != 0.0f) m.number("frequency_penalty", c.frequency_penalty);
    if (c.repetition_penalty != 1.0f) m.number("repetition_penalty", c.repetition_penalty);
    if (c.repeat_last_n != 64) m.key("repeat_last_n").pack_int64(c.repeat_last_n);
    if (!c.logit_bias.empty()) {
      Packer& p = m.key("logit_bias");
      p.pack_map(static_cast<std::uint32_t>(c.logit_bias.size()));
      for (const auto& [id, bias] : c.logit_bias) {
        p.pack_int32(id);
        p.pack_double(bias);
      }
    }
    const Constraint& k = s.constraint;
    if (k.kind == Constraint::choices) {
      Packer& p = m.key("choices");
      p.pack_array(static_cast<std::uint32_t>(k.options.size()));
      for (const std::string& x : k.options) pack_str(p, x);
    } else if (k.kind != Constraint::none) {
      m.str(constraint_kind_name(k.kind), k.source);
    }
    if (s.n != 1) m.uint("n", s.n);
    if (s.prompt_logprobs) m.uint("prompt_logprobs", *s.prompt_logprobs);
    return m.finish();
  }
  std::string operator()(const Cancel& c) const {
    MapOut m;
    m.head("cancel");
    encode_key(m, c.id, c.tenant, c.token);
    return m.finish();
  }
  std::string operator()(const Status& s) const {
    MapOut m;
    m.head("status");
    encode_key(m, s.id, s.tenant, s.token);
    return m.finish();
  }
  std::string operator()(const Ping& p) const {
    MapOut m;
    m.head("ping");
    if (p.seq != 0) m.uint("seq", p.seq);
    return m.finish();
  }
  std::string operator()(const ToolResult& t) const {
    MapOut m;
    m.head("tool_result");
    encode_key(m, t.id, t.tenant, t.token);
    m.str("call", t.call);
    m.str("content", t.content);
    return m.finish();
  }
  std::string operator()(const Control& c) const {
    MapOut m;
    m.head("control");
    if (!c.token.empty()) m.str("token", c.token);
    m.str("command", c.command);
    if (!c.policy.empty()) m.str("policy", c.policy);
    return m.finish();
  }
};

}  // namespace

std::variant<ClientMessage, DecodeError> decode_client(const void* data, std::size_t size,
                                                       const DecodeLimits& limits) {
  return decode_with<ClientMessage>(data, size, limits, decode_client_object);
}

std::variant<ServerMessage, DecodeError> decode_server(const void* data, std::size_t size,
                                                       const DecodeLimits& limits) {
  return decode_with<ServerMessage>(data, size, limits, decode_server_object);
}

std::string encode_server(const ServerMessage& m) {
  return std::visit(ServerEncoder{}, m);
}

std::string encode_client(const ClientMessage& m) {
  return std::visit(ClientEncoder{}, m);
}

}  // namespace sy::wire
