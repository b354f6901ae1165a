// The `switchyard` command end to end: runs the real binary and checks its JSON and errors.
#define BOOST_TEST_MODULE cli
#include <sys/wait.h>

#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <string>

namespace {

const std::string kBin = std::string(SY_BINARY_DIR) + "/switchyard";
const std::string kModel = std::string(SY_MODELS_DIR) + "/stories260K.gguf";

struct Run {
  int status = -1;
  std::string out;  // stdout and stderr together
};

Run run(const std::string& args) {
  Run r;
  FILE* p = popen((kBin + " " + args + " 2>&1").c_str(), "r");
  BOOST_REQUIRE(p);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(tokenize_json) {
  auto r = run("tokenize --model " + kModel + " --text 'Once upon a time' --json");
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out == "{\"ids\": [1, 403, 407, 261, 378]}\n");
  r = run("tokenize --model " + kModel + " --text 'Once upon a time' --json --no-bos");
  BOOST_TEST(r.out == "{\"ids\": [403, 407, 261, 378]}\n");
}

BOOST_AUTO_TEST_CASE(generate_json_matches_llamacpp) {
  // reference-llamacpp.json: "The cat", first 8 greedy ids.
  auto r = run("generate --model " + kModel + " --prompt 'The cat' -n 8 --json --logprobs 2");
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.find("\"prompt_token_ids\": [1, 291, 280, 294]") != std::string::npos, r.out);
  BOOST_TEST(
      r.out.find("\"token_ids\": [269, 261, 268, 414, 422, 382, 276, 337]") != std::string::npos,
      r.out);
  BOOST_TEST(r.out.find("\"text\": \" and a boy were play\"") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("\"logprobs\": [[{\"id\": 269, \"logprob\": ") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(generate_streams_text) {
  auto r = run("generate --model " + kModel + " --prompt 'Once upon a time' -n 12");
  BOOST_TEST(r.status == 0);
  BOOST_TEST(
      r.out.find("Once upon a time, there was a little girl named Lily.") != std::string::npos,
      r.out);
}

BOOST_AUTO_TEST_CASE(bad_input_is_named) {
  auto r = run("generate --model /nonexistent.gguf --prompt hi");
  BOOST_TEST(r.status == 1);
  BOOST_TEST(r.out.find("/nonexistent.gguf") != std::string::npos, r.out);
  r = run("generate --model " + kModel + " --prompt hi -n 0");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("-n must be at least 1") != std::string::npos, r.out);
  r = run("generate --model " + kModel + " --prompt hi --top-p 2");
  BOOST_TEST(r.status == 1);
  BOOST_TEST(r.out.find("top_p") != std::string::npos, r.out);
  r = run("generate --bogus");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("unknown option '--bogus'") != std::string::npos, r.out);
  r = run("tokenize --model " + std::string(SY_MODELS_DIR) + "/README.md --text x");
  BOOST_TEST(r.status == 1);
  BOOST_TEST(r.out.find("magic") != std::string::npos, r.out);
}
