// Engine throughput: prefill and batched greedy decode tokens/s of random-weight Llama models in
// several dtypes, driven straight through the Engine interface. Prints one JSON object.
//
//   bench_engine [--dir ./bench-models] [--shape 110M] [--threads 2] [--dtypes f32,f16,q8_0,q4_0]
//                [--batches 1,8,32] [--decode-steps 64] [--prompt 512] [--decode-prompt 32]
//                [--reps 2] [--vocab-from FILE.gguf]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
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
};

// llama.cpp (llama-bench, 2 threads, same machine class) on the 110M shape: the figures to beat.
struct Target {
  double pp512, tg128;
};
const std::map<std::string, Target> kLlamaCpp = {
    {"f32", {660, 78}}, {"f16", {830, 160}}, {"q8_0", {940, 210}}, {"q4_0", {1080, 305}}};

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
    if (i + 1 >= argc) throw std::invalid_argument("option " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--dir") o.dir = v;
    else if (a == "--shape") o.shape = v;
    else if (a == "--vocab-from") o.vocab_from = v;
    else if (a == "--threads") o.threads = to_int(a, v);
    else if (a == "--dtypes") o.dtypes = split(v);
    else if (a == "--batches") {
      o.batches.clear();
      for (const auto& b : split(v)) o.batches.push_back(to_int(a, b));
    } else if (a == "--decode-steps") o.decode_steps = to_int(a, v);
    else if (a == "--prompt") o.prompt = to_int(a, v);
    else if (a == "--decode-prompt") o.decode_prompt = to_int(a, v);
    else if (a == "--reps") o.reps = to_int(a, v);
    else throw std::invalid_argument("unknown option " + a);
  }
  if (o.threads < 1 || o.decode_steps < 1 || o.prompt < 1 || o.decode_prompt < 1 || o.reps < 1)
    throw std::invalid_argument("--threads, --decode-steps, --prompt, --decode-prompt and --reps "
                                "must be >= 1");
  for (int b : o.batches)
    if (b < 1) throw std::invalid_argument("--batches entries must be >= 1");
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

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    int max_batch = 1;
    for (int b : o.batches) max_batch = std::max(max_batch, b);
    std::mt19937_64 rng(7);

    std::ostringstream js;
    js << "{\n  \"shape\": \"" << o.shape << "\", \"threads\": " << o.threads
       << ", \"prompt_tokens\": " << o.prompt << ", \"decode_prompt_tokens\": " << o.decode_prompt
       << ", \"decode_steps\": " << o.decode_steps << ", \"reps\": " << o.reps
       << ",\n  \"results\": [";
    bool first = true;
    for (const auto& dtype : o.dtypes) {
      const std::string path = model_file(o, dtype);
      auto model = sy::LlamaModel::load(path);
      sy::EngineOptions eo;
      eo.n_threads = o.threads;
      const int32_t bs = eo.block_size;
      const int per_seq_blocks = (std::max(o.prompt, o.decode_prompt + o.decode_steps) + bs - 1) / bs;
      eo.n_blocks = per_seq_blocks * std::max(max_batch, 1);
      if (o.prompt > model->config().ctx_len ||
          o.decode_prompt + o.decode_steps > model->config().ctx_len)
        throw std::invalid_argument("prompt or decode length exceeds the model context");
      auto engine = sy::make_cpu_engine(model, eo);
      sy::StepOutput out;

      // Prefill: one prompt in one step; the first run also faults the mapped weights in.
      double best_pp = 1e30;
      for (int r = 0; r <= o.reps; ++r) {
        Batch b(*engine, 1, o.prompt, o.prompt, rng);
        const double dt = b.prefill(out);
        if (r > 0) best_pp = std::min(best_pp, dt);
      }
      const double pp = o.prompt / best_pp;
      std::cerr << "bench_engine: " << dtype << " prefill " << fmt(pp) << " tok/s\n";

      js << (first ? "" : ",") << "\n    {\"dtype\": \"" << dtype << "\", \"file_mib\": "
         << fmt(static_cast<double>(fs::file_size(path)) / (1 << 20))
         << ", \"prefill_tok_s\": " << fmt(pp) << ", \"decode_tok_s\": {";
      first = false;
      double tg1 = 0;
      for (size_t bi = 0; bi < o.batches.size(); ++bi) {
        const int nb = o.batches[bi];
        double best = 1e30;
        for (int r = 0; r <= o.reps; ++r) {
          Batch b(*engine, nb, o.decode_prompt, o.decode_prompt + o.decode_steps, rng);
          b.prefill(out);
          const double dt = b.decode(o.decode_steps, out);
          if (r > 0) best = std::min(best, dt);  // run 0 warms up
        }
        const double tg = static_cast<double>(nb) * o.decode_steps / best;
        if (nb == 1) tg1 = tg;
        std::cerr << "bench_engine: " << dtype << " decode batch " << nb << ": " << fmt(tg)
                  << " tok/s\n";
        js << (bi ? ", " : "") << "\"" << nb << "\": " << fmt(tg);
      }
      js << "}";
      auto t = kLlamaCpp.find(dtype);
      if (t != kLlamaCpp.end() && o.shape == "110M") {
        // Percent of llama.cpp's figure: prefill against pp512, batch-1 decode against tg128.
        js << ", \"llama_cpp\": {\"pp512\": " << fmt(t->second.pp512)
           << ", \"tg128\": " << fmt(t->second.tg128)
           << "}, \"pct_of_llama_cpp\": {\"prefill\": " << fmt(100 * pp / t->second.pp512)
           << ", \"decode_b1\": " << (tg1 > 0 ? fmt(100 * tg1 / t->second.tg128) : "null")
           << "}";
      }
      js << "}";
    }
    js << "\n  ]\n}\n";
    std::cout << js.str();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_engine: " << e.what() << "\n";
    return 1;
  }
}
