// Architectures without a zoo file, checked against independent float64 numpy forward passes
// (tests/python/forward_ref.py, forward_qwen3moe.py): random-weight qwen3 and qwen3moe models
// (per-head q/k RMSNorm before NEOX RoPE, head_dim != dim / n_heads; qwen3moe's renormalised
// top-k experts). Also what the loader refuses, and what the description tells a backend that
// runs only the plain llama block.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/engine.hpp"
#include "model/make_model.hpp"

BOOST_AUTO_TEST_SUITE(test_engine_archs)

namespace gguf = sy::gguf;

namespace {

// Our f32 logits against numpy's float64 ones: f32 rounding through 2 layers of width 64 stays
// near 1e-5 of logits of magnitude ~5; 1e-3 leaves room and still catches any wrong step (a
// missing q/k norm or a NORM-for-NEOX rotation moves logits by 1e-1 or more). qwen3moe adds the
// routing: once both sides choose the same experts (kRouterGap below), an expert's weight is a
// softmax probability divided by the chosen ones' sum, smooth in the router logits, so it adds
// rounding of the same size (measured 1.3e-6); leaving out the renormalisation moves logits 0.57.
constexpr double kLogitTol = 1e-3;

constexpr int kDim = 64, kLayers = 2, kHeads = 4, kKvHeads = 2, kHeadDim = 32, kFfn = 96;
constexpr int kVocab = 40;

struct Spec {
  std::string arch = "qwen3";
  bool q_norm = true;                       // attn_q_norm / attn_k_norm tensors
  std::vector<std::string> extra_u32_keys;  // "<arch>.key=value"
  std::string scaling_type;                 // rope.scaling.type, empty: absent
  std::string zero_q8_1;                    // a tensor written as Q8_1 blocks of zeros instead
  // > 0: the FFN tensors are a router ffn_gate_inp and 3-D ffn_{gate,up,down}_exps stacks of this
  // many experts, each exp_ffn wide (the keys that declare them go in extra_u32_keys).
  int experts = 0;
  int exp_ffn = 0;
  int weights_norm = -1;                              // <arch>.expert_weights_norm: -1 absent
  std::map<std::string, std::vector<uint64_t>> dims;  // tensors written with other dims
};

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small model of `s.arch` with normal random weights (norm weights around 1).
gguf::Writer build(const Spec& s) {
  gguf::Writer w;
  const std::string p = s.arch + ".";
  w.add_string("general.architecture", s.arch);
  w.add_u32(p + "context_length", 256);
  w.add_u32(p + "embedding_length", kDim);
  w.add_u32(p + "block_count", kLayers);
  w.add_u32(p + "feed_forward_length", kFfn);
  w.add_u32(p + "attention.head_count", kHeads);
  w.add_u32(p + "attention.head_count_kv", kKvHeads);
  w.add_u32(p + "attention.key_length", kHeadDim);
  w.add_u32(p + "attention.value_length", kHeadDim);
  w.add_f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.add_f32(p + "rope.freq_base", 1000000.0f);
  for (const std::string& kv : s.extra_u32_keys) {
    const size_t eq = kv.find('=');
    w.add_u32(p + kv.substr(0, eq), static_cast<uint32_t>(std::stoul(kv.substr(eq + 1))));
  }
  if (!s.scaling_type.empty()) {
    w.add_string(p + "rope.scaling.type", s.scaling_type);
    w.add_f32(p + "rope.scaling.factor", 4.0f);
  }
  if (s.weights_norm >= 0) w.add_bool(p + "expert_weights_norm", s.weights_norm == 1);
  std::vector<std::string> toks = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int i = 3; i < kVocab; ++i) {
    toks.push_back(std::string(1, static_cast<char>('a' + (i - 3) % 26)) + std::to_string(i));
    scores.push_back(-static_cast<float>(i));
    types.push_back(1);
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", toks);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);

  std::mt19937 rng(13);
  // Scaled so that activations stay O(1) through the layers (random weights of std 1/sqrt(fan in)).
  const auto tensor = [&](const std::string& name, std::vector<uint64_t> dims, bool norm) {
    if (auto it = s.dims.find(name); it != s.dims.end()) dims = it->second;
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::normal_distribution<float> nd(norm ? 1.0f : 0.0f,
                                       norm ? 0.2f : 1.0f / std::sqrt(float(dims[0])));
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    if (name == s.zero_q8_1) {
      const auto rb =
          sy::kernels::dtype_row_bytes(sy::kernels::DType::Q8_1, static_cast<int64_t>(dims[0]));
      w.add_tensor(name, sy::kernels::DType::Q8_1, dims,
                   std::vector<uint8_t>(static_cast<size_t>(rb) * (n / dims[0])));
      return;
    }
    w.add_tensor(name, sy::kernels::DType::F32, dims, f32_bytes(v));
  };
  const uint64_t q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
  tensor("token_embd.weight", {kDim, kVocab}, false);
  tensor("output_norm.weight", {kDim}, true);
  tensor("output.weight", {kDim, kVocab}, false);
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    tensor(b + "attn_norm.weight", {kDim}, true);
    tensor(b + "attn_q.weight", {kDim, q}, false);
    tensor(b + "attn_k.weight", {kDim, kv}, false);
    tensor(b + "attn_v.weight", {kDim, kv}, false);
    if (s.q_norm) {
      tensor(b + "attn_q_norm.weight", {kHeadDim}, true);
      tensor(b + "attn_k_norm.weight", {kHeadDim}, true);
    }
    tensor(b + "attn_output.weight", {q, kDim}, false);
    tensor(b + "ffn_norm.weight", {kDim}, true);
    if (s.experts > 0) {
      const uint64_t e = static_cast<uint64_t>(s.experts), f = static_cast<uint64_t>(s.exp_ffn);
      tensor(b + "ffn_gate_inp.weight", {kDim, e}, false);
      tensor(b + "ffn_gate_exps.weight", {kDim, f, e}, false);
      tensor(b + "ffn_up_exps.weight", {kDim, f, e}, false);
      tensor(b + "ffn_down_exps.weight", {f, kDim, e}, false);
      continue;
    }
    tensor(b + "ffn_gate.weight", {kDim, kFfn}, false);
    tensor(b + "ffn_up.weight", {kDim, kFfn}, false);
    tensor(b + "ffn_down.weight", {kFfn, kDim}, false);
  }
  return w;
}

std::shared_ptr<sy::Model> load_bytes(const std::vector<uint8_t>& bytes) {
  return sy::Model::from_gguf(gguf::File::from_memory(bytes.data(), bytes.size()));
}

// Loading throws gguf::Error whose message holds every fragment.
void expect_error(const Spec& s, const std::vector<std::string>& fragments) {
  const std::vector<uint8_t> bytes = build(s).bytes();
  try {
    load_bytes(bytes);
    BOOST_ERROR("loading succeeded; expected an error naming " << fragments.front());
  } catch (const gguf::Error& e) {
    const std::string msg = e.what();
    for (const std::string& f : fragments)
      BOOST_TEST(msg.find(f) != std::string::npos, "message '" << msg << "' lacks '" << f << "'");
  }
}

// numpy's logits of every position of `ids` for the file at `path`, by tests/python/`script`;
// a line "router_gap G" of its output goes to *router_gap.
std::vector<std::vector<double>> numpy_logits(const std::string& path,
                                              const std::vector<int32_t>& ids,
                                              const char* script = "forward_ref.py",
                                              double* router_gap = nullptr) {
  std::ostringstream c;
  c << "/usr/bin/python3 " << SY_SOURCE_DIR << "/tests/python/" << script << ' ' << path;
  for (int32_t id : ids) c << ' ' << id;
  const std::string cmd = c.str();
  FILE* f = popen(cmd.c_str(), "r");
  BOOST_REQUIRE_MESSAGE(f, "cannot run " << cmd);
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  BOOST_REQUIRE_MESSAGE(pclose(f) == 0, "'" << cmd << "' failed");
  std::vector<std::vector<double>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    if (line.rfind("router_gap ", 0) == 0) {
      std::string key;
      ls >> key;
      if (router_gap) ls >> *router_gap;
      continue;
    }
    rows.emplace_back();
    for (double v; ls >> v;) rows.back().push_back(v);
  }
  return rows;
}

std::unique_ptr<sy::Engine> engine(std::shared_ptr<sy::Model> m, bool reference) {
  sy::EngineOptions o;
  o.reference = reference;
  o.kv_type = sy::kernels::DType::F32;  // the numpy reference keeps K/V in float64
  o.n_threads = 2;
  o.block_size = 4;
  o.n_blocks = 8;
  return sy::make_cpu_engine(std::move(m), o);
}

const std::vector<int32_t> kBlocks = {0, 1, 2, 3, 4, 5, 6, 7};

// The logits of every position of `ids` from one prefill.
std::vector<std::vector<float>> prefill_logits(std::shared_ptr<sy::Model> m,
                                               const std::vector<int32_t>& ids, bool reference) {
  auto e = engine(std::move(m), reference);
  sy::SeqStep s;
  s.tokens = ids.data();
  s.n_tokens = static_cast<int32_t>(ids.size());
  s.block_table = kBlocks.data();
  s.n_blocks = static_cast<int32_t>(kBlocks.size());
  s.all_logits = true;
  sy::StepOutput out;
  e->step({s}, out);
  std::vector<std::vector<float>> rows;
  for (int32_t t = 0; t < s.n_tokens; ++t) {
    const float* r = out.row(0, t);
    rows.emplace_back(r, r + out.n_vocab);
  }
  return rows;
}

int32_t argmax(const std::vector<float>& row) {
  int32_t best = 0;
  for (int32_t v = 1; v < static_cast<int32_t>(row.size()); ++v)
    if (row[static_cast<size_t>(v)] > row[static_cast<size_t>(best)]) best = v;
  return best;
}

// Greedy continuation of `prompt` by n tokens: a prefill, then one-token decode steps; the
// logits each choice was made from go to *rows.
std::vector<int32_t> greedy(std::shared_ptr<sy::Model> m, const std::vector<int32_t>& prompt, int n,
                            bool reference, std::vector<std::vector<float>>* rows) {
  auto e = engine(std::move(m), reference);
  std::vector<int32_t> seq = prompt, out_ids;
  sy::StepOutput out;
  for (int32_t done = 0; static_cast<int>(out_ids.size()) < n;) {
    sy::SeqStep s;
    s.tokens = seq.data() + done;
    s.n_tokens = static_cast<int32_t>(seq.size()) - done;
    s.n_past = done;
    s.block_table = kBlocks.data();
    s.n_blocks = static_cast<int32_t>(kBlocks.size());
    e->step({s}, out);
    done = static_cast<int32_t>(seq.size());
    rows->emplace_back(out.row(0), out.row(0) + out.n_vocab);
    out_ids.push_back(argmax(rows->back()));
    seq.push_back(out_ids.back());
  }
  return out_ids;
}

double max_gap(const std::vector<std::vector<float>>& a, const std::vector<std::vector<double>>& b,
               size_t b0 = 0) {
  double w = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t v = 0; v < a[t].size(); ++v)
      w = std::max(w, std::abs(double{a[t][v]} - b[b0 + t][v]));
  return w;
}

// Checks that each greedy id equals numpy's top-1 (numpy row b0 + i for id i) wherever numpy's
// top-1 leads by more than 2 * kLogitTol (what the tolerance lets our logits move); returns how
// many steps it compared.
int same_greedy_ids(const std::vector<int32_t>& gen, const std::vector<std::vector<double>>& want,
                    size_t b0) {
  int compared = 0;
  for (size_t i = 0; i < gen.size(); ++i) {
    std::vector<double> row = want[b0 + i];
    const auto top = std::max_element(row.begin(), row.end());
    const auto want_id = static_cast<int32_t>(top - row.begin());
    const double best = *top;
    *top = -INFINITY;
    if (best - *std::max_element(row.begin(), row.end()) <= 2 * kLogitTol) continue;
    ++compared;
    BOOST_TEST(gen[i] == want_id, "greedy step " << i);
  }
  return compared;
}

// qwen3moe: qwen3's attention (4 heads of 32 over dim 64) with 4 experts of width 48, top 2.
Spec qwen3moe_spec() {
  Spec s;
  s.arch = "qwen3moe";
  s.experts = 4;
  s.exp_ffn = 48;
  s.extra_u32_keys = {"expert_count=4", "expert_used_count=2", "expert_feed_forward_length=48"};
  return s;
}

// The chosen experts are the same in f32 and float64 when the gap between the k-th and (k+1)-th
// router logit is far above f32's error in those logits: a dot product of 64 terms (normed
// inputs of size ~1 times weights of std 1/8, their sizes summing to ~6) rounds by at most
// ~64 * 6e-8 * 6 = 2e-5, plus what rounding upstream left in x (relative ~1e-6). A gap above
// 1e-3 leaves a factor 50.
constexpr double kRouterGap = 1e-3;

}  // namespace

BOOST_AUTO_TEST_CASE(qwen3_matches_numpy_forward_pass) {
  const std::string path = std::string(SY_BINARY_DIR) + "/test_engine_archs_qwen3.gguf";
  build(Spec{}).write(path);
  const auto model = sy::Model::load(path);
  const sy::ModelConfig& c = model->config();
  BOOST_TEST(c.arch == "qwen3");
  BOOST_TEST((c.rope_layout == sy::RopeLayout::Neox));
  BOOST_TEST(model->weights().layers[1].q_norm != nullptr);
  BOOST_TEST(c.head_dim * c.n_heads != c.dim);

  const std::vector<int32_t> ids = {1, 7, 3, 22, 39, 5, 5, 11, 30, 2, 17, 8};
  const auto want = numpy_logits(path, ids);
  BOOST_REQUIRE_EQUAL(want.size(), ids.size());
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  for (bool reference : {false, true}) {
    BOOST_TEST_CONTEXT((reference ? "reference" : "fast") << " path") {
      // All positions in one prefill, then the same tokens as a 5-token prefill and one-token
      // decode steps (the KV cache carries the keys, normed and rotated).
      auto e = engine(model, reference);
      sy::SeqStep s;
      s.tokens = ids.data();
      s.n_tokens = static_cast<int32_t>(ids.size());
      s.block_table = blocks.data();
      s.n_blocks = static_cast<int32_t>(blocks.size());
      s.all_logits = true;
      sy::StepOutput out;
      e->step({s}, out);
      double worst = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        const float* row = out.row(0, static_cast<int32_t>(t));
        for (int v = 0; v < kVocab; ++v)
          worst = std::max(worst, std::abs(double{row[v]} - want[t][static_cast<size_t>(v)]));
      }
      BOOST_TEST_MESSAGE("qwen3 prefill: largest |logit - numpy| " << worst);
      BOOST_TEST(worst < kLogitTol);

      auto e2 = engine(model, reference);
      worst = 0;
      for (int32_t done = 0; done < s.n_tokens;) {
        sy::SeqStep d = s;
        d.tokens = ids.data() + done;
        d.n_past = done;
        d.n_tokens = done == 0 ? 5 : 1;
        d.all_logits = false;
        e2->step({d}, out);
        done += d.n_tokens;
        const float* row = out.row(0);
        for (int v = 0; v < kVocab; ++v) {
          worst = std::max(worst,
                           std::abs(double{row[v]} -
                                    want[static_cast<size_t>(done - 1)][static_cast<size_t>(v)]));
        }
      }
      BOOST_TEST_MESSAGE("qwen3 decode: largest |logit - numpy| " << worst);
      BOOST_TEST(worst < kLogitTol);
    }
  }
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(qwen3_without_qk_norms_is_refused) {
  Spec s;
  s.q_norm = false;
  expect_error(s, {"missing tensor 'blk.0.attn_q_norm.weight'"});
}

BOOST_AUTO_TEST_CASE(qwen3moe_matches_numpy_forward_pass) {
  // The same weights twice: with the chosen experts' probabilities renormalised (qwen3moe's
  // default) and with the file's expert_weights_norm = false.
  const std::vector<int32_t> ids = {1, 7, 3, 22, 39, 5, 5, 11, 30, 2, 17, 8};
  std::vector<std::vector<std::vector<float>>> fast;  // prefill logits per file
  for (const int weights_norm : {-1, 0}) {
    BOOST_TEST_CONTEXT("expert_weights_norm " << (weights_norm < 0 ? "absent" : "false")) {
      Spec spec = qwen3moe_spec();
      spec.weights_norm = weights_norm;
      const std::string path = std::string(SY_BINARY_DIR) + "/test_engine_archs_qwen3moe" +
                               std::to_string(weights_norm + 1) + ".gguf";
      build(spec).write(path);
      const auto model = sy::Model::load(path);
      const sy::ModelConfig& c = model->config();
      BOOST_TEST(c.arch == "qwen3moe");
      BOOST_TEST((c.rope_layout == sy::RopeLayout::Neox));
      BOOST_TEST(c.n_experts == 4);
      BOOST_TEST(c.n_experts_used == 2);
      BOOST_TEST(c.expert_ffn_dim == 48);
      BOOST_TEST(c.expert_weights_norm == (weights_norm != 0));
      BOOST_TEST(c.shared_expert_ffn_dim == 0);
      BOOST_TEST(!c.qk_norm_whole);
      BOOST_TEST(model->weights().layers[1].q_norm != nullptr);
      BOOST_TEST(model->weights().layers[1].exp_down.size() == 4u);

      double gap = 0;
      const auto want = numpy_logits(path, ids, "forward_qwen3moe.py", &gap);
      BOOST_REQUIRE_EQUAL(want.size(), ids.size());
      BOOST_TEST_MESSAGE("qwen3moe: smallest router gap (k-th - (k+1)-th logit) " << gap);
      BOOST_REQUIRE(gap > kRouterGap);
      for (const bool reference : {false, true}) {
        const auto got = prefill_logits(model, ids, reference);
        const double worst = max_gap(got, want);
        BOOST_TEST_MESSAGE("qwen3moe " << (reference ? "reference" : "fast")
                                       << " prefill: largest |logit - numpy| " << worst);
        BOOST_TEST(worst < kLogitTol);
        if (!reference) fast.push_back(got);
      }
      if (weights_norm == 0) {
        std::remove(path.c_str());
        continue;
      }

      // Greedy: a 5-token prompt, then 10 one-token decode steps (the KV cache holds the keys
      // normed and rotated). Both paths choose the same ids; numpy's logits of the whole
      // sequence give each step's logits and, wherever its own top-1 leads by more than the
      // tolerance allows to move, the same choice.
      const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 5);
      std::vector<std::vector<float>> rows_fast, rows_ref;
      const auto gen = greedy(model, prompt, 10, false, &rows_fast);
      BOOST_TEST(greedy(model, prompt, 10, true, &rows_ref) == gen,
                 boost::test_tools::per_element());
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), gen.begin(), gen.end() - 1);
      const auto want_seq = numpy_logits(path, seq, "forward_qwen3moe.py", &gap);
      BOOST_REQUIRE_EQUAL(want_seq.size(), seq.size());
      BOOST_REQUIRE(gap > kRouterGap);
      for (const auto* rows : {&rows_fast, &rows_ref}) {
        const double worst = max_gap(*rows, want_seq, prompt.size() - 1);
        BOOST_TEST_MESSAGE("qwen3moe greedy steps: largest |logit - numpy| " << worst);
        BOOST_TEST(worst < kLogitTol);
      }
      // These weights have no near-tie along the sequence: every step is compared.
      BOOST_TEST(same_greedy_ids(gen, want_seq, prompt.size() - 1) == 10);
      std::remove(path.c_str());
    }
  }
  // Renormalising the chosen probabilities changes the logits far beyond the tolerance, so the
  // comparisons above see which routing rule ran.
  BOOST_REQUIRE_EQUAL(fast.size(), 2u);
  double moved = 0;
  for (size_t t = 0; t < fast[0].size(); ++t)
    for (size_t v = 0; v < fast[0][t].size(); ++v)
      moved = std::max(moved, std::abs(double{fast[0][t][v]} - fast[1][t][v]));
  BOOST_TEST_MESSAGE("qwen3moe: renormalised vs not: largest logit change " << moved);
  BOOST_TEST(moved > 100 * kLogitTol);
}

BOOST_AUTO_TEST_CASE(make_model_qwen3moe_matches_numpy_forward_pass) {
  // What `switchyard make-model --arch qwen3moe` writes (tiny: dim 64, 2 layers, 8 experts of
  // width 192, top 2, tied output, 32000 tokens) loads as the same model numpy runs: one prefill
  // on both paths and a greedy continuation on the fast path.
  const std::string path = std::string(SY_BINARY_DIR) + "/test_engine_archs_mm_qwen3moe.gguf";
  sy::MakeModelOptions o;
  o.shape = "tiny";
  o.arch = "qwen3moe";
  o.seed = 7;
  o.out = path;
  sy::make_model(o);
  const auto model = sy::Model::load(path);
  const sy::ModelConfig& c = model->config();
  BOOST_TEST(c.arch == "qwen3moe");
  BOOST_TEST(c.n_experts == 8);
  BOOST_TEST(c.expert_weights_norm);

  const std::vector<int32_t> prompt = {1, 415, 2934, 17, 30999, 8};
  std::vector<std::vector<float>> rows;
  const auto gen = greedy(model, prompt, 6, false, &rows);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);
  double gap = 0;
  const auto want = numpy_logits(path, seq, "forward_qwen3moe.py", &gap);
  BOOST_REQUIRE_EQUAL(want.size(), seq.size());
  BOOST_TEST_MESSAGE("make-model qwen3moe: smallest router gap " << gap);
  BOOST_REQUIRE(gap > kRouterGap);
  for (const bool reference : {false, true}) {
    const double worst = max_gap(prefill_logits(model, seq, reference), want);
    BOOST_TEST_MESSAGE("make-model qwen3moe " << (reference ? "reference" : "fast")
                                              << " prefill: largest |logit - numpy| " << worst);
    BOOST_TEST(worst < kLogitTol);
  }
  const double worst = max_gap(rows, want, prompt.size() - 1);
  BOOST_TEST_MESSAGE("make-model qwen3moe greedy steps: largest |logit - numpy| " << worst);
  BOOST_TEST(worst < kLogitTol);
  BOOST_TEST(same_greedy_ids(gen, want, prompt.size() - 1) == 6);
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(expert_tensors_that_disagree_with_the_keys_are_refused) {
  // A stack of 3 experts where expert_count says 4: the tensor, both shapes and the keys.
  Spec s = qwen3moe_spec();
  s.dims["blk.0.ffn_up_exps.weight"] = {kDim, 48, 3};
  expect_error(s, {"tensor 'blk.0.ffn_up_exps.weight' has shape [64, 48, 3], expected [64, 48, 4]",
                   "qwen3moe.embedding_length, qwen3moe.expert_feed_forward_length, "
                   "qwen3moe.expert_count"});
  // Experts 40 wide where expert_feed_forward_length says 48 (a later layer).
  s = qwen3moe_spec();
  s.dims["blk.1.ffn_down_exps.weight"] = {40, kDim, 4};
  expect_error(s,
               {"tensor 'blk.1.ffn_down_exps.weight' has shape [40, 64, 4], expected [48, 64, 4]",
                "qwen3moe.expert_feed_forward_length, qwen3moe.embedding_length"});
  // A router of 3 rows for 4 experts.
  s = qwen3moe_spec();
  s.dims["blk.0.ffn_gate_inp.weight"] = {kDim, 3};
  expect_error(s, {"tensor 'blk.0.ffn_gate_inp.weight' has shape [64, 3], expected [64, 4] = "
                   "[qwen3moe.embedding_length, qwen3moe.expert_count]"});
  // Without expert_feed_forward_length an expert is feed_forward_length / expert_used_count
  // wide (llama.cpp's rule): 96 / 2 = 48 loads, 96 / 3 = 32 disagrees with the 48-wide stacks.
  s = qwen3moe_spec();
  s.extra_u32_keys = {"expert_count=4", "expert_used_count=2"};
  BOOST_TEST(load_bytes(build(s).bytes())->config().expert_ffn_dim == 48);
  s.extra_u32_keys = {"expert_count=4", "expert_used_count=3"};
  expect_error(s, {"tensor 'blk.0.ffn_gate_exps.weight' has shape [64, 48, 4], expected "
                   "[64, 32, 4]",
                   "qwen3moe.feed_forward_length / qwen3moe.expert_used_count"});
  // More experts used than there are; no expert_count at all; sigmoid gating.
  s.extra_u32_keys = {"expert_count=4", "expert_used_count=5"};
  expect_error(s, {"'qwen3moe.expert_used_count' = 5 exceeds 'qwen3moe.expert_count' = 4"});
  s.extra_u32_keys = {"expert_used_count=2"};
  expect_error(s, {"missing metadata key 'qwen3moe.expert_count'"});
  s = qwen3moe_spec();
  s.extra_u32_keys.push_back("expert_gating_func=2");
  expect_error(s, {"'qwen3moe.expert_gating_func' = 2 (sigmoid gating) is not supported"});
  // qwen3's per-head q/k norms are required here too.
  s = qwen3moe_spec();
  s.q_norm = false;
  expect_error(s, {"missing tensor 'blk.0.attn_q_norm.weight'"});
}

BOOST_AUTO_TEST_CASE(mixture_of_experts_and_unknown_architectures_are_refused) {
  // llama runs experts (Mixtral), but a file that declares them must say how many a token uses.
  Spec moe;
  moe.arch = "llama";
  moe.q_norm = false;
  moe.extra_u32_keys = {"expert_count=8"};
  expect_error(moe, {"llama.expert_used_count"});
  // More experts used than there are.
  moe.extra_u32_keys = {"expert_count=4", "expert_used_count=8"};
  expect_error(moe, {"llama.expert_used_count", "8"});
  // Keys that declare experts the tensors do not have: the first missing one is named.
  moe.extra_u32_keys = {"expert_count=4", "expert_used_count=2"};
  expect_error(moe, {"blk.0.ffn_gate_inp.weight"});
  // An architecture without experts refuses a file that has them, by name.
  Spec dense;
  dense.arch = "qwen2";
  dense.q_norm = false;
  dense.extra_u32_keys = {"expert_count=8"};
  expect_error(dense, {"mixture-of-experts", "qwen2.expert_count = 8", "'qwen2'"});
  // Mixture-of-experts architectures this build does not implement are named as such; Granite's
  // by the scalings it would need.
  Spec dbrx;
  dbrx.arch = "dbrx";
  expect_error(dbrx, {"unsupported architecture 'dbrx'", "mixture-of-experts"});
  Spec granite;
  granite.arch = "granitemoe";
  expect_error(granite, {"unsupported architecture 'granitemoe'", "granitemoe.residual_scale",
                         "granitemoe.logit_scale"});
  Spec unknown;
  unknown.arch = "mamba";
  expect_error(unknown, {"unsupported architecture 'mamba'",
                         "llama, qwen2, qwen3, gemma2, phi3, qwen2moe, olmoe, qwen3moe"});
}

BOOST_AUTO_TEST_CASE(rope_scaling_types) {
  Spec lin;
  lin.scaling_type = "linear";
  BOOST_TEST(load_bytes(build(lin).bytes())->config().rope_freq_scale == 0.25f);
  Spec yarn;
  yarn.scaling_type = "yarn";
  expect_error(yarn, {"rope scaling type 'yarn'", "qwen3.rope.scaling.type", "unsupported"});
  Spec llama3;
  llama3.arch = "llama";
  llama3.q_norm = false;
  llama3.scaling_type = "llama3";
  expect_error(llama3, {"'llama3'", "rope_freqs.weight"});
}

BOOST_AUTO_TEST_CASE(features_beyond_llama_name_what_a_plain_backend_lacks) {
  Spec plain;
  plain.arch = "llama";
  plain.q_norm = false;
  BOOST_TEST(sy::features_beyond_llama(*load_bytes(build(plain).bytes())) == "");
  const std::string q3 = sy::features_beyond_llama(*load_bytes(build(Spec{}).bytes()));
  BOOST_TEST(q3.find("NEOX RoPE") != std::string::npos);
  BOOST_TEST(q3.find("per-head q/k norms") != std::string::npos);
  const auto gemma2 = sy::Model::load(std::string(SY_MODELS_DIR) + "/zoo/zoo-gemma2-f32.gguf");
  const std::string g = sy::features_beyond_llama(*gemma2);
  for (const char* f : {"NEOX RoPE", "post-attention/post-FFN norms", "GELU-gated FFN",
                        "logit soft-caps", "embedding scale", "per-layer attention windows"}) {
    BOOST_TEST(g.find(f) != std::string::npos, "'" << g << "' lacks '" << f << "'");
  }
}

BOOST_AUTO_TEST_CASE(zoo_llama3_and_qwen2_match_numpy_forward_pass) {
  // llama3: NORM RoPE with rope_freqs factors; qwen2: NEOX RoPE with q/k/v biases. Our logits
  // equal numpy's float64 ones within f32 rounding, so the zoo's remaining gap to llama.cpp
  // (test_engine_zoo) is llama.cpp's arithmetic, not a missing step.
  const std::vector<int32_t> ids = {1,   291, 410, 456, 425, 417, 340, 268, 420, 327, 416, 272,
                                    414, 444, 370, 235, 448, 182, 24,  61,  89,  224, 202, 356};
  std::vector<int32_t> blocks(8);
  for (int32_t b = 0; b < 8; ++b) blocks[static_cast<size_t>(b)] = b;
  for (const char* name : {"llama3-f32", "qwen2-f32"}) {
    const std::string path = std::string(SY_MODELS_DIR) + "/zoo/zoo-" + name + ".gguf";
    const auto want = numpy_logits(path, ids);
    BOOST_REQUIRE_EQUAL(want.size(), ids.size());
    auto e = engine(sy::Model::load(path), false);
    sy::SeqStep s;
    s.tokens = ids.data();
    s.n_tokens = static_cast<int32_t>(ids.size());
    s.block_table = blocks.data();
    s.n_blocks = static_cast<int32_t>(blocks.size());
    s.all_logits = true;
    sy::StepOutput out;
    e->step({s}, out);
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* row = out.row(0, static_cast<int32_t>(t));
      for (int32_t v = 0; v < out.n_vocab; ++v)
        worst = std::max(worst, std::abs(double{row[v]} - want[t][static_cast<size_t>(v)]));
    }
    BOOST_TEST_MESSAGE("zoo-" << name << ": largest |logit - numpy| " << worst);
    BOOST_TEST(worst < kLogitTol, "zoo-" << name);
  }
}

BOOST_AUTO_TEST_CASE(layer_windows_combine_with_a_sequence_window) {
  // gemma2's even layers see 16 slots. A sequence window (KV policy) narrows every layer; a wider
  // one leaves the layers' own; sinks apply only where the sequence's window rules. The fast path
  // (tiled prefill, then one-token decode) must agree with the reference path in every case, and
  // a sequence window wider than the sequence changes nothing.
  const auto model = sy::Model::load(std::string(SY_MODELS_DIR) + "/zoo/zoo-gemma2-f32.gguf");
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(1 + (i * 37) % 500);
  std::vector<int32_t> blocks(8);
  for (int32_t b = 0; b < 8; ++b) blocks[static_cast<size_t>(b)] = b;
  // Logits of every position: a 30-token prefill, then one token per step.
  const auto run = [&](bool reference, int32_t window, int32_t sinks) {
    sy::EngineOptions o;
    o.reference = reference;
    o.kv_type = sy::kernels::DType::F32;  // the numpy reference keeps K/V in float64
    o.n_threads = 2;
    o.block_size = 8;
    o.n_blocks = 8;
    auto e = sy::make_cpu_engine(model, o);
    std::vector<float> all;
    sy::StepOutput out;
    for (int32_t done = 0; done < static_cast<int32_t>(ids.size());) {
      sy::SeqStep s;
      s.tokens = ids.data() + done;
      s.n_tokens = done == 0 ? 30 : 1;
      s.n_past = done;
      s.block_table = blocks.data();
      s.n_blocks = static_cast<int32_t>(blocks.size());
      s.all_logits = true;
      s.window = window;
      s.sinks = sinks;
      e->step({s}, out);
      all.insert(all.end(), out.logits.begin(), out.logits.end());
      done += s.n_tokens;
    }
    return all;
  };
  const auto gap = [](const std::vector<float>& a, const std::vector<float>& b) {
    double w = 0;
    for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(double{a[i]} - b[i]));
    return w;
  };
  const std::vector<float> full = run(true, 0, 0);
  for (const auto& [window, sinks] :
       std::vector<std::pair<int32_t, int32_t>>{{0, 0}, {24, 0}, {8, 0}, {12, 4}, {20, 2}}) {
    BOOST_TEST_CONTEXT("window " << window << ", sinks " << sinks) {
      const std::vector<float> ref = run(true, window, sinks);
      BOOST_TEST(gap(run(false, window, sinks), ref) < 1e-4);
      // Narrower than the sequence: the logits move once the window is behind some token.
      if (window > 0) BOOST_TEST(gap(ref, full) > 1e-3);
    }
  }
  BOOST_TEST(gap(run(true, 64, 0), full) == 0.0);  // wider than the 40 tokens: no change
}

BOOST_AUTO_TEST_CASE(tensor_of_a_type_without_kernels_is_refused_by_name) {
  // Q8_1 is a ggml type the reader sizes but no kernel computes with (llama.cpp uses it for
  // activations only).
  Spec s;
  s.zero_q8_1 = "blk.1.ffn_up.weight";
  expect_error(s, {"tensor 'blk.1.ffn_up.weight' has type Q8_1 (9), which this build does not "
                   "support"});
}

BOOST_AUTO_TEST_SUITE_END()  // test_engine_archs
