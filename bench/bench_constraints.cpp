// Per-token cost of constrained generation: a grammar compiled against a real vocabulary, then a
// simulated generation of a valid text, timing each step's constraint work. Prints one JSON object.
//
//   bench_constraints [--vocab-dir ../shared/models/vocab] [--passes 5] [--seed 7]
//
// For the 32k llama-spm and the 102k deepseek-llm vocabularies, and for a nested JSON-schema-like
// grammar, a regex-like one and any-JSON (all below), it tokenizes a valid text (the tokenizer's own
// encoding; where that does not spell the text exactly, as SPM's leading space, longest pieces
// first) and reports mean, p50, p99 and max in µs of:
//   fast_path        allows(sampled) + advance(sampled), the sampled token being the text's own;
//   mask_cold        the full mask with the mask cache emptied before each step (tables kept);
//   mask_warm        the full mask found in the cache;
//   mask_no_tables   the full mask with masks and per-state tables emptied before each step;
//   mixed            what a sequence costs per token when half the sampled tokens are uniform
//                    random ids: allows(sampled), the full mask when it is refused, advance;
//                    first pass on an empty mask cache, then `passes` passes in all.
// Plus compile times (GBNF to automaton, and the per-state tables). Single thread. Run it from
// the repository root, or pass --vocab-dir.
//
//   bench_constraints --decode MODEL.gguf [--steps 64] [--rounds 3] [--threads N]
//
// instead decodes a batch of 16 on MODEL (CPU engine) two ways, alternating, `rounds` times:
// all 16 free, and 8 under a JSON Schema (an unbounded array of objects) beside 8 free. It
// reports the free jobs' tokens/s in each and their ratio: what constrained neighbours cost the
// jobs that are not constrained. End of sequence is biased away (-100) in every job and the free
// ones ignore it, so all 16 run the same number of steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "constraints/filter.hpp"
#include "constraints/grammar.hpp"
#include "constraints/matcher.hpp"
#include "gpu/engine.hpp"
#include "gpu/generator.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"

using namespace sy::constraints;
using Clock = std::chrono::steady_clock;

namespace {

// An order as a JSON Schema converter would write it: nested objects, an array of objects with
// an array of strings, enums, integers, numbers, strings with escapes, nullable, bounded
// whitespace.
const char* kSchemaGrammar =
    R"g(root ::= "{" ws "\"order_id\"" ws ":" ws integer ws "," ws "\"customer\"" ws ":" ws customer ws "," ws "\"status\"" ws ":" ws status ws "," ws "\"items\"" ws ":" ws items ws "," ws "\"total\"" ws ":" ws number ws "," ws "\"notes\"" ws ":" ws ( string | "null" ) ws "}"
customer ::= "{" ws "\"name\"" ws ":" ws string ws "," ws "\"email\"" ws ":" ws string ws "," ws "\"vip\"" ws ":" ws boolean ws "," ws "\"address\"" ws ":" ws address ws "}"
address ::= "{" ws "\"street\"" ws ":" ws string ws "," ws "\"city\"" ws ":" ws string ws "," ws "\"zip\"" ws ":" ws string ws "," ws "\"country\"" ws ":" ws country ws "}"
country ::= "\"US\"" | "\"DE\"" | "\"FR\"" | "\"JP\"" | "\"BR\""
status ::= "\"pending\"" | "\"shipped\"" | "\"delivered\"" | "\"cancelled\""
items ::= "[" ws ( item ( ws "," ws item )* )? ws "]"
item ::= "{" ws "\"sku\"" ws ":" ws string ws "," ws "\"qty\"" ws ":" ws integer ws "," ws "\"price\"" ws ":" ws number ws "," ws "\"tags\"" ws ":" ws tags ws "}"
tags ::= "[" ws ( string ( ws "," ws string ){0,9} )? ws "]"
boolean ::= "true" | "false"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
number ::= integer ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= | " " | "\n" [ \t]{0,20}
)g";

const char* kSchemaText = R"({
  "order_id": 1048576,
  "customer": {
    "name": "Zoë \"Zed\" Müller-Łukasiewicz",
    "email": "zoe.muller@example.com",
    "vip": true,
    "address": {
      "street": "12 Rue de l'Église, Bâtiment B",
      "city": "Saint-Étienne",
      "zip": "42000",
      "country": "FR"
    }
  },
  "status": "shipped",
  "items": [
    {
      "sku": "KB-2049/black",
      "qty": 2,
      "price": 49.95,
      "tags": ["keyboard", "mechanical", "backlit\u2122"]
    },
    {
      "sku": "MS-7\\alpha",
      "qty": 1,
      "price": 19.5,
      "tags": ["mouse"]
    },
    {
      "sku": "日本-0042",
      "qty": 12,
      "price": 3.2e1,
      "tags": ["import", "東京", "fragile", "gift wrap", "\ttabbed"]
    },
    {
      "sku": "CAB-USB-C",
      "qty": 3,
      "price": 7,
      "tags": []
    }
  ],
  "total": 252.4,
  "notes": "Leave at the door.\nCall first: +33 4 77 00 00 00 \ud83d\ude00"
})";

// Any JSON value (llama.cpp's json.gbnf): recursive rules, so tokens that close a value depend on
// the stack below and are checked at run time.
const char* kJsonGrammar = R"g(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)g";

// A log line pattern: ISO date and time, severity, e-mail, international phone number.
const char* kRegexGrammar = R"g(root ::= line ( "\n" line ){0,31}
line ::= date "T" time " " level " " email " " phone
date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )
time ::= ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] [0-9]{2} ":" [0-9]{2} )
level ::= "DEBUG" | "INFO" | "WARN" | "ERROR"
email ::= [a-zA-Z0-9._%+-]{1,64} "@" [a-zA-Z0-9-]{1,63} ( "." [a-zA-Z0-9-]{1,63} )* "." [a-zA-Z]{2,12}
phone ::= "+" [1-9] [0-9]{0,2} " " ( "(" [0-9]{1,4} ")" " " )? [0-9]{2,4} ( [ -] [0-9]{2,4} ){1,4}
)g";

const char* kRegexText =
    "2024-03-15T08:30:00Z INFO john.doe@example.com +1 (555) 123-4567\n"
    "2024-03-15T08:31:12.250+01:00 WARN ops_team+alerts@mail.example.co.uk +44 20 7946 0958\n"
    "2024-12-01T23:59:59.999999-05:00 ERROR a.b-c@sub-domain.example.org +81 (3) 1234-5678\n"
    "2025-01-31T00:00:00Z DEBUG x@y.io +49 (30) 1234 5678";

struct Summary {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
  std::size_t n = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  auto at = [&](double q) {
    const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
  };
  s.p50 = at(0.5);
  s.p99 = at(0.99);
  s.max = v.back();
  return s;
}

nlohmann::json to_json(const Summary& s) {
  auto r = [](double x) {
    return static_cast<double>(static_cast<long long>(x * 100 + 0.5)) / 100;
  };
  return {{"mean", r(s.mean)}, {"p50", r(s.p50)}, {"p99", r(s.p99)}, {"max", r(s.max)}, {"n", s.n}};
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Longest piece first: a valid cut of `text` into the vocabulary's pieces.
std::vector<int32_t> greedy(const Vocabulary& v, const std::string& text) {
  std::vector<int32_t> ids;
  for (std::size_t pos = 0; pos < text.size();) {
    int32_t best = -1;
    std::size_t len = 0;
    for (int32_t id = 0; id < v.size(); ++id) {
      const std::string& p = v.piece(id);
      if (!v.is_eog(id) && p.size() > len && text.compare(pos, p.size(), p) == 0) {
        best = id;
        len = p.size();
      }
    }
    if (best < 0)
      throw std::runtime_error("no piece spells the text at byte " + std::to_string(pos));
    ids.push_back(best);
    pos += len;
  }
  return ids;
}

nlohmann::json run_case(const std::string& vocab_name, const sy::Tokenizer& tok,
                        const std::shared_ptr<const Vocabulary>& vocab, const std::string& name,
                        const char* grammar, const std::string& text, int passes, uint32_t seed) {
  nlohmann::json out;
  out["vocab"] = vocab_name;
  out["grammar"] = name;

  auto t0 = Clock::now();
  const auto g = compile_gbnf(grammar);
  out["compile_gbnf_ms"] = us_since(t0) / 1000;
  const GrammarInfo info = grammar_info(*g);
  out["automaton"] = {{"rules", info.rules},
                      {"elements", info.elements},
                      {"states", info.states},
                      {"byte_classes", info.byte_classes}};
  t0 = Clock::now();
  const auto c = compile(g, vocab);
  out["compile_tables_ms"] = us_since(t0) / 1000;
  out["table_bytes"] = c->stats().table_bytes;
  out["tables_built"] = c->stats().tables_built;
  if (!grammar_accepts(*g, text))
    throw std::runtime_error(name + ": the text is not in the grammar");

  std::vector<int32_t> ids = tok.encode(text, false);
  std::string spelled;
  for (int32_t id : ids) spelled += vocab->piece(id);
  out["tokenization"] = spelled == text ? "encode" : "longest piece first";
  if (spelled != text) ids = greedy(*vocab, text);
  out["tokens"] = ids.size();
  out["text_bytes"] = text.size();

  // (1) the fast path: the sampled token is allowed.
  std::vector<double> fast;
  for (int p = 0; p < passes; ++p) {
    Matcher m(c);
    for (int32_t id : ids) {
      const auto t = Clock::now();
      if (!m.allows(id)) throw std::runtime_error("token refused on the fast path");
      m.advance(id);
      fast.push_back(us_since(t));
    }
    if (!m.allows(vocab->eog_ids().empty() ? 0 : vocab->eog_ids()[0]))
      throw std::runtime_error("the grammar does not end after the text");
  }
  out["fast_path_us"] = to_json(summarize(fast));

  // (2) full masks: cold (cache emptied, tables kept), warm, and without tables.
  std::vector<double> cold, warm, bare;
  std::vector<double> allowed;
  {
    Matcher m(c);
    for (int32_t id : ids) {
      c->clear_masks();
      Matcher a = m, b = m;
      auto t = Clock::now();
      const int32_t n = a.allowed_count();
      cold.push_back(us_since(t));
      t = Clock::now();
      (void)b.mask();
      warm.push_back(us_since(t));
      allowed.push_back(n);
      m.advance(id);
    }
    CacheOptions no_precompute;
    no_precompute.precompute = false;
    const auto lazy = compile(g, vocab, no_precompute);
    Matcher l(lazy);
    for (int32_t id : ids) {
      lazy->clear_masks();
      lazy->clear_tables();
      Matcher a = l;
      const auto t = Clock::now();
      (void)a.mask();
      bare.push_back(us_since(t));
      l.advance(id);
    }
  }
  out["mask_cold_us"] = to_json(summarize(cold));
  out["mask_warm_us"] = to_json(summarize(warm));
  out["mask_no_tables_us"] = to_json(summarize(bare));
  out["allowed_tokens_per_step"] = to_json(summarize(allowed));

  // (3) the mixed run on a fresh compile: half the sampled tokens are random ids.
  const auto fresh = compile(g, vocab);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> any(0, vocab->size() - 1);
  std::vector<double> first, all;
  std::size_t refused = 0, steps = 0;
  for (int p = 0; p < passes; ++p) {
    Matcher m(fresh);
    for (int32_t id : ids) {
      const int32_t sampled = (rng() & 1) ? id : any(rng);
      const auto t = Clock::now();
      if (!m.allows(sampled)) {
        // The sampler would now draw again under the mask; it draws the text's token.
        const std::vector<uint64_t>& mask = m.mask();
        if (!((mask[static_cast<std::size_t>(id) >> 6] >> (id & 63)) & 1))
          throw std::runtime_error("the text's token is not in the mask");
        ++refused;
      }
      m.advance(id);
      const double us = us_since(t);
      all.push_back(us);
      if (p == 0) first.push_back(us);
      ++steps;
    }
  }
  out["mixed_first_pass_us"] = to_json(summarize(first));
  out["mixed_us"] = to_json(summarize(all));
  out["mixed_refused_fraction"] = static_cast<double>(refused) / static_cast<double>(steps);
  const auto st = fresh->stats();
  out["mixed_cache"] = {{"masks", st.masks},
                        {"mask_bytes", st.mask_bytes},
                        {"hits", st.mask_hits},
                        {"misses", st.mask_misses}};
  return out;
}

}  // namespace

// The batch-of-16 decode comparison (--decode).
nlohmann::json decode_ratio(const std::string& path, int steps, int rounds, int threads) {
  auto model = sy::LlamaModel::load(path);
  sy::EngineOptions eo;
  eo.n_threads = threads;
  eo.n_blocks = 16 * ((8 + steps + 15) / 16 + 1);
  auto engine = sy::make_cpu_engine(model, eo);
  const int32_t eos = model->tokenizer().eos();
  auto vocab = sy::constraints::vocabulary_of(model->tokenizer(), model->config().n_vocab);
  sy::constraints::ConstraintCache cache;
  sy::Constraint schema;
  schema.kind = sy::Constraint::json_schema;
  schema.source = R"({"type": "array", "items": {"type": "object", "properties": {
      "name": {"type": "string"}, "n": {"type": "integer"}, "tags": {"type": "array",
      "items": {"enum": ["a", "b", "c"]}}}, "required": ["name", "n"]}})";
  auto compiled = cache.get(schema, vocab);
  const std::vector<int32_t> prompt = model->tokenizer().encode("Data:", true);
  auto requests = [&](int constrained) {
    std::vector<sy::GenRequest> reqs(16);
    for (int i = 0; i < 16; ++i) {
      sy::GenRequest& r = reqs[static_cast<size_t>(i)];
      r.prompt = prompt;
      r.max_tokens = steps;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = static_cast<uint64_t>(i);
      if (eos >= 0) r.sampling.controls.logit_bias = {{eos, -100.0f}};
      if (i < constrained)
        r.constraint = compiled;
      else
        r.ignore_eos = true;
    }
    return reqs;
  };
  std::vector<double> free_all, free_mixed;  // tokens/s per free job
  for (int round = 0; round < rounds; ++round) {
    // Each round swaps which of the two goes first, so warm-up and drift fall on both alike.
    for (int constrained : round % 2 ? std::vector<int>{8, 0} : std::vector<int>{0, 8}) {
      const auto reqs = requests(constrained);
      const auto t0 = Clock::now();
      const auto res = sy::generate(*engine, reqs);
      const double secs = us_since(t0) / 1e6;
      size_t tokens = 0;
      for (size_t i = static_cast<size_t>(constrained); i < res.size(); ++i)
        tokens += res[i].tokens.size();
      const double per_job =
          static_cast<double>(tokens) / static_cast<double>(16 - constrained) / secs;
      (constrained ? free_mixed : free_all).push_back(per_job);
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  nlohmann::json out;
  out["model"] = path;
  out["steps"] = steps;
  out["rounds"] = rounds;
  out["free_jobs_tokens_per_s_all_free"] = free_all;
  out["free_jobs_tokens_per_s_beside_8_constrained"] = free_mixed;
  out["ratio_mixed_over_all_free"] = mean(free_mixed) / mean(free_all);
  return out;
}

int main(int argc, char** argv) {
  std::string dir = "../shared/models/vocab";
  std::string decode_model;
  int steps = 64, rounds = 3, threads = 0;
  int passes = 5;
  uint32_t seed = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--vocab-dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--passes" && i + 1 < argc) {
      passes = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--seed" && i + 1 < argc) {
      seed = static_cast<uint32_t>(std::stoul(argv[++i]));
    } else if (a == "--decode" && i + 1 < argc) {
      decode_model = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::max(0, std::stoi(argv[++i]));
    } else {
      std::cerr << "usage: bench_constraints [--vocab-dir DIR] [--passes N] [--seed S]\n"
                   "       bench_constraints --decode MODEL.gguf [--steps N] [--rounds N] "
                   "[--threads N]\n";
      return 2;
    }
  }
  if (!decode_model.empty()) {
    try {
      nlohmann::json r = decode_ratio(decode_model, steps, rounds, threads);
      r["bench"] = "constraints_decode";
      std::cout << r.dump(2) << std::endl;
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "bench_constraints: " << e.what() << "\n";
      return 1;
    }
  }
  nlohmann::json report;
  report["bench"] = "constraints";
  report["passes"] = passes;
  try {
    for (const std::string vocab_name : {"llama-spm", "deepseek-llm"}) {
      const auto file = sy::gguf::File::open(dir + "/ggml-vocab-" + vocab_name + ".gguf");
      const auto tok = sy::Tokenizer::from_gguf(file);
      const auto t0 = Clock::now();
      const auto vocab = sy::constraints::vocabulary_of(*tok, tok->n_vocab());
      nlohmann::json v;
      v["vocab"] = vocab_name;
      v["n_vocab"] = vocab->size();
      v["vocabulary_build_ms"] = us_since(t0) / 1000;
      v["vocabulary_bytes"] = vocab->memory_bytes();
      report["vocabularies"].push_back(v);
      report["results"].push_back(run_case(vocab_name, *tok, vocab, "json_schema", kSchemaGrammar,
                                           kSchemaText, passes, seed));
      report["results"].push_back(
          run_case(vocab_name, *tok, vocab, "regex_like", kRegexGrammar, kRegexText, passes, seed));
      report["results"].push_back(run_case(vocab_name, *tok, vocab, "json_recursive", kJsonGrammar,
                                           kSchemaText, passes, seed));
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_constraints: " << e.what() << "\n";
    return 1;
  }
  std::cout << report.dump(2) << std::endl;
  return 0;
}
