// Byte-level BPE pre-split rules (Llama 3 "llama-bpe", GPT-2, llama.cpp's "default") checked
// word by word, and Llama-3 vocabulary behaviour (whole-word tokens, BOS, end tokens, detokenize
// with clean_spaces) on a byte-level vocabulary written in the test.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "model/unicode_cats.hpp"

BOOST_AUTO_TEST_SUITE(test_tokenizer_llama3)

namespace {

using sy::Tokenizer;
using sy::gguf::Writer;
using Words = std::vector<std::string>;
using Ids = std::vector<int32_t>;

Words split(Tokenizer::PreSplit rules, std::string_view text) {
  return sy::tokenizer_detail::pre_split(rules, text);
}
Words llama3(std::string_view text) {
  return split(Tokenizer::PreSplit::Llama3, text);
}
Words gpt2(std::string_view text) {
  return split(Tokenizer::PreSplit::Gpt2, text);
}
Words dflt(std::string_view text) {
  return split(Tokenizer::PreSplit::Default, text);
}

// The character GPT-2's byte mapping writes for byte b: printable Latin-1 bytes stand for
// themselves, the 68 others take U+0100 onward in byte order.
std::string byte_char(int b) {
  auto printable = [](int x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
  };
  uint32_t cp = static_cast<uint32_t>(b);
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) {
      if (!printable(x)) ++cp;
    }
  }
  std::string s;
  sy::append_utf8(s, cp);
  return s;
}

// Vocabulary text of a plain string (each byte through the mapping).
std::string enc(std::string_view text) {
  std::string s;
  for (char c : text) s += byte_char(static_cast<uint8_t>(c));
  return s;
}

// A byte-level vocabulary: ids 0..255 are the byte tokens in byte order, then merged tokens (each
// with its merge, ranked in the order added), then tokens without merges and special tokens.
struct BpeVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;

  BpeVocab() {
    for (int b = 0; b < 256; ++b) add_token(byte_char(b));
  }
  int32_t add_token(const std::string& text, int32_t type = 1) {
    tokens.push_back(text);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  // Adds the merge "left right" (plain text, mapped here) and its result token.
  int32_t merge(std::string_view left, std::string_view right) {
    merges.push_back(enc(left) + " " + enc(right));
    return add_token(enc(std::string(left) + std::string(right)));
  }
  Writer writer(std::string_view pre) const {
    Writer w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    if (!pre.empty()) w.add_string("tokenizer.ggml.pre", std::string(pre));
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    w.add_string_array("tokenizer.ggml.merges", merges);
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

int32_t byte_id(char c) {
  return static_cast<uint8_t>(c);
}

}  // namespace

// Expected words follow the Llama-3 alternatives in order, the first that matches winning
// greedily: (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |
//  ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
BOOST_AUTO_TEST_CASE(llama3_words) {
  BOOST_TEST(llama3("Hello world") == (Words{"Hello", " world"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("") == Words{}, boost::test_tools::per_element());
  // Contractions, in any case.
  BOOST_TEST(llama3("I'm") == (Words{"I", "'m"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("I'M") == (Words{"I", "'M"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("we'RE") == (Words{"we", "'RE"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("you'Ll") == (Words{"you", "'Ll"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("don't") == (Words{"don", "'t"}), boost::test_tools::per_element());
  // The contraction matches before the letter rule could take "'sup" whole; with letters after
  // it, an upper-case contraction shows the case folding (without it, "'Sup" would be one word).
  BOOST_TEST(llama3("'sup") == (Words{"'s", "up"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("'Sup") == (Words{"'S", "up"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("HE'SAID") == (Words{"HE", "'S", "AID"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("we'REad") == (Words{"we", "'RE", "ad"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("I'MM") == (Words{"I", "'M", "M"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("you'LLx") == (Words{"you", "'LL", "x"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("'Dx") == (Words{"'D", "x"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("'Tx") == (Words{"'T", "x"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("'VEx") == (Words{"'VE", "x"}), boost::test_tools::per_element());
  // Only ASCII letters fold, as in llama.cpp: "ſ" (a letter) is no "s", so "'" leads it instead.
  BOOST_TEST(llama3("'\xC5\xBF") == (Words{"'\xC5\xBF"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("x''s") == (Words{"x", "''", "s"}), boost::test_tools::per_element());
  // Numbers in threes from the left, never joined to a space or letter.
  BOOST_TEST(llama3("12345") == (Words{"123", "45"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("1234567") == (Words{"123", "456", "7"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("$100") == (Words{"$", "100"}), boost::test_tools::per_element());
  BOOST_TEST(llama3(" $100") == (Words{" $", "100"}), boost::test_tools::per_element());
  BOOST_TEST(llama3(" 12") == (Words{" ", "12"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("a1b") == (Words{"a", "1", "b"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("3.14") == (Words{"3", ".", "14"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("\u00BD3") == (Words{"\u00BD3"}),  // ½ is a number (No)
             boost::test_tools::per_element());
  // One character that is no newline, letter or number leads a letter run.
  BOOST_TEST(llama3("!x") == (Words{"!x"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("(x)") == (Words{"(x", ")"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("\tx") == (Words{"\tx"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("\nx") == (Words{"\n", "x"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("a+b=c") == (Words{"a", "+b", "=c"}), boost::test_tools::per_element());
  // Punctuation runs take the newlines after them.
  BOOST_TEST(llama3("hello!!!\n") == (Words{"hello", "!!!\n"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("x:\n\n") == (Words{"x", ":\n\n"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("ab, cd.") == (Words{"ab", ",", " cd", "."}), boost::test_tools::per_element());
  // White space: up to the last newline of a run; else all but the space before a word.
  BOOST_TEST(llama3("a\n\nb") == (Words{"a", "\n\n", "b"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("a \r\n b") == (Words{"a", " \r\n", " b"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("x  \n  y") == (Words{"x", "  \n", " ", " y"}),
             boost::test_tools::per_element());
  BOOST_TEST(llama3("  x") == (Words{" ", " x"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("a\t\tb") == (Words{"a", "\t", "\tb"}), boost::test_tools::per_element());
  BOOST_TEST(llama3("end  ") == (Words{"end", "  "}), boost::test_tools::per_element());
  BOOST_TEST(llama3("a  \t") == (Words{"a", "  \t"}), boost::test_tools::per_element());
  // Other scripts.
  BOOST_TEST(llama3("na\xC3\xAFve caf\xC3\xA9") == (Words{"na\xC3\xAFve", " caf\xC3\xA9"}),
             boost::test_tools::per_element());
  BOOST_TEST(llama3("\xE4\xB8\xAD\xE6\x96\x87 \xE5\xAD\x97") ==
                 (Words{"\xE4\xB8\xAD\xE6\x96\x87", " \xE5\xAD\x97"}),
             boost::test_tools::per_element());
  // Invalid UTF-8 becomes U+FFFD (a symbol: "other") before splitting.
  BOOST_TEST(llama3("a\xFF") == (Words{"a", "\xEF\xBF\xBD"}), boost::test_tools::per_element());
}

// The same inputs under GPT-2's rules, where they differ from Llama 3's.
BOOST_AUTO_TEST_CASE(gpt2_words_differ) {
  BOOST_TEST(gpt2("I'M") == (Words{"I", "'", "M"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("'Sup") == (Words{"'", "Sup"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("'sup") == (Words{"'s", "up"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("I'm") == (Words{"I", "'m"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("12345") == (Words{"12345"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2(" 12") == (Words{" 12"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("a\n\nb") == (Words{"a", "\n", "\n", "b"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("hello!!!\n") == (Words{"hello", "!!!", "\n"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("(x)") == (Words{"(", "x", ")"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("x  \n  y") == (Words{"x", "  \n ", " y"}), boost::test_tools::per_element());
  BOOST_TEST(gpt2("  x") == (Words{" ", " x"}), boost::test_tools::per_element());
}

// llama.cpp's default: punctuation (and $+<=>^~|) runs first, then GPT-2 words, then number runs,
// then ASCII digit triples.
BOOST_AUTO_TEST_CASE(default_words) {
  BOOST_TEST(dflt("Hello world") == (Words{"Hello", " world"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("I'm") == (Words{"I", "'", "m"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("'sup") == (Words{"'", "sup"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("$100") == (Words{"$", "100"}), boost::test_tools::per_element());
  BOOST_TEST(dflt(" $100") == (Words{" ", "$", "100"}), boost::test_tools::per_element());
  BOOST_TEST(dflt(" 12") == (Words{" ", "12"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("1234567") == (Words{"123", "456", "7"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("a+b=c") == (Words{"a", "+", "b", "=", "c"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("1,234") == (Words{"1", ",", "234"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("hello!!!\n") == (Words{"hello", "!!!", "\n"}), boost::test_tools::per_element());
  // "`" is a symbol (Sk), not in the first class: it stays with GPT-2's "other" run.
  BOOST_TEST(dflt("a`!") == (Words{"a", "`", "!"}), boost::test_tools::per_element());
  BOOST_TEST(dflt("a``") == (Words{"a", "``"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(llama3_vocabulary) {
  BpeVocab v;
  // Merges are ranked in this order; "3 4" first so that GPT-2's single word "12345" differs.
  const int32_t m34 = v.merge("3", "4");
  const int32_t m12 = v.merge("1", "2");
  const int32_t m123 = v.merge("12", "3");
  const int32_t m45 = v.merge("4", "5");
  const int32_t apos_m = v.merge("'", "M");
  const int32_t sp_w = v.merge(" ", "w");
  const int32_t ll = v.merge("l", "l");
  const int32_t he = v.merge("H", "e");
  const int32_t hell = v.merge("He", "ll");
  const int32_t hello = v.merge("Hell", "o");
  const int32_t xyz = v.add_token(enc("xyz"));  // reachable by no merge
  const int32_t begin = v.add_token("<|begin_of_text|>", 3);
  const int32_t end_text = v.add_token("<|end_of_text|>", 3);
  const int32_t eot = v.add_token("<|eot_id|>", 3);
  const int32_t header = v.add_token("<|start_header_id|>", 3);
  Writer w = v.writer("llama-bpe");
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(begin));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(end_text));
  const auto t = Built(w).tok();
  BOOST_TEST((t->kind() == Tokenizer::Kind::Bpe));
  BOOST_TEST((t->pre_split() == Tokenizer::PreSplit::Llama3));
  BOOST_TEST(!t->pre_assumed());

  // BOS by default for Llama 3; no EOS.
  BOOST_TEST(t->add_bos());
  BOOST_TEST(!t->add_eos());
  BOOST_TEST(t->encode("Hello", true) == (Ids{begin, hello}), boost::test_tools::per_element());
  BOOST_TEST(t->encode("Hello world", false) ==
                 (Ids{hello, sp_w, byte_id('o'), byte_id('r'), byte_id('l'), byte_id('d')}),
             boost::test_tools::per_element());
  // "'M" is a word of its own under Llama 3.
  BOOST_TEST(t->encode("I'M", false) == (Ids{byte_id('I'), apos_m}),
             boost::test_tools::per_element());
  // "12345" is "123" + "45": rank 0 "3 4" never applies across the two words.
  BOOST_TEST(t->encode("12345", false) == (Ids{m123, m45}), boost::test_tools::per_element());
  // A word that is a token is taken whole even though no merge builds it.
  BOOST_TEST(t->encode("xyz", false) == (Ids{xyz}), boost::test_tools::per_element());
  BOOST_TEST(
      t->encode(" xyz", false) == (Ids{byte_id(' '), byte_id('x'), byte_id('y'), byte_id('z')}),
      boost::test_tools::per_element());

  // End tokens: <|eot_id|> is the EOT (no eot_token_id key), and both it and <|end_of_text|>
  // end generation; other control tokens do not.
  BOOST_TEST(t->eos() == end_text);
  BOOST_TEST(t->eot() == eot);
  BOOST_TEST(t->is_eog(eot));
  BOOST_TEST(t->is_eog(end_text));
  BOOST_TEST(!t->is_eog(begin));
  BOOST_TEST(!t->is_eog(header));
  BOOST_TEST(!t->is_eog(hello));

  // Control tokens are text unless parse_special.
  BOOST_TEST(t->encode("<|eot_id|>Hello", false, true) == (Ids{eot, hello}),
             boost::test_tools::per_element());
  BOOST_TEST(t->encode("<|eot_id|>", false).size() > 1u);

  // Same vocabulary, GPT-2 rules: no BOS, merges as ranked, no whole-word shortcut.
  Writer g = v.writer("gpt-2");
  g.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(begin));
  const auto tg = Built(g).tok();
  BOOST_TEST(!tg->add_bos());
  BOOST_TEST(tg->encode("Hello", true) == (Ids{hello}), boost::test_tools::per_element());
  BOOST_TEST(tg->encode("I'M", false) == (Ids{byte_id('I'), byte_id('\''), byte_id('M')}),
             boost::test_tools::per_element());
  BOOST_TEST(tg->encode("12345", false) == (Ids{m12, m34, byte_id('5')}),
             boost::test_tools::per_element());
  BOOST_TEST(tg->encode("xyz", false) == (Ids{byte_id('x'), byte_id('y'), byte_id('z')}),
             boost::test_tools::per_element());
  (void)ll;
  (void)he;
  (void)hell;
}

BOOST_AUTO_TEST_CASE(llama3_metadata_overrides) {
  BpeVocab v;
  const int32_t begin = v.add_token("<|begin_of_text|>", 3);
  const int32_t end_text = v.add_token("<|end_of_text|>", 3);
  const int32_t eot = v.add_token("<|eot_id|>", 3);
  // An instruct model: EOS is <|eot_id|>, BOS switched off; "llama3" is another name of the rules.
  Writer w = v.writer("llama3");
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(begin));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eot));
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  const auto t = Built(w).tok();
  BOOST_TEST((t->pre_split() == Tokenizer::PreSplit::Llama3));
  BOOST_TEST(!t->add_bos());
  BOOST_TEST(t->encode("a", true) == (Ids{byte_id('a')}), boost::test_tools::per_element());
  BOOST_TEST(t->eos() == eot);
  BOOST_TEST(t->is_eog(eot));
  BOOST_TEST(t->is_eog(end_text));  // still ends generation, recognized by its text
  BOOST_TEST(!t->is_eog(begin));
  // A declared eot_token_id wins over the texts.
  Writer w2 = v.writer("llama-bpe");
  w2.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(end_text));
  BOOST_TEST(Built(w2).tok()->eot() == end_text);
}

BOOST_AUTO_TEST_CASE(pre_names) {
  BpeVocab v;
  using sy::gguf::Error;
  {
    // No pre key: llama.cpp's default rules, flagged as assumed.
    const auto t = Built(v.writer("")).tok();
    BOOST_TEST((t->pre_split() == Tokenizer::PreSplit::Default));
    BOOST_TEST(t->pre_assumed());
    BOOST_TEST(!t->add_bos());
    BOOST_TEST(t->encode(" $100", false) ==
                   (Ids{byte_id(' '), byte_id('$'), byte_id('1'), byte_id('0'), byte_id('0')}),
               boost::test_tools::per_element());
  }
  {
    const auto t = Built(v.writer("default")).tok();
    BOOST_TEST((t->pre_split() == Tokenizer::PreSplit::Default));
    BOOST_TEST(!t->pre_assumed());
  }
  BOOST_TEST((Built(v.writer("gpt-2")).tok()->pre_split() == Tokenizer::PreSplit::Gpt2));
  BOOST_TEST((Built(v.writer("falcon3")).tok()->pre_split() == Tokenizer::PreSplit::Llama3));
  // Names that share rules, and the flags that come with the name.
  {
    const auto t = Built(v.writer("qwen2")).tok();
    BOOST_TEST((t->pre_split() == Tokenizer::PreSplit::Qwen2));
    BOOST_TEST(!t->clean_spaces());
    BOOST_TEST(!t->add_bos());
  }
  BOOST_TEST((Built(v.writer("mpt")).tok()->pre_split() == Tokenizer::PreSplit::Gpt2));
  BOOST_TEST((Built(v.writer("refact")).tok()->pre_split() == Tokenizer::PreSplit::Starcoder));
  BOOST_TEST((Built(v.writer("falcon")).tok()->pre_split() == Tokenizer::PreSplit::Falcon));
  BOOST_TEST(!Built(v.writer("deepseek-llm")).tok()->clean_spaces());
  BOOST_TEST(!Built(v.writer("deepseek-coder")).tok()->clean_spaces());
  BOOST_TEST(Built(v.writer("starcoder")).tok()->clean_spaces());
  // DBRX uses Llama 3's split without its BOS and whole-word rule.
  BOOST_TEST(!Built(v.writer("dbrx")).tok()->add_bos());
  // Rules we do not have are an error that names the pre-tokenizer, never a silent fallback.
  BOOST_CHECK_THROW(Built(v.writer("LLAMA-BPE")).tok(), Error);
  try {
    Built(v.writer("tekken")).tok();
    BOOST_ERROR("pre-tokenizer 'tekken' was accepted");
  } catch (const Error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("unsupported BPE pre-tokenizer 'tekken' (supported: default, gpt-2") ==
                   0u + std::string("tokenizer: ").size(),
               what);
  }
}

BOOST_AUTO_TEST_CASE(detokenize_and_clean_spaces) {
  BpeVocab v;
  const int32_t begin = v.add_token("<|begin_of_text|>", 3);
  const int32_t end_text = v.add_token("<|end_of_text|>", 3);
  Writer w = v.writer("llama-bpe");
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(begin));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(end_text));
  w.add_bool("tokenizer.ggml.add_eos_token", true);
  const auto t = Built(w).tok();
  BOOST_TEST(t->clean_spaces());
  auto detok = [&](const std::string& text) { return t->detokenize(t->encode(text, false)); };
  // A space before ?!., goes.
  BOOST_TEST(detok("Hello , world !") == "Hello, world!");
  BOOST_TEST(detok("a . b ? c") == "a. b? c");
  BOOST_TEST(detok("x  ,") == "x ,");  // only the one right before it
  // " ' " becomes "'".
  BOOST_TEST(detok("a ' b") == "a'b");
  // Contractions: the space goes before 's 'm 're 've, stays before 't 'd 'll.
  BOOST_TEST(detok("I 'm he 's we 're I 've") == "I'm he's we're I've");
  BOOST_TEST(detok("don 't I 'd we 'll") == "don 't I 'd we 'll");
  // decode() keeps the pieces as they are.
  BOOST_TEST(t->decode(t->encode("Hello , world", false)) == "Hello , world");

  // remove_special drops the BOS and EOS the vocabulary adds; unparse_special prints controls.
  const Ids ids = t->encode("hi", true);
  BOOST_TEST(ids == (Ids{begin, byte_id('h'), byte_id('i'), end_text}),
             boost::test_tools::per_element());
  BOOST_TEST(t->detokenize(ids) == "hi");
  BOOST_TEST(t->detokenize(ids, false, true) == "<|begin_of_text|>hi<|end_of_text|>");
  BOOST_TEST(t->detokenize(ids, true, true) == "hi");
  BOOST_TEST(t->detokenize({}) == "");
}

BOOST_AUTO_TEST_CASE(spm_detokenize_keeps_spaces) {
  // SentencePiece: no clean_spaces; the dummy-prefix space of the first token is removed.
  Writer w;
  const std::string sp = "\xE2\x96\x81";
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", sp + "a", sp + ","});
  w.add_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -1});
  w.add_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1});
  const auto t = Built(w).tok();
  BOOST_TEST(!t->clean_spaces());
  BOOST_TEST((t->pre_split() == Tokenizer::PreSplit::None));
  BOOST_TEST(t->detokenize({3, 4}) == "a ,");
  // After a removed BOS the first piece keeps its space, as in llama.cpp.
  BOOST_TEST(t->detokenize({1, 3, 4}, true) == " a ,");
  // A BOS that stays prints nothing but still uses up the one-space strip, as in llama.cpp.
  BOOST_TEST(t->detokenize({1, 3, 4}, false) == " a ,");
}

BOOST_AUTO_TEST_SUITE_END()  // test_tokenizer_llama3
