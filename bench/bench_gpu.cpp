// GPU benchmark: the device's copy bandwidth and bf16 GEMM rate, then an 8B-shaped Llama
// (Llama-3-8B dimensions, random bf16 weights made on the device) through the CUDA engine:
// decode tokens/s at several batch sizes over a 1024-token context, prefill tokens/s for
// 2048-token prompts, each as a fraction of the measured ceilings. Prints a table; --json PATH
// also writes the figures as JSON. --cuda-graphs replays the decode steps as CUDA graphs;
// --graph-batches 1,16 adds decode rows of those batches with graphs (a second engine, built after
// the first is gone), so one run shows decode both ways. --quant-batches 1,8 (the default; empty:
// none) adds decode rows with Q8_0 weights read by the quantized GEMV (quantized_decode, another
// engine built last), and measures the bf16 rows of those batches too, to compare the two.
// --kv-dtype f16|f32 picks the KV cache's element type (batching.kv_dtype; f16, the serving
// default, unless given). --tiny swaps in a toy shape (2 layers of dim 256, vocab 512) and small
// runs, options after it still applying: a smoke run of every code path that the CUDA emulator
// finishes in a minute; its figures mean nothing.
//   bench_gpu [--json PATH] [--tiny] [--layers N] [--ctx 1024] [--prompt 2048]
//             [--batches 1,16,64,256] [--cuda-graphs] [--graph-batches 1,16] [--quant-batches 1,8]
//             [--kv-dtype f16|f32]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/cuda_engine.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/gemm.cuh"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Device-to-device copy bandwidth of `bytes`-sized copies, bytes read plus bytes written per
// second.
double copy_bandwidth(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  CUDA_CHECK(cudaMalloc(&a, bytes));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  const int iters = 10;
  CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i)
    CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaEventRecord(e1));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) * iters / (ms * 1e-3);
}

// bf16 GEMM rate (FLOP/s) of cuBLASLt on random n^3 operands, as the engine calls it.
double gemm_rate(int64_t n) {
  sy::cuda::bf16 *w = nullptr, *x = nullptr;
  float* y = nullptr;
  CUDA_CHECK(cudaMalloc(&w, sizeof(sy::cuda::bf16) * n * n));
  CUDA_CHECK(cudaMalloc(&x, sizeof(sy::cuda::bf16) * n * n));
  CUDA_CHECK(cudaMalloc(&y, sizeof(float) * n * n));
  CUDA_CHECK(sy::cuda::fill_uniform(w, n * n, 0.0f, 1.0f, 1, nullptr));
  CUDA_CHECK(sy::cuda::fill_uniform(x, n * n, 0.0f, 1.0f, 2, nullptr));
  sy::cuda::Gemm g;
  for (int i = 0; i < 3; ++i) CUBLAS_CHECK(g.run(w, x, n, n, n, y, nullptr));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  const int iters = 10;
  CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) CUBLAS_CHECK(g.run(w, x, n, n, n, y, nullptr));
  CUDA_CHECK(cudaEventRecord(e1));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * double(n) * n * n * iters / (ms * 1e-3);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::stoi(item));
  return v;
}

// Decode steps per sequence and batch: warm-up (they include a graph's capture), then timed.
constexpr int kWarmSteps = 3, kTimedSteps = 20;

struct DecodeRow {
  int batch;
  bool graphs;
  bool q8;  // weights read as Q8_0 blocks by the quantized GEMV
  double step_ms, tok_s, gb_s;
};

// Decode rows for each batch size: every sequence holds `ctx` cached tokens (random KV) and
// decodes warm + iters tokens; the timed steps are the last iters. weight_read: the weight bytes
// one step reads (for GB/s); kv_value_bytes: bytes of one cached value (2 for f16, 4 for f32).
std::vector<DecodeRow> decode_rows(sy::CudaEngine& e, const std::vector<int>& batches, int ctx,
                                   bool graphs, bool q8, double weight_read,
                                   double kv_value_bytes) {
  const sy::LlamaConfig& c = e.config();
  const int64_t kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  const double kv_bytes_per_token = 2.0 * kv_value_bytes * double(c.n_layers) * double(kv_dim);
  const int warm = kWarmSteps, iters = kTimedSteps;
  std::vector<DecodeRow> decode;
  for (int B : batches) {
    const int total = ctx + warm + iters;
    const int nb = (total + e.block_size() - 1) / e.block_size();
    std::vector<std::vector<int32_t>> bt(static_cast<size_t>(B));
    bool ok = true;
    for (auto& t : bt) {
      for (int i = 0; i < nb && ok; ++i) {
        auto b = e.pool().alloc();
        if (!b)
          ok = false;
        else
          t.push_back(*b);
      }
    }
    if (!ok) {
      std::printf("batch %d: KV pool too small, skipped\n", B);
      for (auto& t : bt)
        for (int32_t b : t) e.pool().free(b);
      continue;
    }
    std::vector<int32_t> tok(static_cast<size_t>(B), 1), ids;
    std::vector<sy::SampleControl> ctl(static_cast<size_t>(B));
    Clock::time_point t0;
    for (int s = 0; s < warm + iters; ++s) {
      if (s == warm) t0 = Clock::now();
      std::vector<sy::SeqStep> batch(static_cast<size_t>(B));
      for (int i = 0; i < B; ++i) {
        sy::SeqStep& st = batch[static_cast<size_t>(i)];
        st.tokens = &tok[static_cast<size_t>(i)];
        st.n_tokens = 1;
        st.n_past = ctx + s;
        st.block_table = bt[static_cast<size_t>(i)].data();
        st.n_blocks = nb;
      }
      e.step_sample(batch, ctl, ids);
      for (int i = 0; i < B; ++i) tok[static_cast<size_t>(i)] = ids[static_cast<size_t>(i)];
    }
    const double dt = seconds_since(t0) / iters;
    const double bytes = weight_read + B * (ctx + warm + iters / 2.0) * kv_bytes_per_token;
    decode.push_back({B, graphs, q8, dt * 1e3, B / dt, bytes / dt / 1e9});
    for (auto& t : bt)
      for (int32_t b : t) e.pool().free(b);
  }
  return decode;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  int layers = 32, ctx = 1024, prompt = 2048;
  std::vector<int> batches = {1, 16, 64, 256}, graph_batches, quant_batches = {1, 8};
  bool graphs = false, tiny = false;
  sy::kernels::DType kv_type = sy::kernels::DType::F16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") {
      json = next();
    } else if (a == "--tiny") {
      tiny = true;
      layers = 2;
      ctx = 64;
      prompt = 64;
      batches = graph_batches = quant_batches = {1, 4};
    } else if (a == "--layers")
      layers = std::stoi(next());
    else if (a == "--ctx")
      ctx = std::stoi(next());
    else if (a == "--prompt")
      prompt = std::stoi(next());
    else if (a == "--batches")
      batches = parse_list(next());
    else if (a == "--cuda-graphs")
      graphs = true;
    else if (a == "--graph-batches")
      graph_batches = parse_list(next());
    else if (a == "--quant-batches")
      quant_batches = parse_list(next());
    else if (a == "--kv-dtype") {
      const auto t = sy::kernels::parse_kv_type(next());
      if (!t || *t == sy::kernels::DType::Q8_0) {
        std::fprintf(stderr, "--kv-dtype: f16 or f32 (the CUDA engine has no q8_0 cache)\n");
        return 2;
      }
      kv_type = *t;
    } else {
      std::fprintf(stderr,
                   "usage: bench_gpu [--json PATH] [--tiny] [--layers N] [--ctx N] [--prompt N] "
                   "[--batches 1,16,...] [--cuda-graphs] [--graph-batches 1,16,...] "
                   "[--quant-batches 1,8,...] [--kv-dtype f16|f32]\n");
      return 2;
    }
  }
  // Each q8_0 row gets its bf16 counterpart.
  for (int b : quant_batches) {
    if (std::find(batches.begin(), batches.end(), b) == batches.end()) batches.push_back(b);
  }
  std::sort(batches.begin(), batches.end());
  if (sy::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu: no usable CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f GiB\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1u << 30));
  if (tiny) std::printf("--tiny: a toy shape for a smoke run; its figures mean nothing\n");

  // Full size: 2 GiB copies, far past the 60 MB L2, and 8192^3 products, long enough to reach
  // the peak rate. --tiny: what the emulator (2 GiB of memory, an f32 loop for cuBLASLt) does
  // in a second.
  const size_t copy_bytes = tiny ? size_t{16} << 20 : size_t{2} << 30;
  const int64_t gemm_n = tiny ? 256 : 8192;
  const double bw = copy_bandwidth(copy_bytes);
  const double gemm = gemm_rate(gemm_n);
  std::printf(
      "copy bandwidth (read + write): %.0f GB/s\nbf16 GEMM %lld^3 (cuBLASLt): %.0f TFLOP/s\n",
      bw / 1e9, static_cast<long long>(gemm_n), gemm / 1e12);

  // Llama-3-8B dimensions
  sy::LlamaConfig c;
  c.n_vocab = 128256;
  c.dim = 4096;
  c.n_layers = layers;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.ffn_dim = 14336;
  c.ctx_len = 8192;
  c.rope_dim = 128;
  c.rope_theta = 500000.0f;
  c.norm_eps = 1e-5f;
  if (tiny) {
    // Every width a multiple of 32 (whole Q8_0 blocks per row), grouped-query attention as in
    // the 8B shape, head_dim as in the 8B shape.
    c.n_vocab = 512;
    c.dim = 256;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 128;
    c.ffn_dim = 512;
    c.ctx_len = 256;
    c.rope_dim = 128;
  }
  int max_batch = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);
  for (int b : graph_batches) max_batch = std::max(max_batch, b);
  for (int b : quant_batches) max_batch = std::max(max_batch, b);
  sy::CudaEngineOptions o;
  o.max_batch_tokens = std::max(prompt, max_batch);
  o.max_logit_rows = max_batch;
  o.cuda_graphs = graphs;
  o.kv_type = kv_type;
  const double kv_value_bytes = kv_type == sy::kernels::DType::F32 ? 4.0 : 2.0;
  if (tiny) {
    // Just the KV blocks the runs take (decode_rows: max_batch sequences of every decode step's
    // context; the prefill: one prompt): the default fraction of free memory would have
    // randomize_kv fill 1.7 GB on the emulator.
    const int64_t bs = o.block_size, steps = ctx + kWarmSteps + kTimedSteps;
    o.n_blocks = static_cast<int32_t>(
        std::max<int64_t>(max_batch * ((steps + bs - 1) / bs), (prompt + bs - 1) / bs));
  }
  const auto t_load = Clock::now();
  auto e = sy::make_cuda_engine_synthetic(c, o, 42);
  e->randomize_kv(7);
  std::printf("%s model (%d layers): weights %.2f GB, KV cache %.2f GB (%s), built in %.1f s\n",
              tiny ? "toy" : "8B-shaped", layers, e->weight_bytes() / 1e9, e->kv_bytes() / 1e9,
              sy::kernels::kv_type_name(kv_type), seconds_since(t_load));

  const size_t weight_bytes = e->weight_bytes();
  // What a bf16 decode step reads of the weights: all of them but the embedding table, of which
  // it reads one row per token (as for the Q8_0 rows below).
  const double bf16_read =
      static_cast<double>(weight_bytes) - 2.0 * static_cast<double>(c.n_vocab) * c.dim;
  std::vector<DecodeRow> decode =
      decode_rows(*e, batches, ctx, graphs, false, bf16_read, kv_value_bytes);
  // prefill: one prompt per step
  double prefill_s = 0, prefill_tflops = 0;
  {
    const int nb = (prompt + e->block_size() - 1) / e->block_size();
    std::vector<int32_t> bt;
    for (int i = 0; i < nb; ++i) bt.push_back(*e->pool().alloc());
    std::vector<int32_t> tok(static_cast<size_t>(prompt));
    for (int i = 0; i < prompt; ++i) tok[static_cast<size_t>(i)] = (i * 7919) % c.n_vocab;
    std::vector<int32_t> ids;
    const std::vector<sy::SampleControl> ctl(1);
    sy::SeqStep st;
    st.tokens = tok.data();
    st.n_tokens = prompt;
    st.block_table = bt.data();
    st.n_blocks = nb;
    e->step_sample({st}, ctl, ids);  // warm-up
    const int reps = 3;
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) e->step_sample({st}, ctl, ids);
    prefill_s = seconds_since(t0) / reps;
    const double params =
        double(c.n_layers) * (double(c.dim) * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim +
                              double(c.n_heads) * c.head_dim * c.dim + 3.0 * c.dim * c.ffn_dim);
    const double attn = 4.0 * c.n_layers * c.n_heads * c.head_dim * (double(prompt) * prompt / 2.0);
    const double flops = 2.0 * params * prompt + attn + 2.0 * c.dim * double(c.n_vocab);
    prefill_tflops = flops / prefill_s / 1e12;
    for (int32_t b : bt) e->pool().free(b);
  }
  if (!graph_batches.empty()) {
    // The first engine's KV cache fills the device: it goes before the second is built.
    e.reset();
    o.cuda_graphs = true;
    const auto t_graphs = Clock::now();
    auto eg = sy::make_cuda_engine_synthetic(c, o, 42);
    eg->randomize_kv(7);
    std::printf("second engine, with CUDA graphs: built in %.1f s\n", seconds_since(t_graphs));
    for (const DecodeRow& d :
         decode_rows(*eg, graph_batches, ctx, true, false, bf16_read, kv_value_bytes))
      decode.push_back(d);
  }
  // What a Q8_0 decode step reads of the weights: every layer matrix and the output matrix as
  // 34-byte blocks of 32 weights, plus the f32 norms (the embedding rows are negligible).
  const double q8_params =
      double(c.n_layers) * (double(c.dim) * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim +
                            double(c.n_heads) * c.head_dim * c.dim + 3.0 * c.dim * c.ffn_dim) +
      double(c.n_vocab) * c.dim;
  const double q8_read = q8_params * 34.0 / 32.0 + 4.0 * (2.0 * c.dim * c.n_layers + c.dim);
  if (!quant_batches.empty()) {
    // As for graphs: only one engine at a time. Graphs as for the first engine's rows, so the
    // q8_0 rows differ from their bf16 counterparts in the weights alone.
    e.reset();
    o.cuda_graphs = graphs;
    o.quantized_decode = true;
    const auto t_q = Clock::now();
    auto eq = sy::make_cuda_engine_synthetic(c, o, 42);
    eq->randomize_kv(7);
    std::printf("engine with Q8_0 decode weights: weights %.2f GB (bf16 + Q8_0), built in %.1f s\n",
                eq->weight_bytes() / 1e9, seconds_since(t_q));
    for (const DecodeRow& d :
         decode_rows(*eq, quant_batches, ctx, graphs, true, q8_read, kv_value_bytes))
      decode.push_back(d);
  }

  std::printf(
      "\n| phase | batch | step ms | tokens/s | GB/s | fraction |\n|---|---|---|---|---|---|\n");
  for (const DecodeRow& d : decode) {
    std::printf("| decode ctx %d%s%s | %d | %.2f | %.0f | %.0f | %.2f of copy bandwidth |\n", ctx,
                d.graphs ? " graphs" : "", d.q8 ? " q8_0" : "", d.batch, d.step_ms, d.tok_s, d.gb_s,
                d.gb_s * 1e9 / bw);
  }
  std::printf("| prefill %d | 1 | %.1f | %.0f | - | %.2f of GEMM rate (%.0f TFLOP/s) |\n", prompt,
              prefill_s * 1e3, prompt / prefill_s, prefill_tflops * 1e12 / gemm, prefill_tflops);

  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\n  \"device\": \"" << prop.name << "\",\n  \"copy_bandwidth_gbs\": " << bw / 1e9
      << ",\n  \"gemm_bf16_tflops\": " << gemm / 1e12
      << ",\n  \"tiny\": " << (tiny ? "true" : "false") << ",\n  \"layers\": " << layers
      << ",\n  \"kv_dtype\": \"" << sy::kernels::kv_type_name(kv_type) << "\""
      << ",\n  \"weight_bytes\": " << weight_bytes
      << ",\n  \"bf16_weight_read_bytes\": " << bf16_read
      << ",\n  \"q8_0_weight_read_bytes\": " << q8_read << ",\n  \"decode\": [";
    for (size_t i = 0; i < decode.size(); ++i) {
      const DecodeRow& d = decode[i];
      f << (i ? ",\n" : "\n") << "    {\"batch\": " << d.batch << ", \"ctx\": " << ctx
        << ", \"cuda_graphs\": " << (d.graphs ? "true" : "false") << ", \"weights\": \""
        << (d.q8 ? "q8_0" : "bf16") << "\", \"step_ms\": " << d.step_ms
        << ", \"tokens_per_s\": " << d.tok_s << ", \"gbs\": " << d.gb_s
        << ", \"fraction_of_copy_bw\": " << d.gb_s * 1e9 / bw << "}";
    }
    f << "\n  ],\n  \"prefill\": {\"prompt\": " << prompt << ", \"ms\": " << prefill_s * 1e3
      << ", \"tokens_per_s\": " << prompt / prefill_s << ", \"tflops\": " << prefill_tflops
      << ", \"fraction_of_gemm\": " << prefill_tflops * 1e12 / gemm << "}\n}\n";
    std::printf("\nwrote %s\n", json.c_str());
  }
  return 0;
}
