// The engine interface: one model step over a batch of sequences whose KV memory is paged.
// The continuous batcher drives it; the CPU backend (gpu/cpu_engine.cpp) and the CUDA backend
// implement it and are checked against the same golden outputs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace sy {

/// Fixed-size KV blocks handed out from a free list. Ids are [0, n_total).
class BlockPool {
 public:
  explicit BlockPool(int32_t n_blocks);
  /// A free block, or nullopt when none is left.
  std::optional<int32_t> alloc();
  /// Returns a block to the pool; freeing a block that is not in use throws std::logic_error.
  void free(int32_t id);
  int32_t n_total() const { return n_total_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t n_used() const { return n_total_ - n_free(); }

 private:
  int32_t n_total_;
  std::vector<int32_t> free_;
  std::vector<uint8_t> in_use_;
};

/// One sequence's part of a step. The sequence's cached tokens occupy logical slots
/// [0, n_past); its new tokens go to slots [n_past, n_past + n_tokens). Slot s lives in block
/// block_table[s / block_size] at offset s % block_size. Token i, at slot t = n_past + i, attends
/// to slots [0, t] (window == 0), or to [0, sinks) and (t - window, t] (window > 0). With sinks > 0
/// the sinks are attended with StreamingLLM's cache positions: the query is rotated as if at
/// position min(p, sinks + window - 1) for them (p its own position), so no relative distance
/// exceeds sinks + window - 1. A block table entry may be -1 (released) where no new token of the
/// step attends to any slot of that block.
///
/// On an engine that splits its KV cache into two layer groups (Engine::window_pool() not null:
/// the model's layers are of two kinds, ModelLimits::split_window), block_table holds the K/V of
/// the full-attention layers only and window_table those of the layers with a window of their
/// own; both map the same logical slots, each into its own pool. A window-group entry may be -1
/// where no new token of the step sees that block through the layer's window.
struct SeqStep {
  const int32_t* tokens = nullptr;     // (n_tokens)
  const int32_t* positions = nullptr;  // (n_tokens) RoPE positions; nullptr: n_past + i
  int32_t n_tokens = 0;
  int32_t n_past = 0;
  const int32_t* block_table = nullptr;  // (n_blocks) must cover n_past + n_tokens slots
  int32_t n_blocks = 0;
  bool all_logits = false;  // logits for every new token, not only the last
  int32_t window = 0;       // > 0: attention sees only the last `window` slots (plus the sinks)
  int32_t sinks = 0;        // with window > 0: the first `sinks` slots stay visible
  // The window group's block table (an engine that splits; nullptr elsewhere): must cover
  // n_past + n_tokens slots, ids of Engine::window_pool().
  const int32_t* window_table = nullptr;  // (n_window_blocks)
  int32_t n_window_blocks = 0;
};

/// Logits of a step: for sequence i, rows [offset[i], offset[i] + count[i]) of n_vocab floats.
struct StepOutput {
  std::vector<float> logits;
  std::vector<int32_t> offset;
  std::vector<int32_t> count;
  int32_t n_vocab = 0;                                 // floats per row
  const float* row(size_t seq, int32_t k = -1) const;  ///< k = -1: the sequence's last row
};

/// Engine::step's refusal of one sequence of the batch (its index `seq`), thrown before any KV
/// slot is written: the caller may run the step again without that sequence.
class BadSequence : public std::invalid_argument {
 public:
  BadSequence(size_t seq_index, const std::string& what)
      : std::invalid_argument(what), seq(seq_index) {}
  size_t seq;
};

/// Engine::step's answer to the flag given to Engine::interrupt_on, raised while the step ran: the
/// step stopped inside its layers, before its logits. It has no outputs, and the K/V slots of its
/// new tokens may be partly written; the caller feeds the same tokens at the same slots again (in
/// one step or in several) before any step reads those slots, which leaves the cache exactly as
/// an uninterrupted step would. Nothing else changed: the blocks copied before the step (copy_blocks) stay copied.
class StepInterrupted : public std::runtime_error {
 public:
  StepInterrupted() : std::runtime_error("step interrupted") {}
};

/// One KV block copy (Engine::copy_blocks): block `src` into block `dst` of the same pool, the
/// window group's where `window` (an engine that splits its cache), else pool()'s.
struct KvBlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
  bool window = false;
};

struct EngineOptions {
  int n_threads = 0;             // 0: hardware concurrency
  int32_t block_size = 16;       // tokens per KV block
  int32_t n_blocks = 0;          // 0: enough for 4 sequences of the full context
  bool reference = false;        // plain-loop reference path (test oracle), single thread
  int32_t max_batch_tokens = 0;  // most new tokens in one step; 0: 4096
  // Element type of the cached keys and values: F16 (llama.cpp's default: half the memory of
  // F32), F32 or Q8_0 (blocks of 32 with an f16 scale; head_dim a multiple of 32; the CPU
  // backend only: make_engine passes it to the CUDA engine, which refuses Q8_0).
  kernels::DType kv_type = kernels::DType::F16;
  // > 0: blocks of the window group, for a model whose layers are of two kinds
  // (ModelLimits::split_window() > 0): the windowed layers' K/V then live in a pool of their
  // own, n_blocks being the full-attention layers' pool. 0: one pool for every layer.
  int32_t n_window_blocks = 0;
  // Runs first on each thread the engine starts for itself (the CPU engine's workers), with its
  // index from 1: the executor names them and gives them its CPU priority (core/thread_class.hpp).
  std::function<void(int)> on_thread_start;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const Model& model() const = 0;
  virtual int32_t block_size() const = 0;
  virtual BlockPool& pool() = 0;
  /// The window group's pool where the engine splits its KV cache into two layer groups
  /// (EngineOptions::n_window_blocks > 0); nullptr with one group. pool() is then the
  /// full-attention group's.
  virtual BlockPool* window_pool() { return nullptr; }
  /// Bytes the KV cache takes (keys and values of every block and layer); 0 where unknown.
  virtual size_t kv_bytes() const { return 0; }
  /// Runs one step; throws std::invalid_argument for a malformed batch (block table too short,
  /// token id out of range, ...), checked before any KV slot is written: BadSequence where one
  /// sequence alone is at fault. One step at a time.
  virtual void step(const std::vector<SeqStep>& batch, StepOutput& out) = 0;
  /// Copies whole KV blocks (the keys and values of every layer of the block's group, every
  /// slot), in order, before the next step reads them: copy-on-write of a partly filled block
  /// that sequences forked from one prompt share, before one of them writes into it. Throws
  /// std::invalid_argument, copying nothing, for an id outside its pool or a window copy on an
  /// engine with one group.
  virtual void copy_blocks(const std::vector<KvBlockCopy>& copies) {
    if (!copies.empty()) throw std::invalid_argument("this engine cannot copy KV blocks");
  }
  /// From now on, step() reads `flag` at points inside its layers and throws StepInterrupted when
  /// it is set (the caller clears it); once the layers are done the step runs to its end. Null:
  /// steps run to their end. The CPU engine's fast path reads it after each layer's attention and
  /// after its feed-forward; its reference path (a test oracle) and the CUDA engine (a step there
  /// is launched whole) run every step to its end.
  virtual void interrupt_on(const std::atomic<bool>* flag) { (void)flag; }
  /// A step whose next tokens are picked greedily where the logits are, so that only the ids
  /// (one per sequence, ties to the lowest id, as Sampler) come back. Returns false, doing
  /// nothing, on a backend without it (the CPU engine: its logits are already in host memory).
  virtual bool step_greedy(const std::vector<SeqStep>& batch, std::vector<int32_t>& ids) {
    (void)batch;
    (void)ids;
    return false;
  }
};

/// What a backend's step accepts, for validate_batch.
struct BatchLimits {
  int32_t max_tokens = 0;    // most new tokens in one step
  int32_t block_size = 0;    // tokens per KV block
  int32_t n_blocks = 0;      // block ids are [0, n_blocks)
  int32_t n_vocab = 0;       // token ids are [0, n_vocab)
  int32_t model_window = 0;  // > 0: a window the backend applies to every sequence on its own
  // > 0: the backend splits its cache; SeqStep::window_table (ids [0, n_window_blocks)) serves
  // the layers with window `group_window` of their own.
  int32_t n_window_blocks = 0;
  int32_t group_window = 0;
};

/// The checks of Engine::step shared by every backend, done before anything is written: throws
/// BadSequence naming the sequence at fault (bad counts, a block table too short or with an
/// out-of-range id, a released block that the step would read or write, in either table where
/// the backend splits its cache (BatchLimits::n_window_blocks), a token id out of range,
/// a negative position), or std::invalid_argument for a batch over max_tokens. Returns the
/// number of new tokens.
int64_t validate_batch(const std::vector<SeqStep>& batch, const BatchLimits& lim);

/// The checks of Engine::copy_blocks shared by every backend: throws std::invalid_argument for
/// an id outside [0, n_blocks) (of its group: [0, n_window_blocks) for a window copy, refused
/// when that is 0) or a block copied onto itself.
void validate_copies(const std::vector<KvBlockCopy>& copies, int32_t n_blocks,
                     int32_t n_window_blocks);

/// The parts of m's description beyond the plain llama block (NORM RoPE without frequency
/// factors or scaling, no biases, no q/k norms, pre-norms only, SiLU, no soft-caps, embedding
/// scale 1, no per-layer windows), comma-separated; empty when there are none. A backend that
/// runs only the plain block refuses a model for which this is not empty.
std::string features_beyond_llama(const Model& m);

/// The CPU backend.
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<Model> model, const EngineOptions& opts);

}  // namespace sy
