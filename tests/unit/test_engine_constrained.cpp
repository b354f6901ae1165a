// Constrained generation through the engine (Must show 1 of constrained generation): 1,000
// generations per constraint at temperature 1.0 on stories260K and on a random-weight zoo model,
// each output checked by an independent validator (python3-jsonschema, Python's re, grammar
// checkers: tests/python/check_constrained.py); and greedy outputs unchanged by a constraint
// that allows them.
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "constraints/filter.hpp"
#include "gpu/engine.hpp"
#include "gpu/generator.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/stories.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_engine_constrained)

namespace {

using sy::Constraint;
using Json = nlohmann::json;

struct Case {
  std::string name;
  Constraint c;
  Json spec;  // what the validator checks against
  int max_tokens = 64;
};

Constraint of(uint8_t kind, std::string source, std::vector<std::string> options = {}) {
  Constraint c;
  c.kind = kind;
  c.source = std::move(source);
  c.options = std::move(options);
  return c;
}

// Nested objects and arrays, an enum, bounded integers, a number, a boolean, a pattern.
const char* kPerson = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 12},
  "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "pet": {"enum": ["cat", "dog", "bird"]},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
  "home": {"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 10},
      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
    "required": ["city"], "additionalProperties": false},
  "score": {"type": "number"},
  "ok": {"type": "boolean"}},
 "required": ["name", "age", "pet", "home"], "additionalProperties": false})";

// A recursive $defs tree, anyOf with null, const, strings with escapes.
const char* kTree = R"({"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer", "minimum": -5, "maximum": 5},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
  "required": ["v"], "additionalProperties": false}},
 "type": "object", "properties": {
  "tree": {"$ref": "#/$defs/node"},
  "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
  "kind": {"const": "T"}},
 "required": ["tree", "kind"], "additionalProperties": false})";

const char* kArith = R"G(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
)G";

const char* kWords = R"(root ::= word (" " word){0,5} "."
word ::= [a-z]+ | "\"" [^"\n]{0,6} "\""
)";

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"schema_person", of(Constraint::json_schema, kPerson), Json::parse(kPerson), 160});
  v.push_back({"schema_tree", of(Constraint::json_schema, kTree), Json::parse(kTree), 160});
  const std::string date = "(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  v.push_back({"regex_date", of(Constraint::regex, date), date, 24});
  const std::string sentence = R"([A-Z][a-z]{1,8}( [a-z]{1,8}){0,4}[.!?])";
  v.push_back({"regex_sentence", of(Constraint::regex, sentence), sentence, 64});
  const std::string mail = R"([a-z0-9._]{1,8}@[a-z]{1,8}\.(com|org|net))";
  v.push_back({"regex_mail", of(Constraint::regex, mail), mail, 40});
  v.push_back({"grammar_arith", of(Constraint::grammar, kArith), "arith", 48});
  v.push_back({"grammar_words", of(Constraint::grammar, kWords), "words", 64});
  std::vector<std::string> options = {" yes", " no", " maybe later", "x\"y\\z", "caf\xc3\xa9"};
  v.push_back({"choices", of(Constraint::choices, "", options), options, 16});
  return v;
}

std::unique_ptr<sy::Engine> engine_for(std::shared_ptr<sy::LlamaModel> m, int n_seqs,
                                       int max_tokens, int prompt) {
  sy::EngineOptions eo;
  eo.block_size = 16;
  eo.n_blocks = n_seqs * ((prompt + max_tokens + 15) / 16 + 1);
  eo.max_batch_tokens = n_seqs * prompt + 64;
  return sy::make_cpu_engine(std::move(m), eo);
}

// 1,000 samples of each case on `model`, written as check_constrained.py's lines; returns the
// validator's exit status (its output in `report`).
int run_model(std::shared_ptr<sy::LlamaModel> model, const std::string& tag, std::string& report) {
  constexpr int kSamples = 1000;
  sy::test::TempDir dir;
  const std::string path = dir.path() + "/" + tag + ".jsonl";
  std::ofstream out(path, std::ios::binary);
  const std::vector<int32_t> prompt = model->tokenizer().encode("Once upon a time", true);
  auto vocab = sy::constraints::vocabulary_of(model->tokenizer(), model->config().n_vocab);
  sy::constraints::ConstraintCache cache;
  int stopped = 0;
  for (const Case& k : cases()) {
    auto engine = engine_for(model, kSamples, k.max_tokens, static_cast<int>(prompt.size()));
    std::vector<sy::GenRequest> reqs(kSamples);
    auto compiled = cache.get(k.c, vocab);
    for (int i = 0; i < kSamples; ++i) {
      reqs[i].prompt = prompt;
      reqs[i].max_tokens = k.max_tokens;
      reqs[i].sampling.temperature = 1.0f;
      reqs[i].sampling.seed = static_cast<uint64_t>(i);
      reqs[i].constraint = compiled;
    }
    const auto results = sy::generate(*engine, reqs);
    for (const auto& r : results) {
      stopped += r.finish_reason == "stop";
      Json line = {{"name", tag + "/" + k.name},
                   {"kind", sy::constraint_kind_name(k.c.kind)},
                   {"spec", k.spec},
                   {"text", r.text},
                   {"finish", r.finish_reason}};
      out << line.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
    }
  }
  out.close();
  BOOST_TEST_MESSAGE(tag << ": " << stopped << " outputs ended where their constraint accepts");
  // Some outputs must be complete, or the validator checks nothing.
  BOOST_TEST(stopped > 0);
  const std::string cmd =
      "python3 " SY_SOURCE_DIR "/tests/python/check_constrained.py " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(p);
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) report += buf;
  return pclose(p);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_output_validates_on_stories260k) {
  std::string report;
  const int rc = run_model(sy::test::stories_model(), "stories260K", report);
  BOOST_TEST_MESSAGE(report);
  BOOST_TEST(rc == 0, report);
}

BOOST_AUTO_TEST_CASE(every_output_validates_on_a_random_zoo_model) {
  auto model = sy::LlamaModel::load(SY_MODELS_DIR "/zoo/zoo-llama3-q4_k_m.gguf");
  std::string report;
  const int rc = run_model(model, "zoo-llama3-q4_k_m", report);
  BOOST_TEST_MESSAGE(report);
  BOOST_TEST(rc == 0, report);
}

// A constraint never changes an allowed greedy choice: where the unconstrained greedy output
// already satisfies the constraint, the constrained one is the same, token for token.
BOOST_AUTO_TEST_CASE(greedy_output_unchanged_where_the_constraint_allows_it) {
  auto model = sy::test::stories_model();
  auto engine = engine_for(model, 4, 48, 8);
  const std::vector<int32_t> prompt = model->tokenizer().encode("Once upon a time", true);
  sy::GenRequest free_req;
  free_req.prompt = prompt;
  free_req.max_tokens = 40;
  free_req.sampling.temperature = 0.0f;
  const sy::GenResult free_out = sy::generate(*engine, {free_req}).at(0);
  BOOST_REQUIRE(free_out.text.size() > 20u);

  auto vocab = sy::constraints::vocabulary_of(model->tokenizer(), model->config().n_vocab);
  sy::constraints::ConstraintCache cache;
  // Printable ASCII of any length: the whole free output is allowed as it goes.
  for (const Constraint& c :
       {of(Constraint::regex, "[ -~]*"), of(Constraint::grammar, "root ::= [^\\n]*"),
        of(Constraint::regex, "[ -~]{0,400}")}) {
    sy::GenRequest r = free_req;
    r.constraint = cache.get(c, vocab);
    const sy::GenResult got = sy::generate(*engine, {r}).at(0);
    BOOST_TEST(got.tokens == free_out.tokens, c.source);
    BOOST_TEST(got.finish_reason == free_out.finish_reason, c.source);
  }
  // The first 12 greedy tokens' text as one of two choices: the same 12 tokens come first, then
  // the output must end (end of generation is the only token the choice still allows).
  const std::vector<int32_t> head(free_out.tokens.begin(), free_out.tokens.begin() + 12);
  std::string head_text;
  for (int32_t id : head) head_text += model->tokenizer().token_to_piece(id);
  sy::GenRequest r = free_req;
  r.constraint = cache.get(of(Constraint::choices, "", {head_text, " zzz"}), vocab);
  const sy::GenResult got = sy::generate(*engine, {r}).at(0);
  BOOST_TEST(got.tokens == head);
  BOOST_TEST(got.text == head_text);
  BOOST_TEST(got.finish_reason == "stop");
}

BOOST_AUTO_TEST_SUITE_END()
