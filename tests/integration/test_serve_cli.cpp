// `switchyard serve` as a command: flags override the config file, a bad config file or flag is
// refused with a message naming it (exit 1 / 2), a busy address is an error, not a hang.
#include <boost/test/unit_test.hpp>

#include "clients/cpp/client.hpp"
#include "gpu/backend.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_serve_cli)

using namespace std::chrono_literals;

namespace {

using sy::it::Run;

// Runs the binary to its end (for commands that fail at start-up); bounded so that one that
// hangs instead fails the test rather than stalling the suite.
Run run(const std::string& args) {
  return sy::it::run_binary(args, "timeout 60 ");
}

}  // namespace

BOOST_AUTO_TEST_CASE(flags_override_the_file) {
  sy::it::TempDir dir;
  // The file names an address that cannot be bound and a model that does not exist; the flags
  // replace both, so the server starts.
  std::string cfg = dir.write("o.yaml", R"(
model: /nonexistent/model.gguf
endpoints:
  bind: tcp://192.0.2.1:1
executors:
  backend: cpu
shutdown_grace_ms: 100
)");
  sy::it::ServerProcess srv({"--config", cfg, "--backend", "null"});
  BOOST_TEST(srv.endpoint().rfind("tcp://127.0.0.1:", 0) == 0u, srv.endpoint());
  sy::client::Client cl(srv.endpoint());
  BOOST_TEST(cl.ping_wait(10s));
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(bad_config_and_flags_are_named) {
  sy::it::TempDir dir;
  std::string bad = dir.write("bad.yaml", "batching:\n  max_sequences: lots\n");
  auto r = run("serve --backend null --config " + bad);
  BOOST_TEST(r.status == 1, r.out);
  BOOST_TEST(r.out.find(bad + ": key 'batching.max_sequences' (line 2): expected an integer") !=
                 std::string::npos,
             r.out);
  r = run("serve --backend gpu9000");
  BOOST_TEST(r.status == 2, r.out);
  BOOST_TEST(r.out.find("--backend must be auto, cpu, cuda or null") != std::string::npos, r.out);
  r = run("serve --executors 0 --backend null");
  BOOST_TEST(r.status == 2, r.out);
  r = run("serve --model /nonexistent/m.gguf");
  BOOST_TEST(r.status == 1, r.out);
  BOOST_TEST(r.out.find("/nonexistent/m.gguf") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(backend_choice_is_named_and_cuda_without_a_device_is_an_error) {
  // auto names what it chose before anything else (here the model file is bad, so it stops).
  auto r = run("serve --backend auto --model /nonexistent/m.gguf");
  BOOST_TEST(r.status == 1, r.out);
  const std::string chosen = sy::usable_cuda_devices() > 0 ? "switchyard: backend cuda ("
                                                           : "switchyard: backend cpu (auto: ";
  BOOST_TEST(r.out.find(chosen) != std::string::npos, r.out);
  if (sy::usable_cuda_devices() == 0) {
    r = run("serve --backend cuda --model " + sy::it::kStories);
    BOOST_TEST(r.status == 1, r.out);
    BOOST_TEST(r.out.find("backend cuda: ") != std::string::npos, r.out);
    BOOST_TEST(r.out.find("use --backend cpu or auto") != std::string::npos, r.out);
  }
}

BOOST_AUTO_TEST_CASE(busy_address_is_an_error) {
  sy::it::ServerProcess first({"--backend", "null"});
  auto r = run("serve --backend null --bind " + first.endpoint());
  BOOST_TEST(r.status == 1, r.out);
  BOOST_TEST(first.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(a_draft_model_is_checked_at_start_and_drafts) {
  // Another vocabulary (the zoo's phi3 file has its own 32064 tokens): the start is refused,
  // naming the key.
  const std::string phi3 = std::string(SY_MODELS_DIR) + "/zoo/zoo-phi3-f32.gguf";
  auto r = run("serve --backend cpu --model " + sy::it::kStories + " --draft-model " + phi3);
  BOOST_TEST(r.status == 1, r.out);
  BOOST_TEST(r.out.find("does not share the target's vocabulary: tokenizer.ggml.tokens") !=
                 std::string::npos,
             r.out);
  r = run("serve --backend cpu --model " + sy::it::kStories + " --draft-model /nonexistent/d.gguf");
  BOOST_TEST(r.status == 1, r.out);
  BOOST_TEST(r.out.find("draft model /nonexistent/d.gguf") != std::string::npos, r.out);
  // The target as its own draft: a greedy job gets all its tokens, and drafts were verified.
  sy::it::TempDir dir;
  const std::string cfg = dir.write("m.yaml", "metrics:\n  bind: \"127.0.0.1:0\"\n");
  sy::it::ServerProcess srv({"--model", sy::it::kStories, "--draft-model", sy::it::kStories,
                             "--speculative", "always", "--threads", "1", "--config", cfg});
  sy::client::Client cl(srv.endpoint());
  sy::wire::Submit s;
  s.id = "drafted";
  s.tenant = "t";
  s.prompt = std::string("Once upon a time");
  s.max_tokens = 40;
  s.ignore_eos = true;
  s.temperature = 0;
  const auto res = cl.run(s, 60s);
  BOOST_REQUIRE_MESSAGE(res.ok(), (res.error ? res.error->message : std::string("no answer")));
  BOOST_TEST(res.done->usage.completion_tokens == 40u);
  const std::string page = sy::it::http_get(srv.metrics_endpoint(), "/metrics").body;
  const auto at = page.find("\nswitchyard_spec_draft_tokens_total ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, page);
  BOOST_TEST(std::stod(page.substr(at + 36)) > 0.0, page.substr(at, 60));
  BOOST_TEST(srv.stop(SIGTERM) == 0);
}

BOOST_AUTO_TEST_CASE(log_level_and_format) {
  sy::it::TempDir dir;
  const std::string json_log = dir.path() + "/json.log";
  {
    // The config file asks for warnings only; the flags win: every level from info up, as JSON.
    std::string cfg = dir.write("log.yaml", "log:\n  level: warn\n  format: text\n");
    sy::it::ServerProcess srv(
        {"--config", cfg, "--backend", "null", "--log-level", "info", "--log-format", "json"}, 60s,
        json_log);
    // The machine-read stdout lines keep their shape (the constructor found "ready" and the
    // endpoint in them).
    BOOST_TEST(srv.endpoint().rfind("tcp://127.0.0.1:", 0) == 0u, srv.endpoint());
    BOOST_TEST(srv.stop(SIGTERM) == 0);
  }
  std::ifstream in(json_log);
  int lines = 0;
  bool null_line = false, stopped_line = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    ++lines;
    nlohmann::json j;
    BOOST_REQUIRE_NO_THROW(j = nlohmann::json::parse(line));
    BOOST_TEST(j.size() == 3u, line);
    BOOST_TEST(j.at("ts").is_string(), line);
    BOOST_TEST(j.at("level").get<std::string>() == "info", line);
    const std::string msg = j.at("msg").get<std::string>();
    null_line |= msg.rfind("backend null: no model", 0) == 0;
    stopped_line |= msg.rfind("stopped (", 0) == 0;
  }
  BOOST_TEST(lines >= 2);
  BOOST_TEST(null_line);
  BOOST_TEST(stopped_line);

  // From the config file alone: level warn drops the info lines.
  const std::string warn_log = dir.path() + "/warn.log";
  {
    std::string cfg = dir.write("warn.yaml", "log:\n  level: warn\n");
    sy::it::ServerProcess srv({"--config", cfg, "--backend", "null"}, 60s, warn_log);
    BOOST_TEST(srv.stop(SIGTERM) == 0);
  }
  const std::string warn_text = sy::test::read_file(warn_log);
  BOOST_TEST(warn_text.find("backend null") == std::string::npos, warn_text);
  BOOST_TEST(warn_text.find("stopped (") == std::string::npos, warn_text);

  std::string bad = dir.write("bad_log.yaml", "log:\n  level: loud\n");
  auto r = run("serve --backend null --config " + bad);
  BOOST_TEST(r.status == 1, r.out);
  BOOST_TEST(r.out.find("expected trace, debug, info, warn, error or off") != std::string::npos,
             r.out);
  r = run("serve --backend null --log-format xml");
  BOOST_TEST(r.status == 2, r.out);
  BOOST_TEST(r.out.find("--log-format must be text or json") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_SUITE_END()  // test_serve_cli
