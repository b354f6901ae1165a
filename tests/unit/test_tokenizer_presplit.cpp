// The byte-level BPE pre-split rules against an independent model:
// tests/python/tokenizer_presplit.py runs llama.cpp's regex sequence of each pre-tokenizer with
// Python's `regex` module over written tricky strings and seeded random ones, and every word
// list here must be the same, word for word. Qwen2 has no published test vocabulary, so this is
// its check; it also separates rules whose vocabulary vectors agree (deepseek-llm and
// deepseek-coder tokenize those vectors alike).
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer.hpp"

BOOST_AUTO_TEST_SUITE(test_tokenizer_presplit)

namespace {

using sy::Tokenizer;

// Debian's interpreter, which has python3-regex (the `python3` on PATH may not).
const std::string kPython = "/usr/bin/python3";

const std::map<std::string, Tokenizer::PreSplit> kRules = {
    {"gpt2", Tokenizer::PreSplit::Gpt2},
    {"llama3", Tokenizer::PreSplit::Llama3},
    {"qwen2", Tokenizer::PreSplit::Qwen2},
    {"default", Tokenizer::PreSplit::Default},
    {"falcon", Tokenizer::PreSplit::Falcon},
    {"starcoder", Tokenizer::PreSplit::Starcoder},
    {"deepseek-coder", Tokenizer::PreSplit::DeepseekCoder},
    {"deepseek-llm", Tokenizer::PreSplit::DeepseekLlm},
};

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return out;
}

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

std::string show(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += "[" + w + "]";
  return s;
}

struct Case {
  std::string rules;
  std::string text;
  std::vector<std::string> words;
};

// Runs the reference script and reads its cases.
std::vector<Case> reference_cases() {
  const std::string cmd = kPython + " " + SY_SOURCE_DIR + "/tests/python/tokenizer_presplit.py";
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_REQUIRE_MESSAGE(p, "cannot run " << cmd);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  BOOST_REQUIRE_MESSAGE(status == 0, cmd << " failed (status " << status << ")");

  std::vector<Case> cases;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const auto fields = split_list(line, '\t');
    BOOST_REQUIRE_MESSAGE(fields.size() >= 2, "bad reference line: " << line);
    Case c{fields[0], unhex(fields[1]), {}};
    if (fields.size() > 2) {
      for (const std::string& h : split_list(fields[2], ',')) c.words.push_back(unhex(h));
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_rule_matches_the_python_regex_model) {
  const auto cases = reference_cases();
  std::map<std::string, std::pair<size_t, size_t>> tally;  // rules -> (passed, total)
  for (const Case& c : cases) {
    const auto it = kRules.find(c.rules);
    BOOST_REQUIRE_MESSAGE(it != kRules.end(), "unknown rules '" << c.rules << "'");
    const auto got = sy::tokenizer_detail::pre_split(it->second, c.text);
    auto& [passed, total] = tally[c.rules];
    ++total;
    if (got == c.words) {
      ++passed;
    } else {
      BOOST_ERROR(c.rules << " '" << c.text << "'\n  python " << show(c.words) << "\n  ours   "
                          << show(got));
    }
  }
  // Every rule was exercised on the whole corpus (the script lists each one).
  BOOST_TEST(tally.size() == kRules.size());
  for (const auto& [rules, counts] : tally) {
    std::cout << rules << ": " << counts.first << "/" << counts.second << " strings split alike\n";
    // 38 written and 300 generated strings; fewer means the script's output was cut short.
    BOOST_TEST(counts.second == 338u);
    BOOST_TEST(counts.first == counts.second, rules);
  }
}

// Pinned splits that show what each rule does differently (independent of the script).
BOOST_AUTO_TEST_CASE(pinned_differences) {
  using W = std::vector<std::string>;
  auto split = [](Tokenizer::PreSplit r, std::string_view t) {
    return sy::tokenizer_detail::pre_split(r, t);
  };
  // Qwen2 keeps digits apart; Llama 3 groups three.
  BOOST_TEST(split(Tokenizer::PreSplit::Qwen2, "12345") == (W{"1", "2", "3", "4", "5"}),
             boost::test_tools::per_element());
  BOOST_TEST(split(Tokenizer::PreSplit::Llama3, "12345") == (W{"123", "45"}),
             boost::test_tools::per_element());
  // StarCoder: each digit alone, then GPT-2 words.
  BOOST_TEST(split(Tokenizer::PreSplit::Starcoder, "x 42") == (W{"x", " ", "4", "2"}),
             boost::test_tools::per_element());
  // Falcon: backtick runs are punctuation; ASCII digits in threes.
  BOOST_TEST(
      split(Tokenizer::PreSplit::Falcon, "a``b 12345") == (W{"a", "``", "b", " ", "123", "45"}),
      boost::test_tools::per_element());
  // deepseek-coder: a space goes with the letters after it; CJK runs lose a leading space.
  BOOST_TEST(
      split(Tokenizer::PreSplit::DeepseekCoder, "a 我想\n1") == (W{"a", " ", "我想", "\n", "1"}),
      boost::test_tools::per_element());
  // deepseek-llm: lower-case Armenian is outside its letter class; trailing space is a word.
  BOOST_TEST(split(Tokenizer::PreSplit::DeepseekLlm, "Ա աբ  ") == (W{"Ա", " աբ", "  "}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()  // test_tokenizer_presplit
