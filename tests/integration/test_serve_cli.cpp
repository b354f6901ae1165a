// `switchyard serve` as a command: flags override the config file, a bad config file or flag is
// refused with a message naming it (exit 1 / 2), a busy address is an error, not a hang.
#define BOOST_TEST_MODULE it_serve_cli
#include <boost/test/unit_test.hpp>

#include "clients/cpp/client.hpp"
#include "gpu/backend.hpp"
#include "tests/integration/server_process.hpp"

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
