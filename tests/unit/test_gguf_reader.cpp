// GGUF reader against real files: the trained stories260K model and the vocabulary-only files.
#define BOOST_TEST_MODULE gguf_reader
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "model/gguf.hpp"

using namespace sy::gguf;

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
  BOOST_TEST((emb->type == TensorType::F32));
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
  BOOST_TEST(std::string(type_name(TensorType::Q4_0)) == "q4_0");
  BOOST_TEST(std::string(type_name(TensorType::BF16)) == "bf16");
  BOOST_TEST(block_elems(TensorType::F16) == 1);
  BOOST_TEST(block_elems(TensorType::Q8_0) == 32);
  BOOST_TEST(block_bytes(TensorType::F32) == 4);
  BOOST_TEST(block_bytes(TensorType::F16) == 2);
  BOOST_TEST(block_bytes(TensorType::BF16) == 2);
  BOOST_TEST(block_bytes(TensorType::Q8_0) == 34);
  BOOST_TEST(block_bytes(TensorType::Q4_0) == 18);
  BOOST_TEST(row_bytes(TensorType::Q4_0, 4096) == 128 * 18);
  BOOST_TEST(row_bytes(TensorType::Q8_0, 64) == 68);
  BOOST_TEST(row_bytes(TensorType::BF16, 7) == 14);
}
