// The memory-bound keys of the config: result_cache_bytes, tenant_idle_ms, max_idle_tenants and
// metrics.max_tenant_labels are read, range-checked, and the journal takes the cache's byte bound.
#include <boost/test/unit_test.hpp>
#include <string>

#include "server/config.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_config_memory_bounds)

namespace {

sy::ServerConfig load(const std::string& text) {
  static int n = 0;
  static const sy::test::TempDir dir("sy_config_bounds_");
  sy::ServerConfig cfg;
  std::string name = "c";  // appended: GCC 12 warns (-Wrestrict) on "lit" + string&&
  name += std::to_string(n++);
  name += ".yaml";
  sy::load_config_file(dir.write(name, text), cfg);
  sy::finalize_config(cfg);
  return cfg;
}

}  // namespace

BOOST_AUTO_TEST_CASE(defaults_bound_everything) {
  const sy::ServerConfig c = load("");
  BOOST_TEST(c.admission.result_cache_bytes == 256u << 20);
  BOOST_TEST(c.admission.tenant_idle_ms == 60000);
  BOOST_TEST(c.admission.max_idle_tenants == 10000u);
  BOOST_TEST(c.metrics.max_tenant_labels == 1000u);
  BOOST_TEST(c.journal.keep_result_bytes == c.admission.result_cache_bytes);
}

BOOST_AUTO_TEST_CASE(keys_are_read_and_the_journal_follows_the_cache) {
  const sy::ServerConfig c = load(
      "admission:\n"
      "  result_cache_bytes: 1048576\n"
      "  tenant_idle_ms: 500\n"
      "  max_idle_tenants: 7\n"
      "metrics:\n"
      "  max_tenant_labels: 3\n");
  BOOST_TEST(c.admission.result_cache_bytes == 1048576u);
  BOOST_TEST(c.admission.tenant_idle_ms == 500);
  BOOST_TEST(c.admission.max_idle_tenants == 7u);
  BOOST_TEST(c.metrics.max_tenant_labels == 3u);
  BOOST_TEST(c.metrics.bind.empty());  // the metrics section without bind stays off
  BOOST_TEST(c.journal.keep_result_bytes == 1048576u);
}

BOOST_AUTO_TEST_CASE(out_of_range_values_name_the_key) {
  for (const char* text :
       {"admission:\n  tenant_idle_ms: -1\n", "admission:\n  tenant_idle_ms: 86400001\n",
        "admission:\n  result_cache_bytes: 1.5\n", "metrics:\n  max_tenant_labels: many\n"}) {
    std::string what;
    try {
      load(text);
    } catch (const std::exception& e) {
      what = e.what();
    }
    BOOST_TEST_CONTEXT(text) {
      BOOST_TEST(!what.empty());
      const std::string key = std::string(text).find("metrics") == 0 ? "max_tenant_labels"
                              : std::string(text).find("bytes") != std::string::npos
                                  ? "result_cache_bytes"
                                  : "tenant_idle_ms";
      BOOST_TEST(what.find(key) != std::string::npos, what);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_config_memory_bounds
