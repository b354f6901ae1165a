// The `switchyard` command: serve, submit, ctl, keygen, render-chat, generate, tokenize and
// make-model.

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "cli/args.hpp"
#include "cli/chat.hpp"
#include "cli/ctl.hpp"
#include "cli/demo_model.hpp"
#include "cli/json.hpp"
#include "cli/keygen.hpp"
#include "cli/serve.hpp"
#include "gpu/engine.hpp"
#include "gpu/generator.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/make_model.hpp"
#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

using sy::cli::Args;
using sy::cli::demo_model_path;
using sy::cli::json_number;
using sy::cli::json_string;
using sy::cli::UsageError;

namespace {

constexpr const char* kUsageHead =
    "usage: switchyard <command> [options]\n"
    "commands:\n";
constexpr const char* kUsage =
    "  generate    --model FILE --prompt TEXT -n N [--temperature T --top-k K --top-p P\n"
    "              --seed S --logprobs N --stop STR --ignore-eos --threads N --json]\n"
    "  tokenize    --model FILE --text TEXT [--no-bos] [--parse-special] [--json]\n"
    "  make-model  --shape {tiny,mini,15M,110M,1B,8B} [--arch {llama,qwen2,qwen3,gemma2,phi3}]\n"
    "              --dtype {f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,iq4_nl,q2_k,q3_k,q4_k,q5_k,\n"
    "              q6_k,iq4_xs,q4_k_m,q5_k_m} [--vocab-from FILE.gguf] [--seed N] [--ctx N]\n"
    "              --out FILE.gguf\n"
    "Without --model, serve, generate and tokenize use a generated random-weight demo model.\n";

void print_usage(std::ostream& os) {
  os << kUsageHead << sy::cli::kServeUsage << sy::cli::kSubmitUsage << sy::cli::kCtlUsage
     << sy::cli::kKeygenUsage << sy::cli::kRenderChatUsage << kUsage;
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
  o.arch = a.str("arch", "llama");
  o.dtype = a.str("dtype", "f32");
  o.vocab_from = a.str("vocab-from");
  o.seed = static_cast<uint64_t>(a.integer("seed", 0));
  o.ctx_len = a.integer("ctx", 0);  // 0: the shape's context length
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
    print_usage(std::cout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (argc > 2 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h")) {
    print_usage(std::cout);
    return 0;
  }
  try {
    if (cmd == "serve") {
      Args a(argc, argv, 2, sy::cli::kServeOptions, sy::cli::kServeFlags);
      return sy::cli::cmd_serve(a);
    }
    if (cmd == "submit") {
      Args a(argc, argv, 2, sy::cli::kSubmitOptions, {});
      return sy::cli::cmd_submit(a);
    }
    if (cmd == "ctl") return sy::cli::cmd_ctl(argc, argv, 2);
    if (cmd == "keygen") {
      Args a(argc, argv, 2, sy::cli::kKeygenOptions, sy::cli::kKeygenFlags);
      return sy::cli::cmd_keygen(a);
    }
    if (cmd == "generate") {
      Args a(argc, argv, 2,
             {"model", "prompt", "n", "temperature", "top-k", "top-p", "seed", "logprobs", "stop",
              "threads", "prefill-chunk"},
             {"json", "ignore-eos", "no-bos"});
      return cmd_generate(a);
    }
    if (cmd == "render-chat") {
      Args a(argc, argv, 2, sy::cli::kRenderChatOptions, sy::cli::kRenderChatFlags);
      return sy::cli::cmd_render_chat(a);
    }
    if (cmd == "tokenize") {
      Args a(argc, argv, 2, {"model", "text"}, {"json", "no-bos", "parse-special"});
      return cmd_tokenize(a);
    }
    if (cmd == "make-model") {
      Args a(argc, argv, 2, {"shape", "arch", "dtype", "vocab-from", "seed", "ctx", "out"}, {});
      return cmd_make_model(a);
    }
    throw UsageError("unknown command '" + cmd + "'");
  } catch (const UsageError& e) {
    std::cerr << "switchyard: " << e.what() << "\n";
    print_usage(std::cerr);
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "switchyard: error: " << e.what() << "\n";
    return 1;
  }
}
