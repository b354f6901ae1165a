// The `switchyard` command: generate, tokenize and make-model (the server comes with serving).

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "cli/args.hpp"
#include "cli/json.hpp"
#include "gpu/engine.hpp"
#include "gpu/generator.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/make_model.hpp"
#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

namespace fs = std::filesystem;
using sy::cli::Args;
using sy::cli::json_number;
using sy::cli::json_string;
using sy::cli::UsageError;

namespace {

constexpr const char* kUsage =
    "usage: switchyard <command> [options]\n"
    "commands:\n"
    "  generate    --model FILE --prompt TEXT -n N [--temperature T --top-k K --top-p P\n"
    "              --seed S --logprobs N --stop STR --ignore-eos --threads N --json]\n"
    "  tokenize    --model FILE --text TEXT [--no-bos] [--json]\n"
    "  make-model  --shape {tiny,15M,110M,1B,8B} --dtype {f32,f16,bf16,q8_0,q4_0}\n"
    "              [--vocab-from FILE.gguf] [--seed N] --out FILE.gguf\n"
    "Without --model, generate and tokenize use a generated random-weight demo model.\n";

// The demo model: a random-weight 15M-shaped Llama that the project writes itself, so the
// quick start needs no download. Cached per user; rebuilt if the file is missing.
std::string demo_model_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path dir = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  dir /= "switchyard";
  fs::create_directories(dir);
  fs::path path = dir / "demo-15M-q8_0-seed1.gguf";
  std::cerr << "switchyard: no --model given: using the demo model " << path.string()
            << " (random weights, 15M Llama shape; its text is noise — pass --model FILE.gguf)\n";
  if (!fs::exists(path)) {
    sy::MakeModelOptions o;
    o.shape = "15M";
    o.dtype = "q8_0";
    o.seed = 1;
    // Written beside the target and renamed, so an interrupted run never leaves a torn file.
    fs::path tmp = path;
    tmp += ".tmp";
    o.out = tmp.string();
    sy::make_model(o);
    fs::rename(tmp, path);
  }
  return path.string();
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
  sy::MakeModelOptions o;
  o.shape = a.str("shape", "tiny");
  o.dtype = a.str("dtype", "f32");
  o.vocab_from = a.str("vocab-from");
  o.seed = static_cast<uint64_t>(a.integer("seed", 0));
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
  auto ids = tok->encode(a.str("text"), !a.has("no-bos"));
  std::string out;
  if (a.has("json")) {
    out = "{\"ids\": [";
    out += join_ids(ids, ", ") + "]}";
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
  sy::Sampler check(req.sampling);  // throws std::invalid_argument naming a bad field
  req.stop = a.all("stop");
  req.ignore_eos = a.has("ignore-eos");
  sy::GenOptions go;
  go.prefill_chunk = static_cast<int>(a.integer("prefill-chunk", 512));
  if (go.prefill_chunk < 1) throw UsageError("--prefill-chunk must be at least 1");
  if (a.str("prompt", "").empty()) throw UsageError("the prompt is empty: pass --prompt TEXT");

  std::string path = a.has("model") ? a.str("model") : demo_model_path();
  auto model = sy::LlamaModel::load(path);
  req.prompt = model->tokenizer().encode(a.str("prompt", ""), !a.has("no-bos"));

  // Enough KV blocks for this one request (prompt + output), rounded up to whole blocks.
  int64_t need = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
  eo.n_blocks = static_cast<int32_t>((need + eo.block_size - 1) / eo.block_size) + 1;
  auto engine = sy::make_cpu_engine(model, eo);

  bool json = a.has("json");
  sy::TokenCallback stream;
  if (!json) {
    std::cout << a.str("prompt", "") << std::flush;
    stream = [](size_t, int32_t, std::string_view delta) { std::cout << delta << std::flush; };
  }
  auto t0 = std::chrono::steady_clock::now();
  auto results = sy::generate(*engine, {req}, go, stream);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& r = results.at(0);

  if (!json) {
    std::cout << "\n";
    std::cerr << "switchyard: " << r.tokens.size() << " tokens in " << secs << " s ("
              << (secs > 0 ? r.tokens.size() / secs : 0.0) << " tok/s), finish: " << r.finish_reason
              << "\n";
    return 0;
  }
  std::string out = "{\"prompt_token_ids\": [" + join_ids(req.prompt, ", ");
  out += "], \"token_ids\": [" + join_ids(r.tokens, ", ");
  out += "], \"text\": " + json_string(r.text);
  out += ", \"finish_reason\": " + json_string(r.finish_reason);
  if (req.sampling.n_logprobs > 0) {
    out += ", \"logprobs\": [";
    for (size_t i = 0; i < r.logprobs.size(); ++i) {
      out += i ? ", [" : "[";
      for (size_t k = 0; k < r.logprobs[i].size(); ++k) {
        out += k ? ", " : "";
        out += "{\"id\": " + std::to_string(r.logprobs[i][k].id) +
               ", \"logprob\": " + json_number(r.logprobs[i][k].logprob) + "}";
      }
      out += "]";
    }
    out += "]";
  }
  out += "}";
  std::cout << out << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "generate") {
      Args a(argc, argv, 2,
             {"model", "prompt", "n", "temperature", "top-k", "top-p", "seed", "logprobs", "stop",
              "threads", "prefill-chunk"},
             {"json", "ignore-eos", "no-bos"});
      return cmd_generate(a);
    }
    if (cmd == "tokenize") {
      Args a(argc, argv, 2, {"model", "text"}, {"json", "no-bos"});
      return cmd_tokenize(a);
    }
    if (cmd == "make-model") {
      Args a(argc, argv, 2, {"shape", "dtype", "vocab-from", "seed", "out"}, {});
      return cmd_make_model(a);
    }
    throw UsageError("unknown command '" + cmd + "'");
  } catch (const UsageError& e) {
    std::cerr << "switchyard: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "switchyard: error: " << e.what() << "\n";
    return 1;
  }
}
