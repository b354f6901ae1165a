// Tokenizer checks on the stories260K vocabulary (SPM, 512 tokens) against llama.cpp's reference
// ids, decode round trips on both test vocabularies, special-token handling and Utf8Stream.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/reference.hpp"

BOOST_AUTO_TEST_SUITE(test_tokenizer_stories)

namespace {

const std::string kModels = SY_MODELS_DIR;

struct Loaded {
  sy::gguf::File file;
  std::unique_ptr<sy::Tokenizer> tok;
  explicit Loaded(const std::string& path)
      : file(sy::gguf::File::open(path)), tok(sy::Tokenizer::from_gguf(file)) {}
};

const sy::Tokenizer& stories() {
  static Loaded l(kModels + "/stories260K.gguf");
  return *l.tok;
}
const sy::Tokenizer& llama_spm() {
  static Loaded l(kModels + "/vocab/ggml-vocab-llama-spm.gguf");
  return *l.tok;
}
const sy::Tokenizer& gpt2() {
  static Loaded l(kModels + "/vocab/ggml-vocab-gpt-2.gguf");
  return *l.tok;
}

// Strings that exercise spaces, newlines, multi-byte characters and byte fallback.
const std::vector<std::string> kSamples = {
    "Once upon a time",
    " leading space",
    "two  spaces and\ttab\nnewline\n\n",
    "caf\xC3\xA9 na\xC3\xAFve \xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE",
    "emoji \xF0\x9F\xA6\x99 and \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F",
    "\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
    "apple\xE5\xB7\xA5\xE4\xBD\x9C 1314151",
    "It's 'RE we'll I've",
};

}  // namespace

BOOST_AUTO_TEST_CASE(vocabulary_facts) {
  const auto& t = stories();
  BOOST_CHECK(t.kind() == sy::Tokenizer::Kind::Spm);
  BOOST_CHECK_EQUAL(t.n_vocab(), 512);
  BOOST_CHECK_EQUAL(t.bos(), 1);
  BOOST_CHECK_EQUAL(t.eos(), 2);
  BOOST_CHECK(t.add_bos());
  BOOST_CHECK(!t.add_eos());
  BOOST_CHECK(t.is_eog(2));
  BOOST_CHECK(!t.is_eog(1));
  BOOST_CHECK(!t.is_eog(403));
  BOOST_CHECK_EQUAL(t.token_text(3), "<0x00>");

  const auto& g = gpt2();
  BOOST_CHECK(g.kind() == sy::Tokenizer::Kind::Bpe);
  BOOST_CHECK_EQUAL(g.n_vocab(), 50257);
  BOOST_CHECK(!g.add_bos());
  BOOST_CHECK(g.is_eog(50256));
  BOOST_CHECK(!g.is_eog(198));
}

BOOST_AUTO_TEST_CASE(reference_prompts_and_generations) {
  const auto& t = stories();
  int n_cases = 0;
  for (const auto& c : sy::test::reference_cases()) {
    const auto& prompt = c.prompt;
    const auto& prompt_ids = c.prompt_token_ids;
    const auto& pieces = c.prompt_pieces;
    const auto& gen_ids = c.generated_token_ids;
    const auto& gen_text = c.generated_text;

    const auto ids = t.encode(prompt, /*add_special=*/true);
    BOOST_CHECK_EQUAL_COLLECTIONS(ids.begin(), ids.end(), prompt_ids.begin(), prompt_ids.end());
    BOOST_REQUIRE_EQUAL(pieces.size(), prompt_ids.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      BOOST_CHECK_EQUAL(t.token_to_piece(prompt_ids[i], /*special=*/true), pieces[i]);
    }
    // Without special rendering BOS is silent, and the dummy-prefix space stays (llama.cpp
    // shows " Once upon a time" for a prompt that starts with BOS).
    BOOST_CHECK_EQUAL(t.token_to_piece(1), "");
    BOOST_CHECK_EQUAL(t.decode(prompt_ids, true), " " + prompt);
    BOOST_CHECK_EQUAL(t.decode(t.encode(prompt, false), true), prompt);
    BOOST_CHECK_EQUAL(t.decode(gen_ids), gen_text);

    // Streaming the generation piece by piece gives the same text.
    sy::Utf8Stream stream;
    std::string streamed;
    for (int32_t id : gen_ids) streamed += stream.push(t.token_to_piece(id));
    streamed += stream.flush();
    BOOST_CHECK_EQUAL(streamed, gen_text);
    ++n_cases;
  }
  BOOST_CHECK_EQUAL(n_cases, 6);
}

BOOST_AUTO_TEST_CASE(byte_fallback) {
  const auto& t = stories();
  // "我" (E6 88 91) is not in the 512-token vocabulary: after the dummy-prefix space "▁" (410)
  // its three bytes become <0xE6> <0x88> <0x91>, whose ids are 3 + byte.
  const auto ids = t.encode("\xE6\x88\x91", false);
  const std::vector<int32_t> want = {410, 3 + 0xE6, 3 + 0x88, 3 + 0x91};
  BOOST_CHECK_EQUAL_COLLECTIONS(ids.begin(), ids.end(), want.begin(), want.end());
  BOOST_CHECK_EQUAL(t.token_to_piece(3 + 0xE6), "\xE6");
  BOOST_CHECK_EQUAL(t.decode(ids, true), "\xE6\x88\x91");
  // "é" is a token of its own (485).
  BOOST_CHECK(t.encode("\xC3\xA9", false) == (std::vector<int32_t>{410, 485}));
}

BOOST_AUTO_TEST_CASE(round_trips) {
  for (const auto& s : kSamples) {
    BOOST_CHECK_EQUAL(stories().decode(stories().encode(s, false), true), s);
    BOOST_CHECK_EQUAL(llama_spm().decode(llama_spm().encode(s, false), true), s);
    BOOST_CHECK_EQUAL(gpt2().decode(gpt2().encode(s, false)), s);
  }
  // Empty text: no tokens, except BOS when asked for.
  BOOST_CHECK(stories().encode("", false).empty());
  BOOST_CHECK(stories().encode("", true) == std::vector<int32_t>{1});
  BOOST_CHECK(gpt2().encode("", true).empty());
}

BOOST_AUTO_TEST_CASE(special_tokens_in_text) {
  const auto& t = stories();
  // By default "<s>" is plain text; with parse_special it is the BOS token itself.
  const auto plain = t.encode("<s>Hi", false);
  BOOST_CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
  const auto parsed = t.encode("<s>Hi", false, /*parse_special=*/true);
  BOOST_REQUIRE(!parsed.empty());
  BOOST_CHECK_EQUAL(parsed[0], 1);
  // After a special token SPM adds the dummy-prefix space again, as llama.cpp does.
  BOOST_CHECK(std::vector<int32_t>(parsed.begin() + 1, parsed.end()) == t.encode("Hi", false));

  const auto& g = gpt2();
  const auto eot = g.encode("a<|endoftext|>", false, true);
  BOOST_REQUIRE_EQUAL(eot.size(), 2u);
  BOOST_CHECK_EQUAL(eot[1], 50256);
  BOOST_CHECK_GT(g.encode("a<|endoftext|>", false).size(), 2u);
  BOOST_CHECK_EQUAL(g.token_to_piece(50256), "");
  BOOST_CHECK_EQUAL(g.token_to_piece(50256, true), "<|endoftext|>");
  BOOST_CHECK_EQUAL(g.token_to_piece(198), "\n");
  BOOST_CHECK_EQUAL(g.token_to_piece(-1), "");
  BOOST_CHECK_EQUAL(g.token_to_piece(1 << 20), "");
}

BOOST_AUTO_TEST_CASE(utf8_stream_holds_back_partial_characters) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99z";  // a é € 🦙 z
  sy::Utf8Stream s;
  std::string all;
  std::vector<std::string> parts;
  for (char c : text) {
    parts.push_back(s.push(std::string_view(&c, 1)));
    all += parts.back();
  }
  all += s.flush();
  BOOST_CHECK_EQUAL(all, text);
  // Output appears only when a character completes.
  const std::vector<std::string> want = {"a", "", "\xC3\xA9",         "", "", "\xE2\x82\xAC", "",
                                         "",  "", "\xF0\x9F\xA6\x99", "z"};
  BOOST_CHECK_EQUAL_COLLECTIONS(parts.begin(), parts.end(), want.begin(), want.end());

  // An incomplete tail is returned by flush as it is; stray continuation bytes pass through.
  sy::Utf8Stream t;
  BOOST_CHECK_EQUAL(t.push("x\xF0\x9F"), "x");
  BOOST_CHECK_EQUAL(t.flush(), "\xF0\x9F");
  BOOST_CHECK_EQUAL(t.push("\x80q"), "\x80q");
}

BOOST_AUTO_TEST_CASE(long_inputs) {
  // Merging uses priority queues, so long inputs stay fast; check results, print the time.
  std::string text;
  while (text.size() < 400000) text += "Once upon a time, there was a little girl named Lily. ";
  std::string word(100000, 'a');  // one pre-split word of 100k letters
  for (const auto* t : {&stories(), &llama_spm(), &gpt2()}) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = t->encode(text, false);
    const auto ids2 = t->encode(word, false);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cout << (t == &gpt2() ? "gpt2" : "spm") << " vocab " << t->n_vocab() << ": "
              << text.size() + word.size() << " bytes -> " << ids.size() + ids2.size()
              << " tokens in " << ms << " ms\n";
    const bool spm = t->kind() == sy::Tokenizer::Kind::Spm;
    BOOST_CHECK_EQUAL(t->decode(ids, spm), text);
    BOOST_CHECK_EQUAL(t->decode(ids2, spm), word);
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_tokenizer_stories
