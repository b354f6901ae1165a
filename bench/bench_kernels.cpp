// Times the CPU matmul on the weight shapes of a 110M-parameter Llama (dim 768, FFN 2048,
// vocab 32000, 12 layers) for each weight dtype and several token counts; prints JSON lines.
//
// Run: bench_kernels [threads=2] [dtypes=f32,f16,bf16,q8_0,q4_0] [tokens=1,8,32,512]
// (dtypes also takes q4_k, q5_k and q6_k)
// Each "model" line is one whole pass (12 layers + output) over distinct weight buffers, as a
// model step streams them, so caches hold no more than they would in a real step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"

using namespace sy::kernels;

namespace {

constexpr int kDim = 768, kFfn = 2048, kVocab = 32000, kLayers = 12;

struct Mat {
  std::vector<uint8_t> bytes;
  WeightView view;
  int kind;  // index into kShapeNames
};

const char* kShapeNames[] = {"attn_768x768", "ffn_up_2048x768", "ffn_down_768x2048",
                             "output_32000x768"};

/// Fills a matrix with pseudo-random values (xorshift: generating 110M values must be quick).
Mat make(DType t, int rows, int cols, int kind, uint64_t& state) {
  Mat m;
  const size_t rb = row_bytes(t, cols);
  m.bytes.resize(rb * static_cast<size_t>(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int r = 0; r < rows; ++r) {
    for (auto& v : row) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      v = (static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.1f;
    }
    quantize_row(t, row.data(), m.bytes.data() + rb * static_cast<size_t>(r), cols);
  }
  m.view = WeightView{t, m.bytes.data(), rows, cols};
  m.kind = kind;
  return m;
}

/// CPU time of the whole process: with threads=1 it is the kernel's own time, unaffected by
/// other processes competing for the cores (the wall-clock figures are).
double cpu_s() {
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

DType parse_type(const std::string& s) {
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "bf16") return DType::BF16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_0") return DType::Q4_0;
  if (s == "q4_k") return DType::Q4_K;
  if (s == "q5_k") return DType::Q5_K;
  if (s == "q6_k") return DType::Q6_K;
  std::fprintf(stderr, "unknown dtype %s\n", s.c_str());
  std::exit(2);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = s.find(',', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const auto types = split(argc > 2 ? argv[2] : "f32,f16,bf16,q8_0,q4_0");
  std::vector<int> tokens;
  for (const auto& s : split(argc > 3 ? argv[3] : "1,8,32,512"))
    tokens.push_back(std::atoi(s.c_str()));
  const int max_tokens = *std::max_element(tokens.begin(), tokens.end());

  ThreadPool pool(threads);
  std::vector<float> x(static_cast<size_t>(max_tokens) * kFfn),
      y(static_cast<size_t>(max_tokens) * kVocab);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;

  for (const auto& tname : types) {
    const DType t = parse_type(tname);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    std::vector<Mat> mats;  // per layer: q, k, v, o, gate, up, down; then output
    for (int l = 0; l < kLayers; ++l) {
      for (int i = 0; i < 4; ++i) mats.push_back(make(t, kDim, kDim, 0, state));
      for (int i = 0; i < 2; ++i) mats.push_back(make(t, kFfn, kDim, 1, state));
      mats.push_back(make(t, kDim, kFfn, 2, state));
    }
    mats.push_back(make(t, kVocab, kDim, 3, state));

    for (int nt : tokens) {
      // Enough passes for ~1 s of work per point, at least 2 (the first one only warms up).
      double kind_s[4] = {0, 0, 0, 0};
      double pass_s = 0.0;
      double pass_cpu_s = 0.0;
      double out1_s = 0.0;  // the output matrix for one token
      int passes = 0;
      const double t_start = now_s();
      for (int p = 0; (p < 3 || now_s() - t_start < 1.0) && p < 200; ++p) {
        double ks[4] = {0, 0, 0, 0};
        const double c0 = cpu_s();
        const double p0 = now_s();
        for (const auto& m : mats) {
          const double s = now_s();
          matmul(m.view, x.data(), nt, y.data(), &pool);
          ks[m.kind] += now_s() - s;
        }
        const double p1 = now_s();
        const double c1 = cpu_s();
        const double o0 = now_s();
        matmul(mats.back().view, x.data(), 1, y.data(), &pool);
        const double o1 = now_s();
        if (p == 0) continue;
        out1_s += o1 - o0;
        for (int k = 0; k < 4; ++k) kind_s[k] += ks[k];
        pass_s += p1 - p0;
        pass_cpu_s += c1 - c0;
        ++passes;
      }
      for (double& v : kind_s) v /= passes;
      pass_s /= passes;
      pass_cpu_s /= passes;
      out1_s /= passes;

      double bytes_total = 0.0, flops_total = 0.0;
      for (int k = 0; k < 4; ++k) {
        double bytes = 0.0, flops = 0.0;
        for (const auto& m : mats) {
          if (m.kind != k) continue;
          bytes += static_cast<double>(m.bytes.size());
          flops += 2.0 * static_cast<double>(m.view.rows) * static_cast<double>(m.view.cols) * nt;
        }
        bytes_total += bytes;
        flops_total += flops;
        std::printf(
            "{\"dtype\":\"%s\",\"threads\":%d,\"tokens\":%d,\"shape\":\"%s\",\"ms\":%.4f,\"GBps\":%"
            ".2f,"
            "\"GFLOPps\":%.2f}\n",
            tname.c_str(), threads, nt, kShapeNames[k], kind_s[k] * 1e3, bytes / kind_s[k] / 1e9,
            flops / kind_s[k] / 1e9);
      }
      // Prefill computes logits for the last token only, as llama.cpp's prompt processing does.
      const double out1 = out1_s;
      const double layers_s = kind_s[0] + kind_s[1] + kind_s[2];
      std::printf(
          "{\"dtype\":\"%s\",\"threads\":%d,\"tokens\":%d,\"shape\":\"model\",\"ms\":%.3f,\"GBps\":"
          "%.2f,"
          "\"GFLOPps\":%.2f,\"tok_per_s_all_logits\":%.1f,\"tok_per_s_last_logits\":%.1f,\"cpu_"
          "ms\":%.3f}\n",
          tname.c_str(), threads, nt, pass_s * 1e3, bytes_total / pass_s / 1e9,
          flops_total / pass_s / 1e9, nt / pass_s, nt / (layers_s + out1), pass_cpu_s * 1e3);
      std::fflush(stdout);
    }
  }
  return 0;
}
