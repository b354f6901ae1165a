// Tokenizer behaviour on small vocabularies written in the test: score-driven SPM merging,
// metadata flags (add_bos_token, eot), user-defined tokens, and errors for unusable metadata.
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "model/unicode_cats.hpp"

BOOST_AUTO_TEST_SUITE(test_tokenizer_synthetic)

namespace {

using sy::Tokenizer;
using sy::gguf::Writer;

// An SPM vocabulary: unk, BOS, EOS, 256 byte tokens, then `extra` with their scores and types.
struct SpmVocab {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};

  SpmVocab() {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      add(name, 0, 6);
    }
  }
  int32_t add(const std::string& text, float score, int32_t type = 1) {
    tokens.push_back(text);
    scores.push_back(score);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  Writer writer() const {
    Writer w;
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    return w;
  }
};

// Keeps the serialized bytes alive as long as the parsed file that points into them.
struct Built {
  std::vector<uint8_t> bytes;
  sy::gguf::File file;
  explicit Built(const Writer& w)
      : bytes(w.bytes()), file(sy::gguf::File::from_memory(bytes.data(), bytes.size())) {}
  std::unique_ptr<Tokenizer> tok() const { return Tokenizer::from_gguf(file); }
};

const std::string kSp = "\xE2\x96\x81";  // "▁"

}  // namespace

BOOST_AUTO_TEST_CASE(spm_merges_follow_scores) {
  SpmVocab v;
  const int32_t sp = v.add(kSp, -5);
  const int32_t a = v.add("a", -5);
  const int32_t b = v.add("b", -5);
  const int32_t sp_a = v.add(kSp + "a", -1);
  const int32_t ab = v.add("ab", -2);
  const int32_t sp_ab = v.add(kSp + "ab", -0.5f);
  {
    const auto t = Built(v.writer()).tok();
    BOOST_CHECK(t->encode("ab ab", false) == (std::vector<int32_t>{sp_ab, sp_ab}));
    BOOST_CHECK(t->encode("ab ab", true) == (std::vector<int32_t>{1, sp_ab, sp_ab}));
    BOOST_CHECK(t->encode("ba", false) == (std::vector<int32_t>{sp, b, a}));
    // Unknown characters fall back to bytes: "c" is 0x63.
    BOOST_CHECK(t->encode("c", false) == (std::vector<int32_t>{sp, 3 + 0x63}));
  }
  // With "ab" scored above "▁a", "ab" forms first and "▁ab" can no longer be built from "▁a".
  SpmVocab w = v;
  w.scores[static_cast<size_t>(ab)] = -0.1f;
  w.tokens[static_cast<size_t>(sp_ab)] = "unused-piece";
  const auto t = Built(w.writer()).tok();
  BOOST_CHECK(t->encode("ab", false) == (std::vector<int32_t>{sp, ab}));
  (void)sp_a;
}

BOOST_AUTO_TEST_CASE(metadata_flags_and_end_tokens) {
  SpmVocab v;
  v.add(kSp, -1);
  v.add("x", -1);
  const int32_t eot = v.add("<|eot|>", 0, 3);
  const int32_t im_end = v.add("<|im_end|>", 0, 1);  // recognized by its text
  auto w = v.writer();
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  w.add_bool("tokenizer.ggml.add_eos_token", true);
  w.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(eot));
  w.add_u32("tokenizer.ggml.bos_token_id", 4000000000u);  // out of range: the default stays
  const auto t = Built(w).tok();
  BOOST_CHECK_EQUAL(t->bos(), 1);
  BOOST_CHECK(!t->add_bos());
  BOOST_CHECK(t->add_eos());
  const auto ids = t->encode("x", true);
  BOOST_REQUIRE(!ids.empty());
  BOOST_CHECK_NE(ids.front(), 1);
  BOOST_CHECK_EQUAL(ids.back(), 2);
  BOOST_CHECK_EQUAL(t->eot(), eot);
  BOOST_CHECK(t->is_eog(2));
  BOOST_CHECK(t->is_eog(eot));
  BOOST_CHECK(t->is_eog(im_end));
  BOOST_CHECK(!t->is_eog(1));
  // A token made an end token by its text is treated as control: it prints nothing.
  BOOST_CHECK_EQUAL(t->token_to_piece(im_end), "");
}

BOOST_AUTO_TEST_CASE(user_defined_tokens_are_matched_whole) {
  SpmVocab v;
  const int32_t sp = v.add(kSp, -1);
  const int32_t x = v.add("x", -1);
  const int32_t tool = v.add("<tool>", 0, 4);
  const int32_t tool_call = v.add("<tool_call>", 0, 4);
  const auto t = Built(v.writer()).tok();
  // Longest user-defined token first; plain text after it gets the dummy prefix again.
  BOOST_CHECK(t->encode("x<tool_call>x<tool>", false) ==
              (std::vector<int32_t>{sp, x, tool_call, sp, x, tool}));
  BOOST_CHECK_EQUAL(t->token_to_piece(tool), "<tool>");
  BOOST_CHECK_EQUAL(t->decode({tool, sp, x}), "<tool> x");
}

BOOST_AUTO_TEST_CASE(unusable_metadata_is_an_error) {
  using sy::gguf::Error;
  {
    Writer w;
    w.add_string_array("tokenizer.ggml.tokens", {"a"});
    BOOST_CHECK_THROW(Built(w).tok(), Error);  // no model key
  }
  {
    Writer w;
    w.add_string("tokenizer.ggml.model", "bert");
    w.add_string_array("tokenizer.ggml.tokens", {"a"});
    BOOST_CHECK_THROW(Built(w).tok(), Error);
  }
  {
    Writer w;
    w.add_string("tokenizer.ggml.model", "llama");
    BOOST_CHECK_THROW(Built(w).tok(), Error);  // no tokens
  }
  {
    Writer w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b"});
    BOOST_CHECK_THROW(Built(w).tok(), Error);  // no merges
    w.add_string_array("tokenizer.ggml.merges", {"a b"});
    w.add_string("tokenizer.ggml.pre", "tekken");
    BOOST_CHECK_THROW(Built(w).tok(), Error);  // pre-split rules not implemented
  }
  {
    SpmVocab v;
    v.types.pop_back();
    BOOST_CHECK_THROW(Built(v.writer()).tok(), Error);  // token_type length mismatch
  }
}

BOOST_AUTO_TEST_CASE(tiny_gpt2_vocabulary) {
  // Byte-level BPE: "Ġ" stands for the space byte; merges ranked by their order.
  Writer w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "gpt-2");
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "\xC4\xA0", "ab",
                                               "\xC4\xA0"
                                               "a",
                                               "\xC4\xA0"
                                               "ab",
                                               "<|endoftext|>"});
  w.add_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1, 3});
  w.add_string_array("tokenizer.ggml.merges", {"a b", "\xC4\xA0 a",
                                               "\xC4\xA0"
                                               "a b"});
  w.add_u32("tokenizer.ggml.eos_token_id", 6);
  const auto t = Built(w).tok();
  // "ab ab" pre-splits into "ab" and " ab"; rank 0 "a b" wins over rank 1 "Ġ a", so " ab" ends
  // as "Ġ" + "ab" (no merge "Ġ ab").
  BOOST_CHECK(t->encode("ab ab", false) == (std::vector<int32_t>{3, 2, 3}));
  BOOST_CHECK(t->encode(" a", false) == (std::vector<int32_t>{4}));
  BOOST_CHECK_EQUAL(t->decode({3, 2, 3}), "ab ab");
  BOOST_CHECK(t->is_eog(6));
  BOOST_CHECK(t->encode("ab", true) == (std::vector<int32_t>{3}));  // no BOS for gpt2
}

BOOST_AUTO_TEST_CASE(unicode_classes_and_lenient_utf8) {
  using sy::UnicodeCat;
  BOOST_CHECK(sy::unicode_category('A') == UnicodeCat::Letter);
  BOOST_CHECK(sy::unicode_category(0x4E00) == UnicodeCat::Letter);  // CJK ideograph
  BOOST_CHECK(sy::unicode_category(0x0660) == UnicodeCat::Number);  // Arabic-Indic zero
  BOOST_CHECK(sy::unicode_category(0x00BD) == UnicodeCat::Number);  // ½ (No)
  BOOST_CHECK(sy::unicode_category('!') == UnicodeCat::Punct);
  BOOST_CHECK(sy::unicode_category('$') == UnicodeCat::Other);       // a symbol (Sc)
  BOOST_CHECK(sy::unicode_category(0x1F600) == UnicodeCat::Other);   // emoji (So)
  BOOST_CHECK(sy::unicode_category(0x10FFFF) == UnicodeCat::Other);  // unassigned
  BOOST_CHECK(sy::unicode_is_whitespace(0x2003));
  BOOST_CHECK(sy::unicode_is_whitespace('\n'));
  BOOST_CHECK(!sy::unicode_is_whitespace(0x1C));
  BOOST_CHECK(!sy::unicode_is_whitespace(0x200B));  // zero-width space is not White_Space

  // A stray continuation byte and a truncated sequence each become U+FFFD per byte.
  const auto cps = sy::utf8_to_cpts("a\x80\xC3\xA9\xE2\x82");
  BOOST_CHECK(cps == (std::vector<uint32_t>{'a', 0xFFFD, 0xE9, 0xFFFD, 0xFFFD}));
  std::string back;
  for (uint32_t cp : {0x41u, 0xE9u, 0x20ACu, 0x1F999u}) sy::append_utf8(back, cp);
  BOOST_CHECK_EQUAL(back, "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99");
}

BOOST_AUTO_TEST_SUITE_END()  // test_tokenizer_synthetic
