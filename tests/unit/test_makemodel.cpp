// make-model: every dtype writes a file the reader accepts with the expected tensors, types,
// hyperparameters and vocabulary; weights are deterministic in the seed and sensibly scaled.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "kernels/cpu/kernels.hpp"
#include "model/gguf.hpp"
#include "model/make_model.hpp"
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

BOOST_AUTO_TEST_SUITE_END()  // test_makemodel
