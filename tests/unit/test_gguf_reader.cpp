// GGUF reader against real files: the trained stories260K model and the vocabulary-only files.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "model/gguf.hpp"

BOOST_AUTO_TEST_SUITE(test_gguf_reader)

using namespace sy::gguf;
using sy::kernels::DType;

namespace {
const std::string kModels = SY_MODELS_DIR;
const std::string kStories = kModels + "/stories260K.gguf";

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(stories_header_and_hyperparameters) {
  const File f = File::open(kStories);
  BOOST_TEST(f.version() == 3u);
  BOOST_TEST(f.alignment() == 32u);
  BOOST_TEST(f.metadata().size() == 19u);
  BOOST_TEST(f.tensors().size() == 48u);  // 3 + 5 layers * 9
  BOOST_TEST(f.size() == 1185376u);
  BOOST_TEST(*f.get_string("general.architecture") == "llama");
  BOOST_TEST(*f.get_int("llama.context_length") == 2048);
  BOOST_TEST(*f.get_int("llama.embedding_length") == 64);
  BOOST_TEST(*f.get_int("llama.feed_forward_length") == 172);
  BOOST_TEST(*f.get_int("llama.attention.head_count") == 8);
  BOOST_TEST(*f.get_int("llama.attention.head_count_kv") == 4);
  BOOST_TEST(*f.get_int("llama.block_count") == 5);
  BOOST_TEST(*f.get_int("llama.rope.dimension_count") == 8);
  BOOST_TEST(std::fabs(*f.get_float("llama.attention.layer_norm_rms_epsilon") - 1e-5) < 1e-9);
  BOOST_TEST(!f.get_int("llama.rope.freq_base").has_value());
  BOOST_TEST(!f.find("no.such.key"));
  // uint32 0xffffffff stays unsigned (the converter's "no separator" marker)
  BOOST_TEST(*f.get_int("tokenizer.ggml.seperator_token_id") == 4294967295LL);
  // a string key read as an int is absent, not garbage
  BOOST_TEST(!f.get_int("general.architecture").has_value());
  BOOST_TEST(!f.get_string("llama.block_count").has_value());
}

BOOST_AUTO_TEST_CASE(stories_vocabulary) {
  const File f = File::open(kStories);
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  BOOST_REQUIRE(tokens);
  BOOST_TEST(tokens->size() == 512u);
  BOOST_TEST((*tokens)[0] == "<unk>");
  BOOST_TEST((*tokens)[1] == "<s>");
  BOOST_TEST((*tokens)[3] == "<0x00>");
  BOOST_TEST((*tokens)[258] == "<0xFF>");
  auto scores = f.get_float_array("tokenizer.ggml.scores");
  BOOST_REQUIRE(scores);
  BOOST_TEST(scores->size() == 512u);
  auto types = f.get_int_array("tokenizer.ggml.token_type");
  BOOST_REQUIRE(types);
  BOOST_TEST((*types)[0] == 2);
  BOOST_TEST((*types)[1] == 3);
  BOOST_TEST((*types)[2] == 3);
  BOOST_TEST((*types)[3] == 6);
  BOOST_TEST((*types)[300] == 1);
  BOOST_TEST(!f.get_string_array("tokenizer.ggml.scores").has_value());
  const Value* v = f.find("tokenizer.ggml.token_type");
  BOOST_REQUIRE(v);
  BOOST_TEST((v->type == ValueType::ARRAY));
  BOOST_TEST((v->as_array()->elem_type == ValueType::INT32));
}

BOOST_AUTO_TEST_CASE(stories_tensors) {
  const File f = File::open(kStories);
  const TensorInfo* emb = f.tensor("token_embd.weight");
  BOOST_REQUIRE(emb);
  BOOST_TEST((emb->dims == std::vector<uint64_t>{64, 512}));
  BOOST_TEST((emb->type == DType::F32));
  BOOST_TEST(emb->n_elements == 64u * 512u);
  BOOST_TEST(emb->n_bytes == 64u * 512u * 4u);
  const TensorInfo* down = f.tensor("blk.4.ffn_down.weight");
  BOOST_REQUIRE(down);
  BOOST_TEST((down->dims == std::vector<uint64_t>{172, 64}));
  const TensorInfo* norm = f.tensor("blk.2.attn_norm.weight");
  BOOST_REQUIRE(norm);
  BOOST_TEST((norm->dims == std::vector<uint64_t>{64}));
  BOOST_TEST(!f.tensor("blk.5.attn_q.weight"));
  const uint8_t* first = f.data(f.tensors().front());
  for (const TensorInfo& t : f.tensors()) {
    BOOST_TEST(t.offset % 32 == 0u);
    const uint8_t* p = f.data(t);
    BOOST_TEST((p >= first && p + t.n_bytes <= first + f.size()));
    BOOST_TEST(reinterpret_cast<uintptr_t>(p) % 32 == 0u);  // mapping is page aligned
  }
  // Norm weights of a trained model are finite and not all zero.
  float w[64];
  std::memcpy(w, f.data(*norm), sizeof w);
  double sum = 0;
  for (float x : w) {
    BOOST_TEST(std::isfinite(x));
    sum += std::fabs(x);
  }
  BOOST_TEST(sum > 0.0);
  // output is an untied copy of token_embd in this file
  const TensorInfo* out = f.tensor("output.weight");
  BOOST_REQUIRE(out);
  BOOST_TEST(std::memcmp(f.data(*out), f.data(*emb), emb->n_bytes) == 0);
}

BOOST_AUTO_TEST_CASE(from_memory_matches_open) {
  const std::vector<uint8_t> bytes = slurp(kStories);
  const File a = File::open(kStories);
  const File b = File::from_memory(bytes.data(), bytes.size());
  BOOST_TEST(a.metadata().size() == b.metadata().size());
  BOOST_REQUIRE(a.tensors().size() == b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const auto& ta = a.tensors()[i];
    const auto& tb = b.tensors()[i];
    BOOST_TEST(ta.name == tb.name);
    BOOST_TEST(std::memcmp(a.data(ta), b.data(tb), ta.n_bytes) == 0);
  }
}

BOOST_AUTO_TEST_CASE(move_keeps_mapping) {
  File a = File::open(kStories);
  const uint8_t* p = a.data(*a.tensor("output_norm.weight"));
  File b = std::move(a);
  BOOST_TEST(b.data(*b.tensor("output_norm.weight")) == p);
  File c = File::open(kModels + "/vocab/ggml-vocab-llama-spm.gguf");
  c = std::move(b);
  BOOST_TEST(c.tensors().size() == 48u);
}

BOOST_AUTO_TEST_CASE(vocab_llama_spm) {
  const File f = File::open(kModels + "/vocab/ggml-vocab-llama-spm.gguf");
  BOOST_TEST(f.tensors().empty());
  BOOST_TEST(*f.get_string("tokenizer.ggml.model") == "llama");
  BOOST_TEST(f.get_string_array("tokenizer.ggml.tokens")->size() == 32000u);
  BOOST_TEST(f.get_float_array("tokenizer.ggml.scores")->size() == 32000u);
  BOOST_TEST(*f.get_int("tokenizer.ggml.add_bos_token") == 1);
  BOOST_TEST(*f.get_int("tokenizer.ggml.add_eos_token") == 0);
  BOOST_TEST((f.find("tokenizer.ggml.add_bos_token")->type == ValueType::BOOL));
  BOOST_TEST(*f.get_int("llama.vocab_size") == 32000);
}

BOOST_AUTO_TEST_CASE(vocab_gpt2) {
  const File f = File::open(kModels + "/vocab/ggml-vocab-gpt-2.gguf");
  BOOST_TEST(*f.get_string("tokenizer.ggml.model") == "gpt2");
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  BOOST_TEST(tokens->size() == 50257u);
  BOOST_TEST(tokens->back() == "<|endoftext|>");
  auto merges = f.get_string_array("tokenizer.ggml.merges");
  BOOST_TEST(merges->size() == 50000u);
  BOOST_TEST(merges->front().find(' ') != std::string::npos);
  BOOST_TEST(*f.get_int("tokenizer.ggml.eos_token_id") == 50256);
}

BOOST_AUTO_TEST_CASE(missing_and_odd_paths) {
  BOOST_CHECK_EXCEPTION(File::open("/nonexistent/x.gguf"), Error, [](const Error& e) {
    return std::string(e.what()).find("cannot open") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(File::open(kModels), Error, [](const Error& e) {
    return std::string(e.what()).find("not a regular file") != std::string::npos;
  });
  // a non-GGUF file names the path and the problem
  BOOST_CHECK_EXCEPTION(File::open(kModels + "/README.md"), Error, [](const Error& e) {
    const std::string m = e.what();
    return m.find("README.md") != std::string::npos && m.find("bad magic") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(type_helpers) {
  BOOST_TEST(std::string(dtype_name(DType::Q4_0)) == "Q4_0");
  BOOST_TEST(std::string(dtype_name(DType::BF16)) == "BF16");
  BOOST_TEST(std::string(dtype_name(DType::Q6_K)) == "Q6_K");
  BOOST_TEST(std::string(dtype_name(DType::IQ4_XS)) == "IQ4_XS");
  BOOST_TEST(std::string(dtype_name(static_cast<DType>(4))) == "Q4_2");  // retired
  BOOST_TEST(!dtype_name(static_cast<DType>(99)));
  BOOST_TEST(type_label(14) == "Q6_K (14)");
  BOOST_TEST(type_label(20) == "IQ4_NL (20)");
  BOOST_TEST(type_label(99) == "unknown type 99");
  BOOST_TEST(type_known(30));
  BOOST_TEST(type_known(39));
  BOOST_TEST(!type_known(4));   // retired Q4_2
  BOOST_TEST(!type_known(33));  // retired Q4_0_8_8
  BOOST_TEST(!type_known(40));
  BOOST_TEST(dtype_block_elems(DType::F16) == 1);
  BOOST_TEST(dtype_block_elems(DType::Q8_0) == 32);
  BOOST_TEST(dtype_block_bytes(DType::F32) == 4);
  BOOST_TEST(dtype_block_bytes(DType::F16) == 2);
  BOOST_TEST(dtype_block_bytes(DType::BF16) == 2);
  BOOST_TEST(dtype_block_bytes(DType::Q8_0) == 34);
  BOOST_TEST(dtype_block_bytes(DType::Q4_0) == 18);
  BOOST_TEST(dtype_row_bytes(DType::Q4_0, 4096) == 128 * 18);
  BOOST_TEST(dtype_row_bytes(DType::Q8_0, 64) == 68);
  BOOST_TEST(dtype_row_bytes(DType::BF16, 7) == 14);
}

BOOST_AUTO_TEST_CASE(every_ggml_type_sizes) {
  // Block sizes of ggml-common.h's block structs: elements, bytes.
  struct Row {
    DType t;
    int64_t elems, bytes;
  };
  const Row rows[] = {
      {DType::Q4_1, 32, 20},     {DType::Q5_0, 32, 22},
      {DType::Q5_1, 32, 24},     {DType::Q8_1, 32, 36},
      {DType::Q2_K, 256, 84},    {DType::Q3_K, 256, 110},
      {DType::Q4_K, 256, 144},   {DType::Q5_K, 256, 176},
      {DType::Q6_K, 256, 210},   {DType::Q8_K, 256, 292},
      {DType::IQ2_XXS, 256, 66}, {DType::IQ2_XS, 256, 74},
      {DType::IQ3_XXS, 256, 98}, {DType::IQ1_S, 256, 50},
      {DType::IQ4_NL, 32, 18},   {DType::IQ3_S, 256, 110},
      {DType::IQ2_S, 256, 82},   {DType::IQ4_XS, 256, 136},
      {DType::I8, 1, 1},         {DType::I16, 1, 2},
      {DType::I32, 1, 4},        {DType::I64, 1, 8},
      {DType::F64, 1, 8},        {DType::IQ1_M, 256, 56},
      {DType::TQ1_0, 256, 54},   {DType::TQ2_0, 256, 66},
      {DType::MXFP4, 32, 17},
  };
  for (const Row& r : rows) {
    BOOST_TEST(dtype_block_elems(r.t) == r.elems, dtype_name(r.t));
    BOOST_TEST(dtype_block_bytes(r.t) == r.bytes, dtype_name(r.t));
  }
  // Every known type writes and reads back with its size, computed or not.
  Writer w;
  int n = 0;
  for (uint32_t t = 0; t < 64; ++t) {
    if (!type_known(t)) continue;
    const auto tt = static_cast<DType>(t);
    const auto be = static_cast<uint64_t>(dtype_block_elems(tt));
    std::string name = "t";
    name += std::to_string(t);
    w.add_tensor(name, tt, {2 * be, 3},
                 std::vector<uint8_t>(static_cast<size_t>(dtype_row_bytes(tt, 2 * be) * 3), 1));
    ++n;
  }
  BOOST_TEST(n == 32);  // 40 numbers, 8 of them retired
  const std::vector<uint8_t> b = w.bytes();
  const File f = File::from_memory(b.data(), b.size());
  BOOST_REQUIRE(f.tensors().size() == static_cast<size_t>(n));
  for (const TensorInfo& ti : f.tensors()) {
    const int64_t be = dtype_block_elems(ti.type);
    BOOST_TEST(ti.n_bytes == static_cast<uint64_t>(dtype_row_bytes(ti.type, 2 * be)) * 3, ti.name);
    BOOST_TEST(ti.name.substr(1) == std::to_string(static_cast<uint32_t>(ti.type)));
  }
}

BOOST_AUTO_TEST_CASE(every_zoo_file_reads) {
  // The zoo's K-quant, IQ and legacy files: every tensor type reads, whatever computes it.
  const std::string zoo = kModels + "/zoo/";
  std::set<std::string> seen;
  for (const char* name :
       {"zoo-llama3-q2_k", "zoo-llama3-q3_k_m", "zoo-llama3-q4_k_m", "zoo-llama3-q5_k_m",
        "zoo-llama3-q6_k", "zoo-llama3-q4_1", "zoo-llama3-q5_0", "zoo-llama3-q5_1",
        "zoo-llama3-iq4_nl", "zoo-llama3-iq4_xs", "zoo-qwen2-q4_k_m", "zoo-qwen2-q8_0"}) {
    const File f = File::open(zoo + name + ".gguf");
    BOOST_TEST(!f.tensors().empty(), name);
    for (const TensorInfo& ti : f.tensors()) seen.insert(dtype_name(ti.type));
  }
  for (const char* t : {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
                        "IQ4_XS", "Q8_0", "F32"})
    BOOST_TEST(seen.count(t) == 1u, t);
  // Q4_K_M mixes types: Q4_K for most matrices, Q6_K for the output and some attn_v / ffn_down.
  const File m = File::open(zoo + "zoo-llama3-q4_k_m.gguf");
  BOOST_TEST(std::string(dtype_name(m.tensor("output.weight")->type)) == "Q6_K");
  BOOST_TEST(std::string(dtype_name(m.tensor("blk.0.attn_q.weight")->type)) == "Q4_K");
  BOOST_TEST(std::string(dtype_name(m.tensor("blk.0.ffn_down.weight")->type)) == "Q4_K");
  BOOST_TEST(m.tensor("blk.0.ffn_down.weight")->n_bytes == 768u / 256 * 144 * 256);
  BOOST_TEST(std::string(dtype_name(m.tensor("blk.3.ffn_down.weight")->type)) == "Q6_K");
  BOOST_TEST(m.tensor("blk.3.ffn_down.weight")->n_bytes == 768u / 256 * 210 * 256);
}

BOOST_AUTO_TEST_SUITE_END()  // test_gguf_reader
