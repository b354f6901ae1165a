// The `switchyard` command: serve, submit, ctl, keygen, render-chat, generate, tokenize and
// make-model.

#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "cli/args.hpp"
#include "cli/chat.hpp"
#include "cli/ctl.hpp"
#include "cli/demo_model.hpp"
#include "cli/json.hpp"
#include "cli/keygen.hpp"
#include "cli/serve.hpp"
#include "cli/submit.hpp"
#include "constraints/filter.hpp"
#include "gpu/engine.hpp"
#include "gpu/generator.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/make_model.hpp"
#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

using sy::cli::Args;
using sy::cli::demo_model_path;
using sy::cli::Json;
using sy::cli::json_dump;
using sy::cli::JsonLayout;
using sy::cli::UsageError;

namespace {

constexpr const char* kUsageHead =
    "usage: switchyard <command> [options]\n"
    "commands:\n";
constexpr const char* kGenerateUsage =
    "  generate    --model FILE --prompt TEXT -n N [--temperature T --top-k K --top-p P\n"
    "              --min-p P --presence-penalty X --frequency-penalty X --repeat-penalty X\n"
    "              --repeat-last-n N --seed S --logprobs N --stop STR --ignore-eos --threads N\n"
    "              --json] [one constraint: --grammar-file FILE (GBNF), --json-schema-file\n"
    "              FILE, --regex RE, --choice STR (repeatable)] [--samples N (1-16, seeds\n"
    "              S..S+N-1; --json gives \"choices\")]. -n is the most tokens per sample\n";
constexpr const char* kTokenizeUsage =
    "  tokenize    --model FILE --text TEXT [--no-bos] [--parse-special] [--json]\n";
constexpr const char* kMakeModelUsage =
    "  make-model  --shape {tiny,mini,15M,110M,1B,8B} [--arch {llama,qwen2,qwen3,gemma2,phi3,\n"
    "              mixtral,qwen2moe,olmoe,qwen3moe}]\n"
    "              --dtype {f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,iq4_nl,q2_k,q3_k,q4_k,q5_k,\n"
    "              q6_k,iq4_xs,q4_k_m,q5_k_m} [--vocab-from FILE.gguf] [--seed N] [--ctx N]\n"
    "              [mixtures of experts: --experts N (default 8) --experts-used K (default 2)\n"
    "              --expert-ffn W (one expert's FFN width; default the shape's FFN width)]\n"
    "              --out FILE.gguf\n"
    "              or: make-model --from FILE.gguf --keep-layers N --out FILE.gguf (the file's\n"
    "              first N layers: a draft model of its own vocabulary, docs/speculation.md)\n";
constexpr const char* kUsageTail =
    "Without --model, serve, generate and tokenize use a generated random-weight demo model.\n"
    "switchyard COMMAND --help prints that command's usage alone.\n";

std::string full_usage() {
  return std::string(kUsageHead) + sy::cli::kServeUsage + sy::cli::kSubmitUsage +
         sy::cli::kCtlUsage + sy::cli::kKeygenUsage + sy::cli::kRenderChatUsage + kGenerateUsage +
         kTokenizeUsage + kMakeModelUsage + kUsageTail;
}

// Token ids separated by `sep`.
std::string join_ids(const std::vector<int32_t>& ids, const char* sep) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += sep;
    out += std::to_string(ids[i]);
  }
  return out;
}

int cmd_make_model(const Args& a) {
  if (a.has("from") || a.has("keep-layers")) {
    if (!a.has("from") || !a.has("keep-layers"))
      throw UsageError("make-model --from FILE needs --keep-layers N (and the other way round)");
    for (const char* k : {"shape", "arch", "dtype", "vocab-from", "seed", "ctx", "experts",
                          "experts-used", "expert-ffn"})
      if (a.has(k)) throw UsageError(std::string("--") + k + " does not go with --from");
    const long long n = a.integer("keep-layers", 0);
    if (n < 1 || n > INT32_MAX) throw UsageError("--keep-layers must be >= 1");
    const std::string out = a.str("out");
    if (out.empty()) throw UsageError("make-model needs --out FILE.gguf");
    sy::make_model_keep_layers(a.str("from"), static_cast<int>(n), out);
    std::cerr << "switchyard: wrote " << out << "\n";
    return 0;
  }
  sy::MakeModelOptions o;
  o.shape = a.str("shape", "tiny");
  o.arch = a.str("arch", "llama");
  o.dtype = a.str("dtype", "f32");
  o.vocab_from = a.str("vocab-from");
  o.seed = static_cast<uint64_t>(a.integer("seed", 0));
  o.ctx_len = a.integer("ctx", 0);  // 0: the shape's context length
  // Absent: 0, make-model's default (8 experts, 2 per token, the shape's FFN width). make_model
  // checks the upper bounds, and that a dense architecture is given none of these.
  const auto count = [&](const char* key) -> int {
    if (!a.has(key)) return 0;
    const long long v = a.integer(key, 0);
    if (v < 1 || v > INT32_MAX) throw UsageError(std::string("--") + key + " must be >= 1");
    return static_cast<int>(v);
  };
  o.n_experts = count("experts");
  o.n_experts_used = count("experts-used");
  o.expert_ffn = count("expert-ffn");
  o.out = a.str("out");
  if (o.out.empty()) throw UsageError("make-model needs --out FILE.gguf");
  sy::make_model(o);
  std::cerr << "switchyard: wrote " << o.out << "\n";
  return 0;
}

int cmd_tokenize(const Args& a) {
  std::string path = a.has("model") ? a.str("model") : demo_model_path();
  if (!a.has("text")) throw UsageError("tokenize needs --text TEXT");
  auto file = sy::gguf::File::open(path);
  auto tok = sy::Tokenizer::from_gguf(file);
  // Special-token text ("<s>", "<|im_start|>") becomes control tokens only when asked.
  auto ids = tok->encode(a.str("text"), !a.has("no-bos"), a.has("parse-special"));
  std::string out;
  if (a.has("json")) {
    Json j;
    j["ids"] = ids;
    out = json_dump(j, JsonLayout::spaced);
  } else {
    out = join_ids(ids, " ");
  }
  std::cout << out << std::endl;
  return 0;
}

int cmd_generate(const Args& a) {
  // Every option is checked before the (possibly slow) model load.
  sy::EngineOptions eo;
  eo.n_threads = static_cast<int>(a.integer("threads", 0));
  if (eo.n_threads < 0) throw UsageError("--threads must be >= 0");
  sy::GenRequest req;
  long long n = a.integer("n", 32);
  if (n < 1) throw UsageError("-n must be at least 1");
  req.max_tokens = static_cast<int>(n);
  req.sampling.temperature = static_cast<float>(a.real("temperature", 0.0));
  req.sampling.top_k = static_cast<int>(a.integer("top-k", 0));
  req.sampling.top_p = static_cast<float>(a.real("top-p", 1.0));
  req.sampling.seed = static_cast<uint64_t>(a.integer("seed", 0));
  req.sampling.n_logprobs = static_cast<int>(a.integer("logprobs", 0));
  req.sampling.controls.min_p = static_cast<float>(a.real("min-p", 0.0));
  req.sampling.controls.presence_penalty = static_cast<float>(a.real("presence-penalty", 0.0));
  req.sampling.controls.frequency_penalty = static_cast<float>(a.real("frequency-penalty", 0.0));
  req.sampling.controls.repetition_penalty = static_cast<float>(a.real("repeat-penalty", 1.0));
  req.sampling.controls.repeat_last_n = static_cast<int32_t>(a.integer("repeat-last-n", 64));
  sy::Sampler check(req.sampling);  // throws std::invalid_argument naming a bad field
  // The constraint, read before the model load so that a missing file costs nothing.
  sy::Constraint constraint;
  const auto take = [&](const char* flag, uint8_t kind, std::string source) {
    if (!constraint.empty())
      throw UsageError(std::string("--") + flag +
                       ": give one of --grammar-file, "
                       "--json-schema-file, --regex, --choice");
    constraint.kind = kind;
    constraint.source = std::move(source);
  };
  const auto read_file = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  if (a.has("grammar-file"))
    take("grammar-file", sy::Constraint::grammar, read_file(a.str("grammar-file")));
  if (a.has("json-schema-file"))
    take("json-schema-file", sy::Constraint::json_schema, read_file(a.str("json-schema-file")));
  if (a.has("regex")) take("regex", sy::Constraint::regex, a.str("regex"));
  if (!a.all("choice").empty()) {
    take("choice", sy::Constraint::choices, "");
    constraint.options = a.all("choice");
  }
  req.stop = a.all("stop");
  req.ignore_eos = a.has("ignore-eos");
  sy::GenOptions go;
  go.prefill_chunk = static_cast<int>(a.integer("prefill-chunk", 512));
  if (go.prefill_chunk < 1) throw UsageError("--prefill-chunk must be at least 1");
  const long long samples = a.integer("samples", 1);
  if (samples < 1 || samples > 16) throw UsageError("--samples must be in [1, 16]");
  if (a.str("prompt", "").empty()) throw UsageError("the prompt is empty: pass --prompt TEXT");

  std::string path = a.has("model") ? a.str("model") : demo_model_path();
  auto model = sy::LlamaModel::load(path);
  req.prompt = model->tokenizer().encode(a.str("prompt", ""), !a.has("no-bos"));

  // Enough KV blocks for this one request (prompt + output), rounded up to whole blocks.
  int64_t need = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
  eo.n_blocks = static_cast<int32_t>(samples * ((need + eo.block_size - 1) / eo.block_size) + 1);
  auto engine = sy::make_cpu_engine(model, eo);
  if (!constraint.empty()) {
    sy::constraints::ConstraintCache cache(1);
    // ConstraintError (a std::invalid_argument) names what is wrong with the constraint.
    req.constraint = cache.get(
        constraint, sy::constraints::vocabulary_of(model->tokenizer(), engine->config().n_vocab));
  }

  bool json = a.has("json");
  sy::TokenCallback stream;
  if (!json) {
    std::cout << a.str("prompt", "") << std::flush;
    stream = [](size_t, int32_t, std::string_view delta) { std::cout << delta << std::flush; };
  }
  // --samples N: N samples of the prompt, sample i seeded with seed + i, run as one batch (this
  // offline tool prefills each; the server shares the prompt's KV between samples).
  std::vector<sy::GenRequest> reqs(static_cast<size_t>(samples), req);
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].sampling.seed = req.sampling.seed + i;
  if (samples > 1) stream = {};
  auto t0 = std::chrono::steady_clock::now();
  auto results = sy::generate(*engine, reqs, go, stream);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& r = results.at(0);

  if (!json && samples > 1) {
    for (size_t i = 0; i < results.size(); ++i)
      std::cout << "\n[" << i << "] " << a.str("prompt", "") << results[i].text << "\n";
    return 0;
  }
  if (!json) {
    std::cout << "\n";
    std::cerr << "switchyard: " << r.tokens.size() << " tokens in " << secs << " s ("
              << (secs > 0 ? r.tokens.size() / secs : 0.0) << " tok/s), finish: " << r.finish_reason
              << "\n";
    return 0;
  }
  const auto one = [&](const sy::GenResult& g, Json& out) {
    out["token_ids"] = g.tokens;
    out["text"] = g.text;
    out["finish_reason"] = g.finish_reason;
    if (req.sampling.n_logprobs > 0) {
      Json steps = Json::array();
      for (const auto& step : g.logprobs) {
        Json alts = Json::array();
        for (const auto& alt : step)
          alts.push_back({{"id", alt.id}, {"logprob", static_cast<double>(alt.logprob)}});
        steps.push_back(std::move(alts));
      }
      out["logprobs"] = std::move(steps);
    }
  };
  Json out;
  out["prompt_token_ids"] = req.prompt;
  if (samples == 1) {
    one(r, out);
  } else {
    Json choices = Json::array();
    for (size_t i = 0; i < results.size(); ++i) {
      Json c;
      c["index"] = i;
      one(results[i], c);
      choices.push_back(std::move(c));
    }
    out["choices"] = std::move(choices);
  }
  std::cout << json_dump(out, JsonLayout::spaced) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using sy::cli::Command;
  const std::vector<Command> commands = {
      {"serve", sy::cli::kServeUsage, sy::cli::kServeOptions, sy::cli::kServeFlags, false,
       sy::cli::cmd_serve},
      {"submit", sy::cli::kSubmitUsage, sy::cli::kSubmitOptions, sy::cli::kSubmitFlags, false,
       sy::cli::cmd_submit},
      {"ctl", sy::cli::kCtlUsage, sy::cli::kCtlOptions, {}, true, sy::cli::cmd_ctl},
      {"keygen", sy::cli::kKeygenUsage, sy::cli::kKeygenOptions, sy::cli::kKeygenFlags, false,
       sy::cli::cmd_keygen},
      {"render-chat", sy::cli::kRenderChatUsage, sy::cli::kRenderChatOptions,
       sy::cli::kRenderChatFlags, false, sy::cli::cmd_render_chat},
      {"generate",
       kGenerateUsage,
       {"model",
        "prompt",
        "n",
        "temperature",
        "top-k",
        "top-p",
        "seed",
        "logprobs",
        "stop",
        "threads",
        "prefill-chunk",
        "min-p",
        "presence-penalty",
        "frequency-penalty",
        "repeat-penalty",
        "repeat-last-n",
        "grammar-file",
        "json-schema-file",
        "regex",
        "choice",
        "samples"},
       {"json", "ignore-eos", "no-bos"},
       false,
       cmd_generate},
      {"tokenize",
       kTokenizeUsage,
       {"model", "text"},
       {"json", "no-bos", "parse-special"},
       false,
       cmd_tokenize},
      {"make-model",
       kMakeModelUsage,
       {"shape", "arch", "dtype", "vocab-from", "seed", "ctx", "experts", "experts-used",
        "expert-ffn", "out", "from", "keep-layers"},
       {},
       false,
       cmd_make_model},
  };
  return sy::cli::run_command_line(argc, argv, commands, full_usage());
}
