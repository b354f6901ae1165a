// Loading errors of llama-family files (wrong architecture, missing or mis-shaped tensors,
// missing hyperparameters) and the engine's refusal of malformed batches.
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu/engine.hpp"
#include "tests/support/seq_step.hpp"

BOOST_AUTO_TEST_SUITE(test_llama_errors)

namespace {

namespace gguf = sy::gguf;

// A tiny valid llama file: dim 8, 2 layers, 2 query heads sharing 1 KV head (head_dim 4),
// ffn 12, a 6-token SentencePiece vocabulary. Tweaks break one thing at a time.
struct Tweaks {
  std::string arch = "llama";
  std::set<std::string> drop_keys;
  std::set<std::string> drop_tensors;
  std::map<std::string, std::vector<uint64_t>> reshape;
  std::map<std::string, sy::kernels::DType> retype;
  std::map<std::string, uint32_t> extra_u32;
  bool with_output = true;
};

constexpr int kDim = 8, kLayers = 2, kHeads = 2, kKvHeads = 1, kHeadDim = 4, kFfn = 12, kVocab = 6;

std::vector<uint8_t> tensor_bytes(sy::kernels::DType type, const std::vector<uint64_t>& dims,
                                  std::mt19937& rng) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  const size_t rb =
      static_cast<size_t>(sy::kernels::dtype_row_bytes(type, static_cast<int64_t>(dims[0])));
  std::vector<uint8_t> out(rb * static_cast<size_t>(n / dims[0]));
  for (uint64_t r = 0; r < n / dims[0]; ++r) {
    sy::kernels::quantize_row(type, v.data() + r * dims[0], out.data() + r * rb,
                              static_cast<int64_t>(dims[0]));
  }
  return out;
}

std::vector<uint8_t> build(const Tweaks& tw = {}) {
  gguf::Writer w;
  const auto key_u32 = [&](const std::string& k, uint32_t v) {
    if (!tw.drop_keys.count(k)) w.add_u32(k, v);
  };
  w.add_string("general.architecture", tw.arch);
  key_u32("llama.context_length", 64);
  key_u32("llama.embedding_length", kDim);
  key_u32("llama.block_count", kLayers);
  key_u32("llama.feed_forward_length", kFfn);
  key_u32("llama.attention.head_count", kHeads);
  key_u32("llama.attention.head_count_kv", kKvHeads);
  if (!tw.drop_keys.count("llama.attention.layer_norm_rms_epsilon")) {
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  }
  for (const auto& [k, v] : tw.extra_u32) w.add_u32(k, v);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>",
                                               "\xe2\x96\x81"
                                               "a",
                                               "a", "b"});
  w.add_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3});
  w.add_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1});
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);

  std::mt19937 rng(7);
  const auto tensor = [&](const std::string& name, std::vector<uint64_t> dims) {
    if (tw.drop_tensors.count(name)) return;
    if (auto it = tw.reshape.find(name); it != tw.reshape.end()) dims = it->second;
    sy::kernels::DType type = sy::kernels::DType::F32;
    if (auto it = tw.retype.find(name); it != tw.retype.end()) type = it->second;
    w.add_tensor(name, type, dims, tensor_bytes(type, dims, rng));
  };
  const uint64_t q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
  tensor("token_embd.weight", {kDim, kVocab});
  tensor("output_norm.weight", {kDim});
  if (tw.with_output) tensor("output.weight", {kDim, kVocab});
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    tensor(b + "attn_norm.weight", {kDim});
    tensor(b + "attn_q.weight", {kDim, q});
    tensor(b + "attn_k.weight", {kDim, kv});
    tensor(b + "attn_v.weight", {kDim, kv});
    tensor(b + "attn_output.weight", {q, kDim});
    tensor(b + "ffn_norm.weight", {kDim});
    tensor(b + "ffn_gate.weight", {kDim, kFfn});
    tensor(b + "ffn_up.weight", {kDim, kFfn});
    tensor(b + "ffn_down.weight", {kFfn, kDim});
  }
  return w.bytes();
}

// Loads from bytes the caller keeps alive.
std::shared_ptr<sy::LlamaModel> load(const std::vector<uint8_t>& bytes) {
  return sy::LlamaModel::from_gguf(gguf::File::from_memory(bytes.data(), bytes.size()));
}

// True when loading throws gguf::Error whose message contains every fragment.
void expect_error(const Tweaks& tw, const std::vector<std::string>& fragments) {
  const std::vector<uint8_t> bytes = build(tw);
  try {
    load(bytes);
    BOOST_ERROR("loading succeeded; expected an error naming " << fragments.front());
  } catch (const gguf::Error& e) {
    const std::string msg = e.what();
    for (const std::string& f : fragments) {
      BOOST_TEST(msg.find(f) != std::string::npos, "message '" << msg << "' lacks '" << f << "'");
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(valid_tiny_file_loads) {
  const auto bytes = build();
  auto m = load(bytes);
  const sy::LlamaConfig& c = m->config();
  BOOST_TEST(c.n_vocab == kVocab);
  BOOST_TEST(c.dim == kDim);
  BOOST_TEST(c.n_layers == kLayers);
  BOOST_TEST(c.n_heads == kHeads);
  BOOST_TEST(c.n_kv_heads == kKvHeads);
  BOOST_TEST(c.head_dim == kHeadDim);
  BOOST_TEST(c.rope_dim == kHeadDim);
  BOOST_TEST(c.ffn_dim == kFfn);
  BOOST_TEST(c.ctx_len == 64);
  BOOST_TEST(c.rope_theta == 10000.0f);
  BOOST_TEST(c.sliding_window == 0);
  BOOST_TEST(m->weights().layers.size() == size_t{kLayers});
  BOOST_TEST(m->weights().layers[1].wq.rows == kHeads * kHeadDim);
  BOOST_TEST(m->weights().layers[1].wq.cols == kDim);
  BOOST_TEST(m->weights().layers[1].w_down.rows == kDim);
  BOOST_TEST(m->weights().layers[1].w_down.cols == kFfn);
  BOOST_TEST(m->weights().output.data != m->weights().tok_embd.data);
  BOOST_TEST(m->tokenizer().n_vocab() == kVocab);
}

BOOST_AUTO_TEST_CASE(tied_output_uses_token_embedding) {
  Tweaks tw;
  tw.with_output = false;
  const auto bytes = build(tw);
  auto m = load(bytes);
  BOOST_TEST(m->weights().output.data == m->weights().tok_embd.data);
}

BOOST_AUTO_TEST_CASE(f16_norms_are_converted) {
  Tweaks tw;
  tw.retype["blk.0.attn_norm.weight"] = sy::kernels::DType::F16;
  const auto bytes = build(tw);
  auto m = load(bytes);
  const gguf::TensorInfo* t = m->file().tensor("blk.0.attn_norm.weight");
  const auto* h = reinterpret_cast<const uint16_t*>(m->file().data(*t));
  for (int i = 0; i < kDim; ++i) {
    BOOST_TEST(m->weights().layers[0].attn_norm[i] == sy::kernels::f16_to_f32(h[i]));
  }
}

BOOST_AUTO_TEST_CASE(wrong_architecture) {
  Tweaks tw;
  tw.arch = "gpt2";
  expect_error(tw, {"unsupported architecture 'gpt2'"});
}

BOOST_AUTO_TEST_CASE(missing_tensor) {
  Tweaks tw;
  tw.drop_tensors.insert("blk.1.ffn_up.weight");
  expect_error(tw, {"missing tensor", "blk.1.ffn_up.weight"});
  Tweaks tw2;
  tw2.drop_tensors.insert("token_embd.weight");
  expect_error(tw2, {"missing tensor", "token_embd.weight"});
}

BOOST_AUTO_TEST_CASE(mismatched_shape) {
  Tweaks tw;
  tw.reshape["blk.1.attn_q.weight"] = {8, 4};
  expect_error(tw, {"tensor 'blk.1.attn_q.weight' has shape [8, 4], expected [8, 8]"});
  Tweaks tw2;
  tw2.reshape["blk.0.attn_norm.weight"] = {7};
  expect_error(tw2, {"blk.0.attn_norm.weight", "[7]", "expected [8]"});
  Tweaks tw3;
  tw3.reshape["output.weight"] = {8, 5};
  expect_error(tw3, {"output.weight", "[8, 5]", "expected [8, 6]"});
}

BOOST_AUTO_TEST_CASE(missing_hyperparameter) {
  for (const char* key :
       {"llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
        "llama.attention.head_count", "llama.context_length"}) {
    BOOST_TEST_CONTEXT(key) {
      Tweaks tw;
      tw.drop_keys.insert(key);
      expect_error(tw, {"missing metadata key", key});
    }
  }
}

BOOST_AUTO_TEST_CASE(optional_hyperparameters_default) {
  Tweaks tw;
  tw.drop_keys = {"llama.attention.head_count_kv", "llama.attention.layer_norm_rms_epsilon"};
  // Without head_count_kv every query head has its own KV head, so attn_k must be [8, 8].
  tw.reshape["blk.0.attn_k.weight"] = {8, 8};
  tw.reshape["blk.0.attn_v.weight"] = {8, 8};
  tw.reshape["blk.1.attn_k.weight"] = {8, 8};
  tw.reshape["blk.1.attn_v.weight"] = {8, 8};
  const auto bytes = build(tw);
  auto m = load(bytes);
  BOOST_TEST(m->config().n_kv_heads == kHeads);
  BOOST_TEST(m->config().norm_eps == 1e-5f);
}

BOOST_AUTO_TEST_CASE(sliding_window_files_load) {
  // Mistral-shaped files are architecture "llama" with GQA and a sliding window key.
  Tweaks tw;
  tw.extra_u32["llama.attention.sliding_window"] = 4096;
  tw.extra_u32["llama.rope.dimension_count"] = 2;
  const auto bytes = build(tw);
  auto m = load(bytes);
  BOOST_TEST(m->config().sliding_window == 4096);
  BOOST_TEST(m->config().rope_dim == 2);
}

BOOST_AUTO_TEST_CASE(inconsistent_hyperparameters) {
  Tweaks tw;
  tw.extra_u32["llama.vocab_size"] = 7;
  expect_error(tw, {"vocab_size 7", "6"});
  Tweaks tw2;
  tw2.drop_keys.insert("llama.attention.head_count_kv");
  tw2.extra_u32["llama.attention.head_count_kv"] = 3;  // 2 query heads cannot share 3 KV heads
  expect_error(tw2, {"head_count_kv"});
  Tweaks tw3;
  tw3.extra_u32["llama.rope.dimension_count"] = 6;  // more than head_dim 4
  expect_error(tw3, {"rope.dimension_count"});
  Tweaks tw4;
  tw4.reshape["token_embd.weight"] = {8, 9};  // 9 rows, 6 tokenizer tokens
  tw4.reshape["output.weight"] = {8, 9};
  expect_error(tw4, {"tokenizer.ggml.tokens", "9"});
}

// ---- engine batch validation ----

namespace {

struct EngineFixture {
  std::vector<uint8_t> bytes = build();
  std::shared_ptr<sy::LlamaModel> model = load(bytes);
  std::unique_ptr<sy::Engine> make(bool reference) {
    sy::EngineOptions o;
    o.reference = reference;
    o.n_threads = 2;
    o.block_size = 4;
    o.n_blocks = 8;
    o.max_batch_tokens = 8;
    return sy::make_cpu_engine(model, o);
  }
};

using sy::test::seq_step;

}  // namespace

BOOST_FIXTURE_TEST_CASE(engine_refuses_malformed_batches, EngineFixture) {
  for (bool reference : {false, true}) {
    BOOST_TEST_CONTEXT("reference=" << reference) {
      auto e = make(reference);
      sy::StepOutput out;
      const std::vector<int32_t> toks = {1, 3, 4}, blocks = {0}, two_blocks = {0, 1};
      const auto refuses = [&](std::vector<sy::SeqStep> b) {
        BOOST_CHECK_THROW(e->step(b, out), std::invalid_argument);
      };
      sy::SeqStep s = seq_step(toks, 0, blocks);
      s.n_tokens = 0;
      refuses({s});
      s = seq_step(toks, 0, blocks);
      s.tokens = nullptr;
      refuses({s});
      const std::vector<int32_t> bad_hi = {1, kVocab}, bad_lo = {-1};
      refuses({seq_step(bad_hi, 0, blocks)});
      refuses({seq_step(bad_lo, 0, blocks)});
      refuses({seq_step(toks, 2, blocks)});   // 5 slots need 2 blocks of 4
      refuses({seq_step(toks, -1, blocks)});  // negative n_past
      const std::vector<int32_t> bad_block = {8}, neg_block = {-1};
      refuses({seq_step(toks, 0, bad_block)});
      refuses({seq_step(toks, 0, neg_block)});
      s = seq_step(toks, 0, blocks);
      s.block_table = nullptr;
      refuses({s});
      const std::vector<int32_t> nine(9, 3);
      refuses({seq_step(nine, 0, {0, 1, 2})});                          // over max_batch_tokens
      refuses({seq_step(toks, 0, blocks), seq_step(toks, 0, blocks)});  // same slots written twice
      const std::vector<int32_t> neg_pos = {0, -1, 2};
      s = seq_step(toks, 0, blocks);
      s.positions = neg_pos.data();
      refuses({s});

      // A refused step leaves nothing behind: the same valid step still gives the logits of a
      // fresh engine.
      sy::StepOutput a, b;
      e->step({seq_step(toks, 0, blocks)}, a);
      make(reference)->step({seq_step(toks, 0, blocks)}, b);
      BOOST_TEST(a.logits == b.logits, boost::test_tools::per_element());
      BOOST_TEST(a.count.size() == 1u);
      BOOST_TEST(a.count[0] == 1);
      BOOST_TEST(a.n_vocab == kVocab);
      e->step({}, out);  // an empty batch is a no-op
      BOOST_TEST(out.logits.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(block_pool_hands_out_and_takes_back) {
  sy::BlockPool p(3);
  BOOST_TEST(p.n_free() == 3);
  std::set<int32_t> got;
  for (int i = 0; i < 3; ++i) got.insert(*p.alloc());
  BOOST_TEST(got == (std::set<int32_t>{0, 1, 2}));
  BOOST_TEST(!p.alloc().has_value());
  BOOST_TEST(p.n_used() == 3);
  p.free(1);
  BOOST_CHECK_THROW(p.free(1), std::logic_error);
  BOOST_CHECK_THROW(p.free(3), std::logic_error);
  BOOST_TEST(*p.alloc() == 1);
}

BOOST_AUTO_TEST_SUITE_END()  // test_llama_errors
