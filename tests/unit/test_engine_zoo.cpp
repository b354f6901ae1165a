// The model zoo (../shared/models/zoo): every architecture and quantization loads and matches
// llama.cpp's NAME.json as the zoo's README says, on the fast path and on the reference path:
// greedy ids (up to a near-tie), teacher-forced top-1 and top-5 log-probabilities.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/engine.hpp"

BOOST_AUTO_TEST_SUITE(test_engine_zoo)

namespace {

// f32 files: llama.cpp's greedy ids may differ from ours only where its own top-1/top-2 margin
// is below this (summation order, its f16 KV cache), as the zoo's README says.
constexpr double kF32NearTie = 0.005;
// Quantized files: top-1 is counted only where llama.cpp's margin exceeds this and its own
// batched and one-token paths agree, as the zoo's README says.
constexpr double kQuantMargin = 0.01;
// Cases checked on the reference path (all of them on the fast path).
constexpr size_t kRefF32Cases = 1;
constexpr size_t kRefQuantCases = 1;
// f32 files: the fast path's log-probabilities equal the reference path's within this (summation
// order only; measured below 1e-5).
constexpr double kFastVsReference = 1e-4;

struct ZooFile {
  const char* name;      // zoo-NAME.gguf / .json
  bool f32;              // f32: every asserted top-1 must agree
  double max_gap;        // bound on |ours - llama.cpp| of any top-5 log-probability
  double mean_gap;       // bound on the mean of those gaps over all cases
  double min_top1_rate;  // quantized: share of counted positions whose top-1 agrees
  double greedy_tie;     // the first greedy difference must be at a llama.cpp margin below this
};

// K/V are f16 here, as in llama.cpp. f32 bounds: the stories260K golden test's (mean 1e-3) with
// a max of 5e-3; measured: max 1.6e-3..2.8e-3, mean 4.5e-4..6.9e-4 on both paths (3.5e-3 with an
// f32 cache; llama.cpp also rounds the queries and the attention weights to f16).
// Quantized files, every type alike: measured over both paths, the largest top-5 gap is
// 0.16 to 0.46 (Q4_K_M, fast path), the mean 0.04 to 0.072, top-1 agrees at 94% to 100% of
// the counted positions, and greedy output first differs at llama.cpp margins up to 0.29. The
// gap does not shrink with the weights' precision (Q8_0 and Q6_K are as far as Q2_K). Traced
// layer by layer against llama.cpp, our products with 8-bit activations equal its values within
// 2e-7 relative; the gap is a cascade that starts where one activation within 1e-7 of a rounding
// boundary rounds the other way (docs/models.md, "Checked against"). llama.cpp's own AMX build is
// 0.15 to 0.30 from these references for the same reason. One bound for every type, with
// headroom over the largest measured gap.
constexpr double kQMaxGap = 0.6;
constexpr double kQMeanGap = 0.1;
constexpr double kQTop1Rate = 0.9;
constexpr double kQGreedyTie = 0.35;

const ZooFile kZoo[] = {
    {"llama3-f32", true, 5e-3, 1e-3, 1.0, kF32NearTie},
    {"qwen2-f32", true, 5e-3, 1e-3, 1.0, kF32NearTie},
    {"gemma2-f32", true, 5e-3, 1e-3, 1.0, kF32NearTie},
    {"phi3-f32", true, 5e-3, 1e-3, 1.0, kF32NearTie},
    // Mixtures of experts: the zoo's README allows ~5e-3 for the f32 files (llama.cpp's f16 KV
    // rounding; its router margins are >= 0.62, so routing never flips).
    {"mixtral-f32", true, 5e-3, 1e-3, 1.0, kF32NearTie},
    {"qwen2moe-f32", true, 5e-3, 1e-3, 1.0, kF32NearTie},
    {"olmoe-f32", true, 5e-3, 1e-3, 1.0, kF32NearTie},
    {"mixtral-q4_k_m", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"qwen2-q8_0", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"qwen2-q4_k_m", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q6_k", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q5_k_m", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q5_0", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q5_1", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q4_k_m", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q4_1", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-iq4_nl", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-iq4_xs", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q3_k_m", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
    {"llama3-q2_k", false, kQMaxGap, kQMeanGap, kQTop1Rate, kQGreedyTie},
};

std::string zoo_path(const std::string& name, const char* ext) {
  return std::string(SY_MODELS_DIR) + "/zoo/zoo-" + name + ext;
}

struct TopLogprob {
  int32_t id;
  double logprob;
};
struct Position {
  bool has_top = false;  // false where llama-server withheld them
  std::vector<TopLogprob> top;
  double margin = 0.0;
  bool tf_top1_is_generated = true;
};
struct ZooCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated;
  std::vector<Position> positions;
};

std::vector<int32_t> ids_of(const nlohmann::json& a) {
  std::vector<int32_t> out;
  for (const auto& v : a) out.push_back(v.get<int32_t>());
  return out;
}

std::vector<ZooCase> load_cases(const std::string& name) {
  std::ifstream f(zoo_path(name, ".json"));
  BOOST_REQUIRE_MESSAGE(f, "cannot open " << zoo_path(name, ".json"));
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json root = nlohmann::json::parse(ss.str());
  std::vector<ZooCase> out;
  for (const auto& c : root.at("cases")) {
    ZooCase z;
    z.prompt = c.at("prompt").get<std::string>();
    z.prompt_ids = ids_of(c.at("prompt_token_ids"));
    z.generated = ids_of(c.at("generated_token_ids"));
    for (const auto& p : c.at("positions")) {
      Position q;
      const auto& top = p.at("top_logprobs");
      if (top.is_array()) {
        q.has_top = true;
        for (const auto& t : top)
          q.top.push_back({t.at("id").get<int32_t>(), t.at("logprob").get<double>()});
        const auto& m = p.at("top1_minus_top2");  // null where there is no runner-up
        q.margin = m.is_number() ? m.get<double>() : 0.0;
        if (auto g = p.find("teacher_forced_top1_is_generated"); g != p.end())
          q.tf_top1_is_generated = g->get<bool>();
      }
      z.positions.push_back(q);
    }
    BOOST_REQUIRE_EQUAL(z.positions.size(), z.generated.size());
    out.push_back(std::move(z));
  }
  BOOST_REQUIRE(!out.empty());
  return out;
}

// Log-softmax of the whole row.
std::vector<double> log_softmax(const float* x, int32_t n) {
  double mx = x[0];
  for (int32_t i = 1; i < n; ++i) mx = std::max(mx, double{x[i]});
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(double{x[i]} - mx);
  std::vector<double> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = double{x[i]} - mx - std::log(sum);
  return out;
}

int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

// One sequence over blocks [0, n): prefill of `ids` with logits for every token.
sy::SeqStep seq_step(const std::vector<int32_t>& ids, int32_t n_past,
                     const std::vector<int32_t>& blocks, bool all_logits) {
  sy::SeqStep s;
  s.tokens = ids.data();
  s.n_tokens = static_cast<int32_t>(ids.size());
  s.n_past = n_past;
  s.block_table = blocks.data();
  s.n_blocks = static_cast<int32_t>(blocks.size());
  s.all_logits = all_logits;
  return s;
}

// K/V in f16 by default, as the references' llama.cpp keeps them.
std::unique_ptr<sy::Engine> make_engine(std::shared_ptr<sy::Model> m, bool reference,
                                        sy::kernels::DType kv = sy::kernels::DType::F16) {
  sy::EngineOptions o;
  o.reference = reference;
  o.kv_type = kv;
  o.n_threads = 2;
  o.block_size = 16;
  o.n_blocks = 8;  // 128 slots: the longest case (prompt + 32) fits
  return sy::make_cpu_engine(std::move(m), o);
}

// Greedy generation: prompt in one step, then one token per step, as llama-server decodes.
std::vector<int32_t> greedy(sy::Engine& e, const std::vector<int32_t>& prompt, size_t n) {
  std::vector<int32_t> blocks(static_cast<size_t>(e.pool().n_total()));
  for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
  sy::StepOutput out;
  e.step({seq_step(prompt, 0, blocks, false)}, out);
  std::vector<int32_t> gen;
  int32_t n_past = static_cast<int32_t>(prompt.size());
  while (gen.size() < n) {
    gen.push_back(argmax(out.row(0), out.n_vocab));
    if (gen.size() == n) break;
    const std::vector<int32_t> one = {gen.back()};
    e.step({seq_step(one, n_past++, blocks, false)}, out);
  }
  return gen;
}

// Checks one file on one path; returns false (with a message) where the build cannot load it.
void check_file(const ZooFile& zf, bool reference) {
  const std::string name = zf.name;
  std::shared_ptr<sy::Model> model;
  try {
    model = sy::Model::load(zoo_path(name, ".gguf"));
  } catch (const sy::gguf::Error& e) {
    const std::string msg = e.what();
    // A quantized type another part of the build has not implemented yet: named, not a number.
    if (!zf.f32 && msg.find("which this build does not support") != std::string::npos) {
      BOOST_TEST_MESSAGE("skipping zoo-" << name << ": " << msg);
      return;
    }
    BOOST_FAIL("zoo-" << name << " does not load: " << msg);
  }
  auto e = make_engine(model, reference);
  auto cases = load_cases(name);
  // The plain-loop reference path (double sums, every quantized row dequantized for every token)
  // is about 20x slower than the fast path: it checks the first cases only, to keep the test
  // within seconds; zoo_fast_path_agrees_with_reference_path covers the rest on f32 files.
  const size_t n_ref = zf.f32 ? kRefF32Cases : kRefQuantCases;
  if (reference && cases.size() > n_ref) cases.resize(n_ref);
  double worst = 0.0, sum = 0.0;
  int n_lp = 0, n_top1 = 0, n_top1_equal = 0, n_greedy_tie = 0;
  for (const ZooCase& c : cases) {
    BOOST_TEST_CONTEXT("zoo-" << name << (reference ? " reference" : " fast") << ", prompt '"
                              << c.prompt << "'") {
      // The model's own tokenizer gives llama.cpp's prompt ids.
      const std::vector<int32_t> ids = model->tokenizer().encode(c.prompt, true);
      BOOST_TEST(ids == c.prompt_ids, boost::test_tools::per_element());

      // Teacher-forced: prompt + generated[:-1] in one batch, logits at every position.
      std::vector<int32_t> all = c.prompt_ids;
      all.insert(all.end(), c.generated.begin(), c.generated.end() - 1);
      std::vector<int32_t> blocks(static_cast<size_t>(e->pool().n_total()));
      for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
      sy::StepOutput out;
      e->step({seq_step(all, 0, blocks, true)}, out);
      const int32_t first = static_cast<int32_t>(c.prompt_ids.size()) - 1;
      for (size_t i = 0; i < c.generated.size(); ++i) {
        const Position& p = c.positions[i];
        if (!p.has_top) continue;
        const float* row = out.row(0, first + static_cast<int32_t>(i));
        const std::vector<double> lp = log_softmax(row, out.n_vocab);
        const int32_t top1 = argmax(row, out.n_vocab);
        BOOST_TEST_CONTEXT("position " << i) {
          const bool assert_top1 =
              zf.f32 ? p.margin >= kF32NearTie : p.tf_top1_is_generated && p.margin > kQuantMargin;
          if (assert_top1) {
            ++n_top1;
            if (top1 == p.top[0].id) {
              ++n_top1_equal;
            } else if (zf.f32) {
              BOOST_ERROR("top-1 " << top1 << " vs llama.cpp " << p.top[0].id << " at margin "
                                   << p.margin);
            }
          }
          for (const TopLogprob& t : p.top) {
            const double d = std::abs(lp[static_cast<size_t>(t.id)] - t.logprob);
            worst = std::max(worst, d);
            sum += d;
            ++n_lp;
            BOOST_TEST(d <= zf.max_gap, "token " << t.id << ": " << lp[static_cast<size_t>(t.id)]
                                                 << " vs llama.cpp " << t.logprob);
          }
        }
      }

      // Greedy: equal to llama.cpp's ids up to the first difference, where llama.cpp's own
      // margin must be below the file's near-tie bound. Where llama-server withheld the margin
      // (a piece that is not whole UTF-8) a quantized file's difference is accepted uncounted;
      // an f32 file's is not.
      // (On the reference path a quantized file is checked teacher-forced only, for time.)
      if (reference && !zf.f32) continue;
      const std::vector<int32_t> gen = greedy(*e, c.prompt_ids, c.generated.size());
      size_t k = 0;
      while (k < gen.size() && gen[k] == c.generated[k]) ++k;
      if (k < gen.size()) {
        ++n_greedy_tie;
        const Position& p = c.positions[k];
        const bool ok = p.has_top ? p.margin < zf.greedy_tie : !zf.f32;
        BOOST_TEST(ok, "greedy ids differ at "
                           << k << " (ours " << gen[k] << ", llama.cpp " << c.generated[k]
                           << ") where llama.cpp's margin is "
                           << (p.has_top ? std::to_string(p.margin) : std::string("withheld")));
      }
    }
  }
  const double mean = n_lp ? sum / n_lp : 0.0;
  const double rate = n_top1 ? static_cast<double>(n_top1_equal) / n_top1 : 1.0;
  BOOST_TEST_MESSAGE("zoo-" << name << (reference ? " reference" : " fast")
                            << ": top-5 logprob gap max " << worst << " mean " << mean
                            << "; top-1 equal at " << n_top1_equal << "/" << n_top1
                            << " asserted positions; greedy diverged " << n_greedy_tie << " times");
  BOOST_TEST(mean <= zf.mean_gap);
  // At least min_top1_rate of the counted positions agree; one flip is always allowed, so a
  // short sample (the reference path's one case) is not judged by a single near-call.
  const int allowed = std::max(1, static_cast<int>((1.0 - zf.min_top1_rate) * n_top1));
  BOOST_TEST(n_top1 - n_top1_equal <= (zf.f32 ? 0 : allowed),
             "top-1 agrees at " << rate << " of " << n_top1 << " positions");
}

}  // namespace

BOOST_AUTO_TEST_CASE(zoo_fast_path) {
  for (const ZooFile& zf : kZoo) check_file(zf, false);
}

BOOST_AUTO_TEST_CASE(zoo_reference_path) {
  for (const ZooFile& zf : kZoo) check_file(zf, true);
}

BOOST_AUTO_TEST_CASE(zoo_descriptions) {
  // What each architecture's description says, read from the files.
  const auto cfg = [](const char* n) { return sy::Model::load(zoo_path(n, ".gguf")); };
  const auto llama3 = cfg("llama3-f32");
  BOOST_TEST(llama3->config().arch == "llama");
  BOOST_TEST(llama3->weights().rope_freqs != nullptr);
  BOOST_TEST((llama3->config().rope_layout == sy::RopeLayout::Norm));
  const auto qwen2 = cfg("qwen2-f32");
  BOOST_TEST((qwen2->config().rope_layout == sy::RopeLayout::Neox));
  BOOST_TEST(qwen2->weights().layers[0].bq != nullptr);
  BOOST_TEST(qwen2->weights().output.data != qwen2->weights().tok_embd.data);
  const auto gemma2 = cfg("gemma2-f32");
  const sy::ModelConfig& g = gemma2->config();
  BOOST_TEST((g.activation == sy::Activation::GeluTanh));
  BOOST_TEST(g.attn_softcap == 50.0f);
  BOOST_TEST(g.final_softcap == 30.0f);
  BOOST_TEST(g.embed_scale == std::sqrt(128.0f));
  BOOST_TEST(g.sliding_window == 0);  // not model-wide: only the even layers are windowed
  BOOST_REQUIRE_EQUAL(g.layer_window.size(), 26u);
  for (int l = 0; l < 26; ++l)
    BOOST_TEST(g.layer_window[static_cast<size_t>(l)] == (l % 2 ? 0 : 16));
  BOOST_TEST(gemma2->weights().output.data == gemma2->weights().tok_embd.data);  // tied
  const auto phi3 = cfg("phi3-f32");
  const sy::LayerWeights& L = phi3->weights().layers[0];
  // Fused attn_qkv and gate|up are views: k follows q, v follows k, up follows gate.
  BOOST_TEST(static_cast<const uint8_t*>(L.wk.data) ==
             static_cast<const uint8_t*>(L.wq.data) + 128 * 128 * 4);
  BOOST_TEST(static_cast<const uint8_t*>(L.wv.data) ==
             static_cast<const uint8_t*>(L.wk.data) + 128 * 128 * 4);
  BOOST_TEST(static_cast<const uint8_t*>(L.w_up.data) ==
             static_cast<const uint8_t*>(L.w_gate.data) + 256 * 128 * 4);
  BOOST_TEST(phi3->config().sliding_window == 2047);
  BOOST_TEST(phi3->config().n_vocab == 32064);
  // Mixtures of experts, with the routing rules of the zoo's README.
  const auto mixtral = cfg("mixtral-f32");
  const sy::ModelConfig& m = mixtral->config();
  BOOST_TEST(m.arch == "llama");
  BOOST_TEST(m.n_experts == 4);
  BOOST_TEST(m.n_experts_used == 2);
  BOOST_TEST(m.expert_ffn_dim == 256);
  BOOST_TEST(m.expert_weights_norm);
  BOOST_TEST(mixtral->weights().layers[0].exp_down.size() == 4u);
  BOOST_TEST(mixtral->weights().layers[0].shexp_gate_inp == nullptr);
  const auto qmoe = cfg("qwen2moe-f32");
  BOOST_TEST(qmoe->config().n_experts == 8);
  BOOST_TEST(!qmoe->config().expert_weights_norm);
  BOOST_TEST(qmoe->config().shared_expert_ffn_dim == 512);
  BOOST_TEST(qmoe->weights().layers[3].shexp_gate_inp != nullptr);
  const auto olmoe = cfg("olmoe-f32");
  BOOST_TEST(olmoe->config().qk_norm_whole);
  BOOST_TEST(!olmoe->config().expert_weights_norm);
  BOOST_TEST((olmoe->config().rope_layout == sy::RopeLayout::Neox));
  // Expert e of a 3-D tensor is a view of its rows: e * rows further on.
  const auto mixtral_q4 = cfg("mixtral-q4_k_m");
  const sy::LayerWeights& q4 = mixtral_q4->weights().layers[2];
  BOOST_TEST(static_cast<const uint8_t*>(q4.exp_down[1].data) ==
             static_cast<const uint8_t*>(q4.exp_down[0].data) +
                 256 * sy::kernels::row_bytes(q4.exp_down[0].type, 256));
}

// The quantized files against their f32 siblings (the same weights before llama-quantize), at
// the same positions: for each case, the positions where both references generated the same
// tokens so far, the logprob of the f32 reference's top-1 token. llama.cpp's gap is between its
// two references; ours between our two engines, teacher-forced on the same tokens. Both read the
// same quantized blocks; llama.cpp also rounds the activations to 8 bits for its quantized dot
// products, where ours stay f32, so ours may be at most as far as its own plus a rounding margin:
// a quarter more on average and 0.02 (the f32 files' own allowance, 5e-3, four times over) at
// the worst position beyond its worst. (Measured: mixtral 0.17 mean against llama.cpp's 0.18,
// llama3 0.24 against 0.24.)
BOOST_AUTO_TEST_CASE(zoo_quantized_as_close_to_f32_as_llamacpps) {
  for (const auto& [quant, f32] :
       {std::pair<const char*, const char*>{"mixtral-q4_k_m", "mixtral-f32"},
        {"llama3-q4_k_m", "llama3-f32"}}) {
    BOOST_TEST_CONTEXT("zoo-" << quant << " against zoo-" << f32) {
      const auto cq = load_cases(quant), cf = load_cases(f32);
      BOOST_TEST_REQUIRE(cq.size() == cf.size());
      auto eq = make_engine(sy::Model::load(zoo_path(quant, ".gguf")), false);
      auto ef = make_engine(sy::Model::load(zoo_path(f32, ".gguf")), false);
      std::vector<int32_t> blocks(8);
      for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
      double ours_sum = 0, theirs_sum = 0, ours_max = 0, theirs_max = 0;
      int n = 0;
      for (size_t c = 0; c < cq.size(); ++c) {
        const ZooCase& q = cq[c];
        const ZooCase& f = cf[c];
        BOOST_TEST_REQUIRE(q.prompt_ids == f.prompt_ids);
        // Positions with the same tokens before them in both references.
        size_t same = 0;
        while (same < q.generated.size() && same < f.generated.size() &&
               q.generated[same] == f.generated[same])
          ++same;
        const size_t upto = std::min({same + 1, q.generated.size(), f.generated.size()});
        std::vector<int32_t> ids = f.prompt_ids;
        ids.insert(ids.end(), f.generated.begin(), f.generated.begin() + static_cast<long>(upto));
        ids.pop_back();  // the last position's own token is not fed
        sy::StepOutput oq, of;
        eq->step({seq_step(ids, 0, blocks, true)}, oq);
        ef->step({seq_step(ids, 0, blocks, true)}, of);
        for (size_t i = 0; i < upto; ++i) {
          const Position& pq = q.positions[i];
          const Position& pf = f.positions[i];
          if (!pq.has_top || !pf.has_top || pf.top.empty()) continue;
          const int32_t tok = pf.top[0].id;
          auto in_q = std::find_if(pq.top.begin(), pq.top.end(),
                                   [&](const auto& t) { return t.id == tok; });
          if (in_q == pq.top.end()) continue;
          const double theirs = std::abs(in_q->logprob - pf.top[0].logprob);
          const int32_t row = static_cast<int32_t>(f.prompt_ids.size() + i) - 1;
          const auto lq = log_softmax(oq.row(0, row), oq.n_vocab);
          const auto lf = log_softmax(of.row(0, row), of.n_vocab);
          const double ours = std::abs(lq[static_cast<size_t>(tok)] - lf[static_cast<size_t>(tok)]);
          ours_sum += ours;
          theirs_sum += theirs;
          ours_max = std::max(ours_max, ours);
          theirs_max = std::max(theirs_max, theirs);
          ++n;
        }
      }
      BOOST_TEST_REQUIRE(n >= 10, "too few shared positions: " << n);
      BOOST_TEST_MESSAGE("zoo-" << quant << " vs f32 over " << n << " positions: ours mean "
                                << ours_sum / n << " max " << ours_max << "; llama.cpp's mean "
                                << theirs_sum / n << " max " << theirs_max);
      BOOST_TEST(ours_sum <= 1.25 * theirs_sum);
      BOOST_TEST(ours_max <= theirs_max + 0.02);
    }
  }
}

BOOST_AUTO_TEST_CASE(zoo_fast_path_agrees_with_reference_path) {
  // On f32 files the two paths differ in summation order only. (On quantized files the fast path
  // quantizes activations to 8 bits as llama.cpp does and the reference path does not.)
  for (const ZooFile& zf : kZoo) {
    if (!zf.f32) continue;
    const auto model = sy::Model::load(zoo_path(zf.name, ".gguf"));
    const ZooCase c = load_cases(zf.name).front();
    std::vector<int32_t> all = c.prompt_ids;
    all.insert(all.end(), c.generated.begin(), c.generated.end() - 1);
    std::vector<std::vector<double>> lp[2];
    for (int ref = 0; ref < 2; ++ref) {
      // f32 K/V: the paths then differ in summation order only.
      auto e = make_engine(model, ref == 1, sy::kernels::DType::F32);
      std::vector<int32_t> blocks(static_cast<size_t>(e->pool().n_total()));
      for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
      sy::StepOutput out;
      e->step({seq_step(all, 0, blocks, true)}, out);
      for (int32_t r = 0; r < out.count[0]; ++r)
        lp[ref].push_back(log_softmax(out.row(0, r), out.n_vocab));
    }
    double worst = 0;
    for (size_t r = 0; r < lp[0].size(); ++r)
      for (size_t k = 0; k < lp[0][r].size(); ++k)
        worst = std::max(worst, std::abs(lp[0][r][k] - lp[1][r][k]));
    BOOST_TEST_MESSAGE("zoo-" << zf.name << ": fast vs reference largest logprob gap " << worst);
    BOOST_TEST(worst < kFastVsReference, "zoo-" << zf.name);
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_engine_zoo
