// bench_loadgen's reading of a llama-server /completion stream (bench/peer_stream.hpp): HTTP/1.1
// framing (chunked and Content-Length), server-sent events and the chunk fields, on byte strings.
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/peer_stream.hpp"

BOOST_AUTO_TEST_SUITE(test_bench_peer_stream)

using namespace sy::bench;

namespace {

std::string chunk(const std::string& payload) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx", payload.size());
  return std::string(size) + "\r\n" + payload + "\r\n";
}

// A streamed answer as llama-server frames it: one SSE event per token, then the final chunk.
const std::string kEvents =
    "data: {\"index\":0,\"content\":\" once\",\"tokens\":[403],\"stop\":false,"
    "\"tokens_predicted\":1}\n\n"
    "data: {\"index\":0,\"content\":\"\",\"tokens\":[2],\"stop\":false,\"tokens_predicted\":2}\n\n"
    "data: {\"index\":0,\"content\":\"\",\"tokens\":[],\"stop\":true,\"tokens_predicted\":2,"
    "\"stop_type\":\"limit\",\"timings\":{\"prompt_n\":16,\"prompt_ms\":1.5,"
    "\"predicted_n\":2,\"predicted_ms\":3.25}}\n\n";

std::string chunked_response(const std::string& body, size_t piece) {
  std::string r =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
      "Keep-Alive: timeout=5, max=100\r\n\r\n";
  for (size_t i = 0; i < body.size(); i += piece) r += chunk(body.substr(i, piece));
  return r + "0\r\n\r\n";
}

struct Parsed {
  HttpResponseParser http;
  SseParser sse;
  std::string body;
  std::vector<SseEvent> events;
  size_t consumed = 0;
};

// Feeds `bytes` in pieces of `step` bytes, as a socket might deliver them.
void feed(Parsed& p, const std::string& bytes, size_t step) {
  for (size_t i = 0; i < bytes.size() && !p.http.done(); i += step) {
    const std::string part = bytes.substr(i, step);
    p.consumed += p.http.feed(part.data(), part.size(), [&](std::string_view b) {
      p.body.append(b);
      for (auto& e : p.sse.feed(b)) p.events.push_back(e);
    });
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(chunked_event_stream_at_every_split) {
  // HTTP chunks that cut events (7 bytes) and reads that cut chunk headers (1..13 bytes).
  for (size_t piece : {7u, 64u, 4096u}) {
    const std::string resp = chunked_response(kEvents, piece);
    for (size_t step = 1; step <= 13; ++step) {
      Parsed p;
      feed(p, resp, step);
      BOOST_TEST_CONTEXT("piece " << piece << " step " << step) {
        BOOST_TEST(p.http.done());
        BOOST_TEST(p.consumed == resp.size());
        BOOST_TEST(p.http.status() == 200);
        BOOST_TEST(p.http.keep_alive());
        BOOST_TEST(p.http.content_type() == "text/event-stream");
        BOOST_TEST(p.body == kEvents);
        BOOST_TEST(!p.sse.pending());
        BOOST_REQUIRE(p.events.size() == 3u);
        PeerChunk a = parse_peer_chunk(p.events[0]);
        BOOST_TEST(p.events[0].field == "data");
        BOOST_TEST(a.tokens == 1u);
        BOOST_TEST(a.has_content);
        BOOST_TEST(!a.stop);
        BOOST_TEST(a.tokens_predicted == 1);
        PeerChunk b = parse_peer_chunk(p.events[1]);
        BOOST_TEST(b.tokens == 1u);  // a token with no text yet still counts
        BOOST_TEST(!b.has_content);
        PeerChunk c = parse_peer_chunk(p.events[2]);
        BOOST_TEST(c.stop);
        BOOST_TEST(c.tokens == 0u);
        BOOST_TEST(c.tokens_predicted == 2);
        BOOST_TEST(c.predicted_n == 2);
        BOOST_TEST(c.prompt_ms == 1.5);
        BOOST_TEST(c.predicted_ms == 3.25);
        BOOST_TEST(c.stop_type == "limit");
        BOOST_TEST(!c.error);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(content_length_answer_and_what_follows_it) {
  const std::string body = R"({"error":{"code":400,"message":"bad prompt","type":"x"}})";
  const std::string resp =
      "HTTP/1.1 400 Bad Request\r\ncontent-length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  const std::string next = "HTTP/1.1 200 OK\r\n";
  const std::string bytes = resp + next;
  HttpResponseParser p;
  std::string got;
  size_t used = p.feed(bytes.data(), bytes.size(), [&](std::string_view b) { got.append(b); });
  BOOST_TEST(p.done());
  BOOST_TEST(used == resp.size());  // the next response's bytes are left alone
  BOOST_TEST(p.status() == 400);
  BOOST_TEST(!p.keep_alive());
  BOOST_TEST(got == body);
  // An error body read as a stream chunk: the message is kept.
  PeerChunk c = parse_peer_chunk({"data", body});
  BOOST_TEST(c.error);
  BOOST_TEST(c.error_message == "bad prompt");

  p.reset();
  const std::string empty = "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
  BOOST_TEST(p.feed(empty.data(), empty.size(), [](std::string_view) {}) == empty.size());
  BOOST_TEST(p.done());
  BOOST_TEST(!p.keep_alive());  // HTTP/1.0 without keep-alive closes
}

BOOST_AUTO_TEST_CASE(malformed_responses_name_the_problem) {
  auto error_of = [](const std::string& bytes) -> std::string {
    HttpResponseParser p;
    try {
      p.feed(bytes.data(), bytes.size(), [](std::string_view) {});
    } catch (const HttpError& e) {
      return e.what();
    }
    return "";
  };
  BOOST_TEST(error_of("SSH-2.0-OpenSSH\r\n") == "bad HTTP status line 'SSH-2.0-OpenSSH'");
  BOOST_TEST(error_of("HTTP/1.1 2x0 OK\r\n") == "bad HTTP status code in 'HTTP/1.1 2x0 OK'");
  BOOST_TEST(error_of("HTTP/1.1 200 OK\r\nno colon\r\n") == "bad HTTP header line 'no colon'");
  BOOST_TEST(error_of("HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n") ==
             "bad Content-Length '12a'");
  BOOST_TEST(error_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n") ==
             "unsupported Transfer-Encoding 'gzip'");
  BOOST_TEST(error_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n") ==
             "bad chunk size line 'zz'");
  BOOST_TEST(error_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n") ==
             "chunk data not followed by CRLF");
  BOOST_TEST(error_of("HTTP/1.1 200 OK\r\n\r\n") ==
             "HTTP response with neither Content-Length nor chunked coding");
  BOOST_TEST(error_of("HTTP/1.1 200 OK\r\n" + std::string(17000, 'a')) ==
             "HTTP line longer than 16 KiB");
}

BOOST_AUTO_TEST_CASE(sse_lines_comments_and_error_events) {
  SseParser s;
  auto ev = s.feed(": keep-alive comment\r\ndata: {\"a\":\r\ndata:1}\r\n\r\nerror: {\"code\":500,");
  BOOST_REQUIRE(ev.size() == 1u);
  BOOST_TEST(ev[0].field == "data");
  BOOST_TEST(ev[0].value == "{\"a\":\n1}");  // lines of one event joined by '\n'
  BOOST_TEST(s.pending());                   // the error event is not finished yet
  ev = s.feed("\"message\":\"slot unavailable\",\"type\":\"server_error\"}\n\n");
  BOOST_REQUIRE(ev.size() == 1u);
  BOOST_TEST(ev[0].field == "error");
  BOOST_TEST(!s.pending());
  PeerChunk c = parse_peer_chunk(ev[0]);
  BOOST_TEST(c.error);
  BOOST_TEST(c.error_message == "slot unavailable");

  try {
    parse_peer_chunk({"data", "[DONE]"});
    BOOST_FAIL("no throw");
  } catch (const std::runtime_error& e) {
    const std::string w = e.what();
    BOOST_TEST(w.find("llama-server sent a data event that is not JSON") == 0u);
    BOOST_TEST(w.find("[DONE]") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(request_body_is_greedy_with_exact_length) {
  PeerRequest r;
  r.prompt = {5, 300, 511};
  r.max_tokens = 128;
  r.seed = 7;
  auto j = nlohmann::json::parse(completion_body(r));
  BOOST_TEST(j["prompt"] == nlohmann::json({5, 300, 511}));
  BOOST_TEST(j["n_predict"] == 128);
  BOOST_TEST(j["ignore_eos"] == true);
  BOOST_TEST(j["stream"] == true);
  BOOST_TEST(j["temperature"] == 0.0);
  BOOST_TEST(j["top_k"] == 1);
  BOOST_TEST(j["repeat_penalty"] == 1.0);
  BOOST_TEST(j["samplers"] == nlohmann::json::array({"top_k", "temperature"}));
  BOOST_TEST(j["seed"] == 7);
  r.temperature = 0.8;
  j = nlohmann::json::parse(completion_body(r));
  BOOST_TEST(j["temperature"] == 0.8);
  BOOST_TEST(!j.contains("top_k"));  // sampled: the peer's own sampler chain
  BOOST_TEST(!j.contains("samplers"));
}

BOOST_AUTO_TEST_SUITE_END()  // test_bench_peer_stream
