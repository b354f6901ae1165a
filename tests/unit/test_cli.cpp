// The `switchyard` command end to end: runs the real binary and checks its JSON and errors.
#include <sys/wait.h>

#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <string>

BOOST_AUTO_TEST_SUITE(test_cli)

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

BOOST_AUTO_TEST_CASE(help_is_per_command) {
  auto r = run("serve --help");
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.find("usage: switchyard serve") == 0u, r.out);
  BOOST_TEST(r.out.find("--model FILE") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("--log-level") != std::string::npos, r.out);
  // Other commands' options are not listed.
  BOOST_TEST(r.out.find("--input jobs.jsonl") == std::string::npos, r.out);
  BOOST_TEST(r.out.find("  submit ") == std::string::npos, r.out);
  BOOST_TEST(r.out.find("  make-model ") == std::string::npos, r.out);

  r = run("submit -h");
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.find("--input jobs.jsonl") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("--kv-mb") == std::string::npos, r.out);

  // The whole list stays at the top level.
  r = run("--help");
  BOOST_TEST(r.status == 0);
  for (const char* cmd : {"  serve ", "  submit ", "  ctl ", "  keygen ", "  render-chat ",
                          "  generate ", "  tokenize ", "  make-model "})
    BOOST_TEST(r.out.find(cmd) != std::string::npos, cmd);
  r = run("");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("  make-model ") != std::string::npos, r.out);
}

BOOST_AUTO_TEST_CASE(bad_command_lines_name_the_problem) {
  auto r = run("serve --bogus-flag 1");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("switchyard: unknown option '--bogus-flag'") != std::string::npos, r.out);
  // The usage that follows is the command's own.
  BOOST_TEST(r.out.find("usage: switchyard serve") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("--input jobs.jsonl") == std::string::npos, r.out);

  r = run("tokenize --model");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("option --model needs a value") != std::string::npos, r.out);
  r = run("tokenize --json=yes --text x");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("option --json takes no value") != std::string::npos, r.out);
  r = run("generate --prompt hi stray");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("unexpected argument 'stray'") != std::string::npos, r.out);
  r = run("generate --prompt hi -n x");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("option --n expects an integer, got 'x'") != std::string::npos, r.out);
  r = run("frobnicate");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("switchyard: unknown command 'frobnicate'") != std::string::npos, r.out);
  r = run("serve --log-level loud");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("--log-level must be trace, debug, info, warn, error or off") !=
                 std::string::npos,
             r.out);
}

BOOST_AUTO_TEST_CASE(options_take_both_spellings_and_repeat) {
  // --name=value and --name value; the last of a repeated single-valued option wins.
  auto a = run("tokenize --model=" + kModel + " --text 'x y' --text='Once upon a time' --json");
  BOOST_TEST(a.status == 0, a.out);
  BOOST_TEST(a.out == "{\"ids\": [1, 403, 407, 261, 378]}\n");
}

BOOST_AUTO_TEST_SUITE_END()  // test_cli
