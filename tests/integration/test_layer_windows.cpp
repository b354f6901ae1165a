// A model whose layers are of two kinds through the real server: the zoo's gemma2 (a window of
// 16 on its even layers) with blocks of 4 tokens generates far past the window with the windowed
// layers' blocks given back (batching.layer_window_kv release, the default), and its greedy ids
// equal llama.cpp's and those of one pool for all layers (keep); the log and /metrics show the
// window group.
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>
#include "clients/cpp/client.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_layer_windows)

using namespace std::chrono_literals;

namespace {

const std::string kZoo = std::string(SY_MODELS_DIR) + "/zoo/";
// llama.cpp's greedy ids may differ from ours only where its own top-1/top-2 margin is below
// this (summation order), as the zoo's README says.
constexpr double kNearTie = 0.005;
// Tokens of the long job: ten windows past its prompt.
constexpr uint32_t kLong = 160;

struct ZooCase {
  std::vector<int32_t> prompt, ids;
  std::vector<double> margin;  // llama.cpp's top-1 minus top-2 at each generated position
};

std::vector<ZooCase> zoo_cases() {
  std::ifstream f(kZoo + "zoo-gemma2-f32.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json root = nlohmann::json::parse(ss.str());
  std::vector<ZooCase> out;
  for (const auto& c : root.at("cases")) {
    ZooCase z;
    for (const auto& v : c.at("prompt_token_ids")) z.prompt.push_back(v.get<int32_t>());
    for (const auto& v : c.at("generated_token_ids")) z.ids.push_back(v.get<int32_t>());
    for (const auto& p : c.at("positions")) {
      const auto& m = p.at("top1_minus_top2");  // null where llama.cpp gave no runner-up
      z.margin.push_back(m.is_number() ? m.get<double>() : 0.0);
    }
    out.push_back(std::move(z));
  }
  return out;
}

struct Server {
  sy::it::TempDir dir;
  std::unique_ptr<sy::it::ServerProcess> srv;
  explicit Server(const std::string& mode) {
    const std::string cfg = dir.path() + "/lw.yaml";
    std::ofstream(cfg) << "batching:\n  kv_block_size: 4\n  prefill_chunk: 8\n  kv_memory_mb: 4\n"
                       << "  max_sequences: 4\n  layer_window_kv: " << mode
                       << "\nmetrics:\n  bind: \"127.0.0.1:0\"\n";
    srv = std::make_unique<sy::it::ServerProcess>(
        std::vector<std::string>{"--model", kZoo + "zoo-gemma2-f32.gguf", "--threads", "1",
                                 "--config", cfg},
        std::chrono::seconds(60), err_file());
  }
  std::string err_file() const { return dir.path() + "/stderr.txt"; }
  // What the server wrote to stderr so far (its KV sizing line comes before "ready").
  std::string err() const {
    std::ifstream f(err_file());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

sy::client::Result greedy(sy::client::Client& cl, const std::string& id,
                          const std::vector<int32_t>& prompt, uint32_t n, bool ignore_eos) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "lw";
  s.prompt = prompt;
  s.max_tokens = n;
  s.temperature = 0;
  s.ignore_eos = ignore_eos;
  return cl.run(s, 120s);
}

// The value of an unlabelled sample in a /metrics text, -1 when absent.
double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gemma2_past_the_window_with_released_window_blocks) {
  const auto cases = zoo_cases();
  BOOST_REQUIRE_EQUAL(cases.size(), 5u);
  std::map<std::string, std::vector<std::vector<int32_t>>> got;
  for (const std::string mode : {"release", "keep"}) {
    BOOST_TEST_CONTEXT(mode) {
      Server s(mode);
      sy::client::Client cl(s.srv->endpoint());
      BOOST_REQUIRE(cl.ping_wait(10s));
      const bool split = mode == "release";
      BOOST_TEST((s.err().find("for the layers with a window of 16") != std::string::npos) == split,
                 s.err());
      for (size_t i = 0; i < cases.size(); ++i) {
        const ZooCase& c = cases[i];
        auto r = greedy(cl, mode + std::to_string(i), c.prompt, static_cast<uint32_t>(c.ids.size()),
                        false);
        BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no done")));
        // Equal to llama.cpp's, or first apart where llama.cpp itself had a near-tie.
        size_t k = 0;
        while (k < r.ids.size() && k < c.ids.size() && r.ids[k] == c.ids[k]) ++k;
        BOOST_TEST_CONTEXT("case " << i << ", first difference at " << k) {
          BOOST_TEST(r.ids.size() == c.ids.size());
          if (k < c.ids.size()) BOOST_TEST(c.margin[k] < kNearTie);
        }
        got[mode].push_back(r.ids);
      }
      auto r = greedy(cl, mode + "long", cases[0].prompt, kLong, true);
      BOOST_REQUIRE_MESSAGE(r.ok(), (r.error ? r.error->message : std::string("no done")));
      BOOST_TEST(r.ids.size() == kLong);
      got[mode].push_back(r.ids);

      const auto m = sy::it::http_get(s.srv->metrics_endpoint(), "/metrics");
      BOOST_REQUIRE(m.status == 200);
      const double wtotal = metric(m.body, "switchyard_kv_window_blocks_total");
      BOOST_TEST(metric(m.body, "switchyard_kv_window_blocks_used") == 0.0);
      if (split) {
        BOOST_TEST(wtotal > 0.0);
        BOOST_TEST(metric(m.body, "switchyard_kv_window_blocks_free") == wtotal);
      } else {
        BOOST_TEST(wtotal == 0.0);
      }
      BOOST_TEST(metric(m.body, "switchyard_kv_blocks_used") == 0.0);
    }
  }
  // Both ways of keeping the windowed layers' K/V compute the same thing.
  BOOST_REQUIRE_EQUAL(got["release"].size(), got["keep"].size());
  for (size_t i = 0; i < got["keep"].size(); ++i)
    BOOST_TEST(got["release"][i] == got["keep"][i], boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()  // test_layer_windows
