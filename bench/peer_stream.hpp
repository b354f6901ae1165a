// What bench_loadgen reads from an HTTP server: an incremental HTTP/1.1 response parser for
// keep-alive connections (Content-Length or chunked bodies), a server-sent-events splitter, and
// the fields of one stream chunk of llama-server's native POST /completion or of OpenAI's POST
// /v1/completions (which llama-server and our HTTP door both serve), with the request bodies of
// both. Header-only and free of sockets, so it is unit tested on byte strings
// (tests/unit/test_bench_peer_stream.cpp, tests/unit/test_bench_openai_stream.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sy::bench {

/// A response that is not HTTP/1.1 as this client speaks it.
struct HttpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One response at a time, fed bytes as they arrive. Body bytes (after removing the chunked
/// coding) go to the callback as they come; `done()` once the whole response is read. Bytes
/// beyond the response's end are not consumed (`feed` returns how many it took): the client
/// never pipelines, so the caller treats leftovers as a protocol error.
class HttpResponseParser {
 public:
  using BodySink = std::function<void(std::string_view)>;

  // A status or header line longer than this is no llama-server response.
  static constexpr size_t kMaxLine = 16 * 1024;
  // Nor are more header lines than this.
  static constexpr size_t kMaxHeaders = 128;

  void reset() { *this = HttpResponseParser(); }

  size_t feed(const char* p, size_t n, const BodySink& sink) {
    size_t i = 0;
    while (i < n && state_ != State::done) {
      switch (state_) {
        case State::body_length:
        case State::chunk_data: {
          size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, n - i));
          if (take) sink(std::string_view(p + i, take));
          i += take;
          remaining_ -= take;
          if (remaining_ == 0)
            state_ = state_ == State::body_length ? State::done : State::chunk_data_end;
          break;
        }
        default: {
          // Line-oriented states: collect up to '\n'.
          const char c = p[i++];
          if (c != '\n') {
            line_ += c;
            if (line_.size() > kMaxLine) throw HttpError("HTTP line longer than 16 KiB");
            break;
          }
          if (!line_.empty() && line_.back() == '\r') line_.pop_back();
          on_line();
          line_.clear();
        }
      }
    }
    return i;
  }

  bool headers_done() const { return headers_done_; }
  bool done() const { return state_ == State::done; }
  int status() const { return status_; }
  /// False when the server said it closes the connection after this response.
  bool keep_alive() const { return keep_alive_; }
  const std::string& content_type() const { return content_type_; }

 private:
  enum class State {
    status_line,
    headers,
    body_length,
    chunk_size,
    chunk_data,
    chunk_data_end,
    trailers,
    done
  };

  static std::string lower(std::string s) {
    for (char& c : s)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return s;
  }

  static std::string trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  }

  void on_line() {
    switch (state_) {
      case State::status_line: {
        // "HTTP/1.1 200 OK"
        if (line_.rfind("HTTP/1.", 0) != 0 || line_.size() < 12 || line_[8] != ' ')
          throw HttpError("bad HTTP status line '" + line_.substr(0, 80) + "'");
        keep_alive_ = line_[7] == '1';  // HTTP/1.0 closes unless it says keep-alive
        status_ = 0;
        for (size_t k = 9; k < 12; ++k) {
          if (line_[k] < '0' || line_[k] > '9')
            throw HttpError("bad HTTP status code in '" + line_.substr(0, 80) + "'");
          status_ = status_ * 10 + (line_[k] - '0');
        }
        state_ = State::headers;
        break;
      }
      case State::headers: {
        if (!line_.empty()) {
          if (++n_headers_ > kMaxHeaders) throw HttpError("more than 128 HTTP header lines");
          size_t colon = line_.find(':');
          if (colon == std::string::npos)
            throw HttpError("bad HTTP header line '" + line_.substr(0, 80) + "'");
          const std::string name = lower(trim(line_.substr(0, colon)));
          const std::string value = trim(line_.substr(colon + 1));
          if (name == "content-length") {
            try {
              size_t pos = 0;
              content_length_ = std::stoull(value, &pos);
              if (pos != value.size()) throw std::invalid_argument("trailing");
            } catch (const std::exception&) {
              throw HttpError("bad Content-Length '" + value + "'");
            }
          } else if (name == "transfer-encoding") {
            if (lower(value).find("chunked") == std::string::npos)
              throw HttpError("unsupported Transfer-Encoding '" + value + "'");
            chunked_ = true;
          } else if (name == "connection") {
            const std::string v = lower(value);
            if (v.find("close") != std::string::npos) keep_alive_ = false;
            if (v.find("keep-alive") != std::string::npos) keep_alive_ = true;
          } else if (name == "content-type") {
            content_type_ = value;
          }
          break;
        }
        headers_done_ = true;
        if (chunked_)
          state_ = State::chunk_size;
        else if (content_length_ >= 0) {
          remaining_ = static_cast<uint64_t>(content_length_);
          state_ = remaining_ ? State::body_length : State::done;
        } else if (status_ == 204 || status_ == 304 || (status_ >= 100 && status_ < 200)) {
          state_ = State::done;
        } else {
          // A body up to the connection's close cannot share a keep-alive connection.
          throw HttpError("HTTP response with neither Content-Length nor chunked coding");
        }
        break;
      }
      case State::chunk_size: {
        // "1a2b[;extension]"
        std::string hex = trim(line_.substr(0, line_.find(';')));
        if (hex.empty() || hex.size() > 15) throw HttpError("bad chunk size line '" + line_ + "'");
        uint64_t size = 0;
        for (char c : hex) {
          int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
          if (d < 0) throw HttpError("bad chunk size line '" + line_ + "'");
          size = size * 16 + static_cast<uint64_t>(d);
        }
        remaining_ = size;
        state_ = size ? State::chunk_data : State::trailers;
        break;
      }
      case State::chunk_data_end:
        if (!line_.empty()) throw HttpError("chunk data not followed by CRLF");
        state_ = State::chunk_size;
        break;
      case State::trailers:
        if (line_.empty()) state_ = State::done;
        break;
      default:
        break;
    }
  }

  State state_ = State::status_line;
  std::string line_;
  int status_ = 0;
  bool keep_alive_ = true;
  bool chunked_ = false;
  bool headers_done_ = false;
  int64_t content_length_ = -1;
  uint64_t remaining_ = 0;
  size_t n_headers_ = 0;
  std::string content_type_;
};

/// One server-sent event: the field name of its lines ("data"; llama-server names its error
/// events "error") and their values joined by '\n'.
struct SseEvent {
  std::string field;
  std::string value;
};

/// Splits a text/event-stream body into events (a blank line ends one). Lines starting with ':'
/// are comments.
class SseParser {
 public:
  // One /completion chunk is a few hundred bytes; an event this big is a broken stream.
  static constexpr size_t kMaxEvent = 4u << 20;

  /// Appends bytes; returns the events they completed.
  std::vector<SseEvent> feed(std::string_view bytes) {
    std::vector<SseEvent> out;
    for (char c : bytes) {
      if (c != '\n') {
        line_ += c;
        if (line_.size() + cur_.value.size() > kMaxEvent)
          throw HttpError("server-sent event larger than 4 MiB");
        continue;
      }
      if (!line_.empty() && line_.back() == '\r') line_.pop_back();
      if (line_.empty()) {
        if (has_field_) out.push_back(std::move(cur_));
        cur_ = SseEvent();
        has_field_ = false;
      } else if (line_[0] != ':') {
        size_t colon = line_.find(':');
        std::string name = line_.substr(0, colon);
        std::string value;
        if (colon != std::string::npos) {
          value = line_.substr(colon + 1);
          if (!value.empty() && value[0] == ' ') value.erase(0, 1);
        }
        if (has_field_) cur_.value += '\n';
        cur_.field = std::move(name);
        cur_.value += value;
        has_field_ = true;
      }
      line_.clear();
    }
    return out;
  }

  /// True when bytes of an unfinished event are buffered (a stream that ends here was cut).
  bool pending() const { return has_field_ || !line_.empty(); }

 private:
  std::string line_;
  SseEvent cur_;
  bool has_field_ = false;
};

/// The fields bench_loadgen uses of one llama-server /completion stream chunk.
struct PeerChunk {
  bool error = false;
  std::string error_message;
  uint32_t tokens = 0;                         // ids in "tokens" (the tokens this chunk streams)
  bool has_content = false;                    // non-empty "content"
  bool stop = false;                           // the final chunk
  int64_t tokens_predicted = -1;               // -1: absent
  int64_t predicted_n = -1;                    // timings.predicted_n; -1: absent
  double prompt_ms = NAN, predicted_ms = NAN;  // timings (final chunk)
  std::string stop_type;
};

/// Reads one event of a /completion stream. Throws std::runtime_error when it is not JSON.
inline PeerChunk parse_peer_chunk(const SseEvent& ev) {
  PeerChunk c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ev.value);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("llama-server sent a " + ev.field + " event that is not JSON (" +
                             e.what() + "): " + ev.value.substr(0, 200));
  }
  auto message_of = [](const nlohmann::json& e) {
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    return e.dump();
  };
  if (ev.field == "error") {
    c.error = true;
    c.error_message = message_of(j.is_object() && j.contains("error") ? j["error"] : j);
    return c;
  }
  if (!j.is_object()) throw std::runtime_error("llama-server chunk is not an object: " + ev.value);
  if (j.contains("error")) {
    c.error = true;
    c.error_message = message_of(j["error"]);
    return c;
  }
  if (auto it = j.find("tokens"); it != j.end() && it->is_array())
    c.tokens = static_cast<uint32_t>(it->size());
  if (auto it = j.find("content"); it != j.end() && it->is_string())
    c.has_content = !it->get_ref<const std::string&>().empty();
  if (auto it = j.find("stop"); it != j.end() && it->is_boolean()) c.stop = it->get<bool>();
  if (auto it = j.find("tokens_predicted"); it != j.end() && it->is_number_integer())
    c.tokens_predicted = it->get<int64_t>();
  if (auto it = j.find("stop_type"); it != j.end() && it->is_string())
    c.stop_type = it->get<std::string>();
  if (auto it = j.find("timings"); it != j.end() && it->is_object()) {
    const auto& t = *it;
    if (auto p = t.find("predicted_n"); p != t.end() && p->is_number_integer())
      c.predicted_n = p->get<int64_t>();
    if (auto p = t.find("prompt_ms"); p != t.end() && p->is_number())
      c.prompt_ms = p->get<double>();
    if (auto p = t.find("predicted_ms"); p != t.end() && p->is_number())
      c.predicted_ms = p->get<double>();
  }
  return c;
}

/// One request of the workload.
struct PeerRequest {
  std::vector<int32_t> prompt;  // token ids, sent as they are (no BOS added, as ours)
  std::string prompt_text;      // sent instead of the ids when not empty (--prompt-kind text)
  uint32_t max_tokens = 0;
  double temperature = 0;
  uint64_t seed = 0;
  bool ignore_eos = true;
};

/// The prompt of `r` as JSON: its text when it has one, else its token ids.
inline nlohmann::json prompt_json(const PeerRequest& r) {
  return r.prompt_text.empty() ? nlohmann::json(r.prompt) : nlohmann::json(r.prompt_text);
}

/// The JSON body of one streamed /completion request; greedy with temperature 0.
inline std::string completion_body(const PeerRequest& r) {
  nlohmann::json j = {{"prompt", prompt_json(r)},
                      {"n_predict", r.max_tokens},
                      {"ignore_eos", r.ignore_eos},
                      {"temperature", r.temperature},
                      {"seed", r.seed},
                      {"stream", true},
                      {"cache_prompt", true}};
  if (r.temperature <= 0) {
    // Greedy as ours: the most likely token alone, no repetition penalty (llama-server's
    // default 1.1 would change the tokens, not their count), no other samplers.
    j["top_k"] = 1;
    j["repeat_penalty"] = 1.0;
    j["samplers"] = {"top_k", "temperature"};
  }
  return j.dump();
}

// ---- OpenAI's POST /v1/completions ---------------------------------------------------------------

/// Which HTTP API the client speaks.
enum class PeerApi : uint8_t {
  llama_native,  ///< llama-server's POST /completion (token ids in every chunk)
  openai,        ///< OpenAI's POST /v1/completions (llama-server's and our HTTP door's)
};

/// The path a request of `api` goes to.
inline const char* api_path(PeerApi api) {
  return api == PeerApi::openai ? "/v1/completions" : "/completion";
}

/// The JSON body of one streamed /v1/completions request: OpenAI's fields (`model` only when not
/// empty: both servers then take their own model), `stream_options.include_usage` so that the
/// stream ends with the completion's token count, and `ignore_eos`, which both servers accept.
/// At temperature 0 also llama.cpp's own `top_k` 1, `repeat_penalty` 1 and `samplers` (only
/// top_k and temperature), the same as completion_body: greedy, without samplers that cost
/// llama-server time and change nothing; a server that does not know them ignores them.
inline std::string openai_completion_body(const PeerRequest& r, const std::string& model) {
  nlohmann::json j = nlohmann::json::object();
  if (!model.empty()) j["model"] = model;
  j["prompt"] = prompt_json(r);
  j["max_tokens"] = r.max_tokens;
  j["temperature"] = r.temperature;
  j["seed"] = r.seed;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  j["ignore_eos"] = r.ignore_eos;
  if (r.temperature <= 0) {
    j["top_k"] = 1;
    j["repeat_penalty"] = 1.0;
    j["samplers"] = {"top_k", "temperature"};
  }
  return j.dump();
}

/// The fields bench_loadgen uses of one /v1/completions stream event: a `text_completion` chunk
/// (choices[0].text, finish_reason), the usage chunk (OpenAI: empty choices; llama-server: usage
/// on the finishing chunk), an error, or the closing "[DONE]".
struct OpenAiChunk {
  bool done_marker = false;  // "data: [DONE]"
  bool error = false;
  std::string error_message;
  bool has_choice = false;                             // choices[0] exists
  bool has_text = false;                               // choices[0].text is not empty
  std::string finish_reason;                           // choices[0].finish_reason; "" while null
  int64_t completion_tokens = -1, prompt_tokens = -1;  // usage; -1: absent
  // llama-server's own `timings` (not OpenAI's; ours sends none): -1 / NAN when absent.
  int64_t predicted_n = -1;
  double prompt_ms = NAN, predicted_ms = NAN;
};

/// Reads one event of a /v1/completions stream. Throws std::runtime_error for an event that is
/// not JSON or not a completion chunk (another `object`, more than one choice, a text that is not
/// a string): a server that sends it does not speak the API.
inline OpenAiChunk parse_openai_chunk(const SseEvent& ev) {
  OpenAiChunk c;
  if (ev.field == "data" && ev.value == "[DONE]") {
    c.done_marker = true;
    return c;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ev.value);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("a " + ev.field + " event that is not JSON (" + e.what() +
                             "): " + ev.value.substr(0, 200));
  }
  auto message_of = [](const nlohmann::json& e) {
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    return e.dump();
  };
  // OpenAI streams an error as a data event {"error": {...}}; llama-server as an "error" event.
  if (ev.field == "error") {
    c.error = true;
    c.error_message = message_of(j.is_object() && j.contains("error") ? j["error"] : j);
    return c;
  }
  if (ev.field != "data") throw std::runtime_error("an event of field '" + ev.field + "'");
  if (!j.is_object()) throw std::runtime_error("a chunk that is not an object: " + ev.value);
  if (auto it = j.find("error"); it != j.end() && !it->is_null()) {
    c.error = true;
    c.error_message = message_of(*it);
    return c;
  }
  if (auto it = j.find("object"); it != j.end() && *it != "text_completion")
    throw std::runtime_error("a chunk of object " + it->dump() + ", not \"text_completion\"");
  if (auto it = j.find("choices"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > 1)
      throw std::runtime_error("choices that are not a list of at most one (n is 1): " +
                               it->dump().substr(0, 200));
    if (!it->empty()) {
      const auto& ch = (*it)[0];
      if (!ch.is_object()) throw std::runtime_error("a choice that is not an object");
      c.has_choice = true;
      if (auto t = ch.find("text"); t != ch.end()) {
        if (!t->is_string()) throw std::runtime_error("choices[0].text is not a string");
        c.has_text = !t->get_ref<const std::string&>().empty();
      }
      if (auto f = ch.find("finish_reason"); f != ch.end() && !f->is_null()) {
        if (!f->is_string()) throw std::runtime_error("choices[0].finish_reason is not a string");
        c.finish_reason = f->get<std::string>();
      }
    }
  }
  if (auto it = j.find("usage"); it != j.end() && it->is_object()) {
    const auto& u = *it;
    if (auto p = u.find("completion_tokens"); p != u.end() && p->is_number_integer())
      c.completion_tokens = p->get<int64_t>();
    if (auto p = u.find("prompt_tokens"); p != u.end() && p->is_number_integer())
      c.prompt_tokens = p->get<int64_t>();
  }
  if (auto it = j.find("timings"); it != j.end() && it->is_object()) {
    const auto& t = *it;
    if (auto p = t.find("predicted_n"); p != t.end() && p->is_number_integer())
      c.predicted_n = p->get<int64_t>();
    if (auto p = t.find("prompt_ms"); p != t.end() && p->is_number())
      c.prompt_ms = p->get<double>();
    if (auto p = t.find("predicted_ms"); p != t.end() && p->is_number())
      c.predicted_ms = p->get<double>();
  }
  return c;
}

}  // namespace sy::bench
