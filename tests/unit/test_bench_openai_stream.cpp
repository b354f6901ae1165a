// bench_loadgen's reading of an OpenAI /v1/completions stream (bench/peer_stream.hpp), as
// llama-server and our HTTP door frame it, and the request body it sends; on byte strings.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/peer_stream.hpp"

BOOST_AUTO_TEST_SUITE(test_bench_openai_stream)

using namespace sy::bench;

namespace {

std::vector<SseEvent> events_of(const std::string& body) {
  SseParser p;
  auto ev = p.feed(body);
  BOOST_TEST(!p.pending());
  return ev;
}

}  // namespace

// llama-server: one chunk per token; the finishing chunk carries finish_reason, usage and its own
// timings together; then [DONE].
BOOST_AUTO_TEST_CASE(llama_server_stream) {
  const std::string body =
      "data: {\"choices\":[{\"text\":\" was\",\"index\":0,\"logprobs\":null,"
      "\"finish_reason\":null}],\"created\":1,\"model\":\"gpt-3.5-turbo\","
      "\"object\":\"text_completion\",\"id\":\"chatcmpl-x\"}\n\n"
      "data: {\"choices\":[{\"text\":\"\",\"index\":0,\"logprobs\":null,"
      "\"finish_reason\":\"length\"}],\"created\":1,\"object\":\"text_completion\","
      "\"usage\":{\"completion_tokens\":4,\"prompt_tokens\":3,\"total_tokens\":7},"
      "\"id\":\"chatcmpl-x\",\"timings\":{\"prompt_n\":3,\"prompt_ms\":1.25,\"predicted_n\":4,"
      "\"predicted_ms\":2.5}}\n\n"
      "data: [DONE]\n\n";
  auto ev = events_of(body);
  BOOST_REQUIRE(ev.size() == 3u);
  OpenAiChunk a = parse_openai_chunk(ev[0]);
  BOOST_TEST(a.has_choice);
  BOOST_TEST(a.has_text);
  BOOST_TEST(a.finish_reason.empty());
  BOOST_TEST(a.completion_tokens == -1);
  BOOST_TEST(!a.done_marker);
  OpenAiChunk b = parse_openai_chunk(ev[1]);
  BOOST_TEST(b.has_choice);
  BOOST_TEST(!b.has_text);
  BOOST_TEST(b.finish_reason == "length");
  BOOST_TEST(b.completion_tokens == 4);
  BOOST_TEST(b.prompt_tokens == 3);
  BOOST_TEST(b.predicted_n == 4);
  BOOST_TEST(b.prompt_ms == 1.25);
  BOOST_TEST(b.predicted_ms == 2.5);
  OpenAiChunk c = parse_openai_chunk(ev[2]);
  BOOST_TEST(c.done_marker);
}

// OpenAI's framing (our door's): "usage": null on the text chunks, the finish_reason on an empty
// text, the usage on a chunk of its own with no choices, then [DONE]; no timings.
BOOST_AUTO_TEST_CASE(openai_stream_with_a_usage_chunk) {
  const std::string body =
      "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
      "\"choices\":[{\"index\":0,\"text\":\"s\",\"logprobs\":null,\"finish_reason\":null}],"
      "\"usage\":null}\r\n\r\n"
      "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
      "\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}],"
      "\"usage\":null}\r\n\r\n"
      "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
      "\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5,"
      "\"prompt_tokens_details\":{\"cached_tokens\":0}}}\r\n\r\n"
      "data: [DONE]\r\n\r\n";
  auto ev = events_of(body);
  BOOST_REQUIRE(ev.size() == 4u);
  OpenAiChunk a = parse_openai_chunk(ev[0]);
  BOOST_TEST(a.has_text);
  BOOST_TEST(a.completion_tokens == -1);
  OpenAiChunk b = parse_openai_chunk(ev[1]);
  BOOST_TEST(!b.has_text);
  BOOST_TEST(b.finish_reason == "length");
  OpenAiChunk u = parse_openai_chunk(ev[2]);
  BOOST_TEST(!u.has_choice);
  BOOST_TEST(u.completion_tokens == 2);
  BOOST_TEST(u.predicted_n == -1);
  BOOST_TEST(std::isnan(u.predicted_ms));
  BOOST_TEST(parse_openai_chunk(ev[3]).done_marker);
}

BOOST_AUTO_TEST_CASE(errors_and_what_is_no_completion_chunk) {
  // OpenAI's error in a stream: a data event; llama-server's: an "error" event.
  OpenAiChunk e = parse_openai_chunk(
      {"data", "{\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\",\"code\":null}}"});
  BOOST_TEST(e.error);
  BOOST_TEST(e.error_message == "overloaded");
  e = parse_openai_chunk({"error", "{\"code\":500,\"message\":\"slot unavailable\"}"});
  BOOST_TEST(e.error);
  BOOST_TEST(e.error_message == "slot unavailable");

  auto throws_with = [](const SseEvent& ev, const std::string& words) {
    try {
      parse_openai_chunk(ev);
      BOOST_ERROR("no throw for " + ev.value);
    } catch (const std::runtime_error& x) {
      BOOST_TEST(std::string(x.what()).find(words) != std::string::npos, x.what());
    }
  };
  throws_with({"data", "{\"choices\":[{\"text\":"}, "not JSON");
  throws_with({"data", "{\"object\":\"chat.completion.chunk\",\"choices\":[]}"},
              "not \"text_completion\"");
  throws_with({"data", "{\"choices\":[{\"text\":\"a\"},{\"text\":\"b\"}]}"}, "at most one");
  throws_with({"data", "{\"choices\":[{\"text\":5}]}"}, "text is not a string");
  throws_with({"data", "[1,2]"}, "not an object");
}

BOOST_AUTO_TEST_CASE(request_body_streams_with_usage_and_exact_length) {
  PeerRequest r;
  r.prompt = {5, 300, 511};
  r.max_tokens = 128;
  r.seed = 7;
  auto j = nlohmann::json::parse(openai_completion_body(r, ""));
  BOOST_TEST(!j.contains("model"));  // the server's own model
  BOOST_TEST(j["prompt"] == nlohmann::json({5, 300, 511}));
  BOOST_TEST(j["max_tokens"] == 128);
  BOOST_TEST(j["stream"] == true);
  BOOST_TEST(j["stream_options"] == nlohmann::json({{"include_usage", true}}));
  BOOST_TEST(j["ignore_eos"] == true);
  BOOST_TEST(j["temperature"] == 0.0);
  BOOST_TEST(j["top_k"] == 1);
  BOOST_TEST(j["samplers"] == nlohmann::json::array({"top_k", "temperature"}));
  BOOST_TEST(j["seed"] == 7);
  BOOST_TEST(!j.contains("n_predict"));  // llama-server would take it over max_tokens

  r.prompt_text = "once upon a time";
  r.temperature = 0.8;
  j = nlohmann::json::parse(openai_completion_body(r, "stories260K"));
  BOOST_TEST(j["model"] == "stories260K");
  BOOST_TEST(j["prompt"] == "once upon a time");  // the text instead of the ids
  BOOST_TEST(j["temperature"] == 0.8);
  BOOST_TEST(!j.contains("top_k"));
  // The native body takes the text too.
  BOOST_TEST(nlohmann::json::parse(completion_body(r))["prompt"] == "once upon a time");
  BOOST_TEST(std::string(api_path(PeerApi::openai)) == "/v1/completions");
  BOOST_TEST(std::string(api_path(PeerApi::llama_native)) == "/completion");
}

BOOST_AUTO_TEST_SUITE_END()  // test_bench_openai_stream
