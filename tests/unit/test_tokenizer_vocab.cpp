// llama.cpp's tokenizer test vectors (vocab/*.gguf with .inp/.out): every case must give exactly
// the expected ids, tokenized as test-tokenizer-0 does (no BOS/EOS, special tokens not parsed).
#define BOOST_TEST_MODULE tokenizer_vocab
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

namespace {

const std::string kVocabDir = std::string(SY_MODELS_DIR) + "/vocab/";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot open " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Cases are the lines between "__ggml_vocab_test__" separator lines, joined with '\n'.
std::vector<std::string> read_inputs(const std::string& path) {
  std::vector<std::string> cases;
  std::istringstream in(read_all(path));
  std::string line, text;
  bool first = true;
  while (std::getline(in, line)) {
    if (line == "__ggml_vocab_test__") {
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

void run_vocab(const std::string& name, sy::Tokenizer::Kind kind) {
  const auto file = sy::gguf::File::open(kVocabDir + name);
  const auto tok = sy::Tokenizer::from_gguf(file);
  BOOST_REQUIRE(tok->kind() == kind);
  const auto inputs = read_inputs(kVocabDir + name + ".inp");
  const auto expected = read_outputs(kVocabDir + name + ".out");
  BOOST_REQUIRE_EQUAL(inputs.size(), expected.size());
  BOOST_REQUIRE(!inputs.empty());

  size_t passed = 0;
  size_t round_trips = 0;
  const bool spm = kind == sy::Tokenizer::Kind::Spm;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto got = tok->encode(inputs[i], /*add_special=*/false);
    // Decoding gives the input back (SPM: without its dummy-prefix space).
    const std::string back = tok->decode(got, /*strip_leading_space=*/spm);
    BOOST_CHECK_MESSAGE(back == inputs[i], name << " case " << i << " decodes to '" << back << "'");
    round_trips += back == inputs[i];
    if (got == expected[i]) {
      ++passed;
    } else {
      BOOST_ERROR(name << " case " << i << " '" << inputs[i] << "'\n  expected" << show(expected[i])
                       << "\n  got     " << show(got));
    }
  }
  std::cout << name << ": " << passed << "/" << inputs.size() << " cases pass, " << round_trips
            << " decode back to their input\n";
  BOOST_CHECK_EQUAL(passed, inputs.size());
}

}  // namespace

BOOST_AUTO_TEST_CASE(llama_spm_all_cases) {
  run_vocab("ggml-vocab-llama-spm.gguf", sy::Tokenizer::Kind::Spm);
}

BOOST_AUTO_TEST_CASE(gpt2_all_cases) {
  run_vocab("ggml-vocab-gpt-2.gguf", sy::Tokenizer::Kind::Bpe);
}
