// llama.cpp's tokenizer test vectors: every vocab/*.gguf that has a .inp/.out pair, found by
// listing the directory, must give exactly the expected ids for every case, tokenized as
// test-tokenizer-0 does (no BOS/EOS, special tokens parsed). A vocabulary this build cannot
// load (say, an unsupported pre-tokenizer) fails its case; nothing is skipped.
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

BOOST_AUTO_TEST_SUITE(test_tokenizer_vocab)

namespace {

namespace fs = std::filesystem;

const std::string kVocabDir = std::string(SY_MODELS_DIR) + "/vocab/";
constexpr std::string_view kSeparator = "__ggml_vocab_test__";

// The vocabulary files that have both test files next to them, sorted by name.
std::vector<std::string> vocab_pairs() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kVocabDir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".gguf") continue;
    if (fs::exists(kVocabDir + name + ".inp") && fs::exists(kVocabDir + name + ".out")) {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot open " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Cases are the lines between separator lines, joined with '\n' (a case can span lines).
std::vector<std::string> read_inputs(const std::string& path) {
  std::vector<std::string> cases;
  std::istringstream in(read_all(path));
  std::string line, text;
  bool first = true;
  while (std::getline(in, line)) {
    if (line == kSeparator) {
      cases.push_back(text);
      text.clear();
      first = true;
      continue;
    }
    if (!first) text += '\n';
    text += line;
    first = false;
  }
  return cases;
}

std::vector<std::vector<int32_t>> read_outputs(const std::string& path) {
  std::vector<std::vector<int32_t>> out;
  std::istringstream in(read_all(path));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// Runs the cases of one pair; each must give exactly the expected ids.
void run_pair(const std::string& name) {
  const auto file = sy::gguf::File::open(kVocabDir + name);
  std::unique_ptr<sy::Tokenizer> tok;
  try {
    tok = sy::Tokenizer::from_gguf(file);
  } catch (const std::exception& e) {
    BOOST_ERROR(name << " does not load: " << e.what());
    return;
  }
  const auto inputs = read_inputs(kVocabDir + name + ".inp");
  const auto expected = read_outputs(kVocabDir + name + ".out");
  BOOST_REQUIRE_EQUAL(inputs.size(), expected.size());
  BOOST_REQUIRE(!inputs.empty());

  size_t passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto got = tok->encode(inputs[i], /*add_special=*/false, /*parse_special=*/true);
    if (got == expected[i]) {
      ++passed;
    } else {
      BOOST_ERROR(name << " case " << i << " '" << inputs[i] << "'\n  expected" << show(expected[i])
                       << "\n  got     " << show(got));
    }
  }
  std::cout << name << ": " << passed << "/" << inputs.size() << " cases pass\n";
  BOOST_TEST(passed == inputs.size(), name << ": " << passed << "/" << inputs.size());
}

}  // namespace

// The directory holds the nine vocabularies it was published with; fewer means the listing or
// the directory is wrong, and the test below would then check too little.
BOOST_AUTO_TEST_CASE(directory_has_the_published_pairs) {
  const auto names = vocab_pairs();
  for (const char* want :
       {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-phi-3.gguf",
        "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-falcon.gguf",
        "ggml-vocab-starcoder.gguf", "ggml-vocab-refact.gguf", "ggml-vocab-mpt.gguf"}) {
    BOOST_TEST(std::count(names.begin(), names.end(), want) == 1, "missing " << want);
  }
}

// Every pair in the directory, each case exact.
BOOST_AUTO_TEST_CASE(every_case_of_every_pair) {
  const auto names = vocab_pairs();
  BOOST_REQUIRE(!names.empty());
  for (const std::string& name : names) run_pair(name);
}

// A listed vocabulary that does not load fails the run rather than being skipped: a copy of a
// published file whose pre-tokenizer is renamed to one without rules here.
BOOST_AUTO_TEST_CASE(unsupported_pre_tokenizer_fails_to_load) {
  // The GGUF string is rewritten in place with a same-length name, so the file stays valid.
  std::string bytes = read_all(kVocabDir + "ggml-vocab-falcon.gguf");
  const std::string from = "falcon";
  const std::string key = "tokenizer.ggml.pre";
  const size_t at = bytes.find(key);
  BOOST_REQUIRE(at != std::string::npos);
  const size_t value = bytes.find(from, at + key.size());
  BOOST_REQUIRE(value != std::string::npos && value - at < key.size() + 16);
  bytes.replace(value, from.size(), "zzzzzz");
  const std::string path =
      (fs::temp_directory_path() / ("sy_vocab_unsupported_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
  }
  try {
    const auto file = sy::gguf::File::open(path);
    sy::Tokenizer::from_gguf(file);
    BOOST_ERROR("a vocabulary with pre-tokenizer 'zzzzzz' loaded");
  } catch (const sy::gguf::Error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("unsupported BPE pre-tokenizer 'zzzzzz'") != std::string::npos, what);
    BOOST_TEST(what.find("qwen2") != std::string::npos, what);  // the message lists what works
  }
  fs::remove(path);
}

// Decoding gives every case back (SPM: without its dummy-prefix space).
BOOST_AUTO_TEST_CASE(decode_round_trips) {
  for (const std::string& name : vocab_pairs()) {
    const auto file = sy::gguf::File::open(kVocabDir + name);
    const auto tok = sy::Tokenizer::from_gguf(file);
    const bool spm = tok->kind() == sy::Tokenizer::Kind::Spm;
    for (const std::string& text : read_inputs(kVocabDir + name + ".inp")) {
      const std::string back = tok->decode(tok->encode(text, false, true), spm);
      BOOST_TEST(back == text, name << ": '" << text << "' decodes to '" << back << "'");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_tokenizer_vocab
