// The CUDA backend: a batched step of the model's description (model/model.hpp: llama, qwen2,
// qwen3, gemma2, phi3 and the mixtures of experts: Mixtral-style llama, qwen2moe, olmoe) over
// a paged KV cache in device memory. All new tokens of a step form one (T, dim) activation
// matrix; matrix products go through cuBLASLt, the rest through the kernels of kernels/cuda.
// Only token ids, positions, block tables (and sampling controls) go to the device each step;
// logits or sampled ids come back. With cuda_graphs, pure decode steps replay a graph captured
// per padded batch size.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "gpu/cuda_engine.hpp"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/bias_add.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemv_q.cuh"
#include "kernels/cuda/head_rmsnorm.cuh"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sample.cuh"
#include "kernels/cuda/softcap.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace sy {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later queries start clean
    return 0;
  }
  return n;
}

namespace {

using cuda::bf16;

// Sequences adding at most this many tokens go through the decode kernel (one key pass per row);
// longer ones through the tiled prefill kernel, which reuses each key tile for 64 query rows.
constexpr int32_t kDecodeMaxTokens = 4;
// Row-splits of decode attention that the workspace holds: 4096 rows x 32 heads x 130 floats is
// 68 MB for an 8B-shaped model; more rows than this get fewer splits each.
constexpr int64_t kDecodeWorkspaceRowSplits = 4096;
// Fewest keys worth a separate split: below this the merge costs more than the parallelism gains.
constexpr int32_t kMinKeysPerSplit = 32;
constexpr int32_t kMaxSplits = 64;
// Host-to-device upload chunk: bounds the staging buffer while keeping copies large.
constexpr size_t kUploadChunkBytes = size_t{64} << 20;
// Largest accepted KV block: far above useful sizes, small enough for 32-bit slot arithmetic.
constexpr int32_t kMaxBlockSize = 1 << 16;
// Largest decode batch replayed as a CUDA graph; smaller batches are padded up to the next power
// of two (1, 2, 4, ...), so at most nine graphs per variant exist. Past 256 sequences the launch
// gaps a graph removes are small next to the step's own work.
constexpr int32_t kMaxGraphBatch = 256;
// Block-table entries per sequence that the graphs' fixed metadata first holds (1024 tokens at
// 16 per block); a longer sequence doubles it and the graphs are captured again.
constexpr int32_t kGraphMinBlocksPerSeq = 64;
// Steps of at most this many tokens run a mixture of experts wholly on the device: the grouping
// stays there and cuda::moe_matmul reads each expert's rows from it (no host round trip, so
// such steps can be graphs). Each expert's weights are then read once per kMoeTileRows of its
// rows, which stays bandwidth-bound while the rows are few: 16 tokens give Mixtral's 8 experts
// (top 2) 4 rows each on average. Longer steps copy the grouping's offsets to the host (one
// synchronisation per layer) and run one cuBLASLt product per active expert, on tensor cores.
constexpr int32_t kMoeDeviceMaxTokens = 16;

// Smallest power of two >= n (n >= 1).
int32_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return static_cast<int32_t>(std::min<int64_t>(p, INT32_MAX));
}

double gib(size_t b) {
  return static_cast<double>(b) / static_cast<double>(size_t{1} << 30);
}

std::string fmt_gib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", gib(b));
  return s;
}

// An owned device allocation.
class DevBuf {
 public:
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  void alloc(size_t bytes, const char* what) {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      p_ = nullptr;
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error(std::string("out of device memory allocating ") + what + " (" +
                               fmt_gib(bytes) + ", " + fmt_gib(free_b) + " free of " +
                               fmt_gib(total_b) + "): " + cudaGetErrorString(e));
    }
    bytes_ = bytes;
  }
  template <class U>
  U* as() const {
    return static_cast<U*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// An owned pinned host allocation (fast, truly asynchronous copies).
class HostBuf {
 public:
  HostBuf() = default;
  HostBuf(const HostBuf&) = delete;
  HostBuf& operator=(const HostBuf&) = delete;
  ~HostBuf() {
    if (p_) cudaFreeHost(p_);
  }
  void alloc(size_t bytes) {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p_, bytes, cudaHostAllocDefault));
    bytes_ = bytes;
  }
  template <class U>
  U* as() const {
    return static_cast<U*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

kernels::DType device_type(kernels::DType t);

// Every quantized type (not F32, F16, BF16): the types gemv_q reads straight from the file's
// blocks.
bool gemv_type(kernels::DType t) {
  return cuda::gemv_q_supports(device_type(t));
}

// Bytes of a weight as stored in the file.
size_t file_bytes(const kernels::WeightView& w) {
  return kernels::row_bytes(w.type, w.cols) * static_cast<size_t>(w.rows);
}

// A file's tensor type, checked to be one the device converts: each tensor is mapped by its own
// type, so files that mix types (Q4_K_M: Q4_K, Q6_K and f32 norms) convert tensor by tensor.
kernels::DType device_type(kernels::DType t) {
  const bool known = kernels::dtype_known(static_cast<uint32_t>(t));
  if (known && cuda::convert_supports(t)) return t;
  const char* name = known ? kernels::dtype_name(t) : nullptr;
  throw std::runtime_error(std::string("cuda backend does not support weight type ") +
                           (name ? name : "unknown") + " (" +
                           std::to_string(static_cast<uint32_t>(t)) + ") yet");
}

// Whether the cache of CudaEngineOptions::kv_type holds half (F16, llama.cpp's default) or float
// (F32) entries; q8_0, which the CPU engine also stores, has no CUDA kernels yet.
bool half_cache(kernels::DType t) {
  if (t == kernels::DType::F16) return true;
  if (t == kernels::DType::F32) return false;
  const char* name = kernels::kv_type_ok(t) ? kernels::kv_type_name(t) : nullptr;
  if (!name && kernels::dtype_known(static_cast<uint32_t>(t))) name = kernels::dtype_name(t);
  throw std::runtime_error(std::string("cuda backend does not support batching.kv_dtype ") +
                           (name ? std::string(name) : std::to_string(static_cast<uint32_t>(t))) +
                           " yet (use f16 or f32)");
}

template <class T>
class CudaEngineImpl final : public CudaEngine {
 public:
  CudaEngineImpl(std::shared_ptr<LlamaModel> model, const LlamaConfig& config,
                 const CudaEngineOptions& opts, const uint64_t* synth_seed);
  ~CudaEngineImpl() override {
    if (stream_) {
      cudaStreamSynchronize(stream_);
      drop_graphs();
      gemm_.reset();
      cudaStreamDestroy(stream_);
    }
  }

  const LlamaConfig& config() const override { return c_; }
  const LlamaModel& model() const override {
    if (!model_) throw std::logic_error("synthetic CUDA engine: no model file behind it");
    return *model_;
  }
  int32_t block_size() const override { return bs_; }
  BlockPool& pool() override { return *pool_; }
  void step(const std::vector<SeqStep>& batch, StepOutput& out) override;
  bool step_greedy(const std::vector<SeqStep>& batch, std::vector<int32_t>& ids) override {
    greedy_.assign(batch.size(), SampleControl{});  // temperature 0: argmax on the device
    // A sequence whose logits are not finite gets id cuda::kNoToken (-1): the KV of the step is
    // written already, so it is the caller's to end that sequence alone (the executor does).
    static_assert(cuda::kNoToken == -1, "the executor reads id -1 as non-finite logits");
    step_sample(batch, greedy_, ids);
    return true;
  }
  void step_sample(const std::vector<SeqStep>& batch, const std::vector<SampleControl>& controls,
                   std::vector<int32_t>& tokens) override;
  void copy_blocks(const std::vector<KvBlockCopy>& copies) override;
  void randomize_kv(uint64_t seed) override;
  size_t weight_bytes() const override { return weight_bytes_; }
  size_t kv_bytes() const override { return k_.bytes() + v_.bytes(); }

 private:
  // A matrix kept as the file's blocks for gemv_q (quantized_decode): runs of rows of one type
  // back to back in buf. A fused matrix is one run where its parts share a type, several where
  // they do not (Q4_K_M files give some layers a Q6_K attn_v next to Q4_K attn_q/attn_k).
  struct QWeight {
    struct Run {
      kernels::DType type;
      int64_t row0, rows;  // the run's rows of the matrix
      size_t offset;       // its first byte in buf
    };
    DevBuf buf;
    std::vector<Run> runs;
  };
  struct Layer {
    DevBuf attn_norm, wqkv, wo, ffn_norm, wgu, wdown;
    QWeight qwqkv, qwo, qwgu, qwdown;  // with quantized_decode only
    // f32 steps the model's description may add (empty where it has none): the q|k|v bias
    // (zeros for a missing part), per-head (or whole-row: olmoe) q/k norms, the output bias,
    // post-attention/FFN norms.
    DevBuf bqkv, q_norm, k_norm, bo, post_attn_norm, post_ffn_norm;
    // A mixture of experts (wgu / wdown then hold the shared expert, or nothing): the f32 router
    // (n_experts, dim), then the shared expert's gate row where there is one; every expert's
    // gate|up (n_experts, 2 expert_ffn, dim) and down (n_experts, dim, expert_ffn) back to back.
    DevBuf router, exp_gu, exp_down;
  };
  // Offsets (in int32 units) of the step's metadata inside the host and device buffers.
  struct Meta {
    size_t tokens, pos, slot, nkeys, window, sinks, sink_pos, row_seq, bt_off, bt, dec_rows,
        tile_row0, tile_len, out_rows, total;
  };
  // The offsets for T_ rows, S sequences and n_bt block-table entries.
  static Meta layout(size_t T_, size_t S, size_t n_bt);

  // Converts w to U (T, or f32 for the router) at dst, through the staging buffer.
  template <class U>
  void upload(const kernels::WeightView& w, U* dst, DevBuf& staging);
  // The parts' blocks back to back as one quantized matrix (parts of one type share a run).
  void upload_quant(std::initializer_list<const kernels::WeightView*> parts, QWeight& dst,
                    const char* what);
  void upload_norm(const float* src, DevBuf& dst, const char* what);
  // n f32 values to a fresh device buffer; nothing (an empty dst) where src is nullptr.
  void upload_f32(const float* src, int64_t n, DevBuf& dst, const char* what);
  void synth(T* dst, int64_t rows, int64_t cols, uint64_t seed);
  // A random Q8_0 (rows, cols) matrix in dst and its dequantized copy in w, as a Q8_0 file gives.
  void synth_q8(QWeight& dst, T* w, int64_t rows, int64_t cols, uint64_t seed, const char* what);
  int32_t plan(const std::vector<SeqStep>& batch, bool last_only, StepOutput* out);
  // The window a sequence's rows attend with: its own (SeqStep::window), the engine-wide
  // sliding_window option, or the narrower of the two; 0: full attention.
  int32_t row_window(const SeqStep& s) const {
    if (s.window > 0 && o_.sliding_window > 0) return std::min(s.window, o_.sliding_window);
    return s.window > 0 ? s.window : o_.sliding_window;
  }
  // The sinks of a sequence's rows: SeqStep::sinks where its rows have a window, else 0.
  int32_t row_sinks(const SeqStep& s) const {
    return s.window > 0 && row_window(s) > 0 ? s.sinks : 0;
  }
  void forward();
  // Layer L's mixture of experts: x += tmp (the attention block's output), then tmp = the
  // experts' weighted sum (plus the shared expert's) of the normed rows.
  void moe_ffn(const Layer& L);
  // Layer l's part of forward() that touches the cache of C (float or half): the new keys and
  // values (rows of qkv, rotated) into it, then attention of the decode rows and prefill tiles
  // over it into att. qs: the sink queries, nullptr in a step without sinks.
  template <class C>
  void attend(int l, const float* qkv, const float* qs, T* att);
  // forward() (then the sampling kernel with `sample`), directly or through the CUDA graph of
  // the step's padded decode batch, captured on first use.
  void run(bool sample);
  void launch_sample();
  void drop_graphs();
  void ensure_logit_rows(int32_t rows);
  template <class C>
  C* kc(int l) const {
    return k_.template as<C>() + int64_t{l} * layer_slots_ * kv_dim_;
  }
  template <class C>
  C* vc(int l) const {
    return v_.template as<C>() + int64_t{l} * layer_slots_ * kv_dim_;
  }

  std::shared_ptr<LlamaModel> model_;
  LlamaConfig c_;
  CudaEngineOptions o_;
  int32_t bs_;
  int64_t q_dim_, kv_dim_, qkv_dim_;
  float theta_scale_;
  int sms_ = 1;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<BlockPool> pool_;
  int64_t n_slots_ = 0;      // slots of the pool's blocks
  int64_t layer_slots_ = 0;  // slots per layer: the pool's, plus the padding block with graphs
  size_t weight_bytes_ = 0;

  // weights
  DevBuf tok_embd_, output_, output_norm_;
  DevBuf rope_freqs_, output_bias_;  // f32, empty where the model has none
  std::vector<Layer> layers_;
  // quantized_decode: every layer matrix has a quantized copy (qdecode_), the output matrix too
  // where the file stores it quantized (qoutput_); steps of at most kGemvMaxTokens tokens use them.
  bool qdecode_ = false, qoutput_ = false;
  QWeight qout_;
  DevBuf qx_;                    // f32 (kGemvMaxTokens, max(dim, q_dim, ffn)) inputs of gemv_q
  const T* output_w_ = nullptr;  // output_ or tok_embd_ when the file ties them
  // KV cache
  bool kv_half_ = true;  // entries are half (CudaEngineOptions::kv_type F16), else float
  DevBuf k_, v_;         // (n_layers, n_slots, kv_dim) each
  // activations, (T, width) row-major
  DevBuf x_, tmp_;  // f32 (T, dim) residual stream, block output
  DevBuf xn_;       // T (T, dim) normed input
  DevBuf qkv_;      // f32 (T, q_dim + 2 kv_dim)
  DevBuf att_;      // T (T, q_dim)
  DevBuf gu_;       // f32 (T, 2 ffn) gate | up
  DevBuf h_;        // T (T, ffn)
  DevBuf xr_;       // T (R, dim) normed rows that get logits
  DevBuf logits_;   // f32 (R, n_vocab)
  DevBuf attn_ws_;  // decode split partials
  // Mixture of experts, for T tokens and P = T * n_experts_used picks (empty without experts).
  int64_t ffn_ = 0;    // width of gu_ / h_: ffn_dim, or the shared expert's in a mixture
  DevBuf xf_;          // f32 (T, dim) normed rows: the router's and the device path's input
  DevBuf moe_logits_;  // f32 (T, n_experts [+ 1 shared gate])
  DevBuf moe_f_;       // f32 weights (P), then shared-expert gates (T)
  DevBuf moe_i_;       // int32 pos (P), src (P), offset (n_experts + 1), tiles
  DevBuf moe_gu_;      // f32 (P, 2 expert_ffn) grouped gate | up
  DevBuf moe_h_;       // (P, expert_ffn) activations: f32 on the device path, T on cuBLASLt's
  DevBuf moe_xg_;      // T (P, dim) grouped inputs of the cuBLASLt path
  DevBuf moe_y_;       // f32 (P, dim) grouped expert outputs
  DevBuf moe_ys_;      // f32 (T, dim) shared expert outputs
  HostBuf moe_off_h_;  // (n_experts + 1) offsets read back on the cuBLASLt path
  DevBuf meta_d_, params_d_, tokens_d_;
  HostBuf meta_h_, params_h_, tokens_h_;
  std::vector<SampleControl> greedy_;  // step_greedy's controls, kept to reuse their memory
  int32_t logit_rows_cap_ = 0;
  int64_t ws_row_splits_ = 0;  // (row, split) pairs the decode workspace holds
  DevBuf q_sink_;              // f32 (T, q_dim) sink queries; allocated by the first sinks step

  // CUDA graphs of decode steps, by (padded batch, sinks, sampling). A graph bakes in the
  // addresses of every buffer it touches: whatever reallocates one drops them all.
  std::map<std::tuple<int32_t, bool, bool>, cudaGraphExec_t> graphs_;
  DevBuf graph_meta_d_;  // fixed metadata of graph steps, laid out for kMaxGraphBatch rows
  HostBuf graph_meta_h_;
  int32_t graph_bt_cap_ = 0;  // block-table entries per sequence in graph metadata
  int32_t pad_block_ = -1;    // block outside the pool that padding rows write and read

  // the current step's plan
  Meta m_{};
  int32_t n_tok_ = 0, n_seq_ = 0, n_dec_ = 0, n_tiles_ = 0, n_out_ = 0, n_splits_ = 1;
  int32_t n_ret_ = 0;               // logit rows (or sampled ids) returned: n_out_ without padding
  int32_t graph_rows_ = 0;          // padded batch of a graph step; 0: the step runs directly
  bool sinks_ = false;              // some row of the step attends to sink slots
  const int32_t* md_ = nullptr;     // the step's device metadata (meta_d_ or graph_meta_d_)
  std::vector<int32_t> host_;       // metadata assembled here, then copied to pinned memory
  std::vector<int64_t> slot_sort_;  // duplicate-slot check
};

template <class T>
CudaEngineImpl<T>::CudaEngineImpl(std::shared_ptr<LlamaModel> model, const LlamaConfig& config,
                                  const CudaEngineOptions& opts, const uint64_t* synth_seed)
    : model_(std::move(model)), c_(config), o_(opts), bs_(opts.block_size) {
  const LlamaConfig& c = c_;
  if (cuda_device_count() <= o_.device || o_.device < 0) {
    throw std::runtime_error("cuda engine: no CUDA device " + std::to_string(o_.device));
  }
  if (bs_ < 1 || bs_ > kMaxBlockSize) {
    throw std::invalid_argument("CudaEngineOptions::block_size must be in [1, " +
                                std::to_string(kMaxBlockSize) + "]");
  }
  if (o_.max_batch_tokens < 1 || o_.max_logit_rows < 1 || o_.n_blocks < 0 ||
      !(o_.kv_memory_fraction > 0.0 && o_.kv_memory_fraction <= 1.0)) {
    throw std::invalid_argument("cuda engine: bad CudaEngineOptions");
  }
  kv_half_ = half_cache(o_.kv_type);
  const size_t kv_elem = kv_half_ ? sizeof(half) : sizeof(float);  // bytes of one entry
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0 || c.head_dim > cuda::kMaxHeadDim ||
      c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim || c.dim <= 0 || c.n_vocab <= 0) {
    throw std::invalid_argument(
        "cuda engine: unsupported shape (head_dim <= " + std::to_string(cuda::kMaxHeadDim) +
        ", n_heads a multiple of n_kv_heads, even rope_dim)");
  }
  CUDA_CHECK(cudaSetDevice(o_.device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, o_.device));
  sms_ = prop.multiProcessorCount;
  q_dim_ = int64_t{c.n_heads} * c.head_dim;
  kv_dim_ = int64_t{c.n_kv_heads} * c.head_dim;
  qkv_dim_ = q_dim_ + 2 * kv_dim_;
  // The same float expression as the CPU reference, so both build identical angles.
  theta_scale_ = std::pow(c.rope_theta, -2.0f / static_cast<float>(c.rope_dim));

  // A mixture of experts: its sizes within what the routing kernels take.
  const bool moe = c.n_experts > 0;
  const bool shared = moe && c.shared_expert_ffn_dim > 0;
  if (moe) {
    if (synth_seed) {
      throw std::invalid_argument("synthetic CUDA engine: no mixture-of-experts weights to make");
    }
    if (c.n_experts > cuda::kMoeMaxExperts || c.n_experts_used < 1 ||
        c.n_experts_used > c.n_experts || c.expert_ffn_dim < 1) {
      throw std::invalid_argument("cuda engine: unsupported mixture of experts (at most " +
                                  std::to_string(cuda::kMoeMaxExperts) +
                                  " experts, 1 <= experts used <= experts)");
    }
  }
  // The dense feed-forward's width: in a mixture of experts, the shared expert's (or none).
  ffn_ = moe ? c.shared_expert_ffn_dim : c.ffn_dim;

  // Weights must fit before anything is uploaded.
  const bool tied = model_ && model_->weights().output.data == model_->weights().tok_embd.data;
  const int64_t dim = c.dim, F = ffn_, V = c.n_vocab;
  const int64_t E = c.n_experts, Fe = c.expert_ffn_dim;
  const int64_t router_rows = moe ? E + (shared ? 1 : 0) : 0;
  const int64_t per_layer =
      qkv_dim_ * dim + dim * q_dim_ + 2 * F * dim + dim * F + 3 * E * Fe * dim;
  size_t wbytes =
      sizeof(T) * static_cast<size_t>(per_layer * c.n_layers + V * dim * (tied ? 1 : 2)) +
      sizeof(float) * static_cast<size_t>((2 + router_rows) * dim * c.n_layers + dim);
  if (model_) {
    // The f32 extras a description may add: biases, q/k (per head or whole-row) and post norms,
    // rope factors.
    const int64_t qk_norms = c.qk_norm_whole ? q_dim_ + kv_dim_ : 2 * c.head_dim;
    const int64_t extras = (qkv_dim_ + qk_norms + 3 * dim) * c.n_layers + V + c.rope_dim / 2;
    wbytes += sizeof(float) * static_cast<size_t>(extras);
  }
  if (o_.quantized_decode && model_) {
    // Only when every layer matrix has a quantized type gemv_q reads. A mixture of experts has
    // no dense layer matrices: its experts always run from their dequantized copies.
    const LlamaWeights& w = model_->weights();
    qdecode_ = !w.layers.empty() && !moe;
    size_t qbytes = 0;
    for (const LlamaLayer& S : w.layers) {
      // Fused parts may differ in type (a run per type, see QWeight).
      for (const auto* m : {&S.wq, &S.wk, &S.wv, &S.wo, &S.w_gate, &S.w_up, &S.w_down}) {
        qdecode_ = qdecode_ && gemv_type(m->type);
        qbytes += file_bytes(*m);
      }
    }
    qoutput_ = qdecode_ && gemv_type(w.output.type);
    if (qoutput_) qbytes += file_bytes(w.output);
    if (qdecode_) wbytes += qbytes;
  }
  if (o_.quantized_decode && synth_seed) {
    // A synthetic Q8_0 model: every layer matrix and the output matrix as Q8_0 blocks (as in a
    // Q8_0 file of this shape), where every row holds whole blocks.
    qdecode_ = c.n_layers > 0 && dim % kernels::kQK == 0 && q_dim_ % kernels::kQK == 0 &&
               F % kernels::kQK == 0;
    qoutput_ = qdecode_;
    if (qdecode_) {
      wbytes += kernels::row_bytes(kernels::DType::Q8_0, per_layer * c.n_layers + V * dim);
    }
  }
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (wbytes > free_b) {
    throw std::runtime_error("model does not fit: its weights need " + fmt_gib(wbytes) +
                             " on the device, " + fmt_gib(free_b) + " free of " + fmt_gib(total_b));
  }
  weight_bytes_ = wbytes;

  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<cuda::Gemm>();

  layers_.resize(static_cast<size_t>(c.n_layers));
  tok_embd_.alloc(sizeof(T) * V * dim, "token embeddings");
  if (!tied) output_.alloc(sizeof(T) * V * dim, "output matrix");
  output_w_ = tied ? tok_embd_.template as<T>() : output_.template as<T>();
  for (auto& L : layers_) {
    L.wqkv.alloc(sizeof(T) * qkv_dim_ * dim, "wq|wk|wv");
    L.wo.alloc(sizeof(T) * dim * q_dim_, "wo");
    L.wgu.alloc(sizeof(T) * 2 * F * dim, moe ? "shared expert gate|up" : "w_gate|w_up");
    L.wdown.alloc(sizeof(T) * dim * F, moe ? "shared expert down" : "w_down");
    if (moe) {
      L.router.alloc(sizeof(float) * router_rows * dim, "router");
      L.exp_gu.alloc(sizeof(T) * E * 2 * Fe * dim, "experts' gate|up");
      L.exp_down.alloc(sizeof(T) * E * dim * Fe, "experts' down");
    }
  }
  if (synth_seed) {
    uint64_t s = *synth_seed;
    const std::vector<float> ones(static_cast<size_t>(dim), 1.0f);
    synth(tok_embd_.template as<T>(), V, dim, s++);
    if (qoutput_) {
      synth_q8(qout_, output_.template as<T>(), V, dim, s++, "quantized output matrix");
    } else if (!tied) {
      synth(output_.template as<T>(), V, dim, s++);
    }
    upload_norm(ones.data(), output_norm_, "output_norm");
    for (auto& L : layers_) {
      if (qdecode_) {
        synth_q8(L.qwqkv, L.wqkv.template as<T>(), qkv_dim_, dim, s++, "quantized wq|wk|wv");
        synth_q8(L.qwo, L.wo.template as<T>(), dim, q_dim_, s++, "quantized wo");
        synth_q8(L.qwgu, L.wgu.template as<T>(), 2 * F, dim, s++, "quantized w_gate|w_up");
        synth_q8(L.qwdown, L.wdown.template as<T>(), dim, F, s++, "quantized w_down");
      } else {
        synth(L.wqkv.template as<T>(), qkv_dim_, dim, s++);
        synth(L.wo.template as<T>(), dim, q_dim_, s++);
        synth(L.wgu.template as<T>(), 2 * F, dim, s++);
        synth(L.wdown.template as<T>(), dim, F, s++);
      }
      upload_norm(ones.data(), L.attn_norm, "attn_norm");
      upload_norm(ones.data(), L.ffn_norm, "ffn_norm");
    }
  } else {
    const LlamaWeights& w = model_->weights();
    DevBuf staging;
    staging.alloc(kUploadChunkBytes, "upload staging");
    upload(w.tok_embd, tok_embd_.template as<T>(), staging);
    if (!tied) upload(w.output, output_.template as<T>(), staging);
    upload_norm(w.output_norm, output_norm_, "output_norm");
    upload_f32(w.output_bias, V, output_bias_, "output bias");
    upload_f32(w.rope_freqs, c.rope_dim / 2, rope_freqs_, "rope_freqs");
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LlamaLayer& S = w.layers[l];
      Layer& L = layers_[l];
      // Fused projections: rows of wq, wk, wv back to back give one (q + 2 kv, dim) matrix; the
      // same for gate and up. One product each instead of three and two.
      upload(S.wq, L.wqkv.template as<T>(), staging);
      upload(S.wk, L.wqkv.template as<T>() + q_dim_ * dim, staging);
      upload(S.wv, L.wqkv.template as<T>() + (q_dim_ + kv_dim_) * dim, staging);
      upload(S.wo, L.wo.template as<T>(), staging);
      if (moe) {
        // Each expert's slice of a 3-D stack is a matrix of its own type (Q4_K_M files give some
        // layers Q6_K down projections): converted expert by expert, gate and up rows fused.
        upload(S.router, L.router.template as<float>(), staging);
        if (shared) {
          CUDA_CHECK(cudaMemcpy(L.router.template as<float>() + E * dim, S.shexp_gate_inp,
                                sizeof(float) * static_cast<size_t>(dim), cudaMemcpyHostToDevice));
        }
        for (int64_t e = 0; e < E; ++e) {
          const auto u = static_cast<size_t>(e);
          T* gu = L.exp_gu.template as<T>() + e * 2 * Fe * dim;
          upload(S.exp_gate[u], gu, staging);
          upload(S.exp_up[u], gu + Fe * dim, staging);
          upload(S.exp_down[u], L.exp_down.template as<T>() + e * dim * Fe, staging);
        }
        if (shared) {
          upload(S.shexp_gate, L.wgu.template as<T>(), staging);
          upload(S.shexp_up, L.wgu.template as<T>() + F * dim, staging);
          upload(S.shexp_down, L.wdown.template as<T>(), staging);
        }
      } else {
        upload(S.w_gate, L.wgu.template as<T>(), staging);
        upload(S.w_up, L.wgu.template as<T>() + F * dim, staging);
        upload(S.w_down, L.wdown.template as<T>(), staging);
      }
      upload_norm(S.attn_norm, L.attn_norm, "attn_norm");
      upload_norm(S.ffn_norm, L.ffn_norm, "ffn_norm");
      if (S.bq || S.bk || S.bv) {
        std::vector<float> b(static_cast<size_t>(qkv_dim_), 0.0f);
        if (S.bq) std::copy(S.bq, S.bq + q_dim_, b.begin());
        if (S.bk) std::copy(S.bk, S.bk + kv_dim_, b.begin() + q_dim_);
        if (S.bv) std::copy(S.bv, S.bv + kv_dim_, b.begin() + q_dim_ + kv_dim_);
        upload_f32(b.data(), qkv_dim_, L.bqkv, "bq|bk|bv");
      }
      upload_f32(S.q_norm, c.qk_norm_whole ? q_dim_ : c.head_dim, L.q_norm, "attn_q_norm");
      upload_f32(S.k_norm, c.qk_norm_whole ? kv_dim_ : c.head_dim, L.k_norm, "attn_k_norm");
      upload_f32(S.bo, dim, L.bo, "attn_output bias");
      upload_f32(S.post_attn_norm, dim, L.post_attn_norm, "post_attention_norm");
      upload_f32(S.post_ffn_norm, dim, L.post_ffn_norm, "post_ffw_norm");
      if (qdecode_) {
        upload_quant({&S.wq, &S.wk, &S.wv}, L.qwqkv, "quantized wq|wk|wv");
        upload_quant({&S.wo}, L.qwo, "quantized wo");
        upload_quant({&S.w_gate, &S.w_up}, L.qwgu, "quantized w_gate|w_up");
        upload_quant({&S.w_down}, L.qwdown, "quantized w_down");
      }
    }
    if (qoutput_) upload_quant({&w.output}, qout_, "quantized output matrix");
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));

  // Scratch for a step of max_batch_tokens new tokens.
  const int64_t Tm = o_.max_batch_tokens;
  x_.alloc(sizeof(float) * Tm * dim, "activations");
  tmp_.alloc(sizeof(float) * Tm * dim, "activations");
  xn_.alloc(sizeof(T) * Tm * dim, "activations");
  qkv_.alloc(sizeof(float) * Tm * qkv_dim_, "activations");
  att_.alloc(sizeof(T) * Tm * q_dim_, "activations");
  gu_.alloc(sizeof(float) * Tm * 2 * F, "activations");
  h_.alloc(sizeof(T) * Tm * F, "activations");
  if (qdecode_) {
    qx_.alloc(sizeof(float) * cuda::kGemvMaxTokens * std::max({dim, q_dim_, F}), "gemv inputs");
  }
  if (moe) {
    const int64_t K = c.n_experts_used, P = Tm * K;
    // Tile entries: as many as a step of the device path can use.
    const int64_t tiles = cuda::moe_max_tiles(std::min<int64_t>(Tm, kMoeDeviceMaxTokens),
                                              c.n_experts_used, c.n_experts);
    xf_.alloc(sizeof(float) * Tm * dim, "activations");
    moe_logits_.alloc(sizeof(float) * Tm * router_rows, "router logits");
    moe_f_.alloc(sizeof(float) * (P + Tm), "expert weights");
    moe_i_.alloc(sizeof(int32_t) * (2 * P + E + 1 + 2 * tiles), "expert grouping");
    moe_gu_.alloc(sizeof(float) * P * 2 * Fe, "expert activations");
    moe_h_.alloc(sizeof(float) * P * Fe, "expert activations");  // f32, or T in fewer bytes
    if (Tm > kMoeDeviceMaxTokens) moe_xg_.alloc(sizeof(T) * P * dim, "expert inputs");
    moe_y_.alloc(sizeof(float) * P * dim, "expert outputs");
    if (shared) moe_ys_.alloc(sizeof(float) * Tm * dim, "shared expert outputs");
    moe_off_h_.alloc(sizeof(int32_t) * static_cast<size_t>(E + 1));
  }
  // Every decode row needs one split's worth at least, however large the step.
  ws_row_splits_ = std::max<int64_t>(kDecodeWorkspaceRowSplits, Tm);
  attn_ws_.alloc(sizeof(float) * cuda::attention_decode_workspace(static_cast<int>(ws_row_splits_),
                                                                  c.n_heads, c.head_dim, 1),
                 "attention workspace");
  ensure_logit_rows(std::min(o_.max_logit_rows, o_.max_batch_tokens));

  // KV pool: what is asked for, or a fraction of what is left.
  const size_t per_block = kv_elem * static_cast<size_t>(bs_) * c.n_layers * kv_dim_ * 2;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t fit = static_cast<int64_t>(static_cast<double>(free_b) * o_.kv_memory_fraction) /
                      static_cast<int64_t>(per_block);
  const int64_t min_tokens = std::min<int64_t>(std::max(c.ctx_len, 1), Tm);
  const int64_t need = (min_tokens + bs_ - 1) / bs_;
  // Slots are 32-bit in the step metadata.
  const int64_t n_blocks = o_.n_blocks > 0 ? std::min<int64_t>(o_.n_blocks, INT32_MAX / bs_)
                                           : std::min<int64_t>(fit, INT32_MAX / bs_);
  // An explicit n_blocks is taken as asked (tests use small pools); a derived one must hold at
  // least one full step.
  if (n_blocks > fit || (o_.n_blocks == 0 && n_blocks < need)) {
    throw std::runtime_error(
        "model does not fit: after " + fmt_gib(wbytes) + " of weights and the step buffers, " +
        fmt_gib(free_b) + " are free, room for " + std::to_string(fit) + " KV blocks of " +
        std::to_string(bs_) + " tokens; " + std::to_string(std::max(n_blocks, need)) + " needed (" +
        std::to_string(min_tokens) + " tokens at least)");
  }
  pool_ = std::make_unique<BlockPool>(static_cast<int32_t>(n_blocks));
  n_slots_ = n_blocks * bs_;
  layer_slots_ = n_slots_;
  if (o_.cuda_graphs) {
    // Padding rows of graph steps need a block of their own; a slot id must stay 32-bit.
    if (n_blocks >= INT32_MAX / bs_) throw std::invalid_argument("cuda engine: too many KV blocks");
    pad_block_ = static_cast<int32_t>(n_blocks);
    layer_slots_ += bs_;
  }
  k_.alloc(kv_elem * static_cast<size_t>(c.n_layers * layer_slots_ * kv_dim_), "K cache");
  v_.alloc(kv_elem * static_cast<size_t>(c.n_layers * layer_slots_ * kv_dim_), "V cache");
}

template <class T>
template <class U>
void CudaEngineImpl<T>::upload(const kernels::WeightView& w, U* dst, DevBuf& staging) {
  const size_t rb = kernels::row_bytes(w.type, w.cols);
  const int64_t rows_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(staging.bytes() / rb));
  if (rb > staging.bytes()) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    staging.alloc(rb, "upload staging");
  }
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; r += rows_per_chunk) {
    const int64_t n = std::min(rows_per_chunk, w.rows - r);
    // The previous chunk's conversion must finish before the staging buffer is overwritten.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpyAsync(staging.template as<void>(), src + r * rb,
                               static_cast<size_t>(n) * rb, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cuda::convert_rows<U>(device_type(w.type), staging.template as<void>(), n, w.cols,
                                     dst + r * w.cols, stream_));
  }
}

template <class T>
void CudaEngineImpl<T>::upload_quant(std::initializer_list<const kernels::WeightView*> parts,
                                     QWeight& dst, const char* what) {
  size_t bytes = 0;
  for (const auto* w : parts) bytes += file_bytes(*w);
  dst.buf.alloc(bytes, what);
  dst.runs.clear();
  size_t at = 0;
  int64_t row = 0;
  for (const auto* w : parts) {
    const kernels::DType t = device_type(w->type);
    if (!dst.runs.empty() && dst.runs.back().type == t) {
      dst.runs.back().rows += w->rows;
    } else {
      dst.runs.push_back({t, row, w->rows, at});
    }
    CUDA_CHECK(cudaMemcpy(dst.buf.template as<uint8_t>() + at, w->data, file_bytes(*w),
                          cudaMemcpyHostToDevice));
    at += file_bytes(*w);
    row += w->rows;
  }
}

template <class T>
void CudaEngineImpl<T>::upload_f32(const float* src, int64_t n, DevBuf& dst, const char* what) {
  if (!src) return;
  dst.alloc(sizeof(float) * static_cast<size_t>(n), what);
  CUDA_CHECK(cudaMemcpy(dst.template as<float>(), src, sizeof(float) * static_cast<size_t>(n),
                        cudaMemcpyHostToDevice));
}

template <class T>
void CudaEngineImpl<T>::upload_norm(const float* src, DevBuf& dst, const char* what) {
  dst.alloc(sizeof(float) * static_cast<size_t>(c_.dim), what);
  CUDA_CHECK(cudaMemcpy(dst.template as<float>(), src, sizeof(float) * static_cast<size_t>(c_.dim),
                        cudaMemcpyHostToDevice));
}

template <class T>
void CudaEngineImpl<T>::synth(T* dst, int64_t rows, int64_t cols, uint64_t seed) {
  // Uniform in +-sqrt(3 / cols): unit-variance inputs give unit-variance outputs, so activations
  // stay in range through all layers.
  const float scale = std::sqrt(3.0f / static_cast<float>(cols));
  CUDA_CHECK(cuda::fill_uniform<T>(dst, rows * cols, 0.0f, scale, seed, stream_));
}

template <class T>
void CudaEngineImpl<T>::synth_q8(QWeight& dst, T* w, int64_t rows, int64_t cols, uint64_t seed,
                                 const char* what) {
  dst.runs = {{kernels::DType::Q8_0, 0, rows, 0}};
  dst.buf.alloc(kernels::row_bytes(kernels::DType::Q8_0, cols) * static_cast<size_t>(rows), what);
  // The same spread as synth()'s bf16 weights.
  const float scale = std::sqrt(3.0f / static_cast<float>(cols));
  CUDA_CHECK(cuda::fill_q8_0(dst.buf.template as<void>(), rows, cols, scale, seed, stream_));
  CUDA_CHECK(cuda::convert_rows<T>(kernels::DType::Q8_0, dst.buf.template as<void>(), rows, cols, w,
                                   stream_));
}

template <class T>
void CudaEngineImpl<T>::copy_blocks(const std::vector<KvBlockCopy>& copies) {
  // One cache for every layer (no window group on this backend).
  validate_copies(copies, pool_->n_total(), 0);
  if (copies.empty()) return;
  // (n_layers, layer_slots, kv_dim): a block is one run of bs_ slots in each layer, so each copy
  // is one strided 2-D copy of n_layers rows per cache, on the step stream, ahead of the step
  // that reads it.
  const size_t elem = kv_half_ ? sizeof(half) : sizeof(float);
  const size_t width = elem * static_cast<size_t>(bs_) * static_cast<size_t>(kv_dim_);
  const size_t pitch = elem * static_cast<size_t>(layer_slots_) * static_cast<size_t>(kv_dim_);
  for (const KvBlockCopy& cp : copies) {
    const size_t from = width * static_cast<size_t>(cp.src);
    const size_t to = width * static_cast<size_t>(cp.dst);
    for (DevBuf* buf : {&k_, &v_}) {
      uint8_t* base = buf->template as<uint8_t>();
      CUDA_CHECK(cudaMemcpy2DAsync(base + to, pitch, base + from, pitch, width,
                                   static_cast<size_t>(c_.n_layers), cudaMemcpyDeviceToDevice,
                                   stream_));
    }
  }
}

template <class T>
void CudaEngineImpl<T>::randomize_kv(uint64_t seed) {
  const int64_t n = int64_t{c_.n_layers} * layer_slots_ * kv_dim_;
  const auto fill = [&](auto* k, auto* v) {  // in the cache's element type
    CUDA_CHECK(cuda::fill_uniform(k, n, 0.0f, 1.0f, seed, stream_));
    CUDA_CHECK(cuda::fill_uniform(v, n, 0.0f, 1.0f, seed + 1, stream_));
  };
  if (kv_half_) {
    fill(k_.template as<half>(), v_.template as<half>());
  } else {
    fill(k_.template as<float>(), v_.template as<float>());
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

template <class T>
void CudaEngineImpl<T>::ensure_logit_rows(int32_t rows) {
  if (rows <= logit_rows_cap_) return;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  drop_graphs();
  logits_.alloc(sizeof(float) * static_cast<size_t>(rows) * c_.n_vocab, "logits");
  xr_.alloc(sizeof(T) * static_cast<size_t>(rows) * c_.dim, "final norm rows");
  params_d_.alloc(sizeof(cuda::SampleParams) * static_cast<size_t>(rows), "sampling controls");
  tokens_d_.alloc(sizeof(int32_t) * static_cast<size_t>(rows), "sampled tokens");
  params_h_.alloc(sizeof(cuda::SampleParams) * static_cast<size_t>(rows));
  tokens_h_.alloc(sizeof(int32_t) * static_cast<size_t>(rows));
  logit_rows_cap_ = rows;
}

template <class T>
typename CudaEngineImpl<T>::Meta CudaEngineImpl<T>::layout(size_t T_, size_t S, size_t n_bt) {
  Meta m{};
  m.tokens = 0;
  m.pos = m.tokens + T_;
  m.slot = m.pos + T_;
  m.nkeys = m.slot + T_;
  m.window = m.nkeys + T_;
  m.sinks = m.window + T_;
  m.sink_pos = m.sinks + T_;
  m.row_seq = m.sink_pos + T_;
  m.bt_off = m.row_seq + T_;
  m.bt = m.bt_off + S;
  m.dec_rows = m.bt + n_bt;
  m.tile_row0 = m.dec_rows + T_;
  m.tile_len = m.tile_row0 + T_;
  m.out_rows = m.tile_len + T_;
  m.total = m.out_rows + T_;
  return m;
}

template <class T>
void CudaEngineImpl<T>::drop_graphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

// Checks the whole batch before anything is written (a refused step leaves the cache as it was),
// lays the new tokens out as rows [0, T), builds the metadata and copies it to the device.
// Returns the number of logit rows.
template <class T>
int32_t CudaEngineImpl<T>::plan(const std::vector<SeqStep>& batch, bool last_only,
                                StepOutput* out) {
  // A step that threw half way may have left copies in flight from the pinned buffers.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  // The checks every backend shares (gpu/engine.cpp); then the sizes this plan needs.
  const int64_t total = validate_batch(
      batch, {o_.max_batch_tokens, bs_, pool_->n_total(), c_.n_vocab, o_.sliding_window});
  int64_t n_bt = 0, max_need = 0;
  bool any_sinks = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    const int64_t end = int64_t{s.n_past} + s.n_tokens;
    const int64_t need = (end + bs_ - 1) / bs_;
    const int32_t w = row_window(s);
    any_sinks =
        any_sinks || std::min<int64_t>(row_sinks(s), w > 0 ? std::max<int64_t>(0, end - w) : 0) > 0;
    n_bt += need;
    max_need = std::max(max_need, need);
  }
  const size_t S = batch.size();
  sinks_ = any_sinks;

  // A pure decode step with cuda_graphs runs as the graph of its batch padded to a power of two:
  // padding rows decode token 0 at position 0 into the private pad block, and every sequence's
  // block table sits at a fixed stride, so the graph's metadata layout depends only on the size.
  graph_rows_ = 0;
  if (o_.cuda_graphs && S > 0 && total == static_cast<int64_t>(S)) {
    const int32_t rows = pow2_at_least(static_cast<int64_t>(S));
    // A mixture of experts is graph-safe only on its device path (moe_ffn): larger decode
    // batches run directly, with the cuBLASLt path's per-layer synchronisation.
    const int32_t cap = c_.n_experts > 0 ? kMoeDeviceMaxTokens : kMaxGraphBatch;
    if (rows <= cap && rows <= o_.max_batch_tokens) graph_rows_ = rows;
  }
  if (graph_rows_ > 0 && max_need > graph_bt_cap_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    drop_graphs();
    graph_bt_cap_ = std::max(kGraphMinBlocksPerSeq, pow2_at_least(max_need));
    const Meta big =
        layout(kMaxGraphBatch, kMaxGraphBatch, static_cast<size_t>(kMaxGraphBatch) * graph_bt_cap_);
    graph_meta_h_.alloc(sizeof(int32_t) * big.total);
    graph_meta_d_.alloc(sizeof(int32_t) * big.total, "graph step metadata");
  }
  const size_t T_ = graph_rows_ > 0 ? static_cast<size_t>(graph_rows_) : static_cast<size_t>(total);
  const size_t n_seq = graph_rows_ > 0 ? T_ : S;
  const size_t bt_stride = graph_rows_ > 0 ? static_cast<size_t>(graph_bt_cap_) : 0;
  n_tok_ = static_cast<int32_t>(T_);
  n_seq_ = static_cast<int32_t>(n_seq);

  Meta& m = m_;
  m = layout(T_, n_seq, graph_rows_ > 0 ? n_seq * bt_stride : static_cast<size_t>(n_bt));
  host_.resize(m.total);
  int32_t* H = host_.data();
  slot_sort_.resize(static_cast<size_t>(total));

  int32_t row = 0, bt_at = 0, max_dec_keys = 0;
  n_dec_ = n_tiles_ = n_out_ = 0;
  if (out) {
    out->offset.resize(S);
    out->count.resize(S);
  }
  for (size_t i = 0; i < S; ++i) {
    const SeqStep& s = batch[i];
    const int32_t need = static_cast<int32_t>((int64_t{s.n_past} + s.n_tokens + bs_ - 1) / bs_);
    if (graph_rows_ > 0) bt_at = static_cast<int32_t>(i * bt_stride);
    H[m.bt_off + i] = bt_at;
    std::copy(s.block_table, s.block_table + need, H + m.bt + bt_at);
    bt_at += need;
    const bool all = s.all_logits && !last_only;
    if (out) {
      out->offset[i] = n_out_;
      out->count[i] = all ? s.n_tokens : 1;
    }
    const int32_t w = row_window(s), ns = row_sinks(s);
    // The sink query's position (docs/kv_policies.md): no query-key distance to a sink exceeds
    // sinks + window - 1, as in StreamingLLM's cache positions.
    const int64_t sink_at = int64_t{ns} + w - 1;
    const int32_t row0 = row;
    for (int32_t t = 0; t < s.n_tokens; ++t, ++row) {
      const int64_t logical = int64_t{s.n_past} + t;
      const int64_t slot = int64_t{s.block_table[logical / bs_]} * bs_ + logical % bs_;
      const int32_t p = s.positions ? s.positions[t] : s.n_past + t;
      H[m.tokens + row] = s.tokens[t];
      H[m.pos + row] = p;
      H[m.slot + row] = static_cast<int32_t>(slot);
      slot_sort_[static_cast<size_t>(row)] = slot;
      H[m.nkeys + row] = s.n_past + t + 1;
      H[m.window + row] = w;
      H[m.sinks + row] = ns;
      H[m.sink_pos + row] = ns > 0 ? static_cast<int32_t>(std::min<int64_t>(p, sink_at)) : p;
      H[m.row_seq + row] = static_cast<int32_t>(i);
      if (all || t == s.n_tokens - 1) H[m.out_rows + n_out_++] = row;
    }
    if (s.n_tokens <= kDecodeMaxTokens) {
      for (int32_t r = row0; r < row; ++r) H[m.dec_rows + n_dec_++] = r;
      const int32_t end = s.n_past + s.n_tokens;
      max_dec_keys = std::max(max_dec_keys, w > 0 ? std::min(end, w + ns) : end);
    } else {
      for (int32_t r = row0; r < row; r += cuda::kPrefillTileRows) {
        H[m.tile_row0 + n_tiles_] = r;
        H[m.tile_len + n_tiles_] = std::min(cuda::kPrefillTileRows, row - r);
        ++n_tiles_;
      }
    }
  }
  // Two new tokens writing the same cache slot would overwrite each other's keys.
  std::sort(slot_sort_.begin(), slot_sort_.end());
  if (std::adjacent_find(slot_sort_.begin(), slot_sort_.end()) != slot_sort_.end()) {
    throw std::invalid_argument("step: two new tokens map to the same KV slot");
  }
  n_ret_ = n_out_;
  for (; row < static_cast<int32_t>(T_); ++row) {  // padding rows of a graph step
    H[m.bt_off + row] = static_cast<int32_t>(static_cast<size_t>(row) * bt_stride);
    H[m.bt + static_cast<size_t>(row) * bt_stride] = pad_block_;
    H[m.tokens + row] = 0;
    H[m.pos + row] = 0;
    H[m.slot + row] = pad_block_ * bs_;  // all padding rows write this slot: it is never read
    H[m.nkeys + row] = 1;                // by a real row, and each padding row only needs it finite
    H[m.window + row] = 0;
    H[m.sinks + row] = 0;
    H[m.sink_pos + row] = 0;
    H[m.row_seq + row] = row;
    H[m.dec_rows + n_dec_++] = row;
    H[m.out_rows + n_out_++] = row;
  }

  // Decode splits: enough blocks to cover the device twice, no split under kMinKeysPerSplit keys,
  // and no more row-splits than the workspace holds. A graph cannot know the context lengths of
  // its later replays, so it drops the key bound (an empty split costs one skipped partial).
  n_splits_ = 1;
  if (n_dec_ > 0) {
    const int64_t blocks = int64_t{n_dec_} * c_.n_kv_heads;
    int64_t want = (2 * int64_t{sms_} + blocks - 1) / blocks;
    if (graph_rows_ == 0) {
      want = std::min<int64_t>(want, (max_dec_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
    }
    want = std::min<int64_t>(want, ws_row_splits_ / n_dec_);
    n_splits_ = static_cast<int32_t>(std::clamp<int64_t>(want, 1, kMaxSplits));
  }

  ensure_logit_rows(n_out_);
  if (sinks_ && !q_sink_.bytes()) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    drop_graphs();
    q_sink_.alloc(sizeof(float) * static_cast<size_t>(o_.max_batch_tokens) * q_dim_,
                  "sink queries");
  }
  const size_t bytes = sizeof(int32_t) * m.total;
  if (graph_rows_ > 0) {
    // Only this copy changes between replays of a graph.
    std::memcpy(graph_meta_h_.template as<int32_t>(), H, bytes);
    CUDA_CHECK(cudaMemcpyAsync(graph_meta_d_.template as<int32_t>(),
                               graph_meta_h_.template as<int32_t>(), bytes, cudaMemcpyHostToDevice,
                               stream_));
    md_ = graph_meta_d_.template as<int32_t>();
  } else {
    if (meta_h_.bytes() < bytes) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      meta_h_.alloc(bytes * 2);
      meta_d_.alloc(bytes * 2, "step metadata");
    }
    // The previous step's copy from the pinned buffer is complete: every step ends synchronised.
    std::memcpy(meta_h_.template as<int32_t>(), H, bytes);
    CUDA_CHECK(cudaMemcpyAsync(meta_d_.template as<int32_t>(), meta_h_.template as<int32_t>(),
                               bytes, cudaMemcpyHostToDevice, stream_));
    md_ = meta_d_.template as<int32_t>();
  }
  if (out) {
    out->n_vocab = c_.n_vocab;
    out->logits.resize(static_cast<size_t>(n_ret_) * c_.n_vocab);
  }
  return n_ret_;
}

template <class T>
void CudaEngineImpl<T>::forward() {
  const LlamaConfig& c = c_;
  const int T_ = n_tok_;
  const int64_t dim = c.dim, F = c.ffn_dim;
  const int32_t* md = md_;
  float* x = x_.template as<float>();
  float* tmp = tmp_.template as<float>();
  T* xn = xn_.template as<T>();
  float* qkv = qkv_.template as<float>();
  float* qs = sinks_ ? q_sink_.template as<float>() : nullptr;
  T* att = att_.template as<T>();
  float* gu = gu_.template as<float>();
  T* h = h_.template as<T>();
  cudaStream_t st = stream_;
  // Few tokens and quantized copies: the products read the file's blocks through gemv_q, with
  // f32 inputs in qx (a sixth to a half of the bytes of bf16 weights).
  const bool gemv = qdecode_ && T_ <= cuda::kGemvMaxTokens;
  float* qx = qx_.template as<float>();
  const auto qgemv = [&](const QWeight& w, int64_t rows, int64_t cols, const float* in, int n,
                         float* y) {
    // One launch per run of one type, each writing its rows of the (n, rows) output.
    for (const auto& run : w.runs) {
      CUDA_CHECK(cuda::gemv_q(run.type, w.buf.template as<uint8_t>() + run.offset, run.rows, cols,
                              in, n, y + run.row0, st, rows));
    }
  };
  // The description's steps beyond the plain llama block, each skipped where the model lacks it.
  const float* rope_freqs = rope_freqs_.bytes() ? rope_freqs_.template as<float>() : nullptr;
  const bool neox = c.rope_layout == RopeLayout::Neox;
  const auto rope = [&](float* v, int64_t stride, int heads, const int32_t* pos) {
    CUDA_CHECK(cuda::rope(v, stride, T_, heads, c.head_dim, c.rope_dim, pos, theta_scale_, st,
                          rope_freqs, c.rope_freq_scale, neox));
  };
  // A block's output (tmp, f32 (T, dim)) before it joins the residual stream: its bias, then
  // its post-norm (gemma2), in place.
  const auto block_out = [&](const DevBuf& bias, const DevBuf& post) {
    if (bias.bytes()) CUDA_CHECK(cuda::bias_add(tmp, dim, T_, dim, bias.template as<float>(), st));
    if (post.bytes()) {
      CUDA_CHECK(cuda::rmsnorm_add<float>(tmp, nullptr, post.template as<float>(), nullptr, tmp, T_,
                                          c.dim, c.norm_eps, st));
    }
  };
  const cuda::GateAct act =
      c.activation == Activation::GeluTanh ? cuda::GateAct::GeluTanh : cuda::GateAct::SiLU;

  CUDA_CHECK(cuda::embedding<T>(tok_embd_.template as<T>(), md + m_.tokens, T_, c.dim, x, st,
                                c.embed_scale));
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    // attention block: the previous block's output (tmp) joins the residual stream here
    if (gemv) {
      CUDA_CHECK(cuda::rmsnorm_add<float>(x, l > 0 ? tmp : nullptr,
                                          L.attn_norm.template as<float>(), nullptr, qx, T_, c.dim,
                                          c.norm_eps, st));
      qgemv(L.qwqkv, qkv_dim_, dim, qx, T_, qkv);
    } else {
      CUDA_CHECK(cuda::rmsnorm_add<T>(x, l > 0 ? tmp : nullptr, L.attn_norm.template as<float>(),
                                      nullptr, xn, T_, c.dim, c.norm_eps, st));
      CUBLAS_CHECK(gemm_->run<T>(L.wqkv.template as<T>(), xn, qkv_dim_, dim, T_, qkv, st));
    }
    if (L.bqkv.bytes()) {
      CUDA_CHECK(cuda::bias_add(qkv, qkv_dim_, T_, qkv_dim_, L.bqkv.template as<float>(), st));
    }
    // Per-head q/k norms (qwen3), or one over the whole q and the whole k row (olmoe: a single
    // "head" as wide as the row), come before RoPE, and so before the sink queries are copied.
    if (L.q_norm.bytes()) {
      const int heads = c.qk_norm_whole ? 1 : c.n_heads;
      CUDA_CHECK(cuda::head_rmsnorm(qkv, qkv_dim_, T_, heads, static_cast<int>(q_dim_ / heads),
                                    L.q_norm.template as<float>(), c.norm_eps, st));
    }
    if (L.k_norm.bytes()) {
      const int heads = c.qk_norm_whole ? 1 : c.n_kv_heads;
      CUDA_CHECK(cuda::head_rmsnorm(qkv + q_dim_, qkv_dim_, T_, heads,
                                    static_cast<int>(kv_dim_ / heads),
                                    L.k_norm.template as<float>(), c.norm_eps, st));
    }
    if (qs) {
      // The sink queries: the unrotated queries turned to each row's sink position.
      CUDA_CHECK(cudaMemcpy2DAsync(qs, sizeof(float) * q_dim_, qkv, sizeof(float) * qkv_dim_,
                                   sizeof(float) * q_dim_, static_cast<size_t>(T_),
                                   cudaMemcpyDeviceToDevice, st));
      rope(qs, q_dim_, c.n_heads, md + m_.sink_pos);
    }
    rope(qkv, qkv_dim_, c.n_heads, md + m_.pos);
    rope(qkv + q_dim_, qkv_dim_, c.n_kv_heads, md + m_.pos);
    if (kv_half_) {
      attend<half>(l, qkv, qs, att);
    } else {
      attend<float>(l, qkv, qs, att);
    }
    if (gemv) {
      const float* a = nullptr;
      if constexpr (std::is_same_v<T, float>) {
        a = att;
      } else {
        CUDA_CHECK(cuda::convert_rows<float>(kernels::DType::BF16, att, T_, q_dim_, qx, st));
        a = qx;
      }
      qgemv(L.qwo, dim, q_dim_, a, T_, tmp);
      block_out(L.bo, L.post_attn_norm);
      // feed-forward block
      CUDA_CHECK(cuda::rmsnorm_add<float>(x, tmp, L.ffn_norm.template as<float>(), nullptr, qx, T_,
                                          c.dim, c.norm_eps, st));
      qgemv(L.qwgu, 2 * F, dim, qx, T_, gu);
      CUDA_CHECK(cuda::swiglu<float>(gu, T_, c.ffn_dim, qx, st, act));
      qgemv(L.qwdown, dim, F, qx, T_, tmp);
      block_out(DevBuf{}, L.post_ffn_norm);
      continue;
    }
    CUBLAS_CHECK(gemm_->run<T>(L.wo.template as<T>(), att, dim, q_dim_, T_, tmp, st));
    block_out(L.bo, L.post_attn_norm);
    if (c.n_experts > 0) {
      moe_ffn(L);
      block_out(DevBuf{}, L.post_ffn_norm);
      continue;
    }
    // feed-forward block
    CUDA_CHECK(cuda::rmsnorm_add<T>(x, tmp, L.ffn_norm.template as<float>(), nullptr, xn, T_, c.dim,
                                    c.norm_eps, st));
    CUBLAS_CHECK(gemm_->run<T>(L.wgu.template as<T>(), xn, 2 * F, dim, T_, gu, st));
    CUDA_CHECK(cuda::swiglu<T>(gu, T_, c.ffn_dim, h, st, act));
    CUBLAS_CHECK(gemm_->run<T>(L.wdown.template as<T>(), h, dim, F, T_, tmp, st));
    block_out(DevBuf{}, L.post_ffn_norm);
  }
  // Only the rows that get logits take the last residual add and the final norm.
  if (gemv && qoutput_) {
    CUDA_CHECK(cuda::rmsnorm_add<float>(x, c.n_layers > 0 ? tmp : nullptr,
                                        output_norm_.template as<float>(), md + m_.out_rows, qx,
                                        n_out_, c.dim, c.norm_eps, st));
    qgemv(qout_, c.n_vocab, dim, qx, n_out_, logits_.template as<float>());
  } else {
    CUDA_CHECK(cuda::rmsnorm_add<T>(x, c.n_layers > 0 ? tmp : nullptr,
                                    output_norm_.template as<float>(), md + m_.out_rows,
                                    xr_.template as<T>(), n_out_, c.dim, c.norm_eps, st));
    CUBLAS_CHECK(gemm_->run<T>(output_w_, xr_.template as<T>(), c.n_vocab, dim, n_out_,
                               logits_.template as<float>(), st));
  }
  float* logits = logits_.template as<float>();
  if (output_bias_.bytes()) {
    CUDA_CHECK(cuda::bias_add(logits, c.n_vocab, n_out_, c.n_vocab,
                              output_bias_.template as<float>(), st));
  }
  if (c.final_softcap > 0.0f) {
    CUDA_CHECK(cuda::softcap(logits, int64_t{n_out_} * c.n_vocab, c.final_softcap, st));
  }
}

// The feed-forward block of a mixture of experts, as the CPU engine's moe_fast: the router's
// f32 logits of the f32-normed rows, then on the device the routing and the grouping of the
// step's (token, choice) picks by expert (moe_route), each active expert's SwiGLU over its
// grouped rows, and per token the weighted sum of its experts' outputs, plus the shared expert
// gated by sigmoid(ffn_gate_inp_shexp . x) (qwen2moe). Steps of at most kMoeDeviceMaxTokens
// tokens leave the grouping on the device (moe_matmul sizes itself from it: graph-safe); longer
// ones read its offsets back once per layer for one cuBLASLt product per active expert.
template <class T>
void CudaEngineImpl<T>::moe_ffn(const Layer& L) {
  const LlamaConfig& c = c_;
  const int T_ = n_tok_;
  const int E = c.n_experts, K = c.n_experts_used;
  const int64_t dim = c.dim, Fe = c.expert_ffn_dim, S = ffn_, P = int64_t{T_} * K;
  const bool shared = S > 0;
  const int64_t router_rows = E + (shared ? 1 : 0);
  cudaStream_t st = stream_;
  float* x = x_.template as<float>();
  float* tmp = tmp_.template as<float>();
  float* xf = xf_.template as<float>();
  float* logits = moe_logits_.template as<float>();
  float* gu = moe_gu_.template as<float>();
  float* ye = moe_y_.template as<float>();
  // The attention block's output joins the residual stream; the normed rows stay f32, so the
  // router (f32 weights, as llama.cpp keeps ffn_gate_inp) sees them unrounded.
  CUDA_CHECK(cuda::rmsnorm_add<float>(x, tmp, L.ffn_norm.template as<float>(), nullptr, xf, T_,
                                      c.dim, c.norm_eps, st));
  CUBLAS_CHECK(
      gemm_->run<float>(L.router.template as<float>(), xf, router_rows, dim, T_, logits, st));
  const bool on_device = T_ <= kMoeDeviceMaxTokens;
  if (!on_device && graph_rows_ > 0) {
    throw std::logic_error("cuda engine: a graph step took the synchronising expert path");
  }
  cuda::MoeRouting r;
  r.weight = moe_f_.template as<float>();
  r.gate = shared ? r.weight + P : nullptr;
  r.pos = moe_i_.template as<int32_t>();
  r.src = r.pos + P;
  r.offset = r.src + P;
  if (on_device) {
    r.tiles = r.offset + E + 1;
    r.n_tiles = cuda::moe_max_tiles(T_, K, E);
  }
  CUDA_CHECK(cuda::moe_route(logits, router_rows, T_, E, K, c.expert_weights_norm,
                             c.expert_weights_scale, r, st));
  const T* wgu = L.exp_gu.template as<T>();
  const T* wdown = L.exp_down.template as<T>();
  if (on_device) {
    float* h = moe_h_.template as<float>();
    CUDA_CHECK(
        cuda::moe_matmul<T>(wgu, 2 * Fe, dim, xf, r.src, r.offset, r.tiles, r.n_tiles, gu, st));
    CUDA_CHECK(cuda::swiglu<float>(gu, static_cast<int>(P), static_cast<int>(Fe), h, st));
    CUDA_CHECK(
        cuda::moe_matmul<T>(wdown, dim, Fe, h, nullptr, r.offset, r.tiles, r.n_tiles, ye, st));
  } else {
    T* xg = moe_xg_.template as<T>();
    T* h = moe_h_.template as<T>();
    CUDA_CHECK(cuda::moe_gather<T>(xf, r.src, P, dim, xg, st));
    int32_t* off = moe_off_h_.template as<int32_t>();
    CUDA_CHECK(cudaMemcpyAsync(off, r.offset, sizeof(int32_t) * static_cast<size_t>(E + 1),
                               cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    for (int e = 0; e < E; ++e) {
      const int64_t p0 = off[e], n = off[e + 1] - off[e];
      if (n == 0) continue;
      CUBLAS_CHECK(gemm_->run<T>(wgu + e * 2 * Fe * dim, xg + p0 * dim, 2 * Fe, dim, n,
                                 gu + p0 * 2 * Fe, st));
    }
    CUDA_CHECK(cuda::swiglu<T>(gu, static_cast<int>(P), static_cast<int>(Fe), h, st));
    for (int e = 0; e < E; ++e) {
      const int64_t p0 = off[e], n = off[e + 1] - off[e];
      if (n == 0) continue;
      CUBLAS_CHECK(gemm_->run<T>(wdown + e * dim * Fe, h + p0 * Fe, dim, Fe, n, ye + p0 * dim, st));
    }
  }
  float* ys = nullptr;
  if (shared) {
    // The shared expert is a dense SwiGLU over every row: the plain feed-forward's products.
    const T* xn = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      xn = xf;
    } else {
      CUDA_CHECK(cuda::convert_rows<T>(kernels::DType::F32, xf, T_, dim, xn_.template as<T>(), st));
      xn = xn_.template as<T>();
    }
    float* sgu = gu_.template as<float>();
    T* sh = h_.template as<T>();
    ys = moe_ys_.template as<float>();
    CUBLAS_CHECK(gemm_->run<T>(L.wgu.template as<T>(), xn, 2 * S, dim, T_, sgu, st));
    CUDA_CHECK(cuda::swiglu<T>(sgu, T_, static_cast<int>(S), sh, st));
    CUBLAS_CHECK(gemm_->run<T>(L.wdown.template as<T>(), sh, dim, S, T_, ys, st));
  }
  CUDA_CHECK(cuda::moe_combine(ye, r.pos, r.weight, T_, K, dim, r.gate, ys, tmp, st));
}

template <class T>
template <class C>
void CudaEngineImpl<T>::attend(int l, const float* qkv, const float* qs, T* att) {
  const LlamaConfig& c = c_;
  const int32_t* md = md_;
  cudaStream_t st = stream_;
  CUDA_CHECK(cuda::kv_store<C>(qkv, qkv_dim_, q_dim_, q_dim_ + kv_dim_, n_tok_,
                               static_cast<int>(kv_dim_), md + m_.slot, kc<C>(l), vc<C>(l), st));
  cuda::PagedKv<C> kv;
  kv.k = kc<C>(l);
  kv.v = vc<C>(l);
  kv.block_tables = md + m_.bt;
  kv.seq_bt_off = md + m_.bt_off;
  kv.row_seq = md + m_.row_seq;
  kv.row_nkeys = md + m_.nkeys;
  kv.block_size = bs_;
  kv.window = o_.sliding_window;
  kv.row_window = md + m_.window;
  if (static_cast<size_t>(l) < c.layer_window.size()) kv.layer_window = c.layer_window[l];
  kv.scale = c.query_scale;  // 0 (a synthetic config): 1 / sqrt(head_dim)
  kv.softcap = c.attn_softcap;
  if (qs) {
    kv.row_sinks = md + m_.sinks;
    kv.q_sink = qs;
    kv.q_sink_stride = q_dim_;
  }
  CUDA_CHECK(cuda::attention_decode(qkv, qkv_dim_, kv, md + m_.dec_rows, n_dec_, c.n_heads,
                                    c.n_kv_heads, c.head_dim, n_splits_,
                                    attn_ws_.template as<float>(), att, q_dim_, st));
  CUDA_CHECK(cuda::attention_prefill(qkv, qkv_dim_, kv, md + m_.tile_row0, md + m_.tile_len,
                                     n_tiles_, c.n_heads, c.n_kv_heads, c.head_dim, att, q_dim_, st,
                                     o_.tensor_core_attention));
}

template <class T>
void CudaEngineImpl<T>::launch_sample() {
  CUDA_CHECK(cuda::sample(logits_.template as<float>(), n_out_, c_.n_vocab,
                          params_d_.template as<cuda::SampleParams>(),
                          tokens_d_.template as<int32_t>(), stream_));
}

template <class T>
void CudaEngineImpl<T>::run(bool sample) {
  if (graph_rows_ == 0) {
    forward();
    if (sample) launch_sample();
    return;
  }
  const auto key = std::make_tuple(graph_rows_, sinks_, sample);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // The capture starts on an idle stream (the step's uploads done), so nothing earlier can be
    // taken for part of the graph. Relaxed: a launcher may set a kernel attribute meanwhile.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    cudaGraph_t g = nullptr;
    try {
      forward();
      if (sample) launch_sample();
    } catch (...) {
      // End the capture, or the stream stays unusable.
      if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    CUDA_CHECK(e);
    it = graphs_.emplace(key, exec).first;
  }
  CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
}

template <class T>
void CudaEngineImpl<T>::step(const std::vector<SeqStep>& batch, StepOutput& out) {
  plan(batch, false, &out);
  if (n_tok_ == 0) return;
  run(false);
  CUDA_CHECK(cudaMemcpyAsync(out.logits.data(), logits_.template as<float>(),
                             sizeof(float) * out.logits.size(), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

template <class T>
void CudaEngineImpl<T>::step_sample(const std::vector<SeqStep>& batch,
                                    const std::vector<SampleControl>& controls,
                                    std::vector<int32_t>& tokens) {
  if (controls.size() != batch.size()) {
    throw std::invalid_argument("step_sample: one SampleControl per sequence expected");
  }
  plan(batch, true, nullptr);
  tokens.resize(batch.size());
  if (n_tok_ == 0) return;
  auto* p = params_h_.template as<cuda::SampleParams>();
  for (size_t i = 0; i < controls.size(); ++i) {
    p[i] = cuda::SampleParams{};
    p[i].temperature = controls[i].temperature;
    p[i].top_k = controls[i].top_k;
    p[i].top_p = controls[i].top_p;
    p[i].seed = controls[i].seed;
    p[i].counter = controls[i].counter;
  }
  // padding rows of a graph step: greedy, their ids are dropped
  for (int32_t i = static_cast<int32_t>(controls.size()); i < n_out_; ++i) p[i] = {};
  CUDA_CHECK(cudaMemcpyAsync(params_d_.template as<void>(), p,
                             sizeof(cuda::SampleParams) * static_cast<size_t>(n_out_),
                             cudaMemcpyHostToDevice, stream_));
  run(true);
  CUDA_CHECK(cudaMemcpyAsync(tokens_h_.template as<int32_t>(), tokens_d_.template as<int32_t>(),
                             sizeof(int32_t) * static_cast<size_t>(n_ret_), cudaMemcpyDeviceToHost,
                             stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::copy(tokens_h_.template as<int32_t>(), tokens_h_.template as<int32_t>() + n_ret_,
            tokens.begin());
}

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<LlamaModel> model,
                                         const CudaEngineOptions& opts) {
  if (!model) throw std::invalid_argument("make_cuda_engine: null model");
  const LlamaConfig c = model->config();
  // Every step a model description can ask for (model/model.hpp) runs here; what no kernel can
  // run (LongRoPE) the loader has refused already, by name.
  if (opts.f32_weights)
    return std::make_unique<CudaEngineImpl<float>>(std::move(model), c, opts, nullptr);
  return std::make_unique<CudaEngineImpl<bf16>>(std::move(model), c, opts, nullptr);
}

std::unique_ptr<CudaEngine> make_cuda_engine_synthetic(const LlamaConfig& config,
                                                       const CudaEngineOptions& opts,
                                                       uint64_t seed) {
  if (opts.f32_weights)
    return std::make_unique<CudaEngineImpl<float>>(nullptr, config, opts, &seed);
  return std::make_unique<CudaEngineImpl<bf16>>(nullptr, config, opts, &seed);
}

}  // namespace sy
