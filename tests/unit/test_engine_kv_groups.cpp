// KV layer groups in the CPU engine (EngineOptions::n_window_blocks): a model whose layers are of
// two kinds (zoo gemma2: a window of 16 on even layers) keeps the windowed layers' K/V in a pool
// of its own, whose blocks behind the window are given back, and computes the same logits as
// with one pool for all layers; the checks on the second block table; the per-group sizes.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/backend.hpp"
#include "gpu/engine.hpp"
#include "policies/kv_policy.hpp"

BOOST_AUTO_TEST_SUITE(test_engine_kv_groups)

namespace {

using sy::kernels::DType;

std::shared_ptr<sy::Model> zoo(const std::string& name) {
  return sy::Model::load(std::string(SY_MODELS_DIR) + "/zoo/zoo-" + name + ".gguf");
}
std::shared_ptr<sy::Model> gemma2() {
  static auto m = zoo("gemma2-f32");
  return m;
}

// The zoo's gemma2: 26 layers, windows of 16 on the 13 even ones.
constexpr int32_t kWindow = 16;
constexpr int32_t kBlock = 4;
// Tokens of the long sequence: far past the window, so most window-group blocks are released.
constexpr int kTokens = 200;
// Prompt tokens fed in chunks of this many, then one token a step.
constexpr int kPrompt = 24;
constexpr int kChunk = 8;

std::unique_ptr<sy::Engine> engine(DType kv, bool reference, int32_t n_blocks,
                                   int32_t n_window_blocks) {
  sy::EngineOptions o;
  o.reference = reference;
  o.kv_type = kv;
  o.n_threads = 2;
  o.block_size = kBlock;
  o.n_blocks = n_blocks;
  o.n_window_blocks = n_window_blocks;
  return sy::make_cpu_engine(gemma2(), o);
}

int32_t argmax(const float* row, int32_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// One sequence through a one-group engine and a split one in lock step: the prompt in chunks,
// then greedy tokens (picked from the one-group engine's logits, fed to both). The split engine's
// window-group blocks wholly behind the window go back to its pool after every step, as the
// batcher does (policy::released_block_range for sliding_window(16)). Returns the largest
// difference of any logit; `most_held` gets the most window-group blocks held at once.
double run_both(DType kv, bool reference, int32_t n_window_blocks, int32_t* most_held) {
  const int32_t n_full = (kTokens + kBlock - 1) / kBlock;
  auto one = engine(kv, reference, n_full, 0);
  auto two = engine(kv, reference, n_full, n_window_blocks);
  BOOST_REQUIRE(one->window_pool() == nullptr);
  BOOST_REQUIRE(two->window_pool() != nullptr);
  sy::BlockPool& wpool = *two->window_pool();
  const sy::policy::KvPolicy win{sy::policy::KvPolicy::sliding_window, kWindow, 0};
  const int32_t n_vocab = gemma2()->config().n_vocab;

  std::vector<int32_t> tokens;
  for (int i = 0; i < kPrompt; ++i) tokens.push_back((i * 37 + 11) % n_vocab);
  std::vector<int32_t> t_one, t_full, t_win;
  int32_t n_past = 0;
  double worst = 0.0;
  *most_held = 0;
  sy::StepOutput o1, o2;
  while (n_past < kTokens - 1) {
    const int32_t n = n_past < kPrompt ? std::min(kChunk, kPrompt - n_past) : 1;
    const size_t need = static_cast<size_t>((n_past + n + kBlock - 1) / kBlock);
    while (t_one.size() < need) t_one.push_back(*one->pool().alloc());
    while (t_full.size() < need) t_full.push_back(*two->pool().alloc());
    while (t_win.size() < need) {
      const auto b = wpool.alloc();
      BOOST_REQUIRE_MESSAGE(b, "window pool dry at slot " << n_past);
      t_win.push_back(*b);
    }
    *most_held = std::max(*most_held, wpool.n_used());
    sy::SeqStep s;
    s.tokens = tokens.data() + n_past;
    s.n_tokens = n;
    s.n_past = n_past;
    s.block_table = t_one.data();
    s.n_blocks = static_cast<int32_t>(t_one.size());
    one->step({s}, o1);
    s.block_table = t_full.data();
    s.n_blocks = static_cast<int32_t>(t_full.size());
    s.window_table = t_win.data();
    s.n_window_blocks = static_cast<int32_t>(t_win.size());
    two->step({s}, o2);
    for (int32_t v = 0; v < n_vocab; ++v)
      worst = std::max(worst, static_cast<double>(std::fabs(o1.row(0)[v] - o2.row(0)[v])));
    n_past += n;
    if (n_past == static_cast<int32_t>(tokens.size())) tokens.push_back(argmax(o1.row(0), n_vocab));
    const sy::policy::BlockRange r = sy::policy::released_block_range(win, n_past, kBlock);
    for (int64_t b = r.begin; b < std::min<int64_t>(r.end, t_win.size()); ++b) {
      int32_t& id = t_win[static_cast<size_t>(b)];
      if (id >= 0) wpool.free(id);
      id = -1;
    }
  }
  // Everything behind the window was released: only the window's blocks are left.
  const auto released = std::count(t_win.begin(), t_win.end(), -1);
  BOOST_TEST(released >= static_cast<long>(t_win.size()) - (kWindow / kBlock + 1));
  return worst;
}

// The most window-group blocks one sequence can hold (kChunk-token prefill chunks): the bound
// the batcher sizes the window pool by.
int32_t window_bound() {
  const sy::policy::KvPolicy win{sy::policy::KvPolicy::sliding_window, kWindow, 0};
  return static_cast<int32_t>(sy::policy::max_blocks_held(win, kTokens, kChunk, kBlock));
}

}  // namespace

BOOST_AUTO_TEST_CASE(group_sizes_of_the_zoo_models) {
  const sy::ModelLimits g = gemma2()->limits();
  BOOST_TEST(g.split_window() == kWindow);
  BOOST_TEST(g.n_window_layers() == 13);
  // K and V rows of kv_dim values per layer of the group.
  BOOST_TEST(g.kv_bytes_per_token_window(DType::F32) == 2 * 13 * g.kv_dim * 4);
  BOOST_TEST(g.kv_bytes_per_token_full(DType::F16) == 2 * 13 * g.kv_dim * 2);
  BOOST_TEST(g.kv_bytes_per_token_full(DType::F16) + g.kv_bytes_per_token_window(DType::F16) ==
             g.kv_bytes_per_token(DType::F16));
  // One kind of layer: no window group (phi3 has a window on every layer, llama none).
  for (const char* name : {"phi3-f32", "llama3-f32"}) {
    const sy::ModelLimits l = zoo(name)->limits();
    BOOST_TEST(l.split_window() == 0, name);
    BOOST_TEST(l.kv_bytes_per_token_window() == 0, name);
    BOOST_TEST(l.kv_bytes_per_token_full() == l.kv_bytes_per_token(), name);
  }
}

BOOST_AUTO_TEST_CASE(split_cache_bytes_and_refusals) {
  auto e = engine(DType::F32, false, 10, 3);
  const sy::ModelLimits g = gemma2()->limits();
  BOOST_TEST(e->kv_bytes() ==
             static_cast<size_t>(kBlock * (10 * g.kv_bytes_per_token_full(DType::F32) +
                                           3 * g.kv_bytes_per_token_window(DType::F32))));
  BOOST_TEST(e->window_pool()->n_total() == 3);
  BOOST_TEST(engine(DType::F32, false, 10, 0)->window_pool() == nullptr);

  // A model with one kind of layer has no window group to size.
  sy::EngineOptions o;
  o.n_blocks = 4;
  o.n_window_blocks = 2;
  try {
    sy::make_cpu_engine(zoo("phi3-f32"), o);
    BOOST_FAIL("a window group for phi3 was accepted");
  } catch (const std::invalid_argument& ex) {
    BOOST_TEST(std::string(ex.what()).find("no window group") != std::string::npos, ex.what());
  }

  // The CUDA backend keeps one block table for all layers, with or without a device.
  o.n_window_blocks = 2;
  try {
    sy::make_engine(sy::Backend::cuda, gemma2(), o, 0, 0.85);
    BOOST_FAIL("a window group for the cuda backend was accepted");
  } catch (const std::invalid_argument& ex) {
    BOOST_TEST(
        std::string(ex.what()).find("keeps one KV block table for all layers") != std::string::npos,
        ex.what());
  }

  // The split engine checks the second table like the first.
  const std::vector<int32_t> toks(8, 5);
  std::vector<int32_t> full = {0, 1, 2, 3, 4, 5};
  std::vector<int32_t> win = {0, 1};
  sy::SeqStep s;
  s.tokens = toks.data();
  s.n_tokens = 8;
  s.block_table = full.data();
  s.n_blocks = 6;
  sy::StepOutput out;
  const auto refused = [&](const std::string& text) {
    try {
      e->step({s}, out);
    } catch (const sy::BadSequence& ex) {
      BOOST_TEST(std::string(ex.what()).find(text) != std::string::npos, ex.what());
      return true;
    }
    return false;
  };
  BOOST_TEST(refused("window block table has 0 blocks, 2 needed for 8 slots"));
  s.window_table = win.data();
  s.n_window_blocks = 2;
  win[1] = 3;
  BOOST_TEST(refused("window block table block id 3 out of range"));
  win[1] = 1;
  e->step({s}, out);  // slots [0, 8)
  // Slot 8's window (16) reaches back to slot 0: block 0 cannot be released yet.
  const std::vector<int32_t> next = {7};
  std::vector<int32_t> win3 = {-1, 1, 2};
  s.tokens = next.data();
  s.n_tokens = 1;
  s.n_past = 8;
  s.window_table = win3.data();
  s.n_window_blocks = 3;
  BOOST_TEST(refused("window block table entry 0 is -1 (released) but slots [0, 4)"));
  // The full-attention layers still read every slot through the first table.
  win3[0] = 0;
  full[1] = -1;
  BOOST_TEST(refused("block table entry 1 is -1 (released)"));
  full[1] = 1;
  e->step({s}, out);
}

BOOST_AUTO_TEST_CASE(released_window_blocks_keep_the_logits_f32) {
  for (bool reference : {false, true}) {
    int32_t most = 0;
    const double worst = run_both(DType::F32, reference, window_bound(), &most);
    BOOST_TEST_MESSAGE((reference ? "reference" : "fast")
                       << ": max |logit diff| " << worst << ", window blocks held " << most);
    // The same values in the same order, only stored elsewhere: measured 0 on both paths.
    BOOST_TEST(worst <= 1e-5);
    BOOST_TEST(most <= window_bound());
    BOOST_TEST(most < kTokens / kBlock);  // the one-group engine holds 50 for every layer
  }
}

BOOST_AUTO_TEST_CASE(released_window_blocks_keep_the_logits_f16) {
  int32_t most = 0;
  const double worst = run_both(DType::F16, false, window_bound(), &most);
  BOOST_TEST(worst <= 1e-5);
  BOOST_TEST(most <= window_bound());
}

// The windowed layers read their K/V through the window table alone: pointing one of its entries
// at another sequence's block changes the logits although the first table is untouched (an
// engine that read every layer through the first table would not see it).
BOOST_AUTO_TEST_CASE(window_layers_read_the_window_table) {
  auto e = engine(DType::F32, false, 8, 8);
  const std::vector<int32_t> a(8, 3), b = {9, 8, 7, 6, 5, 4, 3, 2};
  std::vector<int32_t> fa = {0, 1}, wa = {0, 1}, fb = {2, 3, 4}, wb = {2, 3, 4};
  sy::StepOutput out;
  sy::SeqStep s;
  s.n_tokens = 8;
  s.tokens = a.data();
  s.block_table = fa.data();
  s.n_blocks = 2;
  s.window_table = wa.data();
  s.n_window_blocks = 2;
  e->step({s}, out);
  s.tokens = b.data();
  s.block_table = fb.data();
  s.window_table = wb.data();
  e->step({s}, out);
  // B's next token (slot 8, block 2), once with its own window blocks, once with A's block 1
  // in place of its own: the window (16) covers slots [0, 8], so block 1 is read.
  const std::vector<int32_t> next = {1};
  s.tokens = next.data();
  s.n_tokens = 1;
  s.n_past = 8;
  s.n_blocks = 3;
  s.n_window_blocks = 3;
  e->step({s}, out);
  const std::vector<float> own(out.row(0), out.row(0) + out.n_vocab);
  wb[1] = wa[1];
  e->step({s}, out);
  double diff = 0.0;
  for (int32_t v = 0; v < out.n_vocab; ++v)
    diff =
        std::max(diff, static_cast<double>(std::fabs(own[static_cast<size_t>(v)] - out.row(0)[v])));
  BOOST_TEST(diff > 1e-3);
  wb[1] = 3;
  e->step({s}, out);  // its own blocks again: the same logits as the first time
  for (int32_t v = 0; v < out.n_vocab; ++v)
    BOOST_TEST(out.row(0)[v] == own[static_cast<size_t>(v)]);
}

BOOST_AUTO_TEST_SUITE_END()  // test_engine_kv_groups
