// make-model: every dtype writes a file the reader accepts with the expected tensors, types,
// hyperparameters and vocabulary; weights are deterministic in the seed and sensibly scaled; the
// mixture-of-experts architectures use llama.cpp's keys, tensor names, shapes and types (checked
// against the zoo's files, which llama.cpp's tool chain wrote) and load in our loader.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "model/gguf.hpp"
#include "model/make_model.hpp"
#include "model/model.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_makemodel)

using namespace sy;
using kernels::DType;

namespace {

// Named after this test, so that a folder left in /tmp says where it came from.
struct TempDir : sy::test::TempDir {
  TempDir() : sy::test::TempDir("sy_makemodel_") {}
};

std::string make(const TempDir& d, const std::string& shape, const std::string& dtype,
                 uint64_t seed = 0, const std::string& vocab = "") {
  MakeModelOptions o;
  o.shape = shape;
  o.dtype = dtype;
  o.seed = seed;
  o.vocab_from = vocab;
  o.out = d.path() + "/" + shape + "-" + dtype + "-" + std::to_string(seed) + ".gguf";
  make_model(o);
  return o.out;
}

std::vector<float> row_f32(const gguf::File& f, const gguf::TensorInfo& t, int64_t r) {
  const int64_t cols = static_cast<int64_t>(t.dims[0]);
  std::vector<float> out(static_cast<size_t>(cols));
  const uint8_t* p = f.data(t) + r * kernels::row_bytes(t.type, cols);
  kernels::dequantize_row(t.type, p, out.data(), cols);
  return out;
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const std::string kModels = SY_MODELS_DIR;
const std::string kZoo = kModels + "/zoo/";

// A mixture-of-experts file of `arch` at `shape` (0 for the expert options: make-model's
// defaults), named after all of them.
std::string make_moe(const TempDir& d, const std::string& arch, const std::string& shape,
                     const std::string& dtype, int experts = 0, int used = 0, int expert_ffn = 0,
                     const std::string& vocab = "") {
  MakeModelOptions o;
  o.shape = shape;
  o.arch = arch;
  o.dtype = dtype;
  o.seed = 5;
  o.n_experts = experts;
  o.n_experts_used = used;
  o.expert_ffn = expert_ffn;
  o.vocab_from = vocab;
  o.out = d.path() + "/" + arch + "-" + shape + "-" + dtype + "-" + std::to_string(experts) + "-" +
          std::to_string(used) + "-" + std::to_string(expert_ffn) + ".gguf";
  make_model(o);
  return o.out;
}

// "name d0 d1 ..." of every tensor, or of those whose name contains `only`.
std::set<std::string> names_and_dims(const gguf::File& f, const std::string& only = "") {
  std::set<std::string> out;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name.find(only) == std::string::npos) continue;
    std::string n = t.name;
    for (uint64_t x : t.dims) n += " " + std::to_string(x);
    out.insert(n);
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(tiny_every_dtype) {
  TempDir d;
  const std::pair<const char*, DType> dtypes[] = {{"f32", DType::F32},
                                                  {"f16", DType::F16},
                                                  {"bf16", DType::BF16},
                                                  {"q8_0", DType::Q8_0},
                                                  {"q4_0", DType::Q4_0}};
  for (const auto& [name, type] : dtypes) {
    BOOST_TEST_CONTEXT("dtype " << name) {
      const gguf::File f = gguf::File::open(make(d, "tiny", name));
      BOOST_TEST(*f.get_string("general.architecture") == "llama");
      BOOST_TEST(f.get_string("general.name").has_value());
      BOOST_TEST(f.get_int("general.file_type").has_value());
      BOOST_TEST(*f.get_int("llama.context_length") == 2048);
      BOOST_TEST(*f.get_int("llama.embedding_length") == 64);
      BOOST_TEST(*f.get_int("llama.block_count") == 2);
      BOOST_TEST(*f.get_int("llama.feed_forward_length") == 192);
      BOOST_TEST(*f.get_int("llama.attention.head_count") == 4);
      BOOST_TEST(*f.get_int("llama.attention.head_count_kv") == 2);
      BOOST_TEST(*f.get_int("llama.rope.dimension_count") == 16);
      BOOST_TEST(*f.get_float("llama.rope.freq_base") == 10000.0);
      BOOST_TEST(std::fabs(*f.get_float("llama.attention.layer_norm_rms_epsilon") - 1e-5) < 1e-9);
      BOOST_TEST(*f.get_int("llama.vocab_size") == 32000);
      // tiny ties its output to token_embd
      BOOST_TEST(f.tensors().size() == 2u + 2u * 9u);
      BOOST_TEST(!f.tensor("output.weight"));
      const struct {
        const char* n;
        std::vector<uint64_t> dims;
        bool norm;
      } want[] = {
          {"token_embd.weight", {64, 32000}, false},     {"output_norm.weight", {64}, true},
          {"blk.0.attn_norm.weight", {64}, true},        {"blk.0.attn_q.weight", {64, 64}, false},
          {"blk.1.attn_k.weight", {64, 32}, false},      {"blk.1.attn_v.weight", {64, 32}, false},
          {"blk.1.attn_output.weight", {64, 64}, false}, {"blk.1.ffn_norm.weight", {64}, true},
          {"blk.0.ffn_gate.weight", {64, 192}, false},   {"blk.0.ffn_up.weight", {64, 192}, false},
          {"blk.1.ffn_down.weight", {192, 64}, false}};
      for (const auto& w : want) {
        const gguf::TensorInfo* t = f.tensor(w.n);
        BOOST_REQUIRE_MESSAGE(t, w.n);
        BOOST_TEST(t->dims == w.dims);
        BOOST_TEST((t->type == (w.norm ? DType::F32 : type)), w.n);
      }
      // norms are exactly 1
      const auto norm = row_f32(f, *f.tensor("output_norm.weight"), 0);
      for (float x : norm) BOOST_TEST(x == 1.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(builtin_vocabulary) {
  TempDir d;
  const gguf::File f = gguf::File::open(make(d, "tiny", "q8_0"));
  BOOST_TEST(*f.get_string("tokenizer.ggml.model") == "llama");
  const auto tokens = *f.get_string_array("tokenizer.ggml.tokens");
  const auto types = *f.get_int_array("tokenizer.ggml.token_type");
  const auto scores = *f.get_float_array("tokenizer.ggml.scores");
  BOOST_REQUIRE(tokens.size() == 32000u);
  BOOST_REQUIRE(types.size() == 32000u);
  BOOST_REQUIRE(scores.size() == 32000u);
  BOOST_TEST(tokens[0] == "<unk>");
  BOOST_TEST(types[0] == 2);
  BOOST_TEST(tokens[1] == "<s>");
  BOOST_TEST(tokens[2] == "</s>");
  BOOST_TEST(types[1] == 3);
  BOOST_TEST(types[2] == 3);
  BOOST_TEST(tokens[3] == "<0x00>");
  BOOST_TEST(tokens[3 + 0x0A] == "<0x0A>");
  BOOST_TEST(tokens[258] == "<0xFF>");
  for (int i = 3; i < 259; ++i) BOOST_TEST(types[i] == 6);
  BOOST_TEST(tokens[259] == "\xe2\x96\x81");
  BOOST_TEST(types[259] == 1);
  // every prefix of a word piece is in the vocabulary, so SentencePiece merges can reach it
  std::set<std::string> all(tokens.begin(), tokens.end());
  BOOST_TEST(all.count("\xe2\x96\x81the"));
  BOOST_TEST(all.count("\xe2\x96\x81th"));
  BOOST_TEST(all.count("\xe2\x96\x81t"));
  // Word pieces (scores above -1e6) are merge-reachable; the filler words below them are not
  // meant to be, they only give the random model visible output.
  int words = 0, filler = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != 1) continue;
    if (scores[i] > -1e6f) {
      ++words;
      if (tokens[i].size() > 4 && tokens[i].rfind("\xe2\x96\x81", 0) == 0)
        BOOST_TEST(all.count(tokens[i].substr(0, tokens[i].size() - 1)), tokens[i]);
    } else {
      ++filler;
      BOOST_TEST(tokens[i].rfind("\xe2\x96\x81", 0) == 0, tokens[i]);
    }
  }
  BOOST_TEST(words >= 36);
  BOOST_TEST(words + filler + 259 == 32000);
  BOOST_TEST(types.back() == 1);
  BOOST_TEST(scores.back() <= -1e6f);
  BOOST_TEST(*f.get_int("tokenizer.ggml.bos_token_id") == 1);
  BOOST_TEST(*f.get_int("tokenizer.ggml.eos_token_id") == 2);
  BOOST_TEST(*f.get_int("tokenizer.ggml.unknown_token_id") == 0);
  BOOST_TEST(*f.get_int("tokenizer.ggml.add_bos_token") == 1);
  BOOST_TEST(all.size() == tokens.size());  // no duplicate token texts
}

BOOST_AUTO_TEST_CASE(deterministic_in_seed) {
  TempDir d;
  const auto a = slurp(make(d, "tiny", "q4_0", 7));
  std::filesystem::rename(d.path() + "/tiny-q4_0-7.gguf", d.path() + "/first.gguf");
  const auto b = slurp(make(d, "tiny", "q4_0", 7));
  const auto c = slurp(make(d, "tiny", "q4_0", 8));
  BOOST_TEST(a.size() == b.size());
  BOOST_TEST((a == b));
  BOOST_TEST(a.size() == c.size());
  BOOST_TEST((a != c));
}

BOOST_AUTO_TEST_CASE(weights_are_scaled_and_shared_across_dtypes) {
  TempDir d;
  const gguf::File f32 = gguf::File::open(make(d, "tiny", "f32", 3));
  const gguf::File q8 = gguf::File::open(make(d, "tiny", "q8_0", 3));
  // std of ffn_down (fan_in 192) is about 1/sqrt(192)
  const gguf::TensorInfo& down = *f32.tensor("blk.0.ffn_down.weight");
  double s2 = 0, s1 = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < 64; ++r)
    for (float x : row_f32(f32, down, r)) {
      s1 += x;
      s2 += double(x) * x;
      ++n;
    }
  const double mean = s1 / n, sd = std::sqrt(s2 / n - mean * mean);
  BOOST_TEST(std::fabs(sd * std::sqrt(192.0) - 1.0) < 0.05);
  BOOST_TEST(std::fabs(mean) < 0.01);
  // rows differ from each other
  BOOST_TEST((row_f32(f32, down, 0) != row_f32(f32, down, 1)));
  // q8_0 holds the same values as f32, quantized
  const auto a = row_f32(f32, *f32.tensor("token_embd.weight"), 12345);
  const auto b = row_f32(q8, *q8.tensor("token_embd.weight"), 12345);
  for (size_t i = 0; i < a.size(); ++i) BOOST_TEST(std::fabs(a[i] - b[i]) < 0.003);
}

BOOST_AUTO_TEST_CASE(shape_15M_has_untied_output) {
  TempDir d;
  const gguf::File f = gguf::File::open(make(d, "15M", "q8_0"));
  BOOST_TEST(f.tensors().size() == 3u + 6u * 9u);
  const gguf::TensorInfo* out = f.tensor("output.weight");
  BOOST_REQUIRE(out);
  BOOST_TEST((out->dims == std::vector<uint64_t>{288, 32000}));
  BOOST_TEST((out->type == DType::Q8_0));
  BOOST_TEST((f.tensor("blk.5.attn_k.weight")->dims == std::vector<uint64_t>{288, 288}));
  BOOST_TEST(*f.get_int("llama.attention.head_count") == 6);
  BOOST_TEST(*f.get_int("llama.rope.dimension_count") == 48);
  // output and token_embd are drawn independently
  BOOST_TEST(std::memcmp(f.data(*out), f.data(*f.tensor("token_embd.weight")), 34) != 0);
}

BOOST_AUTO_TEST_CASE(shape_table) {
  const ModelShape s8 = model_shape("8B");
  BOOST_TEST(s8.dim == 4096);
  BOOST_TEST(s8.n_layers == 32);
  BOOST_TEST(s8.n_heads == 32);
  BOOST_TEST(s8.n_kv_heads == 8);
  BOOST_TEST(s8.ffn_dim == 14336);
  BOOST_TEST(s8.n_vocab == 128256);
  BOOST_TEST(s8.rope_theta == 500000.0f);
  const ModelShape s1 = model_shape("1b");
  BOOST_TEST(s1.dim == 2048);
  BOOST_TEST(s1.n_layers == 16);
  BOOST_TEST(s1.ffn_dim == 8192);
  BOOST_TEST(s1.n_kv_heads == 8);
  const ModelShape s110 = model_shape("110M");
  BOOST_TEST(s110.dim == 768);
  BOOST_TEST(s110.n_layers == 12);
  BOOST_TEST(s110.ffn_dim == 2048);
  BOOST_TEST(s110.n_vocab == 32000);
  BOOST_TEST(model_shape("tiny").tied_output);
  BOOST_TEST(!model_shape("15M").tied_output);
  for (const char* n : {"tiny", "15M", "110M", "1B", "8B"})
    BOOST_TEST(model_shape(n).ctx_len == 2048);
}

BOOST_AUTO_TEST_CASE(vocab_from_files) {
  TempDir d;
  const std::string spm = kModels + "/vocab/ggml-vocab-llama-spm.gguf";
  const gguf::File f = gguf::File::open(make(d, "tiny", "f16", 0, spm));
  const gguf::File src = gguf::File::open(spm);
  BOOST_TEST((*f.get_string_array("tokenizer.ggml.tokens") ==
              *src.get_string_array("tokenizer.ggml.tokens")));
  BOOST_TEST((*f.get_float_array("tokenizer.ggml.scores") ==
              *src.get_float_array("tokenizer.ggml.scores")));
  BOOST_TEST(*f.get_string("tokenizer.ggml.pre") == "default");
  BOOST_TEST(*f.get_int("tokenizer.ggml.add_bos_token") == 1);
  BOOST_TEST(*f.get_int("llama.embedding_length") == 64);

  const std::string gpt2 = kModels + "/vocab/ggml-vocab-gpt-2.gguf";
  const gguf::File g = gguf::File::open(make(d, "tiny", "q4_0", 0, gpt2));
  BOOST_TEST(*g.get_string("tokenizer.ggml.model") == "gpt2");
  BOOST_TEST(g.get_string_array("tokenizer.ggml.merges")->size() == 50000u);
  BOOST_TEST(*g.get_int("llama.vocab_size") == 50257);
  BOOST_TEST((g.tensor("token_embd.weight")->dims == std::vector<uint64_t>{64, 50257}));
  BOOST_TEST(!g.find("gpt2.block_count"));  // only tokenizer keys are copied
}

BOOST_AUTO_TEST_CASE(bad_options) {
  TempDir d;
  MakeModelOptions o;
  o.out = d.path() + "/x.gguf";
  o.shape = "huge";
  BOOST_CHECK_EXCEPTION(make_model(o), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("unknown shape 'huge'") != std::string::npos;
  });
  o.shape = "tiny";
  o.dtype = "q7_k";  // not a ggml type
  BOOST_CHECK_EXCEPTION(make_model(o), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("unknown dtype 'q7_k'") != std::string::npos;
  });
  o.dtype = "f32";
  o.vocab_from = d.path() + "/missing.gguf";
  BOOST_CHECK_EXCEPTION(make_model(o), gguf::Error, [](const gguf::Error& e) {
    return std::string(e.what()).find("cannot open") != std::string::npos;
  });
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.write(d.path() + "/novocab.gguf");
  o.vocab_from = d.path() + "/novocab.gguf";
  BOOST_CHECK_EXCEPTION(make_model(o), gguf::Error, [](const gguf::Error& e) {
    return std::string(e.what()).find("tokenizer.ggml.tokens") != std::string::npos;
  });
  o.vocab_from.clear();
  o.out.clear();
  BOOST_CHECK_THROW(make_model(o), std::invalid_argument);
  BOOST_TEST(!std::filesystem::exists(d.path() + "/x.gguf"));
}

BOOST_AUTO_TEST_CASE(moe_files_match_the_zoo) {
  // The zoo's MoE files have the mini shape (dim 256, 4 layers, 4 heads, 2 KV heads; olmoe 4)
  // with experts 256 wide and its 512-token vocabulary: make-model's files of that shape have
  // the same tensor names and dims (qwen2moe's shared expert aside: the zoo's is 512 wide, ours
  // the shape's FFN, 768), every key the zoo file has under the architecture's prefix, of the
  // same type, and the same expert keys' values.
  TempDir d;
  const std::string vocab = kZoo + "zoo-llama3-f32.gguf";
  const struct {
    const char* arch;    // --arch
    const char* zoo;     // zoo-NAME-f32.gguf
    const char* gguf;    // general.architecture
    int experts;         // the zoo file's
    bool shared_expert;  // qwen2moe
  } cases[] = {{"mixtral", "mixtral", "llama", 4, false},
               {"qwen2moe", "qwen2moe", "qwen2moe", 8, true},
               {"olmoe", "olmoe", "olmoe", 8, false}};
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("arch " << c.arch) {
      const gguf::File z = gguf::File::open(kZoo + "zoo-" + c.zoo + "-f32.gguf");
      const gguf::File f =
          gguf::File::open(make_moe(d, c.arch, "mini", "f32", c.experts, 2, 256, vocab));
      BOOST_TEST(*f.get_string("general.architecture") == c.gguf);
      if (c.shared_expert) {
        // Names the same; dims apart from the shared expert's the same.
        std::set<std::string> ours, theirs;
        for (const gguf::TensorInfo& t : f.tensors()) ours.insert(t.name);
        for (const gguf::TensorInfo& t : z.tensors()) theirs.insert(t.name);
        BOOST_TEST(ours == theirs, boost::test_tools::per_element());
        for (const char* part : {"_exps", "ffn_gate_inp.", "attn_", "token_embd", "output"})
          BOOST_TEST(names_and_dims(f, part) == names_and_dims(z, part),
                     boost::test_tools::per_element());
        BOOST_TEST(
            (f.tensor("blk.1.ffn_down_shexp.weight")->dims == std::vector<uint64_t>{768, 256}));
        BOOST_TEST(
            (f.tensor("blk.1.ffn_gate_inp_shexp.weight")->dims == std::vector<uint64_t>{256}));
        BOOST_TEST(*f.get_int("qwen2moe.expert_shared_feed_forward_length") == 768);
      } else {
        BOOST_TEST(names_and_dims(f) == names_and_dims(z), boost::test_tools::per_element());
      }
      const std::string p = std::string(c.gguf) + ".";
      for (const auto& [k, v] : z.metadata()) {
        if (k.rfind(p, 0) != 0) continue;
        const gguf::Value* ours = f.find(k);
        BOOST_TEST(ours != nullptr, k);
        if (ours) BOOST_TEST(static_cast<int>(ours->type) == static_cast<int>(v.type), k);
      }
      for (const char* k :
           {"expert_count", "expert_used_count", "expert_feed_forward_length",
            "feed_forward_length", "attention.head_count_kv", "embedding_length", "block_count"}) {
        if (!z.find(p + k)) continue;
        BOOST_TEST(*f.get_int(p + k) == *z.get_int(p + k), k);
      }
      // Every tensor is F32 in an f32 file, the router included.
      for (const gguf::TensorInfo& t : f.tensors()) BOOST_TEST((t.type == DType::F32), t.name);
    }
  }
}

BOOST_AUTO_TEST_CASE(moe_types_follow_llama_quantize) {
  // Every tensor of llama-quantize's Q4_K_M zoo file of the 4-expert mixtral: the type
  // make-model's rule gives it, 3-D expert stacks and the F32 router included.
  const gguf::File z = gguf::File::open(kZoo + "zoo-mixtral-q4_k_m.gguf");
  int n = 0, stacks = 0;
  for (const gguf::TensorInfo& t : z.tensors()) {
    if (t.dims.size() < 2) continue;
    int layer = -1;
    if (t.name.rfind("blk.", 0) == 0) layer = std::stoi(t.name.substr(4));
    const DType want =
        make_model_tensor_type("q4_k_m", t.name, layer, 4, static_cast<int64_t>(t.dims[0]), false,
                               static_cast<int>(*z.get_int("llama.expert_count")));
    BOOST_TEST(std::string(kernels::dtype_name(want)) == kernels::dtype_name(t.type), t.name);
    ++n;
    stacks += t.dims.size() == 3;
  }
  BOOST_TEST(n == 2 + 4 * 8);  // token_embd, output; per layer q, k, v, o, router, 3 stacks
  BOOST_TEST(stacks == 4 * 3);
  // With exactly 8 experts llama-quantize gives attn_k and attn_v Q8_0 and, in Q4_K_M,
  // attn_output Q5_K; ffn_down_exps and ffn_down_shexp follow ffn_down's rule (12 layers: more
  // bits in layers 0, 3, 6, 9, 10, 11).
  auto type = [](const char* dtype, const std::string& name, int layer, int experts) {
    return std::string(
        kernels::dtype_name(make_model_tensor_type(dtype, name, layer, 12, 768, false, experts)));
  };
  BOOST_TEST(type("q4_k_m", "blk.5.attn_k.weight", 5, 8) == "Q8_0");
  BOOST_TEST(type("q4_k_m", "blk.5.attn_v.weight", 5, 8) == "Q8_0");
  BOOST_TEST(type("q4_k_m", "blk.5.attn_output.weight", 5, 8) == "Q5_K");
  BOOST_TEST(type("q5_k_m", "blk.5.attn_output.weight", 5, 8) == "Q5_K");
  BOOST_TEST(type("q4_k_m", "blk.5.attn_k.weight", 5, 4) == "Q4_K");
  BOOST_TEST(type("q4_k_m", "blk.5.attn_output.weight", 5, 4) == "Q4_K");
  BOOST_TEST(type("q4_k_m", "blk.5.attn_k.weight", 5, 0) == "Q4_K");
  BOOST_TEST(type("q4_k_m", "blk.0.ffn_down_exps.weight", 0, 8) == "Q6_K");
  BOOST_TEST(type("q4_k_m", "blk.4.ffn_down_exps.weight", 4, 8) == "Q4_K");
  BOOST_TEST(type("q4_k_m", "blk.11.ffn_down_shexp.weight", 11, 8) == "Q6_K");
  BOOST_TEST(type("q4_k_m", "blk.4.ffn_gate_exps.weight", 4, 8) == "Q4_K");
  // Pure dtypes are llama-quantize --pure: the 8-expert rule does not apply; the router stays
  // F32 whatever the dtype.
  BOOST_TEST(type("q4_0", "blk.5.attn_v.weight", 5, 8) == "Q4_0");
  for (const char* dtype : {"f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q6_k"})
    BOOST_TEST(type(dtype, "blk.2.ffn_gate_inp.weight", 2, 8) == "F32", dtype);
}

BOOST_AUTO_TEST_CASE(moe_files_write_what_is_asked) {
  // The tiny shape (dim 64, 2 layers, 4 heads of 16, 2 KV heads, FFN 192), every MoE
  // architecture, make-model's defaults and explicit expert options.
  TempDir d;
  {
    const gguf::File f = gguf::File::open(make_moe(d, "mixtral", "tiny", "q8_0"));
    BOOST_TEST(*f.get_string("general.architecture") == "llama");
    BOOST_TEST(*f.get_int("llama.expert_count") == 8);
    BOOST_TEST(*f.get_int("llama.expert_used_count") == 2);
    BOOST_TEST(*f.get_int("llama.feed_forward_length") == 192);  // one expert's width
    BOOST_TEST(!f.find("llama.expert_feed_forward_length"));
    BOOST_TEST(f.tensor("output.weight") == nullptr);  // tiny ties its output
    BOOST_TEST(f.tensor("blk.0.ffn_gate.weight") == nullptr);
    BOOST_TEST(f.tensor("blk.1.ffn_down.weight") == nullptr);
    const gguf::TensorInfo* router = f.tensor("blk.1.ffn_gate_inp.weight");
    BOOST_REQUIRE(router);
    BOOST_TEST((router->dims == std::vector<uint64_t>{64, 8}));
    BOOST_TEST((router->type == DType::F32));
    const gguf::TensorInfo* up = f.tensor("blk.1.ffn_up_exps.weight");
    BOOST_REQUIRE(up);
    BOOST_TEST((up->dims == std::vector<uint64_t>{64, 192, 8}));
    BOOST_TEST((up->type == DType::Q8_0));
    const gguf::TensorInfo* down = f.tensor("blk.0.ffn_down_exps.weight");
    BOOST_REQUIRE(down);
    BOOST_TEST((down->dims == std::vector<uint64_t>{192, 64, 8}));
    BOOST_TEST((down->type == DType::Q8_0));
    // token_embd, output_norm; per layer 2 norms, q, k, v, o, router, 3 stacks
    BOOST_TEST(f.tensors().size() == 2u + 2u * 10u);
  }
  {
    const gguf::File f = gguf::File::open(make_moe(d, "qwen2moe", "tiny", "f16", 16, 4, 96));
    BOOST_TEST(*f.get_int("qwen2moe.expert_count") == 16);
    BOOST_TEST(*f.get_int("qwen2moe.expert_used_count") == 4);
    BOOST_TEST(*f.get_int("qwen2moe.expert_feed_forward_length") == 96);
    BOOST_TEST(*f.get_int("qwen2moe.expert_shared_feed_forward_length") == 192);
    BOOST_TEST(*f.get_int("qwen2moe.feed_forward_length") == 192);
    BOOST_TEST(f.tensor("output.weight") != nullptr);  // llama.cpp's qwen2moe requires it
    BOOST_TEST((f.tensor("blk.0.ffn_gate_exps.weight")->dims == std::vector<uint64_t>{64, 96, 16}));
    BOOST_TEST((f.tensor("blk.0.ffn_down_exps.weight")->dims == std::vector<uint64_t>{96, 64, 16}));
    BOOST_TEST((f.tensor("blk.0.ffn_up_shexp.weight")->dims == std::vector<uint64_t>{64, 192}));
    BOOST_TEST((f.tensor("blk.0.ffn_down_shexp.weight")->type == DType::F16));
    BOOST_TEST((f.tensor("blk.0.ffn_gate_inp.weight")->type == DType::F32));
    BOOST_TEST((f.tensor("blk.1.attn_k.bias")->dims == std::vector<uint64_t>{32}));
    // The shared expert's gate vector is random (so gates differ between tokens), not ones.
    const gguf::TensorInfo& g = *f.tensor("blk.0.ffn_gate_inp_shexp.weight");
    BOOST_TEST((g.dims == std::vector<uint64_t>{64}));
    BOOST_TEST((g.type == DType::F32));
    const auto gv = row_f32(f, g, 0);
    BOOST_TEST(std::count(gv.begin(), gv.end(), 1.0f) == 0);
    BOOST_TEST(*std::max_element(gv.begin(), gv.end()) > 0.0f);
    BOOST_TEST(*std::min_element(gv.begin(), gv.end()) < 0.0f);
  }
  {
    const gguf::File f = gguf::File::open(make_moe(d, "olmoe", "tiny", "f32"));
    BOOST_TEST(*f.get_int("olmoe.attention.head_count_kv") == 4);  // tiny has 2; olmoe needs all
    BOOST_TEST((f.tensor("blk.0.attn_q_norm.weight")->dims == std::vector<uint64_t>{64}));
    BOOST_TEST((f.tensor("blk.0.attn_k_norm.weight")->dims == std::vector<uint64_t>{64}));
    BOOST_TEST((f.tensor("blk.0.attn_k.weight")->dims == std::vector<uint64_t>{64, 64}));
    BOOST_TEST(f.tensor("output.weight") != nullptr);
    BOOST_TEST(!f.tensor("blk.0.attn_q.bias"));
  }
  {
    const gguf::File f = gguf::File::open(make_moe(d, "qwen3moe", "tiny", "f32", 4, 1, 64));
    BOOST_TEST(*f.get_string("general.architecture") == "qwen3moe");
    BOOST_TEST(*f.get_int("qwen3moe.expert_count") == 4);
    BOOST_TEST(*f.get_int("qwen3moe.expert_used_count") == 1);
    BOOST_TEST(*f.get_int("qwen3moe.expert_feed_forward_length") == 64);
    BOOST_TEST(*f.get_int("qwen3moe.attention.key_length") == 16);
    BOOST_TEST((f.tensor("blk.1.attn_q_norm.weight")->dims == std::vector<uint64_t>{16}));
    BOOST_TEST((f.tensor("blk.1.attn_k_norm.weight")->dims == std::vector<uint64_t>{16}));
    BOOST_TEST((f.tensor("blk.1.ffn_up_exps.weight")->dims == std::vector<uint64_t>{64, 64, 4}));
    BOOST_TEST(!f.tensor("blk.0.ffn_gate_inp_shexp.weight"));
    BOOST_TEST(!f.tensor("blk.0.attn_q.bias"));
  }
}

BOOST_AUTO_TEST_CASE(expert_stacks_are_per_expert_matrices) {
  // Each expert's slice of a quantized stack holds the f32 file's values of the same seed,
  // quantized row by row; experts and routers are distinct random draws.
  TempDir d;
  const gguf::File f32 = gguf::File::open(make_moe(d, "mixtral", "tiny", "f32"));
  const gguf::File q8 = gguf::File::open(make_moe(d, "mixtral", "tiny", "q8_0"));
  const gguf::TensorInfo& a = *f32.tensor("blk.1.ffn_down_exps.weight");
  const gguf::TensorInfo& b = *q8.tensor("blk.1.ffn_down_exps.weight");
  for (int64_t r : {0, 63, 64, 64 * 7 + 5}) {  // rows of experts 0, 0, 1 and 7
    const auto x = row_f32(f32, a, r), y = row_f32(q8, b, r);
    for (size_t i = 0; i < x.size(); ++i) BOOST_TEST(std::fabs(x[i] - y[i]) < 0.003);
  }
  BOOST_TEST((row_f32(f32, a, 0) != row_f32(f32, a, 64)));  // expert 0 and expert 1
  // Router rows: standard deviation about 1/sqrt(dim), so router logits over an RMS-normed
  // state have a spread of about 1 and tokens go to different experts.
  const gguf::TensorInfo& router = *f32.tensor("blk.0.ffn_gate_inp.weight");
  double s2 = 0;
  int64_t n = 0;
  for (int64_t e = 0; e < 8; ++e)
    for (float x : row_f32(f32, router, e)) {
      s2 += double(x) * x;
      ++n;
    }
  BOOST_TEST(std::fabs(std::sqrt(s2 / n) * std::sqrt(64.0) - 1.0) < 0.1);
  BOOST_TEST((row_f32(f32, router, 0) != row_f32(f32, router, 1)));
  BOOST_TEST(
      (row_f32(f32, router, 0) != row_f32(f32, *f32.tensor("blk.1.ffn_gate_inp.weight"), 0)));
}

BOOST_AUTO_TEST_CASE(moe_files_load) {
  // Our loader reads every MoE architecture make-model writes, with the expert counts, widths,
  // routing rule and norms the file declares.
  TempDir d;
  const struct {
    const char* arch;
    const char* dtype;
    int experts, used, expert_ffn;
    int want_ffn, want_shared;
    bool norm_w;  // the chosen experts' weights renormalised
  } cases[] = {{"mixtral", "q8_0", 0, 0, 0, 192, 0, true},
               {"mixtral", "q4_k_m", 4, 2, 256, 256, 0, true},
               {"qwen2moe", "f16", 6, 3, 64, 64, 192, false},
               {"olmoe", "q8_0", 0, 0, 0, 192, 0, false},
               {"qwen3moe", "f32", 4, 2, 96, 96, 0, true}};
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.arch << " " << c.dtype) {
      const std::string path =
          make_moe(d, c.arch, "tiny", c.dtype, c.experts, c.used, c.expert_ffn);
      const std::string gguf_arch = std::string(c.arch) == "mixtral" ? "llama" : c.arch;
      const std::shared_ptr<Model> m = Model::load(path);
      const ModelConfig& cfg = m->config();
      BOOST_TEST(cfg.arch == gguf_arch);
      BOOST_TEST(cfg.n_experts == (c.experts ? c.experts : 8));
      BOOST_TEST(cfg.n_experts_used == (c.used ? c.used : 2));
      BOOST_TEST(cfg.expert_ffn_dim == c.want_ffn);
      BOOST_TEST(cfg.shared_expert_ffn_dim == c.want_shared);
      BOOST_TEST(cfg.expert_weights_norm == c.norm_w);
      BOOST_TEST(cfg.qk_norm_whole == (std::string(c.arch) == "olmoe"));
      const LayerWeights& L = m->weights().layers.at(1);
      BOOST_TEST(L.exp_gate.size() == static_cast<size_t>(cfg.n_experts));
      BOOST_TEST(L.exp_down.size() == static_cast<size_t>(cfg.n_experts));
      BOOST_TEST((L.router.type == DType::F32));
      BOOST_TEST(L.router.rows == cfg.n_experts);
      BOOST_TEST((L.shexp_gate_inp != nullptr) == (c.want_shared > 0));
    }
  }
}

BOOST_AUTO_TEST_CASE(moe_bad_options) {
  TempDir d;
  MakeModelOptions o;
  o.out = d.path() + "/x.gguf";
  auto fails_with = [&](const std::string& text) {
    BOOST_CHECK_EXCEPTION(make_model(o), std::invalid_argument,
                          [&](const std::invalid_argument& e) {
                            return std::string(e.what()).find(text) != std::string::npos;
                          });
  };
  o.arch = "llama";
  o.n_experts = 8;  // a dense architecture takes no expert options
  fails_with("mixture-of-experts architectures");
  o.n_experts = 0;
  o.expert_ffn = 64;
  fails_with("mixture-of-experts architectures");
  o.expert_ffn = 0;
  o.arch = "mixtral";
  o.n_experts = 300;
  fails_with("--experts must be in [1, 256]");
  o.n_experts = 4;
  o.n_experts_used = 5;
  fails_with("--experts-used must be in [1, --experts]");
  o.n_experts_used = 0;
  o.expert_ffn = -1;
  fails_with("--expert-ffn");
  BOOST_TEST(!std::filesystem::exists(o.out));
}

BOOST_AUTO_TEST_SUITE_END()  // test_makemodel
