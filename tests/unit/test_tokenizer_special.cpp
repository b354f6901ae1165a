// Special tokens on real vocabularies: control-token text in user input stays text unless
// parse_special is asked for (the library default and `switchyard tokenize` without
// --parse-special), and the end-of-generation ids each vocabulary declares or names.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

BOOST_AUTO_TEST_SUITE(test_tokenizer_special)

namespace {

using Ids = std::vector<int32_t>;
const std::string kVocabDir = std::string(SY_MODELS_DIR) + "/vocab/";

struct Vocab {
  sy::gguf::File file;
  std::unique_ptr<sy::Tokenizer> tok;
  explicit Vocab(const std::string& name)
      : file(sy::gguf::File::open(kVocabDir + name)), tok(sy::Tokenizer::from_gguf(file)) {}
};

bool contains(const Ids& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Runs the real binary; returns stdout and stderr together, with the exit status.
std::pair<int, std::string> run_cli(const std::string& args) {
  const std::string cmd = std::string(SY_BINARY_DIR) + "/switchyard " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(p);
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string json_ids(const Ids& ids) {
  std::string s = "{\"ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]}\n";
}

}  // namespace

BOOST_AUTO_TEST_CASE(control_text_is_plain_text_by_default) {
  const Vocab phi3("ggml-vocab-phi-3.gguf");
  const std::string chat = "<|user|>\nHi<|end|>\n<|assistant|>";
  const Ids plain = phi3.tok->encode(chat, false);
  const Ids parsed = phi3.tok->encode(chat, false, /*parse_special=*/true);
  for (int32_t control : {32010, 32007, 32001}) {  // <|user|>, <|end|>, <|assistant|>
    BOOST_TEST(!contains(plain, control), control);
    BOOST_TEST(contains(parsed, control), control);
  }
  BOOST_TEST(parsed.front() == 32010);
  BOOST_TEST(parsed.back() == 32001);
  // The plain form is the text itself: it decodes back to the input.
  BOOST_TEST(phi3.tok->decode(plain, true) == chat);

  const Vocab gpt2("ggml-vocab-gpt-2.gguf");
  BOOST_TEST(gpt2.tok->encode("a<|endoftext|>", false, true) == (Ids{64, 50256}),
             boost::test_tools::per_element());
  BOOST_TEST(!contains(gpt2.tok->encode("a<|endoftext|>", false), 50256));

  // SentencePiece BOS text: "<s>" is three characters unless parsed.
  const Vocab spm("ggml-vocab-llama-spm.gguf");
  BOOST_TEST(!contains(spm.tok->encode("<s>x", false), 1));
  BOOST_TEST(spm.tok->encode("<s>x", false, true).front() == 1);
}

BOOST_AUTO_TEST_CASE(user_defined_tokens_match_without_parse_special) {
  // Phi-3 stores "</s>" as a user-defined token (type 4): llama.cpp matches those in any text,
  // and so do we; it is not an end-of-generation token of this vocabulary.
  const Vocab phi3("ggml-vocab-phi-3.gguf");
  BOOST_TEST((phi3.tok->token_type(2) == sy::Tokenizer::TokenType::UserDefined));
  BOOST_TEST(contains(phi3.tok->encode("a</s>", false), 2));
  BOOST_TEST(!phi3.tok->is_eog(2));
}

BOOST_AUTO_TEST_CASE(eog_ids_per_vocabulary) {
  // Phi-3: eos <|endoftext|> (32000) and <|end|> (32007), named by its text.
  const Vocab phi3("ggml-vocab-phi-3.gguf");
  BOOST_TEST(phi3.tok->eog_ids() == (Ids{32000, 32007}), boost::test_tools::per_element());
  BOOST_TEST(phi3.tok->is_eog(32007));
  BOOST_TEST(!phi3.tok->is_eog(32010));  // <|user|> is control but does not end a turn
  BOOST_TEST(Vocab("ggml-vocab-gpt-2.gguf").tok->eog_ids() == (Ids{50256}),
             boost::test_tools::per_element());
  BOOST_TEST(Vocab("ggml-vocab-llama-spm.gguf").tok->eog_ids() == (Ids{2}),
             boost::test_tools::per_element());
  BOOST_TEST(Vocab("ggml-vocab-deepseek-llm.gguf").tok->eog_ids() == (Ids{100001}),
             boost::test_tools::per_element());
  BOOST_TEST(Vocab("ggml-vocab-starcoder.gguf").tok->eog_ids() == (Ids{0}),
             boost::test_tools::per_element());
  // Falcon declares eos 11 ("<|endoftext|>").
  BOOST_TEST(Vocab("ggml-vocab-falcon.gguf").tok->eog_ids() == (Ids{11}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(cli_tokenize_parse_special) {
  const Vocab gpt2("ggml-vocab-gpt-2.gguf");
  const std::string model = "--model " + kVocabDir + "ggml-vocab-gpt-2.gguf";
  const std::string text = "--text 'a<|endoftext|>b'";
  const auto [st1, plain] = run_cli("tokenize " + model + " " + text + " --no-bos --json");
  BOOST_TEST(st1 == 0, plain);
  BOOST_TEST(plain == json_ids(gpt2.tok->encode("a<|endoftext|>b", false)));
  BOOST_TEST(plain.find("50256") == std::string::npos, plain);
  const auto [st2, parsed] =
      run_cli("tokenize " + model + " " + text + " --no-bos --parse-special --json");
  BOOST_TEST(st2 == 0, parsed);
  BOOST_TEST(parsed == "{\"ids\": [64, 50256, 65]}\n");
}

BOOST_AUTO_TEST_SUITE_END()  // test_tokenizer_special
