// The YAML config loader: every section read, defaults kept for absent keys, finalize_config's
// default classes, and errors that name the file, the key and the problem.
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "server/config.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_config_yaml)

namespace fs = std::filesystem;

namespace {

// Writes `text` to a fresh temp file and returns its path.
std::string write_temp(const std::string& text) {
  static int n = 0;
  static const sy::test::TempDir dir("sy_config_");
  return dir.write("c" + std::to_string(n++) + ".yaml", text);
}

// The message of the exception that loading `text` raises ("" when none).
std::string load_error(const std::string& text) {
  sy::ServerConfig cfg;
  std::string path = write_temp(text);
  try {
    sy::load_config_file(path, cfg);
    sy::finalize_config(cfg);
  } catch (const std::exception& e) {
    std::string m = e.what();
    BOOST_TEST((m.find(path) != std::string::npos || m.rfind("config:", 0) == 0), m);
    return m;
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_key_is_read) {
  std::string path = write_temp(R"(
model: /models/m.gguf
endpoints:
  bind: tcp://0.0.0.0:6000
  pull: tcp://0.0.0.0:6001
  results: tcp://0.0.0.0:6002
  max_message_bytes: 65536
  sndhwm: 10
  rcvhwm: 20
admission:
  allow_anonymous: false
  max_prompt_tokens: 100
  max_output_tokens: 50
  result_cache: 7
  tenants:
    - name: acme
      token: s3cret
      weight: 3
      max_in_flight: 4
      tokens_per_second: 100.5
      burst_tokens: 1000
    - name: beta
router:
  default_class: bulk
  classes:
    - {name: rt, rank: 0, weight: 2, queue_limit: 8, queue_timeout_ms: 100}
    - {name: bulk, rank: 3, weight: 0.5, queue_limit: 100}
batching:
  step_token_budget: 128
  max_sequences: 4
  prefill_chunk: 32
  kv_block_size: 32
  kv_memory_mb: 64
  kv_gpu_fraction: 0.6
  kv_dtype: q8_0
  layer_window_kv: keep
  step_delay_ms: 5
  priority_pacing: 0.25
  priority_pacing_ms: 0
executors:
  backend: "null"
  count: 2
  threads: 1
  cpu_priority: background
shutdown_grace_ms: 250
)");
  sy::ServerConfig c;
  sy::load_config_file(path, c);
  sy::finalize_config(c);
  BOOST_TEST(c.model == "/models/m.gguf");
  BOOST_TEST(c.endpoints.bind == "tcp://0.0.0.0:6000");
  BOOST_TEST(c.endpoints.pull == "tcp://0.0.0.0:6001");
  BOOST_TEST(c.endpoints.results == "tcp://0.0.0.0:6002");
  BOOST_TEST(c.endpoints.max_message_bytes == 65536);
  BOOST_TEST(c.endpoints.sndhwm == 10);
  BOOST_TEST(c.endpoints.rcvhwm == 20);
  BOOST_TEST(!c.admission.allow_anonymous);
  BOOST_TEST(c.admission.max_prompt_tokens == 100u);
  BOOST_TEST(c.admission.max_output_tokens == 50u);
  BOOST_TEST(c.admission.result_cache == 7u);
  BOOST_REQUIRE(c.admission.tenants.size() == 2u);
  const auto& t = c.admission.tenants[0];
  BOOST_TEST(t.name == "acme");
  BOOST_TEST(t.token == "s3cret");
  BOOST_TEST(t.weight == 3.0);
  BOOST_TEST(t.max_in_flight == 4u);
  BOOST_TEST(t.tokens_per_second == 100.5);
  BOOST_TEST(t.burst_tokens == 1000.0);
  BOOST_TEST(c.admission.tenants[1].name == "beta");
  BOOST_TEST(c.admission.tenants[1].weight == 1.0);
  BOOST_REQUIRE(c.router.classes.size() == 2u);
  BOOST_TEST(c.router.classes[0].name == "rt");
  BOOST_TEST(c.router.classes[0].weight == 2.0);
  BOOST_TEST(c.router.classes[0].queue_limit == 8u);
  BOOST_TEST(c.router.classes[0].queue_timeout_ms == 100);
  BOOST_TEST(c.router.classes[1].rank == 3);
  BOOST_TEST(c.router.classes[1].weight == 0.5);
  BOOST_TEST(c.router.default_class == "bulk");
  BOOST_TEST(c.batching.step_token_budget == 128u);
  BOOST_TEST(c.batching.max_sequences == 4u);
  BOOST_TEST(c.batching.prefill_chunk == 32u);
  BOOST_TEST(c.batching.kv_block_size == 32);
  BOOST_TEST(c.batching.kv_memory_mb == 64);
  BOOST_TEST(c.batching.kv_gpu_fraction == 0.6);
  BOOST_TEST((c.batching.kv_dtype == sy::kernels::DType::Q8_0));
  BOOST_TEST(!c.batching.release_layer_windows);
  BOOST_TEST(c.batching.step_delay_ms == 5);
  BOOST_TEST(c.batching.priority_pacing == 0.25);
  BOOST_TEST(c.batching.priority_pacing_ms == 0);
  BOOST_TEST((c.executors.backend == sy::Backend::null));
  BOOST_TEST(c.executors.count == 2);
  BOOST_TEST(c.executors.threads == 1);
  BOOST_TEST((c.executors.cpu_priority == sy::CpuPriority::background));
  BOOST_TEST(c.shutdown_grace_ms == 250);
}

BOOST_AUTO_TEST_CASE(defaults_without_a_file) {
  sy::ServerConfig c;
  sy::finalize_config(c);
  BOOST_REQUIRE(c.router.classes.size() == 2u);
  BOOST_TEST(c.router.classes[0].name == "interactive");
  BOOST_TEST(c.router.classes[0].rank == 0);
  BOOST_TEST(c.router.classes[1].name == "batch");
  BOOST_TEST(c.router.classes[1].rank == 1);
  BOOST_TEST(c.router.classes[1].queue_limit >= c.router.classes[0].queue_limit);
  BOOST_TEST(c.router.default_class == "interactive");
  BOOST_TEST(c.endpoints.bind == "tcp://127.0.0.1:5555");
  BOOST_TEST((c.executors.backend == sy::Backend::automatic));
  BOOST_TEST((c.executors.cpu_priority == sy::CpuPriority::normal));
  BOOST_TEST((c.batching.kv_dtype == sy::kernels::DType::F16));
  BOOST_TEST(c.batching.release_layer_windows);
}

BOOST_AUTO_TEST_CASE(absent_keys_keep_their_values_and_empty_file_is_fine) {
  sy::ServerConfig c;
  c.batching.max_sequences = 9;
  sy::load_config_file(write_temp("batching:\n  prefill_chunk: 7\n"), c);
  BOOST_TEST(c.batching.max_sequences == 9u);
  BOOST_TEST(c.batching.prefill_chunk == 7u);
  sy::load_config_file(write_temp(""), c);
  BOOST_TEST(c.batching.prefill_chunk == 7u);
}

BOOST_AUTO_TEST_CASE(relative_model_path_is_from_the_config_folder) {
  sy::ServerConfig c;
  std::string path = write_temp("model: models/x.gguf\n");
  sy::load_config_file(path, c);
  BOOST_TEST(c.model == (fs::path(path).parent_path() / "models/x.gguf").string());
}

BOOST_AUTO_TEST_CASE(tenant_burst_defaults_to_ten_seconds) {
  sy::ServerConfig c;
  sy::load_config_file(
      write_temp("admission:\n  tenants:\n    - {name: a, tokens_per_second: 50}\n"), c);
  sy::finalize_config(c);
  BOOST_TEST(c.admission.tenants[0].burst_tokens == 500.0);
}

BOOST_AUTO_TEST_CASE(errors_name_file_key_and_problem) {
  std::string m = load_error("batching:\n  max_sequences: lots\n");
  BOOST_TEST(contains(m, "'batching.max_sequences'"), m);
  BOOST_TEST(contains(m, "expected an integer, got 'lots'"), m);
  BOOST_TEST(contains(m, "line 2"), m);

  m = load_error("batching:\n  max_sequnces: 4\n");
  BOOST_TEST(contains(m, "'batching.max_sequnces'"), m);
  BOOST_TEST(contains(m, "unknown key"), m);

  m = load_error("executors:\n  count: 0\n");
  BOOST_TEST(contains(m, "'executors.count'"), m);
  BOOST_TEST(contains(m, "out of range [1, 256]"), m);

  m = load_error("executors:\n  backend: gpu9000\n");
  BOOST_TEST(contains(m, "unknown backend"), m);

  m = load_error("executors:\n  cpu_priority: realtime\n");
  BOOST_TEST(contains(m, "'executors.cpu_priority'"), m);
  BOOST_TEST(contains(m, "unknown CPU priority"), m);

  m = load_error("batching:\n  kv_gpu_fraction: 1.5\n");
  BOOST_TEST(contains(m, "'batching.kv_gpu_fraction'"), m);

  m = load_error("batching:\n  priority_pacing: 2\n");
  BOOST_TEST(contains(m, "'batching.priority_pacing'"), m);

  m = load_error("batching:\n  kv_dtype: bf16\n");
  BOOST_TEST(contains(m, "'batching.kv_dtype'"), m);
  BOOST_TEST(contains(m, "expected f32, f16 or q8_0"), m);

  m = load_error("batching:\n  layer_window_kv: drop\n");
  BOOST_TEST(contains(m, "'batching.layer_window_kv'"), m);
  BOOST_TEST(contains(m, "expected release or keep"), m);

  m = load_error("batching:\n  step_token_budget: 1.5\n");
  BOOST_TEST(contains(m, "expected an integer, got '1.5'"), m);

  m = load_error("admission:\n  allow_anonymous: maybe\n");
  BOOST_TEST(contains(m, "expected true or false"), m);

  m = load_error("router:\n  classes:\n    - {rank: 0}\n");
  BOOST_TEST(contains(m, "'router.classes[0].name'"), m);

  m = load_error("router:\n  classes:\n    - {name: a, weight: -1}\n");
  BOOST_TEST(contains(m, "'router.classes[0].weight'"), m);
  BOOST_TEST(contains(m, "out of range"), m);

  m = load_error("admission:\n  tenants:\n    - {name: a, weight: x}\n");
  BOOST_TEST(contains(m, "'admission.tenants[0].weight'"), m);
  BOOST_TEST(contains(m, "expected a number"), m);

  m = load_error("endpoints: [1, 2]\n");
  BOOST_TEST(contains(m, "'endpoints'"), m);
  BOOST_TEST(contains(m, "expected a map, got a list"), m);

  m = load_error("batching: {prefill_chunk: 4\n");
  BOOST_TEST(contains(m, "YAML syntax"), m);
}

BOOST_AUTO_TEST_CASE(finalize_refuses_inconsistent_settings) {
  BOOST_TEST(contains(load_error("router:\n  classes:\n    - {name: a}\n    - {name: a}\n"),
                      "defined twice"));
  BOOST_TEST(contains(load_error("router:\n  default_class: nope\n"), "'nope' is not one of"));
  BOOST_TEST(contains(load_error("admission:\n  tenants:\n    - {name: t}\n    - {name: t}\n"),
                      "tenant 't' is defined twice"));
  BOOST_TEST(
      contains(load_error("endpoints:\n  pull: tcp://127.0.0.1:1\n"), "needs endpoints.results"));
}

BOOST_AUTO_TEST_CASE(missing_file_is_named) {
  sy::ServerConfig c;
  try {
    sy::load_config_file("/nonexistent/sy.yaml", c);
    BOOST_FAIL("no exception");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(contains(e.what(), "/nonexistent/sy.yaml: cannot open"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(tracing_and_gpu_keys) {
  sy::ServerConfig c;
  sy::load_config_file(write_temp(R"(
metrics:
  gpu: false
  test_fake_nvml: true
tracing:
  otlp_endpoint: "http://127.0.0.1:4318"
  sample: all
  max_queued_spans: 10
  batch_spans: 5
  export_interval_ms: 50
  export_timeout_ms: 300
  service_name: edge
)"),
                       c);
  BOOST_TEST(!c.metrics.gpu);
  BOOST_TEST(c.metrics.test_fake_nvml);
  BOOST_TEST(c.tracing.otlp_endpoint == "http://127.0.0.1:4318");
  BOOST_TEST(c.tracing.sample_all);
  BOOST_TEST(c.tracing.max_queued_spans == 10u);
  BOOST_TEST(c.tracing.batch_spans == 5u);
  BOOST_TEST(c.tracing.export_interval_ms == 50);
  BOOST_TEST(c.tracing.export_timeout_ms == 300);
  BOOST_TEST(c.tracing.service_name == "edge");
  const std::string e = load_error("tracing:\n  sample: some\n");
  BOOST_TEST(contains(e, "tracing.sample"), e);
  BOOST_TEST(contains(e, "traced or all"), e);
}

BOOST_AUTO_TEST_CASE(example_config_loads) {
  // The documented example in the repository must stay loadable.
  sy::ServerConfig c;
  sy::load_config_file((fs::path(SY_SOURCE_DIR) / "config/switchyard.example.yaml").string(), c);
  sy::finalize_config(c);
  BOOST_TEST(c.router.classes.size() >= 2u);
}

BOOST_AUTO_TEST_SUITE_END()  // test_config_yaml
