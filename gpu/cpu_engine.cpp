// The CPU backend of the engine interface: a batched transformer step over a paged KV cache,
// computed from the model's description (model/model.hpp): which norms, biases, RoPE layout,
// activation, soft-caps and windows each layer has. Two paths: a plain-loop reference (the test
// oracle) and a threaded SIMD fast path; both read the same description and have no
// per-architecture branches.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "gpu/engine.hpp"

namespace sy {
namespace {

// The KV cache holds rows of kv_dim values per (layer, slot) in EngineOptions::kv_type (F32,
// F16 or Q8_0), written by kernels::kv_store_row and read by kv_dot / kv_axpy / kv_load_row.
using KvElem = uint8_t;

// A step larger than this is refused unless the caller raises EngineOptions::max_batch_tokens: it
// bounds the scratch memory a single malformed request can make the engine allocate.
constexpr int32_t kDefaultMaxBatchTokens = 4096;
// Default KV capacity: this many sequences of the full trained context.
constexpr int64_t kDefaultSeqsOfContext = 4;
// Multiply-adds below which an op runs on the calling thread: waking the pool costs microseconds
// (much more when the machine is busy), about what this much work takes on one core, so tiny
// models and tiny batches gain nothing from threads.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;
// Decode attention reads every cached key and value once per multiply-add pair, from memory
// rather than cache, so a multiply-add there costs about as much as this many of a matmul's;
// pool_for weighs attention's work by it. Measured on the 110M shape at batch 1 (context ~64):
// single-threaded attention took 41 us per layer, about 16 times a matmul of as many MACs.
constexpr int64_t kAttnMacCost = 16;
// Tokens from which the per-token work between the matmuls (head norms, RoPE, K/V stores) is
// shared over the pool: each costs a few microseconds, about one hand-off.
constexpr size_t kPoolTokens = 8;
// A sequence with at least this many new tokens attends as small matrix products (queries of a
// tile against the gathered keys); fewer tokens use one dot product per key, which skips the
// gather and so costs less for decode.
constexpr int32_t kGemmMinTokens = 4;
// Query tokens per attention tile: bounds the per-worker score buffer (tile x context floats)
// while giving the matrix product enough rows to reuse each gathered key.
constexpr int32_t kQueryTile = 64;
// Mixture of experts: when no active expert has more rows than this (decode), each expert is one
// pool task run on one thread; with more (prefill), each expert's matmuls are split over the pool.
constexpr int64_t kMoeTaskRows = 16;
// Largest accepted KV block: far above useful sizes, small enough for 32-bit slot arithmetic.
constexpr int32_t kMaxBlockSize = 1 << 16;

template <class T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// What the token at slot t sees under SeqStep::window/sinks: sink slots [0, n_sinks), attended
// with the sink query, and window slots [lo, t]. Full attention (window 0) is n_sinks = lo = 0.
struct Visible {
  int64_t n_sinks;
  int64_t lo;
};
Visible visible(int64_t t, int32_t window, int32_t sinks) {
  if (window <= 0) return {0, 0};
  const int64_t lo = std::max<int64_t>(0, t - window + 1);
  return {std::min<int64_t>(sinks, lo), lo};
}

class CpuEngine final : public Engine {
 public:
  CpuEngine(std::shared_ptr<Model> model, const EngineOptions& opts);

  const ModelConfig& config() const override { return c_; }
  const Model& model() const override { return *model_; }
  int32_t block_size() const override { return bs_; }
  BlockPool& pool() override { return pool_; }
  BlockPool* window_pool() override { return wpool_.get(); }
  size_t kv_bytes() const override { return 2 * static_cast<size_t>(kv_cache_bytes_); }
  void step(const std::vector<SeqStep>& batch, StepOutput& out) override;
  // Read after each half of a layer on the fast path; the reference path (a test oracle) runs
  // to the end.
  void interrupt_on(const std::atomic<bool>* flag) override { interrupt_ = flag; }
  void copy_blocks(const std::vector<KvBlockCopy>& copies) override {
    validate_copies(copies, pool_.n_total(), wpool_ ? wpool_->n_total() : 0);
    // Block-major cache: one block of one layer is one stretch of every head's slots.
    const int64_t block_bytes = int64_t{c_.n_kv_heads} * bs_ * head_row_;
    for (const KvBlockCopy& cp : copies) {
      for (int l = 0; l < c_.n_layers; ++l) {
        if (in_window_group(l) != cp.window) continue;
        const int64_t from = kv_offset(0, int64_t{cp.src} * bs_);
        const int64_t to = kv_offset(0, int64_t{cp.dst} * bs_);
        const auto layer = static_cast<size_t>(l);
        std::memcpy(k_base_[layer] + to, k_base_[layer] + from, static_cast<size_t>(block_bytes));
        std::memcpy(v_base_[layer] + to, v_base_[layer] + from, static_cast<size_t>(block_bytes));
      }
    }
  }

 private:
  void validate_and_plan(const std::vector<SeqStep>& batch, StepOutput& out);
  void forward_reference(const std::vector<SeqStep>& batch, StepOutput& out);
  void forward_fast(const std::vector<SeqStep>& batch, StepOutput& out);
  void attention_fast(const std::vector<SeqStep>& batch, int layer);
  // Mixture of experts, one token (reference) and the step's T rows of xb_ (fast, in place).
  void moe_reference(const LayerWeights& L, const float* xb, float* out) const;
  void moe_fast(const LayerWeights& L, size_t T);
  void attend_dot(const SeqStep& s, int32_t row0, int layer, int g0, int g1, float* ws);
  void attend_gemm(const SeqStep& s, int32_t row0, int layer, int g, int32_t i0, int32_t i1,
                   float* ws);
  // The (window, sinks) layer `layer` attends s with: the step's, or the layer's own window
  // (without sinks) where the model gives the layer a narrower one (gemma2's even layers).
  struct Reach {
    int32_t window;
    int32_t sinks;
  };
  Reach reach(const SeqStep& s, int layer) const {
    const int32_t w = c_.layer_window[static_cast<size_t>(layer)];
    if (w > 0 && (s.window == 0 || w < s.window)) return {w, 0};
    return {s.window, s.sinks};
  }
  // The pool for an op of `macs` multiply-adds, or nullptr when it is too small to split.
  kernels::ThreadPool* pool_for(int64_t macs) const {
    return macs >= kMinParallelMacs ? threads_.get() : nullptr;
  }
  void matmul(const kernels::WeightView& w, const float* x, float* y, int64_t n) const {
    kernels::matmul(w, x, n, y, pool_for(w.rows * w.cols * n));
  }
  // Several matrices by the same x in one hand-off (see kernels::matmul_many).
  template <int N>
  void matmul_many(const kernels::WeightView* const (&ws)[N], float* const (&ys)[N], const float* x,
                   int64_t n) const {
    int64_t macs = 0;
    for (const kernels::WeightView* w : ws) macs += w->rows * w->cols * n;
    kernels::matmul_many(ws, ys, N, x, n, pool_for(macs));
  }

  // Whether layer l keeps its K/V in the window group (the cache is split and l has a window of
  // its own); the block table of s that maps layer l's slots.
  bool in_window_group(int layer) const {
    return wpool_ && c_.layer_window[static_cast<size_t>(layer)] > 0;
  }
  const int32_t* table_of(const SeqStep& s, int layer) const {
    return in_window_group(layer) ? s.window_table : s.block_table;
  }
  // Physical slot of logical slot s of a sequence whose block table is `tab`.
  int64_t slot_of(const int32_t* tab, int64_t logical) const {
    return int64_t{tab[logical / bs_]} * bs_ + logical % bs_;
  }
  // Physical slot that new-token row `row` writes in layer l's cache.
  int64_t row_slot(int layer, size_t row) const {
    return in_window_group(layer) ? wslot_[row] : slot_[row];
  }
  // Calls fn(j, first physical slot, count) for the runs of consecutive physical slots that
  // hold the logical slots [a, b) of block table tab (a block at most each), j counting up
  // from j0 at the run's first slot; walks the table block by block, so there is no division
  // per slot.
  template <class Fn>
  void for_runs(const int32_t* tab, int64_t a, int64_t b, int64_t j0, Fn&& fn) const {
    for (int64_t x = a, j = j0; x < b;) {
      const int64_t off = x % bs_;
      const int64_t lim = std::min<int64_t>(bs_ - off, b - x);
      fn(j, int64_t{tab[x / bs_]} * bs_ + off, lim);
      x += lim;
      j += lim;
    }
  }
  // Calls fn(j, physical slot) for each of the logical slots [a, b), as for_runs.
  template <class Fn>
  void for_slots(const int32_t* tab, int64_t a, int64_t b, int64_t j0, Fn&& fn) const {
    for_runs(tab, a, b, j0, [&](int64_t j, int64_t slot, int64_t n) {
      for (int64_t o = 0; o < n; ++o) fn(j + o, slot + o);
    });
  }
  // KV head g's cached key (value) of physical slot `slot` in layer `layer`. Block-major: a
  // block holds every head's rows of its slots, head after head, so the slots of one head in one
  // block follow each other head_row_ bytes apart and a block's heads are one stretch.
  int64_t kv_offset(int64_t g, int64_t slot) const {
    return ((slot / bs_ * c_.n_kv_heads + g) * bs_ + slot % bs_) * head_row_;
  }
  KvElem* k_head(int layer, int64_t g, int64_t slot) {
    return k_base_[static_cast<size_t>(layer)] + kv_offset(g, slot);
  }
  KvElem* v_head(int layer, int64_t g, int64_t slot) {
    return v_base_[static_cast<size_t>(layer)] + kv_offset(g, slot);
  }
  int64_t layer_slots(int layer) const { return in_window_group(layer) ? n_wslots_ : n_slots_; }
  // Writes the new token's K and V rows (kv_dim values each) into slot `slot` of layer `layer`,
  // head by head (head_dim % 32 == 0 for Q8_0, checked, so its blocks never straddle heads).
  void store_kv(int layer, int64_t slot, const float* k, const float* v) {
    for (int64_t g = 0; g < c_.n_kv_heads; ++g) {
      kernels::kv_store_row(kv_type_, k + g * c_.head_dim, k_head(layer, g, slot), c_.head_dim);
      kernels::kv_store_row(kv_type_, v + g * c_.head_dim, v_head(layer, g, slot), c_.head_dim);
    }
  }

  std::shared_ptr<Model> model_;
  const ModelConfig& c_;
  const ModelWeights& w_;
  kernels::RopeSpec rope_;  // the model's RoPE, the same for every layer
  EngineOptions opts_;
  int32_t bs_;
  int32_t max_tokens_;
  BlockPool pool_;
  // The window group's pool (EngineOptions::n_window_blocks > 0), or null: one group.
  std::unique_ptr<BlockPool> wpool_;
  int64_t n_slots_;         // n_blocks * block_size
  int64_t n_wslots_ = 0;    // window-group blocks * block_size
  int64_t q_dim_;           // n_heads * head_dim
  int64_t kv_dim_;          // n_kv_heads * head_dim
  kernels::DType kv_type_;  // EngineOptions::kv_type
  int64_t head_row_;        // bytes of one KV head's key (or value) in one slot
  // Left uninitialised on purpose: pages are touched only when a slot is first written, so a
  // large default capacity costs address space, not memory.
  // Each layer's keys: (blocks, n_kv_heads, block_size, head_row_ bytes), n_slots / block_size
  // blocks in a full-attention layer and n_wslots / block_size in a window-group one, laid out
  // one layer after the other; k_base_[l] is layer l's first. Within a block each head's slots
  // are one run, so attention over a run of slots reads one contiguous stretch per head, and a
  // decode task that takes several heads reads each block as one stretch.
  std::unique_ptr<KvElem[]> k_cache_;
  std::unique_ptr<KvElem[]> v_cache_;
  std::vector<KvElem*> k_base_, v_base_;  // (n_layers)
  int64_t kv_cache_bytes_ = 0;            // bytes of k_cache_ (and of v_cache_)
  std::unique_ptr<kernels::ThreadPool> threads_;
  const std::atomic<bool>* interrupt_ = nullptr;  // interrupt_on

  // The step plan, rebuilt each step in buffers that only grow.
  int32_t n_tok_ = 0;               // T: new tokens in the step
  std::vector<int32_t> tok_;        // (T) token ids
  std::vector<int32_t> pos_;        // (T) RoPE positions
  std::vector<int64_t> slot_;       // (T) physical KV slot written by each token
  std::vector<int64_t> wslot_;      // (T) the same in the window group (split cache only)
  std::vector<int64_t> slot_sort_;  // (T) scratch for the duplicate-slot check
  std::vector<int32_t> seq_row_;    // (n_seq + 1) first token row of each sequence
  std::vector<int32_t> out_row_;    // (R) token rows whose logits are returned
  // Sinks with a gap (position p > sinks + window - 1): the sink slots are scored with a second
  // copy of the query rotated to sinks + window - 1. sink_pos_[row] is that position or -1 (no
  // second query); sink_idx_[row] the row of q_sink_ holding it.
  std::vector<int32_t> sink_pos_;  // (T)
  std::vector<int32_t> sink_idx_;  // (T)
  int32_t n_sink_rows_ = 0;
  // One attention task: KV heads [head, head + n_heads) with their groups of query heads over
  // every new token of a decoding sequence (dot path, gemm = false), or one KV head over query
  // tokens [i0, i1) (tiled path, gemm = true, n_heads = 1).
  struct AttnUnit {
    int32_t seq;
    int32_t head;
    int32_t n_heads;
    int32_t i0;
    int32_t i1;
    bool gemm;
  };
  std::vector<AttnUnit> units_;  // the step's attention tasks, handed out dynamically
  int64_t attn_macs_ = 0;        // attention work of the step, per layer
  int64_t ws_floats_ = 0;        // scratch floats one worker needs for any unit

  // Fast-path activations, (T, width) row-major; they only grow.
  std::vector<float> x_;       // (T, dim) residual stream
  std::vector<float> xb_;      // (T, dim) normed input / block output
  std::vector<float> q_;       // (T, n_heads * head_dim)
  std::vector<float> q_sink_;  // (n_sink_rows_, n_heads * head_dim) sink queries
  std::vector<float> k_;       // (T, n_kv_heads * head_dim)
  std::vector<float> v_;       // (T, n_kv_heads * head_dim)
  std::vector<float> att_;     // (T, n_heads * head_dim) attention output
  std::vector<float> hb_;      // (T, ffn_dim) gate, then silu(gate) * up
  std::vector<float> hb2_;     // (T, ffn_dim) up
  std::vector<float> xr_;      // (R, dim) normed rows that get logits
  // Mixture of experts: router probabilities (T, n_experts), each token's chosen experts and
  // weights (T, n_experts_used), the rows of each expert (gathered inputs, hidden, outputs) and
  // the weighted sum (T, dim).
  std::vector<float> moe_p_;
  std::vector<int32_t> moe_pick_;
  std::vector<float> moe_w_;
  std::vector<int32_t> moe_rows_;    // (T * n_experts_used) token rows grouped by expert
  std::vector<int32_t> moe_slot_;    // their pick index (row * n_used + j), same order
  std::vector<int32_t> moe_start_;   // (n_experts + 1) offsets into moe_rows_
  std::vector<int32_t> moe_active_;  // (n_experts) the experts with rows, most rows first
  std::vector<float> moe_in_, moe_h_, moe_h2_, moe_out_, moe_acc_;
  std::vector<float> ws_;  // (n_workers, ws_floats_) attention scratch, one slice per worker
};

CpuEngine::CpuEngine(std::shared_ptr<Model> model, const EngineOptions& opts)
    : model_(std::move(model)),
      c_(model_->config()),
      w_(model_->weights()),
      opts_(opts),
      bs_(opts.block_size),
      max_tokens_(opts.max_batch_tokens > 0 ? opts.max_batch_tokens : kDefaultMaxBatchTokens),
      pool_([&] {
        if (opts.block_size < 1 || opts.block_size > kMaxBlockSize) {
          throw std::invalid_argument("EngineOptions::block_size must be in [1, " +
                                      std::to_string(kMaxBlockSize) + "]");
        }
        if (opts.n_blocks < 0) throw std::invalid_argument("EngineOptions::n_blocks < 0");
        if (opts.n_blocks > 0) return opts.n_blocks;
        const int64_t per_seq =
            (int64_t{model_->config().ctx_len} + opts.block_size - 1) / opts.block_size;
        return static_cast<int32_t>(std::min<int64_t>(per_seq * kDefaultSeqsOfContext, INT32_MAX));
      }()) {
  n_slots_ = int64_t{pool_.n_total()} * bs_;
  if (opts.n_window_blocks < 0) throw std::invalid_argument("EngineOptions::n_window_blocks < 0");
  if (opts.n_window_blocks > 0) {
    if (model_->limits().split_window() == 0) {
      throw std::invalid_argument(
          "EngineOptions::n_window_blocks: the layers of this model are not of two kinds (full "
          "attention and one shared window), so there is no window group");
    }
    wpool_ = std::make_unique<BlockPool>(opts.n_window_blocks);
    n_wslots_ = int64_t{opts.n_window_blocks} * bs_;
  }
  rope_.head_dim = c_.head_dim;
  rope_.rope_dim = c_.rope_dim;
  rope_.theta_base = c_.rope_theta;
  rope_.freq_scale = c_.rope_freq_scale;
  rope_.freq_factors = w_.rope_freqs;
  rope_.neox = c_.rope_layout == RopeLayout::Neox;
  q_dim_ = int64_t{c_.n_heads} * c_.head_dim;
  kv_dim_ = int64_t{c_.n_kv_heads} * c_.head_dim;
  kv_type_ = opts.kv_type;
  if (!kernels::kv_type_ok(kv_type_)) {
    const char* name = kernels::dtype_known(static_cast<uint32_t>(kv_type_))
                           ? kernels::dtype_name(kv_type_)
                           : nullptr;
    throw std::invalid_argument(std::string("KV cache type ") + (name ? name : "?") +
                                " is not one of f32, f16, q8_0");
  }
  if (kv_type_ == kernels::DType::Q8_0 && c_.head_dim % kernels::kQK != 0) {
    throw std::invalid_argument("KV cache type q8_0 needs a head dimension that is a multiple of " +
                                std::to_string(kernels::kQK) + " (this model's is " +
                                std::to_string(c_.head_dim) + "); use f16");
  }
  head_row_ = static_cast<int64_t>(kernels::row_bytes(kv_type_, c_.head_dim));
  std::vector<int64_t> offsets(static_cast<size_t>(c_.n_layers));
  for (int l = 0; l < c_.n_layers; ++l) {
    offsets[static_cast<size_t>(l)] = kv_cache_bytes_;
    kv_cache_bytes_ += layer_slots(l) * c_.n_kv_heads * head_row_;
  }
  k_cache_.reset(new KvElem[static_cast<size_t>(kv_cache_bytes_)]);
  v_cache_.reset(new KvElem[static_cast<size_t>(kv_cache_bytes_)]);
  for (int64_t off : offsets) {
    k_base_.push_back(k_cache_.get() + off);
    v_base_.push_back(v_cache_.get() + off);
  }
  if (!opts_.reference) {
    int n = opts_.n_threads > 0 ? opts_.n_threads
                                : static_cast<int>(std::thread::hardware_concurrency());
    threads_ = std::make_unique<kernels::ThreadPool>(std::max(n, 1), opts_.on_thread_start);
  }
}

void CpuEngine::step(const std::vector<SeqStep>& batch, StepOutput& out) {
  validate_and_plan(batch, out);
  if (n_tok_ == 0) return;
  if (opts_.reference) {
    forward_reference(batch, out);
  } else {
    forward_fast(batch, out);
  }
}

// Checks the whole batch before anything is written, so a refused step leaves the cache as it
// was; then lays the new tokens of all sequences out as rows [0, T) and sizes the output.
void CpuEngine::validate_and_plan(const std::vector<SeqStep>& batch, StepOutput& out) {
  const int64_t total =
      validate_batch(batch, {max_tokens_, bs_, pool_.n_total(), c_.n_vocab, 0,
                             wpool_ ? wpool_->n_total() : 0, model_->limits().split_window()});

  const size_t T = static_cast<size_t>(total);
  n_tok_ = static_cast<int32_t>(total);
  grow(tok_, T);
  grow(pos_, T);
  grow(slot_, T);
  if (wpool_) grow(wslot_, T);
  grow(slot_sort_, T);
  grow(sink_pos_, T);
  grow(sink_idx_, T);
  n_sink_rows_ = 0;
  grow(seq_row_, batch.size() + 1);
  out_row_.clear();
  out.offset.resize(batch.size());
  out.count.resize(batch.size());
  int32_t row = 0;
  attn_macs_ = 0;
  ws_floats_ = 0;
  units_.clear();
  const int group = c_.n_heads / c_.n_kv_heads;
  const int64_t hd = c_.head_dim;
  // KV heads per decode task: as many as leave about four tasks per thread, so that a large
  // batch reads each cached block as one stretch (one task per sequence) and a small one still
  // splits its heads over the threads.
  int64_t n_dot = 0;
  for (const SeqStep& s : batch) n_dot += s.n_tokens < kGemmMinTokens;
  const int64_t n_workers = threads_ ? threads_->size() : 1;
  const int dot_heads = static_cast<int>(
      std::clamp<int64_t>(c_.n_kv_heads * n_dot / (4 * n_workers), 1, c_.n_kv_heads));
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    seq_row_[i] = row;
    if (opts_.reference) {
      // The reference path plans no attention tasks.
    } else if (s.n_tokens >= kGemmMinTokens) {
      for (int32_t i0 = 0; i0 < s.n_tokens; i0 += kQueryTile) {
        const int32_t i1 = std::min(s.n_tokens, i0 + kQueryTile);
        for (int g = 0; g < c_.n_kv_heads; ++g)
          units_.push_back({static_cast<int32_t>(i), g, 1, i0, i1, true});
        // keys (nk, hd), values transposed (hd, nk), queries (rows, hd), scores (rows, nk),
        // output (rows, hd); nk: the tile's sinks plus its first token's window start up to its
        // last token
        const Visible v0 = visible(int64_t{s.n_past} + i0, s.window, s.sinks);
        const int64_t nk = v0.n_sinks + int64_t{s.n_past} + i1 - v0.lo;
        const int64_t rows = int64_t{group} * (i1 - i0);
        ws_floats_ = std::max(ws_floats_, 2 * nk * hd + 2 * rows * hd + rows * nk);
      }
    } else {
      for (int g = 0; g < c_.n_kv_heads; g += dot_heads)
        units_.push_back({static_cast<int32_t>(i), g, std::min(dot_heads, c_.n_kv_heads - g), 0,
                          s.n_tokens, false});
      // one score row per query head of the unit's groups
      ws_floats_ =
          std::max(ws_floats_, int64_t{dot_heads} * group * (int64_t{s.n_past} + s.n_tokens));
    }
    // Each query token scores and mixes about n_past + n_tokens / 2 slots (at most sinks +
    // window of them), twice head_dim each.
    int64_t seen = int64_t{s.n_past} + s.n_tokens / 2 + 1;
    if (s.window > 0) seen = std::min(seen, int64_t{s.window} + s.sinks);
    attn_macs_ += int64_t{c_.n_heads} * s.n_tokens * seen * 2 * c_.head_dim;
    out.offset[i] = static_cast<int32_t>(out_row_.size());
    out.count[i] = s.all_logits ? s.n_tokens : 1;
    for (int32_t t = 0; t < s.n_tokens; ++t, ++row) {
      tok_[static_cast<size_t>(row)] = s.tokens[t];
      pos_[static_cast<size_t>(row)] = s.positions ? s.positions[t] : s.n_past + t;
      slot_[static_cast<size_t>(row)] = slot_of(s.block_table, int64_t{s.n_past} + t);
      if (wpool_) wslot_[static_cast<size_t>(row)] = slot_of(s.window_table, int64_t{s.n_past} + t);
      // A second query only where it differs from the first (gap) and sink slots are in sight.
      const int64_t sink_at = int64_t{s.sinks} + s.window - 1;
      const int64_t p = pos_[static_cast<size_t>(row)];
      const bool gap = s.window > 0 && s.sinks > 0 && p > sink_at &&
                       visible(int64_t{s.n_past} + t, s.window, s.sinks).n_sinks > 0;
      sink_pos_[static_cast<size_t>(row)] = gap ? static_cast<int32_t>(sink_at) : -1;
      sink_idx_[static_cast<size_t>(row)] = gap ? n_sink_rows_++ : -1;
      if (s.all_logits || t == s.n_tokens - 1) out_row_.push_back(row);
    }
  }
  seq_row_[batch.size()] = row;
  // Rounded up to a cache line so that workers' slices never share one.
  ws_floats_ = (ws_floats_ + 15) / 16 * 16;
  grow(ws_, static_cast<size_t>(ws_floats_ * n_workers));

  // Two new tokens writing the same cache slot would overwrite each other's keys.
  for (const std::vector<int64_t>* slots : {&slot_, &wslot_}) {
    if (slots == &wslot_ && !wpool_) continue;
    std::copy(slots->begin(), slots->begin() + n_tok_, slot_sort_.begin());
    std::sort(slot_sort_.begin(), slot_sort_.begin() + n_tok_);
    if (std::adjacent_find(slot_sort_.begin(), slot_sort_.begin() + n_tok_) !=
        slot_sort_.begin() + n_tok_) {
      throw std::invalid_argument(
          slots == &slot_ ? "step: two new tokens map to the same KV slot"
                          : "step: two new tokens map to the same window-group KV slot");
    }
  }

  out.n_vocab = c_.n_vocab;
  out.logits.resize(out_row_.size() * static_cast<size_t>(c_.n_vocab));
}

// ---- reference path: one token at a time, plain loops over kernels::ref ----

void CpuEngine::forward_reference(const std::vector<SeqStep>& batch, StepOutput& out) {
  namespace ref = kernels::ref;
  const ModelConfig& c = c_;
  const int hd = c.head_dim;
  const int group = c.n_heads / c.n_kv_heads;  // query heads per KV head
  const float scale = c.query_scale;
  std::vector<float> x(c.dim);        // (dim) residual stream
  std::vector<float> xb(c.dim);       // (dim) normed input
  std::vector<float> xb2(c.dim);      // (dim) block output
  std::vector<float> q(q_dim_);       // (n_heads * head_dim)
  std::vector<float> qs(q_dim_);      // (n_heads * head_dim) sink query
  std::vector<float> k(kv_dim_);      // (n_kv_heads * head_dim)
  std::vector<float> v(kv_dim_);      // (n_kv_heads * head_dim)
  std::vector<float> att(q_dim_);     // (n_heads * head_dim)
  std::vector<float> hb(c.ffn_dim);   // (ffn_dim)
  std::vector<float> hb2(c.ffn_dim);  // (ffn_dim)
  std::vector<float> scores;          // (visible slots) attention weights of one head
  std::vector<float> kvrow(hd);       // (head_dim) one cached key or value, as f32

  size_t out_i = 0;
  for (size_t si = 0; si < batch.size(); ++si) {
    const SeqStep& s = batch[si];
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      const int32_t row = seq_row_[si] + i;
      const int pos = pos_[static_cast<size_t>(row)];
      const int sink_pos = sink_pos_[static_cast<size_t>(row)];
      const int64_t t = int64_t{s.n_past} + i;

      // token embedding: row `tok` of token_embd, times the architecture's embedding scale
      const kernels::WeightView& E = w_.tok_embd;
      const auto* erow = static_cast<const uint8_t*>(E.data) +
                         static_cast<size_t>(s.tokens[i]) * kernels::row_bytes(E.type, E.cols);
      kernels::dequantize_row(E.type, erow, x.data(), c.dim);
      if (c.embed_scale != 1.0f) ref::scale(x.data(), c.dim, c.embed_scale);

      for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
        // Sink slots [0, ns) then window slots [lo, t] of this layer; full attention: [0, t].
        const Reach at = reach(s, l);
        const Visible vis = visible(t, at.window, at.sinks);
        const int64_t ns = vis.n_sinks;
        const int64_t n_keys = ns + t - vis.lo + 1;
        const int32_t* tab = table_of(s, l);
        const int64_t slot = row_slot(l, static_cast<size_t>(row));
        const auto key_slot = [&](int64_t j) { return slot_of(tab, j < ns ? j : vis.lo + j - ns); };
        scores.resize(static_cast<size_t>(n_keys));

        // attention: x += post(wo(attn(rope(wq xb), rope(wk xb), wv xb))), xb = rmsnorm(x)
        ref::rmsnorm(xb.data(), x.data(), L.attn_norm, c.dim, c.norm_eps);
        ref::matmul(L.wq, xb.data(), 1, q.data());
        ref::matmul(L.wk, xb.data(), 1, k.data());
        ref::matmul(L.wv, xb.data(), 1, v.data());
        if (L.bq) ref::add_bias(q.data(), L.bq, 1, q_dim_);
        if (L.bk) ref::add_bias(k.data(), L.bk, 1, kv_dim_);
        if (L.bv) ref::add_bias(v.data(), L.bv, 1, kv_dim_);
        // Per head (qwen3), or the whole row at once (olmoe: qk_norm_whole).
        const int qn = c.qk_norm_whole ? 1 : c.n_heads, kn = c.qk_norm_whole ? 1 : c.n_kv_heads;
        if (L.q_norm)
          ref::rmsnorm_heads(q.data(), qn, static_cast<int>(q_dim_ / qn), L.q_norm, c.norm_eps);
        if (L.k_norm)
          ref::rmsnorm_heads(k.data(), kn, static_cast<int>(kv_dim_ / kn), L.k_norm, c.norm_eps);
        if (sink_pos >= 0) {
          std::copy(q.begin(), q.end(), qs.begin());
          ref::rope_ext(qs.data(), c.n_heads, rope_, sink_pos);
        }
        ref::rope_ext(q.data(), c.n_heads, rope_, pos);
        ref::rope_ext(k.data(), c.n_kv_heads, rope_, pos);
        store_kv(l, slot, k.data(), v.data());
        for (int h = 0; h < c.n_heads; ++h) {
          const float* qh = q.data() + h * hd;
          const float* qsh = sink_pos >= 0 ? qs.data() + h * hd : qh;
          const int g = h / group;
          for (int64_t j = 0; j < n_keys; ++j) {
            kernels::kv_load_row(kv_type_, k_head(l, g, key_slot(j)), kvrow.data(), hd);
            scores[static_cast<size_t>(j)] = ref::dot(j < ns ? qsh : qh, kvrow.data(), hd) * scale;
          }
          if (c.attn_softcap > 0.0f) ref::softcap(scores.data(), n_keys, c.attn_softcap);
          ref::softmax(scores.data(), n_keys);
          float* oh = att.data() + h * hd;
          std::fill(oh, oh + hd, 0.0f);
          for (int64_t j = 0; j < n_keys; ++j) {
            kernels::kv_load_row(kv_type_, v_head(l, g, key_slot(j)), kvrow.data(), hd);
            ref::axpy(scores[static_cast<size_t>(j)], kvrow.data(), oh, hd);
          }
        }
        ref::matmul(L.wo, att.data(), 1, xb2.data());
        if (L.bo) ref::add_bias(xb2.data(), L.bo, 1, c.dim);
        if (L.post_attn_norm) {
          ref::rmsnorm(xb2.data(), xb2.data(), L.post_attn_norm, c.dim, c.norm_eps);
        }
        for (int d = 0; d < c.dim; ++d) x[d] += xb2[d];

        // feed-forward: x += post(down(act(gate xb) * up xb)), xb = rmsnorm(x)
        ref::rmsnorm(xb.data(), x.data(), L.ffn_norm, c.dim, c.norm_eps);
        if (c.n_experts > 0) {
          moe_reference(L, xb.data(), xb2.data());
        } else {
          ref::matmul(L.w_gate, xb.data(), 1, hb.data());
          ref::matmul(L.w_up, xb.data(), 1, hb2.data());
          if (c.activation == Activation::GeluTanh) {
            ref::geglu(hb.data(), hb2.data(), c.ffn_dim);
          } else {
            ref::swiglu(hb.data(), hb2.data(), c.ffn_dim);
          }
          ref::matmul(L.w_down, hb.data(), 1, xb2.data());
        }
        if (L.post_ffn_norm) {
          ref::rmsnorm(xb2.data(), xb2.data(), L.post_ffn_norm, c.dim, c.norm_eps);
        }
        for (int d = 0; d < c.dim; ++d) x[d] += xb2[d];
      }

      if (s.all_logits || i == s.n_tokens - 1) {
        float* lg = out.logits.data() + out_i * c.n_vocab;
        ref::rmsnorm(xb.data(), x.data(), w_.output_norm, c.dim, c.norm_eps);
        ref::matmul(w_.output, xb.data(), 1, lg);
        if (w_.output_bias) ref::add_bias(lg, w_.output_bias, 1, c.n_vocab);
        if (c.final_softcap > 0.0f) ref::softcap(lg, c.n_vocab, c.final_softcap);
        ++out_i;
      }
    }
  }
}

// ---- fast path: all new tokens of all sequences as one (T, dim) activation matrix ----

void CpuEngine::forward_fast(const std::vector<SeqStep>& batch, StepOutput& out) {
  const ModelConfig& c = c_;
  const size_t T = static_cast<size_t>(n_tok_);
  const int64_t dim = c.dim;
  grow(x_, T * dim);
  grow(xb_, T * dim);
  grow(q_, T * q_dim_);
  grow(q_sink_, static_cast<size_t>(n_sink_rows_ * q_dim_));
  grow(k_, T * kv_dim_);
  grow(v_, T * kv_dim_);
  grow(att_, T * q_dim_);
  grow(hb_, T * c.ffn_dim);
  grow(hb2_, T * c.ffn_dim);
  grow(xr_, out_row_.size() * dim);

  const kernels::WeightView& E = w_.tok_embd;
  const size_t erow_bytes = kernels::row_bytes(E.type, E.cols);
  for (size_t t = 0; t < T; ++t) {
    kernels::dequantize_row(E.type, static_cast<const uint8_t*>(E.data) + tok_[t] * erow_bytes,
                            x_.data() + t * dim, dim);
  }
  if (c.embed_scale != 1.0f)
    kernels::scale(x_.data(), static_cast<int64_t>(T) * dim, c.embed_scale);
  const auto rows_norm = [&](float* y, const float* x, const float* w) {
    for (size_t t = 0; t < T; ++t) kernels::rmsnorm(y + t * dim, x + t * dim, w, dim, c.norm_eps);
  };
  // After each half of a layer the step can stop (interrupt_on): the K/V slots of the layers
  // begun are written, the later layers' are not, and the caller feeds the same tokens again.
  const auto stop_point = [&] {
    if (interrupt_ && interrupt_->load(std::memory_order_relaxed)) throw StepInterrupted();
  };

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
    rows_norm(xb_.data(), x_.data(), L.attn_norm);
    matmul_many({&L.wq, &L.wk, &L.wv}, {q_.data(), k_.data(), v_.data()}, xb_.data(), n_tok_);
    if (L.bq) kernels::add_bias(q_.data(), L.bq, n_tok_, q_dim_);
    if (L.bk) kernels::add_bias(k_.data(), L.bk, n_tok_, kv_dim_);
    if (L.bv) kernels::add_bias(v_.data(), L.bv, n_tok_, kv_dim_);
    // Per token: head norms, RoPE and the K/V store. Tokens touch disjoint rows and slots, so a
    // batch of them is shared over the pool (a batch-32 step of the 110M shape spent about 1 ms
    // here on one thread).
    const auto per_token = [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* qt = q_.data() + t * q_dim_;
        float* kt = k_.data() + t * kv_dim_;
        if (L.q_norm) {
          const int qn = c.qk_norm_whole ? 1 : c.n_heads;
          kernels::rmsnorm_heads(qt, qn, static_cast<int>(q_dim_ / qn), L.q_norm, c.norm_eps);
        }
        if (L.k_norm) {
          const int kn = c.qk_norm_whole ? 1 : c.n_kv_heads;
          kernels::rmsnorm_heads(kt, kn, static_cast<int>(kv_dim_ / kn), L.k_norm, c.norm_eps);
        }
        if (sink_pos_[t] >= 0) {
          float* qs = q_sink_.data() + sink_idx_[t] * q_dim_;
          std::memcpy(qs, qt, sizeof(float) * q_dim_);
          kernels::rope_ext(qs, c.n_heads, rope_, sink_pos_[t]);
        }
        kernels::rope_ext(qt, c.n_heads, rope_, pos_[t]);
        kernels::rope_ext(kt, c.n_kv_heads, rope_, pos_[t]);
        store_kv(l, row_slot(l, static_cast<size_t>(t)), kt, v_.data() + t * kv_dim_);
      }
    };
    if (threads_ && T >= kPoolTokens) {
      threads_->parallel_for(static_cast<int64_t>(T), std::cref(per_token));
    } else {
      per_token(0, static_cast<int64_t>(T));
    }
    attention_fast(batch, l);
    matmul(L.wo, att_.data(), xb_.data(), n_tok_);
    if (L.bo) kernels::add_bias(xb_.data(), L.bo, n_tok_, dim);
    if (L.post_attn_norm) rows_norm(xb_.data(), xb_.data(), L.post_attn_norm);
    kernels::axpy(1.0f, xb_.data(), x_.data(), static_cast<int64_t>(T) * dim);
    stop_point();

    rows_norm(xb_.data(), x_.data(), L.ffn_norm);
    if (c.n_experts > 0) {
      moe_fast(L, T);
    } else {
      matmul_many({&L.w_gate, &L.w_up}, {hb_.data(), hb2_.data()}, xb_.data(), n_tok_);
      if (c.activation == Activation::GeluTanh) {
        kernels::geglu(hb_.data(), hb2_.data(), static_cast<int64_t>(T) * c.ffn_dim);
      } else {
        kernels::swiglu(hb_.data(), hb2_.data(), static_cast<int64_t>(T) * c.ffn_dim);
      }
      matmul(L.w_down, hb_.data(), xb_.data(), n_tok_);
    }
    if (L.post_ffn_norm) rows_norm(xb_.data(), xb_.data(), L.post_ffn_norm);
    kernels::axpy(1.0f, xb_.data(), x_.data(), static_cast<int64_t>(T) * dim);
    stop_point();
  }

  const size_t R = out_row_.size();
  for (size_t r = 0; r < R; ++r) {
    kernels::rmsnorm(xr_.data() + r * dim, x_.data() + static_cast<size_t>(out_row_[r]) * dim,
                     w_.output_norm, dim, c.norm_eps);
  }
  matmul(w_.output, xr_.data(), out.logits.data(), static_cast<int64_t>(R));
  const int64_t n_logits = static_cast<int64_t>(R) * c.n_vocab;
  if (w_.output_bias) kernels::add_bias(out.logits.data(), w_.output_bias, R, c.n_vocab);
  if (c.final_softcap > 0.0f) kernels::softcap(out.logits.data(), n_logits, c.final_softcap);
}

// ---- mixture of experts ----

namespace {

// The router's choice for one token: probabilities p (softmax over all experts, in place of the
// logits), the n_used most probable experts (ties to the lower index) and their weights.
void route(const ModelConfig& c, float* p, int32_t* pick, float* w) {
  kernels::softmax(p, c.n_experts);
  // One pass keeping the best so far sorted, most probable first: an expert goes before one
  // already kept only when strictly more probable, so ties go to the lower index.
  const int n_used = c.n_experts_used;
  int kept = 0;
  for (int32_t e = 0; e < c.n_experts; ++e) {
    if (kept == n_used && !(p[e] > p[pick[n_used - 1]])) continue;
    int j = kept < n_used ? kept++ : n_used - 1;
    for (; j > 0 && p[e] > p[pick[j - 1]]; --j) pick[j] = pick[j - 1];
    pick[j] = e;
  }
  float sum = 0.0f;
  for (int j = 0; j < n_used; ++j) {
    w[j] = p[pick[j]];
    sum += w[j];
  }
  const float k = (c.expert_weights_norm ? 1.0f / sum : 1.0f) * c.expert_weights_scale;
  for (int j = 0; j < n_used; ++j) w[j] *= k;
}

float sigmoid_dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(1.0 / (1.0 + std::exp(-s)));
}

}  // namespace

void CpuEngine::moe_reference(const LayerWeights& L, const float* xb, float* out) const {
  namespace ref = kernels::ref;
  const ModelConfig& c = c_;
  std::vector<float> p(static_cast<size_t>(c.n_experts));
  std::vector<int32_t> pick(static_cast<size_t>(c.n_experts_used));
  std::vector<float> w(static_cast<size_t>(c.n_experts_used));
  ref::matmul(L.router, xb, 1, p.data());
  route(c, p.data(), pick.data(), w.data());
  const int64_t width = std::max(c.expert_ffn_dim, c.shared_expert_ffn_dim);
  std::vector<float> h(static_cast<size_t>(width)), h2(static_cast<size_t>(width));
  std::vector<float> y(static_cast<size_t>(c.dim));
  std::fill(out, out + c.dim, 0.0f);
  for (int j = 0; j < c.n_experts_used; ++j) {
    const auto e = static_cast<size_t>(pick[static_cast<size_t>(j)]);
    ref::matmul(L.exp_gate[e], xb, 1, h.data());
    ref::matmul(L.exp_up[e], xb, 1, h2.data());
    ref::swiglu(h.data(), h2.data(), c.expert_ffn_dim);
    ref::matmul(L.exp_down[e], h.data(), 1, y.data());
    for (int d = 0; d < c.dim; ++d) out[d] += w[static_cast<size_t>(j)] * y[static_cast<size_t>(d)];
  }
  if (L.shexp_gate_inp) {
    ref::matmul(L.shexp_gate, xb, 1, h.data());
    ref::matmul(L.shexp_up, xb, 1, h2.data());
    ref::swiglu(h.data(), h2.data(), c.shared_expert_ffn_dim);
    ref::matmul(L.shexp_down, h.data(), 1, y.data());
    const float g = sigmoid_dot(L.shexp_gate_inp, xb, c.dim);
    for (int d = 0; d < c.dim; ++d) out[d] += g * y[static_cast<size_t>(d)];
  }
}

// The step's tokens grouped by expert (what llama.cpp's mul_mat_id does): each active expert runs
// gate and up, SwiGLU and down over its rows, and the outputs are added back to each row with
// its weight. Two ways to share the experts over the pool:
// - many rows per expert (prefill): expert after expert, each matmul's rows split over the pool;
// - few rows per expert (decode): every active expert is one task of one parallel_for, its
//   whole chain on one thread with single-threaded matvec-sized matmuls: one hand-off per layer
//   instead of two per expert, and each thread streams whole experts' weights.
// Both compute the same products in the same order, so they give the same values. Every buffer is
// a member that only grows.
void CpuEngine::moe_fast(const LayerWeights& L, size_t T) {
  const ModelConfig& c = c_;
  const int64_t dim = c.dim, E = c.n_experts, K = c.n_experts_used, F = c.expert_ffn_dim;
  const int64_t S = c.shared_expert_ffn_dim;
  const auto n = static_cast<int64_t>(T);
  grow(moe_p_, T * E);
  grow(moe_pick_, T * K);
  grow(moe_w_, T * K);
  grow(moe_rows_, T * K);
  grow(moe_slot_, T * K);
  grow(moe_start_, static_cast<size_t>(E + 1));
  grow(moe_active_, static_cast<size_t>(E));
  grow(moe_acc_, T * dim);
  matmul(L.router, xb_.data(), moe_p_.data(), n);
  for (int64_t t = 0; t < n; ++t)
    route(c, moe_p_.data() + t * E, moe_pick_.data() + t * K, moe_w_.data() + t * K);
  // Counting sort of (row, pick) by expert.
  std::fill(moe_start_.begin(), moe_start_.begin() + E + 1, 0);
  for (int64_t i = 0; i < n * K; ++i) ++moe_start_[static_cast<size_t>(moe_pick_[i] + 1)];
  for (int64_t e = 0; e < E; ++e) moe_start_[e + 1] += moe_start_[e];
  // Each pick to its place: moe_start_[e] runs as expert e's cursor, then is shifted back.
  for (int64_t i = 0; i < n * K; ++i) {
    const auto e = static_cast<size_t>(moe_pick_[i]);
    const int32_t pos = moe_start_[e]++;
    moe_rows_[static_cast<size_t>(pos)] = static_cast<int32_t>(i / K);
    moe_slot_[static_cast<size_t>(pos)] = static_cast<int32_t>(i);
  }
  for (int64_t e = E; e > 0; --e) moe_start_[e] = moe_start_[e - 1];
  moe_start_[0] = 0;
  // The active experts, most rows first (the longest tasks are claimed first): an insertion sort,
  // which allocates nothing (std::stable_sort may) and keeps equal counts in expert order.
  const auto rows_of_expert = [&](int32_t e) { return moe_start_[e + 1] - moe_start_[e]; };
  int64_t n_active = 0, max_rows = 0;
  for (int32_t e = 0; e < E; ++e) {
    const int64_t m = rows_of_expert(e);
    if (m == 0) continue;
    max_rows = std::max(max_rows, m);
    int64_t j = n_active++;
    for (; j > 0 && rows_of_expert(moe_active_[static_cast<size_t>(j - 1)]) < m; --j)
      moe_active_[static_cast<size_t>(j)] = moe_active_[static_cast<size_t>(j - 1)];
    moe_active_[static_cast<size_t>(j)] = e;
  }
  const int64_t expert_macs = 3 * F * dim;  // per row: gate, up and down
  const bool tasks = threads_ && n_active >= threads_->size() && max_rows <= kMoeTaskRows &&
                     pool_for(n * K * expert_macs) != nullptr;
  // Task mode keeps every expert's rows at their place in the grouped order (offset r0); the
  // other mode reuses the buffers from row 0 for one expert after the other.
  const int64_t held = tasks ? n * K : max_rows;
  grow(moe_in_, static_cast<size_t>(held * dim));
  grow(moe_h_, static_cast<size_t>(std::max(held * F, n * S)));
  grow(moe_h2_, static_cast<size_t>(std::max(held * F, n * S)));
  grow(moe_out_, static_cast<size_t>(std::max(held, n) * dim));

  // Expert e over its rows: gathered inputs, gate and up, SwiGLU, down, into moe_out_ from row
  // `at`; `pool` splits each matmul's rows (nullptr: all on the calling thread).
  const auto run_expert = [&](int32_t e, int64_t at, kernels::ThreadPool* pool) {
    const int32_t r0 = moe_start_[e];
    const int64_t m = rows_of_expert(e);
    float* in = moe_in_.data() + at * dim;
    float* h = moe_h_.data() + at * F;
    float* h2 = moe_h2_.data() + at * F;
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(in + i * dim, xb_.data() + int64_t{moe_rows_[r0 + i]} * dim, sizeof(float) * dim);
    const auto ue = static_cast<size_t>(e);
    const kernels::WeightView* gate_up[2] = {&L.exp_gate[ue], &L.exp_up[ue]};
    float* hs[2] = {h, h2};
    kernels::matmul_many(gate_up, hs, 2, in, m, pool);
    kernels::swiglu(h, h2, m * F);
    kernels::matmul(L.exp_down[ue], h, m, moe_out_.data() + at * dim, pool);
  };
  // Adds expert e's outputs (from row `at` of moe_out_) to its rows, each with its weight.
  const auto add_expert = [&](int32_t e, int64_t at) {
    const int32_t r0 = moe_start_[e];
    for (int64_t i = 0; i < rows_of_expert(e); ++i)
      kernels::axpy(moe_w_[static_cast<size_t>(moe_slot_[r0 + i])],
                    moe_out_.data() + (at + i) * dim,
                    moe_acc_.data() + int64_t{moe_rows_[r0 + i]} * dim, dim);
  };
  std::fill(moe_acc_.begin(), moe_acc_.begin() + n * dim, 0.0f);
  if (tasks) {
    // Tasks write disjoint rows of moe_in_/h/h2/moe_out_; two experts may feed one token, so
    // the sums are added afterwards, on this thread.
    const auto body = [&](int64_t a0, int64_t a1) {
      for (int64_t a = a0; a < a1; ++a) {
        const int32_t e = moe_active_[static_cast<size_t>(a)];
        run_expert(e, moe_start_[e], nullptr);
      }
    };
    threads_->parallel_for(n_active, std::cref(body));
    for (int64_t a = 0; a < n_active; ++a) {
      const int32_t e = moe_active_[static_cast<size_t>(a)];
      add_expert(e, moe_start_[e]);
    }
  } else {
    for (int64_t a = 0; a < n_active; ++a) {
      const int32_t e = moe_active_[static_cast<size_t>(a)];
      run_expert(e, 0, pool_for(rows_of_expert(e) * expert_macs));
      add_expert(e, 0);
    }
  }
  if (L.shexp_gate_inp) {
    matmul_many({&L.shexp_gate, &L.shexp_up}, {moe_h_.data(), moe_h2_.data()}, xb_.data(), n);
    kernels::swiglu(moe_h_.data(), moe_h2_.data(), n * S);
    matmul(L.shexp_down, moe_h_.data(), moe_out_.data(), n);
    for (int64_t t = 0; t < n; ++t)
      kernels::axpy(sigmoid_dot(L.shexp_gate_inp, xb_.data() + t * dim, dim),
                    moe_out_.data() + t * dim, moe_acc_.data() + t * dim, dim);
  }
  std::memcpy(xb_.data(), moe_acc_.data(), sizeof(float) * static_cast<size_t>(n * dim));
}

// Causal attention of every new token over its sequence's cached slots. Tasks (AttnUnit) are
// handed out through an atomic counter, so one long prefill next to many decodes still
// balances; each worker owns a slice of ws_, so tasks share nothing writable.
void CpuEngine::attention_fast(const std::vector<SeqStep>& batch, int layer) {
  const int64_t n_units = static_cast<int64_t>(units_.size());
  std::atomic<int64_t> next{0};
  const auto work = [&](int64_t w_begin, int64_t w_end) {
    for (int64_t w = w_begin; w < w_end; ++w) {
      float* ws = ws_.data() + w * ws_floats_;
      for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < n_units;) {
        const AttnUnit& a = units_[static_cast<size_t>(u)];
        const SeqStep& s = batch[static_cast<size_t>(a.seq)];
        const int32_t row0 = seq_row_[static_cast<size_t>(a.seq)];
        if (a.gemm) {
          attend_gemm(s, row0, layer, a.head, a.i0, a.i1, ws);
        } else {
          attend_dot(s, row0, layer, a.head, a.head + a.n_heads, ws);
        }
      }
    }
  };
  kernels::ThreadPool* tp = pool_for(attn_macs_ * kAttnMacCost);
  if (tp && n_units > 1) {
    // Through a reference wrapper, std::function stores no copy of the lambda: no allocation.
    tp->parallel_for(tp->size(), std::cref(work));
  } else {
    work(0, 1);
  }
}

// KV heads [g0, g1) with their groups of query heads, every new token of s: the groups' scores
// against each run of cached rows (every row read once for its group; a run's heads lie one
// after the other in the block), a softmax per query head, then the outputs mixed from the same
// runs of values.
void CpuEngine::attend_dot(const SeqStep& s, int32_t row0, int layer, int g0, int g1, float* sc) {
  const int hd = c_.head_dim;
  const int group = c_.n_heads / c_.n_kv_heads;
  const int nh = g1 - g0;
  const int64_t h0 = int64_t{g0} * group;  // the first query head
  const float scale = c_.query_scale;
  const Reach at = reach(s, layer);
  const int32_t* tab = table_of(s, layer);
  for (int32_t i = 0; i < s.n_tokens; ++i) {
    const size_t row = static_cast<size_t>(row0 + i);
    const float* q = q_.data() + row * q_dim_ + h0 * hd;
    const int32_t si = sink_idx_[row];
    const float* qs = si >= 0 ? q_sink_.data() + si * q_dim_ + h0 * hd : q;
    // Scores of sink slots [0, ns) then window slots [lo, t], packed as row r (query head
    // h0 + r) of sc, n_keys apart.
    const int64_t t = int64_t{s.n_past} + i;
    const Visible vis = visible(t, at.window, at.sinks);
    const int64_t ns = vis.n_sinks;
    const int64_t n_keys = ns + t - vis.lo + 1;
    const auto scores = [&](const float* qq) {
      return [&, qq](int64_t j, int64_t slot, int64_t n) {
        for (int g = 0; g < nh; ++g)
          kernels::kv_scores(kv_type_, qq + int64_t{g} * group * hd, hd, group,
                             k_head(layer, g0 + g, slot), head_row_, n, hd, scale,
                             sc + int64_t{g} * group * n_keys + j, n_keys);
      };
    };
    for_runs(tab, 0, ns, 0, scores(qs));
    for_runs(tab, vis.lo, t + 1, ns, scores(q));
    for (int r = 0; r < nh * group; ++r) {
      float* sr = sc + r * n_keys;
      if (c_.attn_softcap > 0.0f) kernels::softcap(sr, n_keys, c_.attn_softcap);
      kernels::softmax(sr, n_keys);
    }
    float* o = att_.data() + row * q_dim_ + h0 * hd;
    std::fill(o, o + int64_t{nh} * group * hd, 0.0f);
    const auto mix = [&](int64_t j, int64_t slot, int64_t n) {
      for (int g = 0; g < nh; ++g)
        kernels::kv_mix(kv_type_, sc + int64_t{g} * group * n_keys + j, n_keys, group,
                        v_head(layer, g0 + g, slot), head_row_, n, hd, o + int64_t{g} * group * hd,
                        hd);
    };
    for_runs(tab, 0, ns, 0, mix);
    for_runs(tab, vis.lo, t + 1, ns, mix);
  }
}

// KV head g with its group of query heads, query tokens [i0, i1) of s: the keys and values the
// tile can see are gathered out of the paged cache once, then scores = Q K^T and out = P V are
// two matrix products (rows = group x tile tokens), with each row's mask applied in between.
// Gathered columns: the first token's sink slots [0, ns0), then slots [lo0, t1) (lo0 the first
// token's window start, t1 one past the last token); a row sees the columns [0, a) as sinks
// and [b, e) as its window.
void CpuEngine::attend_gemm(const SeqStep& s, int32_t row0, int layer, int g, int32_t i0,
                            int32_t i1, float* ws) {
  const int64_t hd = c_.head_dim;
  const int group = c_.n_heads / c_.n_kv_heads;
  const float scale = c_.query_scale;
  const Reach at = reach(s, layer);
  const int64_t t0 = int64_t{s.n_past} + i0, t1 = int64_t{s.n_past} + i1;
  const Visible v0 = visible(t0, at.window, at.sinks);
  const int64_t ns0 = v0.n_sinks;
  const int64_t nk = ns0 + t1 - v0.lo;  // gathered slots
  const int64_t qt = i1 - i0;
  const int64_t rows = group * qt;  // row hh * qt + r: head g * group + hh, token i0 + r
  float* K = ws;                    // (nk, hd)
  float* Vt = K + nk * hd;          // (hd, nk)
  float* Q = Vt + hd * nk;          // (rows, hd)
  float* S = Q + rows * hd;         // (rows, nk)
  float* O = S + rows * nk;         // (rows, hd)

  // O is written only by the last product, so its first row holds a value row while gathering.
  const auto gather = [&](int64_t j, int64_t slot) {
    kernels::kv_load_row(kv_type_, k_head(layer, g, slot), K + j * hd, hd);
    kernels::kv_load_row(kv_type_, v_head(layer, g, slot), O, hd);
    for (int64_t d = 0; d < hd; ++d) Vt[d * nk + j] = O[d];
  };
  const int32_t* tab = table_of(s, layer);
  for_slots(tab, 0, ns0, 0, gather);
  for_slots(tab, v0.lo, t1, ns0, gather);
  for (int hh = 0; hh < group; ++hh) {
    const int64_t h = int64_t{g} * group + hh;
    for (int64_t r = 0; r < qt; ++r) {
      const float* src = q_.data() + (row0 + i0 + r) * q_dim_ + h * hd;
      std::copy(src, src + hd, Q + (hh * qt + r) * hd);
    }
  }
  kernels::matmul(kernels::WeightView{kernels::DType::F32, K, nk, hd}, Q, rows, S, nullptr);
  for (int64_t row = 0; row < rows; ++row) {
    float* sr = S + row * nk;
    const int64_t r = row % qt, t = t0 + r;
    const Visible vis = visible(t, at.window, at.sinks);
    // Sink slots of t below lo0 are columns [0, ns0); those from lo0 on sit in the window part.
    const int64_t a = ns0 + std::max<int64_t>(0, vis.n_sinks - v0.lo);
    const int64_t b = ns0 + vis.lo - v0.lo;
    const int64_t e = ns0 + t - v0.lo + 1;
    const int32_t si = sink_idx_[static_cast<size_t>(row0 + i0 + r)];
    if (si >= 0) {
      const float* qsh = q_sink_.data() + si * q_dim_ + (int64_t{g} * group + row / qt) * hd;
      for (int64_t j = 0; j < a; ++j) sr[j] = kernels::dot(qsh, K + j * hd, hd);
    }
    for (int64_t j = 0; j < a; ++j) sr[j] *= scale;
    for (int64_t j = b; j < e; ++j) sr[j] *= scale;
    if (c_.attn_softcap > 0.0f) {
      kernels::softcap(sr, a, c_.attn_softcap);
      kernels::softcap(sr + b, e - b, c_.attn_softcap);
    }
    if (a == b) {
      kernels::softmax(sr, e);
    } else {
      // Softmax over the two ranges packed together, then moved back with zeros in between.
      std::copy(sr + b, sr + e, sr + a);
      const int64_t n = a + (e - b);
      kernels::softmax(sr, n);
      std::copy_backward(sr + a, sr + n, sr + e);
      std::fill(sr + a, sr + b, 0.0f);
    }
    std::fill(sr + e, sr + nk, 0.0f);
  }
  kernels::matmul(kernels::WeightView{kernels::DType::F32, Vt, hd, nk}, S, rows, O, nullptr);
  for (int hh = 0; hh < group; ++hh) {
    const int64_t h = int64_t{g} * group + hh;
    for (int64_t r = 0; r < qt; ++r) {
      const float* src = O + (hh * qt + r) * hd;
      std::copy(src, src + hd, att_.data() + (row0 + i0 + r) * q_dim_ + h * hd);
    }
  }
}

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<Model> model, const EngineOptions& opts) {
  if (!model) throw std::invalid_argument("make_cpu_engine: null model");
  return std::make_unique<CpuEngine>(std::move(model), opts);
}

}  // namespace sy
