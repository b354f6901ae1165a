// Engine throughput: prefill and batched greedy decode tokens/s of random-weight Llama models in
// several dtypes, driven straight through the Engine interface. Prints one JSON object.
//
//   bench_engine [--dir ./bench-models] [--shape 110M] [--threads 2] [--dtypes f32,f16,q8_0,q4_0]
//                [--batches 1,8,32] [--decode-steps 64] [--prompt 512] [--decode-prompt 32]
//                [--reps 2] [--vocab-from FILE.gguf]
//                [--peer-llama-bench PATH [--rounds 3]]
//     With a llama-bench binary (optional; llama.cpp is not part of the build), every round runs
//     ours and then llama-bench on the same file (pp = --prompt, tg = --decode-steps, same
//     threads), dtype by dtype, and prints ours/llama.cpp ratios per round and their median.
//   bench_engine --kv-bench [--threads 2] [--kv-gen 8192] [--kv-window 1024] [--kv-dtype f16]
//     One sequence on a 15M-shape model with a 9216-token context: decode tokens/s over the last
//     256 tokens and KV memory held at half and all of --kv-gen generated tokens, under full
//     attention and sliding_window(--kv-window). Prints a table (stderr) and JSON (stdout).
//   bench_engine --kv-memory [--shape 110M] [--kv-tokens 4096] [--kv-dtypes f32,f16,q8_0]
//     KV memory of one sequence of --kv-tokens tokens under each KV type: the cache's bytes as
//     the engine sizes it, and the growth of the process's resident memory while it fills.
//   bench_engine --table --model FILE.gguf [--batches 1,4,16,32] [--prompts 128,512,2048]
//                [--decode-steps 16] [--step-tokens 2048] [--reps 1] [--threads 2]
//     One model file, a cell per batch size x prompt length: B random prompts of P tokens
//     prefilled in steps of at most --step-tokens tokens (prefill tokens/s), then --decode-steps
//     greedy steps of all B sequences at a context of P (decode tokens/s). Prints the table
//     (stderr) and JSON (stdout). --perf-ctl FIFO: writes "enable" to perf record's control
//     FIFO (perf record -D -1 --control fifo:FIFO) before each timed decode and "disable" after,
//     so a profile holds the decode steps alone (bench/profile.sh --decode-only).
//   --kv-dtype T (every mode): the K/V element type of the engines measured (default f16).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/engine.hpp"
#include "model/llama.hpp"
#include "model/make_model.hpp"

namespace fs = std::filesystem;

namespace {

struct Options {
  std::string dir = "./bench-models";
  std::string shape = "110M";
  std::string vocab_from;
  int threads = 2;
  std::vector<std::string> dtypes = {"f32", "f16", "q8_0", "q4_0"};
  std::vector<int> batches = {1, 8, 32};
  int decode_steps = 64;
  int prompt = 512;        // prefill test length, as llama-bench's pp512
  int decode_prompt = 32;  // context before decode; with 64 steps the mean context is ~64, as tg128
  int reps = 2;            // timed repetitions after one warm-up; the best is reported
  bool kv_bench = false;
  bool kv_memory = false;
  int kv_tokens = 4096;
  std::vector<std::string> kv_dtypes = {"f32", "f16", "q8_0"};
  sy::kernels::DType kv_dtype = sy::kernels::DType::F16;
  std::string peer_llama_bench;  // llama-bench binary run side by side; empty: none
  int rounds = 0;                // alternating rounds (0: 3 with a peer, else 1)
  int kv_gen = 8192;     // generated tokens of the KV benchmark; measured at half and at all
  int kv_window = 1024;  // the sliding window compared with full attention
  bool table = false;
  std::string model;                            // --table: the file measured
  std::vector<int> prompts = {128, 512, 2048};  // --table: prompt lengths (columns)
  int step_tokens = 2048;                       // --table: most prompt tokens in one prefill step
  std::string perf_ctl;  // --table: perf record's control FIFO, gating it to the decode steps
  bool batches_set = false, decode_steps_set = false, reps_set = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int to_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const int x = std::stoi(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(flag + " needs an integer, got '" + v + "'");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--kv-bench") {
      o.kv_bench = true;
      continue;
    }
    if (a == "--kv-memory") {
      o.kv_memory = true;
      continue;
    }
    if (a == "--table") {
      o.table = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("option " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--dir")
      o.dir = v;
    else if (a == "--shape")
      o.shape = v;
    else if (a == "--vocab-from")
      o.vocab_from = v;
    else if (a == "--threads")
      o.threads = to_int(a, v);
    else if (a == "--dtypes")
      o.dtypes = split(v);
    else if (a == "--model")
      o.model = v;
    else if (a == "--prompts") {
      o.prompts.clear();
      for (const auto& p : split(v)) o.prompts.push_back(to_int(a, p));
    } else if (a == "--perf-ctl")
      o.perf_ctl = v;
    else if (a == "--step-tokens")
      o.step_tokens = to_int(a, v);
    else if (a == "--batches") {
      o.batches_set = true;
      o.batches.clear();
      for (const auto& b : split(v)) o.batches.push_back(to_int(a, b));
    } else if (a == "--decode-steps") {
      o.decode_steps = to_int(a, v);
      o.decode_steps_set = true;
    } else if (a == "--prompt")
      o.prompt = to_int(a, v);
    else if (a == "--decode-prompt")
      o.decode_prompt = to_int(a, v);
    else if (a == "--reps") {
      o.reps = to_int(a, v);
      o.reps_set = true;
    } else if (a == "--kv-gen")
      o.kv_gen = to_int(a, v);
    else if (a == "--kv-window")
      o.kv_window = to_int(a, v);
    else if (a == "--kv-tokens")
      o.kv_tokens = to_int(a, v);
    else if (a == "--kv-dtypes")
      o.kv_dtypes = split(v);
    else if (a == "--kv-dtype") {
      const auto t = sy::kernels::parse_kv_type(v);
      if (!t) throw std::invalid_argument("--kv-dtype must be f32, f16 or q8_0");
      o.kv_dtype = *t;
    } else if (a == "--peer-llama-bench")
      o.peer_llama_bench = v;
    else if (a == "--rounds")
      o.rounds = to_int(a, v);
    else
      throw std::invalid_argument("unknown option " + a);
  }
  if (o.threads < 1 || o.decode_steps < 1 || o.prompt < 1 || o.decode_prompt < 1 || o.reps < 1)
    throw std::invalid_argument(
        "--threads, --decode-steps, --prompt, --decode-prompt and --reps "
        "must be >= 1");
  for (int b : o.batches)
    if (b < 1) throw std::invalid_argument("--batches entries must be >= 1");
  if (o.rounds < 0) throw std::invalid_argument("--rounds must be >= 1");
  if (o.table) {
    if (o.model.empty()) throw std::invalid_argument("--table needs --model FILE.gguf");
    if (!fs::exists(o.model)) throw std::invalid_argument("--model: no file " + o.model);
    if (!o.peer_llama_bench.empty())
      throw std::invalid_argument("--table measures ours only: no --peer-llama-bench");
    // A table of 12 cells on two cores: one measured run per cell after a warm-up, and a
    // short decode (the context, not the step count, sets a decode step's cost).
    if (!o.batches_set) o.batches = {1, 4, 16, 32};
    if (!o.decode_steps_set) o.decode_steps = 16;
    if (!o.reps_set) o.reps = 1;
    if (o.prompts.empty() || o.batches.empty() || o.step_tokens < 1)
      throw std::invalid_argument(
          "--prompts and --batches need entries, --step-tokens must be >= 1");
    for (int p : o.prompts)
      if (p < 1) throw std::invalid_argument("--prompts entries must be >= 1");
  } else if (!o.model.empty() || !o.perf_ctl.empty()) {
    throw std::invalid_argument(
        "--model and --perf-ctl belong to --table (the other modes write their files)");
  }
  if (o.rounds == 0) o.rounds = o.peer_llama_bench.empty() ? 1 : 3;
  if (!o.peer_llama_bench.empty() && !fs::exists(o.peer_llama_bench))
    throw std::invalid_argument("--peer-llama-bench: no file " + o.peer_llama_bench);
  // Two checkpoints, each averaged over its last kKvAvgTokens tokens.
  if (o.kv_gen < 1024 || o.kv_gen % 2 || o.kv_window < 1)
    throw std::invalid_argument("--kv-gen must be even and >= 1024, --kv-window >= 1");
  return o;
}

// The model file for one dtype, written on first use. Written to a temporary name and renamed,
// so an interrupted run never leaves a torn file that later runs would reuse.
std::string model_file(const Options& o, const std::string& dtype) {
  fs::create_directories(o.dir);
  const fs::path path = fs::path(o.dir) / (o.shape + "-" + dtype + ".gguf");
  if (!fs::exists(path)) {
    std::cerr << "bench_engine: writing " << path.string() << "\n";
    sy::MakeModelOptions m;
    m.shape = o.shape;
    m.dtype = dtype;
    m.vocab_from = o.vocab_from;
    m.seed = 1;
    fs::path tmp = path;
    tmp += ".tmp";
    m.out = tmp.string();
    sy::make_model(m);
    fs::rename(tmp, path);
  }
  return path.string();
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int32_t argmax(const float* x, int32_t n) {
  int32_t b = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return b;
}

// A batch of sequences with their block tables, freed on destruction.
struct Batch {
  sy::Engine& eng;
  std::vector<std::vector<int32_t>> tokens;  // per sequence: prompt, then fed tokens
  std::vector<std::vector<int32_t>> blocks;
  std::vector<int32_t> n_past;
  std::vector<int32_t> next;

  Batch(sy::Engine& e, int n_seqs, int prompt_len, int max_len, std::mt19937_64& rng) : eng(e) {
    const int32_t bs = e.block_size();
    const int32_t n_vocab = e.config().n_vocab;
    for (int s = 0; s < n_seqs; ++s) {
      std::vector<int32_t> t(static_cast<size_t>(prompt_len));
      // Random ids, skipping the first few (control tokens in the usual vocabularies).
      for (auto& x : t) x = 3 + static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab - 3));
      tokens.push_back(std::move(t));
      std::vector<int32_t> b;
      for (int32_t k = 0; k < (max_len + bs - 1) / bs; ++k) {
        auto id = e.pool().alloc();
        if (!id) throw std::runtime_error("bench_engine: KV pool too small");
        b.push_back(*id);
      }
      blocks.push_back(std::move(b));
      n_past.push_back(0);
      next.push_back(0);
    }
  }
  ~Batch() {
    for (auto& b : blocks)
      for (int32_t id : b) eng.pool().free(id);
  }

  // Prefills every prompt in one step; returns the seconds taken.
  double prefill(sy::StepOutput& out) {
    std::vector<sy::SeqStep> steps(tokens.size());
    for (size_t s = 0; s < tokens.size(); ++s) {
      auto& st = steps[s];
      st.tokens = tokens[s].data();
      st.n_tokens = static_cast<int32_t>(tokens[s].size());
      st.n_past = 0;
      st.block_table = blocks[s].data();
      st.n_blocks = static_cast<int32_t>(blocks[s].size());
    }
    const double t0 = now_s();
    eng.step(steps, out);
    const double dt = now_s() - t0;
    for (size_t s = 0; s < tokens.size(); ++s) {
      n_past[s] = static_cast<int32_t>(tokens[s].size());
      next[s] = argmax(out.row(s), eng.config().n_vocab);
    }
    return dt;
  }

  // Prefills every prompt in steps of at most `budget` tokens, sequence after sequence (a long
  // prompt in chunks over several steps, several short ones in one step), as a batcher's token
  // budget cuts them; returns the seconds the steps took.
  double prefill_chunked(sy::StepOutput& out, int budget) {
    std::vector<size_t> done(tokens.size(), 0);
    size_t first = 0;  // the first sequence not wholly prefilled
    double total = 0;
    std::vector<sy::SeqStep> steps;
    std::vector<size_t> who;
    while (first < tokens.size()) {
      steps.clear();
      who.clear();
      int left = budget;
      for (size_t s = first; s < tokens.size() && left > 0; ++s) {
        const int n = std::min(left, static_cast<int>(tokens[s].size() - done[s]));
        sy::SeqStep st;
        st.tokens = tokens[s].data() + done[s];
        st.n_tokens = n;
        st.n_past = static_cast<int32_t>(done[s]);
        st.block_table = blocks[s].data();
        st.n_blocks = static_cast<int32_t>(blocks[s].size());
        steps.push_back(st);
        who.push_back(s);
        left -= n;
      }
      const double t0 = now_s();
      eng.step(steps, out);
      total += now_s() - t0;
      for (size_t k = 0; k < who.size(); ++k) {
        const size_t s = who[k];
        done[s] += static_cast<size_t>(steps[k].n_tokens);
        if (done[s] == tokens[s].size()) {
          n_past[s] = static_cast<int32_t>(tokens[s].size());
          next[s] = argmax(out.row(k), eng.config().n_vocab);
        }
      }
      while (first < tokens.size() && done[first] == tokens[first].size()) ++first;
    }
    return total;
  }

  // Runs `steps` greedy decode steps over the whole batch; returns the seconds taken.
  double decode(int n_steps, sy::StepOutput& out) {
    std::vector<sy::SeqStep> steps(tokens.size());
    const double t0 = now_s();
    for (int k = 0; k < n_steps; ++k) {
      for (size_t s = 0; s < tokens.size(); ++s) {
        auto& st = steps[s];
        st.tokens = &next[s];
        st.n_tokens = 1;
        st.n_past = n_past[s];
        st.block_table = blocks[s].data();
        st.n_blocks = static_cast<int32_t>(blocks[s].size());
      }
      eng.step(steps, out);
      for (size_t s = 0; s < tokens.size(); ++s) {
        ++n_past[s];
        next[s] = argmax(out.row(s), eng.config().n_vocab);
      }
    }
    return now_s() - t0;
  }
};

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A figure of the JSON output, rounded as the tables print it (0.1).
double round1(double v) {
  return std::round(v * 10) / 10;
}

// ---- --kv-bench: decode speed and KV memory of one long sequence, full vs sliding window ----

// Decode tokens/s is averaged over this many tokens before each checkpoint: long enough to
// smooth out scheduling noise, short enough to describe the context length at the checkpoint.
constexpr int kKvAvgTokens = 256;
// The model's context: room for the 8192 generated tokens plus the prompt.
constexpr int kKvCtx = 9216;
// Prompt tokens before decoding starts.
constexpr int kKvPrompt = 16;

struct KvPoint {
  int generated = 0;
  double tok_s = 0;
  double cpu_ms = 0;  // process CPU time per token (all threads): less sensitive to a busy host
  int64_t blocks = 0;
  double kv_mib = 0;
};

// Generates o.kv_gen tokens one by one under (window, 0); returns the figures at half and at all.
std::vector<KvPoint> kv_run(sy::Engine& e, const Options& o, int32_t window) {
  const int32_t bs = e.block_size();
  const sy::LlamaConfig& c = e.config();
  // K and V, every layer, in the engine's KV type.
  const int64_t block_bytes = e.model().limits().kv_bytes_per_token(o.kv_dtype) * bs;
  std::vector<int32_t> toks(kKvPrompt, 3), table;
  for (int i = 0; i < kKvPrompt; ++i) toks[static_cast<size_t>(i)] = 3 + i * 17 % (c.n_vocab - 3);
  std::vector<double> dt, cpu;
  std::vector<KvPoint> points;
  int64_t held = 0;
  int32_t n_past = 0;
  sy::StepOutput out;
  for (int gen = 0; gen < o.kv_gen;) {
    const bool prefill = n_past == 0;
    const int32_t n = prefill ? kKvPrompt : 1;
    while (static_cast<int64_t>(table.size()) * bs < n_past + n) {
      auto id = e.pool().alloc();
      if (!id) throw std::runtime_error("bench_engine: KV pool too small");
      table.push_back(*id);
      ++held;
    }
    sy::SeqStep st;
    st.tokens = prefill ? toks.data() : &toks.back();
    st.n_tokens = n;
    st.n_past = n_past;
    st.block_table = table.data();
    st.n_blocks = static_cast<int32_t>(table.size());
    st.window = window;
    const double t0 = now_s();
    const std::clock_t c0 = std::clock();
    e.step({st}, out);
    if (!prefill) {
      dt.push_back(now_s() - t0);
      cpu.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    }
    n_past += n;
    toks.push_back(argmax(out.row(0), c.n_vocab));
    ++gen;
    if (window > 0) {
      // As a batcher does: blocks wholly before the next token's window go back to the pool.
      const int64_t lo = std::max<int64_t>(0, int64_t{n_past} - window + 1);
      for (size_t b = 0; b < table.size() && static_cast<int64_t>(b + 1) * bs <= lo; ++b) {
        if (table[b] >= 0) {
          e.pool().free(table[b]);
          table[b] = -1;
          --held;
        }
      }
    }
    if (gen == o.kv_gen / 2 || gen == o.kv_gen) {
      double sum = 0, cpu_sum = 0;
      const size_t n_avg = std::min<size_t>(kKvAvgTokens, dt.size());
      for (size_t k = dt.size() - n_avg; k < dt.size(); ++k) {
        sum += dt[k];
        cpu_sum += cpu[k];
      }
      points.push_back({gen, static_cast<double>(n_avg) / sum, 1e3 * cpu_sum / n_avg, held,
                        static_cast<double>(held * block_bytes) / (1 << 20)});
      std::cerr << "bench_engine: window " << window << ", " << gen << " tokens\n";
    }
  }
  for (int32_t b : table)
    if (b >= 0) e.pool().free(b);
  return points;
}

int kv_bench(const Options& o) {
  char tmpl[] = "/tmp/sy-kvbench-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("bench_engine: cannot create a temp directory");
  const fs::path dir = tmpl;
  const std::string path = (dir / "kv.gguf").string();
  sy::MakeModelOptions m;
  m.shape = "15M";
  m.dtype = "f32";
  m.seed = 1;
  m.ctx_len = kKvCtx;
  m.out = path;
  sy::make_model(m);
  auto model = sy::LlamaModel::load(path);
  fs::remove_all(dir);  // the model is read into memory (or kept mapped) by now
  if (kKvPrompt + o.kv_gen > model->config().ctx_len)
    throw std::invalid_argument("--kv-gen exceeds the model context");
  sy::EngineOptions eo;
  eo.n_threads = o.threads;
  eo.kv_type = o.kv_dtype;
  eo.n_blocks = (kKvPrompt + o.kv_gen + eo.block_size - 1) / eo.block_size + 1;
  auto engine = sy::make_cpu_engine(model, eo);
  const std::vector<std::pair<std::string, int32_t>> runs = {
      {"full", 0}, {"sliding_window:" + std::to_string(o.kv_window), o.kv_window}};
  nlohmann::ordered_json js = {{"shape", "15M"},
                               {"dtype", "f32"},
                               {"kv_dtype", sy::kernels::kv_type_name(o.kv_dtype)},
                               {"ctx", kKvCtx},
                               {"threads", o.threads},
                               {"block_size", eo.block_size},
                               {"avg_over_tokens", kKvAvgTokens},
                               {"results", nlohmann::ordered_json::array()}};
  std::fprintf(stderr, "%-22s %9s %10s %10s %8s %9s\n", "policy", "generated", "decode/s",
               "cpu ms/tok", "blocks", "KV MiB");
  for (const auto& [name, window] : runs) {
    for (const KvPoint& p : kv_run(*engine, o, window)) {
      std::fprintf(stderr, "%-22s %9d %10.1f %10.2f %8lld %9.1f\n", name.c_str(), p.generated,
                   p.tok_s, p.cpu_ms, static_cast<long long>(p.blocks), p.kv_mib);
      js["results"].push_back({{"policy", name},
                               {"generated", p.generated},
                               {"decode_tok_s", round1(p.tok_s)},
                               {"cpu_ms_per_tok", round1(p.cpu_ms)},
                               {"blocks_held", p.blocks},
                               {"kv_mib", round1(p.kv_mib)}});
    }
  }
  std::cout << js.dump(2) << "\n";
  return 0;
}

// ---- --kv-memory: KV bytes of one long sequence under each KV type ----

int64_t rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  long long pages = 0, resident = 0;
  if (f) {
    if (std::fscanf(f, "%lld %lld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * 4096;
}

int kv_memory(const Options& o) {
  // Weights in q8_0 to keep the prefill short; the cache does not depend on them.
  char tmpl[] = "/tmp/sy-kvmem-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("bench_engine: cannot create a temp directory");
  const fs::path dir = tmpl;
  const std::string path = (dir / "kv.gguf").string();
  sy::MakeModelOptions m;
  m.shape = o.shape;
  m.dtype = "q8_0";
  m.seed = 1;
  m.ctx_len = o.kv_tokens;
  m.out = path;
  sy::make_model(m);
  auto model = sy::LlamaModel::load(path);
  fs::remove_all(dir);
  const sy::LlamaConfig& c = model->config();
  nlohmann::ordered_json js = {
      {"shape", o.shape},         {"layers", c.n_layers},
      {"kv_heads", c.n_kv_heads}, {"head_dim", c.head_dim},
      {"tokens", o.kv_tokens},    {"results", nlohmann::ordered_json::array()}};
  std::fprintf(stderr, "%-6s %14s %14s %14s\n", "K/V", "bytes/token", "cache MiB", "RSS +MiB");
  constexpr int kChunk = 512;  // prefill chunk: bounds the step's scratch next to the cache
  for (size_t i = 0; i < o.kv_dtypes.size(); ++i) {
    const auto t = sy::kernels::parse_kv_type(o.kv_dtypes[i]);
    if (!t)
      throw std::invalid_argument("--kv-dtypes: " + o.kv_dtypes[i] + " is not f32, f16, q8_0");
    sy::EngineOptions eo;
    eo.n_threads = o.threads;
    eo.kv_type = *t;
    eo.n_blocks = (o.kv_tokens + eo.block_size - 1) / eo.block_size;
    eo.max_batch_tokens = kChunk;
    auto e = sy::make_cpu_engine(model, eo);
    std::vector<int32_t> table;
    for (int32_t b = 0; b < eo.n_blocks; ++b) table.push_back(*e->pool().alloc());
    std::vector<int32_t> toks(kChunk);
    sy::StepOutput out;
    // One chunk first, so the step's scratch is allocated before the baseline is taken.
    int32_t n_past = 0;
    int64_t rss0 = 0;
    for (; n_past < o.kv_tokens; n_past += kChunk) {
      for (int k = 0; k < kChunk; ++k) toks[static_cast<size_t>(k)] = 3 + (n_past + k) % 200;
      sy::SeqStep st;
      st.tokens = toks.data();
      st.n_tokens = std::min(kChunk, o.kv_tokens - n_past);
      st.n_past = n_past;
      st.block_table = table.data();
      st.n_blocks = static_cast<int32_t>(table.size());
      e->step({st}, out);
      if (n_past == 0) rss0 = rss_bytes();
    }
    const int64_t per_token = model->limits().kv_bytes_per_token(*t);
    const double cache_mib = static_cast<double>(e->kv_bytes()) / (1 << 20);
    // The first chunk's rows were written before the baseline: add them back.
    const double rss_mib = static_cast<double>(rss_bytes() - rss0 + per_token * kChunk) / (1 << 20);
    std::fprintf(stderr, "%-6s %14lld %14.1f %14.1f\n", o.kv_dtypes[i].c_str(),
                 static_cast<long long>(per_token), cache_mib, rss_mib);
    js["results"].push_back({{"kv_dtype", o.kv_dtypes[i]},
                             {"bytes_per_token", per_token},
                             {"cache_mib", round1(cache_mib)},
                             {"rss_growth_mib", round1(rss_mib)}});
  }
  std::cout << js.dump(2) << "\n";
  return 0;
}

// ---- --table: prefill and decode tokens/s per batch size x prompt length on one file ----

std::vector<double> loadavg() {
  std::vector<double> v(3, 0.0);
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f) {
    if (std::fscanf(f, "%lf %lf %lf", &v[0], &v[1], &v[2]) != 3) v.assign(3, 0.0);
    std::fclose(f);
  }
  return v;
}

int table(const Options& o) {
  const auto la0 = loadavg();
  auto model = sy::LlamaModel::load(o.model);
  const sy::LlamaConfig& c = model->config();
  const int max_b = *std::max_element(o.batches.begin(), o.batches.end());
  const int max_p = *std::max_element(o.prompts.begin(), o.prompts.end());
  if (max_p + o.decode_steps > c.ctx_len)
    throw std::invalid_argument("a prompt of " + std::to_string(max_p) + " and " +
                                std::to_string(o.decode_steps) + " decode steps exceed the " +
                                std::to_string(c.ctx_len) + "-token context of " + o.model);
  sy::EngineOptions eo;
  eo.n_threads = o.threads;
  eo.kv_type = o.kv_dtype;
  eo.max_batch_tokens = std::max(o.step_tokens, max_b);
  const int32_t bs = eo.block_size;
  eo.n_blocks = max_b * ((max_p + o.decode_steps + bs - 1) / bs);
  auto engine = sy::make_cpu_engine(model, eo);
  sy::StepOutput out;
  std::mt19937_64 rng(7);
  {
    // Warm-up: faults the mapped weights in and grows the step's scratch to a full prefill step
    // and the widest decode step before anything is timed.
    {
      Batch one(*engine, 1, std::min(o.step_tokens, max_p), max_p, rng);
      one.prefill_chunked(out, o.step_tokens);
    }
    Batch wide(*engine, max_b, std::min(16, max_p), std::min(16, max_p) + 2, rng);
    wide.prefill_chunked(out, o.step_tokens);
    wide.decode(2, out);
  }
  // perf record's control FIFO: perf reads "enable"/"disable" commands from it.
  std::FILE* ctl = nullptr;
  if (!o.perf_ctl.empty()) {
    ctl = std::fopen(o.perf_ctl.c_str(), "w");
    if (!ctl) throw std::runtime_error("--perf-ctl: cannot open " + o.perf_ctl);
  }
  auto gate = [&](const char* cmd) {
    if (!ctl) return;
    std::fputs(cmd, ctl);
    std::fflush(ctl);
  };
  nlohmann::ordered_json cells = nlohmann::ordered_json::array();
  std::vector<std::vector<double>> pp(o.batches.size()), tg(o.batches.size());
  for (size_t bi = 0; bi < o.batches.size(); ++bi) {
    const int nb = o.batches[bi];
    for (const int p : o.prompts) {
      double best_pp = 1e30, best_tg = 1e30;
      for (int r = 0; r < o.reps; ++r) {
        Batch b(*engine, nb, p, p + o.decode_steps, rng);
        best_pp = std::min(best_pp, b.prefill_chunked(out, o.step_tokens));
        gate("enable\n");
        best_tg = std::min(best_tg, b.decode(o.decode_steps, out));
        gate("disable\n");
      }
      const double pp_s = static_cast<double>(nb) * p / best_pp;
      const double tg_s = static_cast<double>(nb) * o.decode_steps / best_tg;
      pp[bi].push_back(pp_s);
      tg[bi].push_back(tg_s);
      std::cerr << "bench_engine: batch " << nb << " prompt " << p << ": prefill " << fmt(pp_s)
                << " tok/s, decode " << fmt(tg_s) << " tok/s\n";
      cells.push_back({{"batch", nb},
                       {"prompt", p},
                       {"prefill_tok_s", round1(pp_s)},
                       {"decode_tok_s", round1(tg_s)},
                       {"decode_ms_per_step", round1(1e3 * best_tg / o.decode_steps)}});
    }
  }
  // Both grids as Markdown tables: a row per batch size, a column per prompt length.
  for (const auto& [title, grid] : {std::pair{"prefill tokens/s", &pp}, {"decode tokens/s", &tg}}) {
    std::cerr << "\n| " << title << " |";
    for (int p : o.prompts) std::cerr << " prompt " << p << " |";
    std::cerr << "\n| --- |";
    for (size_t k = 0; k < o.prompts.size(); ++k) std::cerr << " --- |";
    std::cerr << "\n";
    for (size_t bi = 0; bi < o.batches.size(); ++bi) {
      std::cerr << "| batch " << o.batches[bi] << " |";
      for (double v : (*grid)[bi])
        std::cerr << " " << static_cast<long long>(std::lround(v)) << " |";
      std::cerr << "\n";
    }
  }
  if (ctl) std::fclose(ctl);
  nlohmann::ordered_json js = {{"mode", "table"},
                               {"model", o.model},
                               {"dim", c.dim},
                               {"layers", c.n_layers},
                               {"vocab", c.n_vocab},
                               {"ctx", c.ctx_len},
                               {"threads", o.threads},
                               {"kv_dtype", sy::kernels::kv_type_name(o.kv_dtype)},
                               {"step_tokens", o.step_tokens},
                               {"decode_steps", o.decode_steps},
                               {"reps", o.reps},
                               {"loadavg_before", la0},
                               {"loadavg_after", loadavg()},
                               {"cells", std::move(cells)}};
  std::cout << js.dump(2) << "\n";
  return 0;
}

// What one run of ours measured on one file: prefill and decode tok/s per batch size.
struct OurFigures {
  double pp = 0;
  std::vector<double> decode;  // per --batches entry
};

OurFigures run_ours(const Options& o, const std::string& path, std::mt19937_64& rng) {
  int max_batch = 1;
  for (int b : o.batches) max_batch = std::max(max_batch, b);
  auto model = sy::LlamaModel::load(path);
  sy::EngineOptions eo;
  eo.n_threads = o.threads;
  eo.kv_type = o.kv_dtype;
  const int32_t bs = eo.block_size;
  const int per_seq_blocks = (std::max(o.prompt, o.decode_prompt + o.decode_steps) + bs - 1) / bs;
  eo.n_blocks = per_seq_blocks * std::max(max_batch, 1);
  if (o.prompt > model->config().ctx_len ||
      o.decode_prompt + o.decode_steps > model->config().ctx_len)
    throw std::invalid_argument("prompt or decode length exceeds the model context");
  auto engine = sy::make_cpu_engine(model, eo);
  sy::StepOutput out;
  OurFigures f;
  // Prefill: one prompt in one step; the first run also faults the mapped weights in.
  double best_pp = 1e30;
  for (int r = 0; r <= o.reps; ++r) {
    Batch b(*engine, 1, o.prompt, o.prompt, rng);
    const double dt = b.prefill(out);
    if (r > 0) best_pp = std::min(best_pp, dt);
  }
  f.pp = o.prompt / best_pp;
  for (const int nb : o.batches) {
    double best = 1e30;
    for (int r = 0; r <= o.reps; ++r) {
      Batch b(*engine, nb, o.decode_prompt, o.decode_prompt + o.decode_steps, rng);
      b.prefill(out);
      const double dt = b.decode(o.decode_steps, out);
      if (r > 0) best = std::min(best, dt);  // run 0 warms up
    }
    f.decode.push_back(static_cast<double>(nb) * o.decode_steps / best);
  }
  return f;
}

// llama-bench on the same file: pp (--prompt tokens in one batch) and tg (--decode-steps tokens
// decoded one at a time from an empty context), each the mean of reps + 1 runs as it reports.
struct PeerFigures {
  double pp = 0, tg = 0;
};

PeerFigures run_peer(const Options& o, const std::string& path) {
  const std::string cmd = "'" + o.peer_llama_bench + "' -m '" + path + "' -t " +
                          std::to_string(o.threads) + " -p " + std::to_string(o.prompt) + " -n " +
                          std::to_string(o.decode_steps) + " -r " + std::to_string(o.reps + 1) +
                          " -o json 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) throw std::runtime_error("cannot run " + o.peer_llama_bench);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const int rc = ::pclose(f);
  if (rc != 0)
    throw std::runtime_error("llama-bench failed on " + path + " (status " + std::to_string(rc) +
                             ")");
  PeerFigures p;
  const nlohmann::json root = nlohmann::json::parse(text);
  auto num = [](const nlohmann::json& t, const char* key) { return t.at(key).get<double>(); };
  for (const auto& t : root) {
    if (num(t, "n_prompt") > 0 && num(t, "n_gen") == 0) p.pp = num(t, "avg_ts");
    if (num(t, "n_gen") > 0 && num(t, "n_prompt") == 0) p.tg = num(t, "avg_ts");
  }
  if (p.pp <= 0 || p.tg <= 0) throw std::runtime_error("llama-bench printed no pp/tg figures");
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string ratio(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", b > 0 ? a / b : 0.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (o.kv_bench) return kv_bench(o);
    if (o.kv_memory) return kv_memory(o);
    if (o.table) return table(o);
    std::mt19937_64 rng(7);
    const bool peer = !o.peer_llama_bench.empty();
    const size_t nd = o.dtypes.size(), nbatch = o.batches.size();
    std::vector<std::string> paths;
    for (const auto& dtype : o.dtypes) paths.push_back(model_file(o, dtype));

    // rounds x dtypes, ours then the peer on each file, so drifts of the machine hit both.
    std::vector<std::vector<OurFigures>> ours(nd);
    std::vector<std::vector<PeerFigures>> theirs(nd);
    for (int r = 0; r < o.rounds; ++r) {
      for (size_t d = 0; d < nd; ++d) {
        const OurFigures f = run_ours(o, paths[d], rng);
        std::cerr << "bench_engine: round " << r + 1 << " " << o.dtypes[d] << " ours: prefill "
                  << fmt(f.pp) << " tok/s";
        for (size_t bi = 0; bi < nbatch; ++bi)
          std::cerr << ", decode b" << o.batches[bi] << " " << fmt(f.decode[bi]);
        std::cerr << "\n";
        ours[d].push_back(f);
        if (peer) {
          const PeerFigures p = run_peer(o, paths[d]);
          std::cerr << "bench_engine: round " << r + 1 << " " << o.dtypes[d] << " llama.cpp: pp"
                    << o.prompt << " " << fmt(p.pp) << ", tg" << o.decode_steps << " " << fmt(p.tg)
                    << " tok/s\n";
          theirs[d].push_back(p);
        }
      }
    }

    // Figures rounded as the table prints them: tok/s and MiB to 0.1, ratios to 0.01.
    auto r1 = round1;
    auto r2 = [](double v) { return std::round(v * 100) / 100; };
    auto list = [](const std::vector<double>& v, auto round) {
      auto a = nlohmann::ordered_json::array();
      for (double x : v) a.push_back(round(x));
      return a;
    };
    nlohmann::ordered_json js = {{"shape", o.shape},
                                 {"threads", o.threads},
                                 {"prompt_tokens", o.prompt},
                                 {"decode_prompt_tokens", o.decode_prompt},
                                 {"decode_steps", o.decode_steps},
                                 {"reps", o.reps},
                                 {"rounds", o.rounds},
                                 {"results", nlohmann::ordered_json::array()}};
    for (size_t d = 0; d < nd; ++d) {
      std::vector<double> pp;
      for (const auto& f : ours[d]) pp.push_back(f.pp);
      nlohmann::ordered_json res = {
          {"dtype", o.dtypes[d]},
          {"file_mib", r1(static_cast<double>(fs::file_size(paths[d])) / (1 << 20))},
          {"prefill_tok_s", r1(median(pp))},
          {"decode_tok_s", nlohmann::ordered_json::object()}};
      std::vector<double> b1;
      for (size_t bi = 0; bi < nbatch; ++bi) {
        std::vector<double> v;
        for (const auto& f : ours[d]) v.push_back(f.decode[bi]);
        if (o.batches[bi] == 1) b1 = v;
        res["decode_tok_s"][std::to_string(o.batches[bi])] = r1(median(v));
      }
      if (o.rounds > 1) {
        auto& per = res["per_round"];
        per["prefill"] = list(pp, r1);
        for (size_t bi = 0; bi < nbatch; ++bi) {
          std::vector<double> v;
          for (const auto& f : ours[d]) v.push_back(f.decode[bi]);
          per["decode_" + std::to_string(o.batches[bi])] = list(v, r1);
        }
      }
      if (peer) {
        std::vector<double> ppp, tg, r_pp, r_tg;
        for (size_t r = 0; r < theirs[d].size(); ++r) {
          ppp.push_back(theirs[d][r].pp);
          tg.push_back(theirs[d][r].tg);
          r_pp.push_back(pp[r] / theirs[d][r].pp);
          if (!b1.empty()) r_tg.push_back(b1[r] / theirs[d][r].tg);
        }
        res["llama_cpp"] = {{"pp" + std::to_string(o.prompt), list(ppp, r1)},
                            {"tg" + std::to_string(o.decode_steps), list(tg, r1)}};
        auto& ratios = res["ours_over_llama_cpp"];
        ratios["prefill"] = r2(median(r_pp));
        ratios["prefill_per_round"] = list(r_pp, r2);
        if (!r_tg.empty()) {
          ratios["decode_batch1"] = r2(median(r_tg));
          ratios["decode_batch1_per_round"] = list(r_tg, r2);
        }
        std::cerr << "bench_engine: " << o.dtypes[d] << " ours/llama.cpp (median of " << o.rounds
                  << " rounds): prefill " << ratio(median(r_pp), 1.0);
        if (!r_tg.empty()) std::cerr << ", decode batch 1 " << ratio(median(r_tg), 1.0);
        std::cerr << "\n";
      }
      js["results"].push_back(std::move(res));
    }
    std::cout << js.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_engine: " << e.what() << "\n";
    return 1;
  }
}
