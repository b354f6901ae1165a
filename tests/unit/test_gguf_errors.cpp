// Malformed GGUF files: each test builds a good file with the writer, breaks one thing by byte
// surgery and checks that the reader throws gguf::Error whose message names the problem.
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <fstream>
#include <iterator>

#include "model/gguf.hpp"

BOOST_AUTO_TEST_SUITE(test_gguf_errors)

using namespace sy::gguf;
using sy::kernels::DType;
using Bytes = std::vector<uint8_t>;

namespace {

// One metadata key of each kind the surgery needs, and two tensors.
Bytes good_file() {
  Writer w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  w.add_tensor("t_emb", DType::F32, {4, 2}, Bytes(32, 1));
  w.add_tensor("t_q8", DType::Q8_0, {32, 2}, Bytes(68, 2));
  return w.bytes();
}

size_t find(const Bytes& b, const std::string& s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  BOOST_REQUIRE(it != b.end());
  return static_cast<size_t>(it - b.begin());
}

template <class T>
void poke(Bytes& b, size_t at, T x) {
  BOOST_REQUIRE(at + sizeof(T) <= b.size());
  std::memcpy(b.data() + at, &x, sizeof(T));
}

// Offsets inside a key/value: the key text is preceded by its u64 length, followed by the u32 type.
size_t key_len_at(const Bytes& b, const std::string& key) {
  return find(b, key) - 8;
}
size_t value_type_at(const Bytes& b, const std::string& key) {
  return find(b, key) + key.size();
}
// Tensor info: name, u32 n_dims, n_dims * u64, u32 type, u64 offset.
size_t n_dims_at(const Bytes& b, const std::string& name) {
  // tensor names also appear nowhere else in good_file()
  return find(b, name) + name.size();
}
size_t tensor_type_at(const Bytes& b, const std::string& name, int n_dims) {
  return n_dims_at(b, name) + 4 + 8 * n_dims;
}

// Expects parsing `b` to throw Error mentioning every word in `words`.
void expect_error(const Bytes& b, std::initializer_list<const char*> words) {
  try {
    File::from_memory(b.data(), b.size());
  } catch (const Error& e) {
    const std::string msg = e.what();
    BOOST_TEST_MESSAGE("message: " << msg);
    for (const char* w : words)
      BOOST_TEST(msg.find(w) != std::string::npos, "'" << w << "' in: " << msg);
    return;
  }
  BOOST_ERROR("no error thrown");
}

}  // namespace

BOOST_AUTO_TEST_CASE(good_file_parses) {
  const Bytes b = good_file();
  const File f = File::from_memory(b.data(), b.size());
  BOOST_TEST(f.tensors().size() == 2u);
}

BOOST_AUTO_TEST_CASE(wrong_magic) {
  Bytes b = good_file();
  b[0] = 'X';
  expect_error(b, {"not a GGUF file", "bad magic"});
}

BOOST_AUTO_TEST_CASE(unsupported_version) {
  Bytes b = good_file();
  poke<uint32_t>(b, 4, 1);
  expect_error(b, {"version 1", "not supported"});
  poke<uint32_t>(b, 4, 4);
  expect_error(b, {"unsupported GGUF version 4"});
  poke<uint32_t>(b, 4, 0x03000000);  // a big-endian v3 file
  expect_error(b, {"unsupported GGUF version", "big-endian"});
}

BOOST_AUTO_TEST_CASE(truncated_header) {
  const Bytes full = good_file();
  for (size_t n : {0, 2, 4, 7, 10, 20}) {
    Bytes b(full.begin(), full.begin() + n);
    expect_error(b, {"truncated", "at offset"});
  }
  expect_error(Bytes(), {"truncated", "magic"});
  // nullptr with a size is treated as empty
  BOOST_CHECK_THROW(File::from_memory(nullptr, 100), Error);
}

BOOST_AUTO_TEST_CASE(truncated_in_metadata) {
  const Bytes full = good_file();
  // cut inside the u32 value of llama.block_count
  const size_t at = value_type_at(full, "llama.block_count") + 4 + 2;
  expect_error(Bytes(full.begin(), full.begin() + at), {"truncated", "uint32 value", "at offset"});
  // cut inside a string of the tokens array
  const size_t s = value_type_at(full, "tokenizer.ggml.tokens") + 4 + 12 + 8 + 1 + 4;
  expect_error(Bytes(full.begin(), full.begin() + s), {"truncated"});
  // every prefix up to the data section fails cleanly
  for (size_t n = 0; n < find(full, "t_emb") + 3 + 4 + 16 + 4 + 8; ++n)
    BOOST_CHECK_THROW(File::from_memory(full.data(), n), Error);
}

BOOST_AUTO_TEST_CASE(truncated_in_tensor_infos) {
  const Bytes full = good_file();
  const size_t at = n_dims_at(full, "t_q8") + 4 + 8 + 3;  // inside the second dim
  expect_error(Bytes(full.begin(), full.begin() + at), {"truncated", "tensor dimension"});
  const size_t off = tensor_type_at(full, "t_q8", 2) + 4 + 1;  // inside the offset
  expect_error(Bytes(full.begin(), full.begin() + off), {"truncated", "tensor data offset"});
}

BOOST_AUTO_TEST_CASE(unknown_value_type) {
  Bytes b = good_file();
  poke<uint32_t>(b, value_type_at(b, "llama.block_count"), 13);
  expect_error(b, {"llama.block_count", "unknown value type 13"});
  Bytes c = good_file();
  poke<uint32_t>(c, value_type_at(c, "tokenizer.ggml.tokens") + 4, 99);  // array element type
  expect_error(c, {"tokenizer.ggml.tokens", "unknown array element value type 99"});
}

BOOST_AUTO_TEST_CASE(unknown_tensor_type) {
  Bytes b = good_file();
  poke<uint32_t>(b, tensor_type_at(b, "t_emb", 2), 99);  // no ggml type has this number
  expect_error(b, {"tensor 't_emb' has unknown type 99"});
  Bytes c = good_file();
  poke<uint32_t>(c, tensor_type_at(c, "t_emb", 2), 40);  // one past ggml's last type (MXFP4)
  expect_error(c, {"tensor 't_emb' has unknown type 40"});
}

BOOST_AUTO_TEST_CASE(retired_tensor_type) {
  // ggml numbers it no longer has: refused by name and number, never by a bare number.
  Bytes b = good_file();
  poke<uint32_t>(b, tensor_type_at(b, "t_emb", 2), 4);
  expect_error(b, {"tensor 't_emb' has type Q4_2 (4)", "retired"});
  Bytes c = good_file();
  poke<uint32_t>(c, tensor_type_at(c, "t_emb", 2), 31);
  expect_error(c, {"tensor 't_emb' has type Q4_0_4_4 (31)", "retired"});
}

BOOST_AUTO_TEST_CASE(known_type_with_partial_block) {
  // Q4_K is a ggml type the reader sizes; a 4-column row is not a whole 256-element block.
  Bytes b = good_file();
  poke<uint32_t>(b, tensor_type_at(b, "t_emb", 2), 12);
  expect_error(b, {"tensor 't_emb'", "inner dimension 4", "Q4_K block size 256"});
}

BOOST_AUTO_TEST_CASE(truncated_k_quant_tensor) {
  // A file cut inside its last K-quant tensor: the error names the tensor and its type.
  Writer w;
  w.add_string("general.architecture", "llama");
  w.add_tensor("blk.0.ffn_norm.weight", DType::F32, {256}, Bytes(1024, 0));
  w.add_tensor("blk.0.ffn_down.weight", DType::Q6_K, {512, 4}, Bytes(2 * 210 * 4, 7));
  const Bytes full = w.bytes();
  const File f = File::from_memory(full.data(), full.size());
  const TensorInfo* t = f.tensor("blk.0.ffn_down.weight");
  BOOST_REQUIRE(t != nullptr);
  const auto end = static_cast<std::ptrdiff_t>(f.data(*t) - full.data() + t->n_bytes);
  for (std::ptrdiff_t cut : {1, 100, 210, 1679}) {
    expect_error(Bytes(full.begin(), full.begin() + end - cut),
                 {"tensor 'blk.0.ffn_down.weight'", "Q6_K", "lies outside the file", "truncated"});
  }
}

BOOST_AUTO_TEST_CASE(tensor_outside_file) {
  Bytes b = good_file();
  poke<uint64_t>(b, tensor_type_at(b, "t_q8", 2) + 4, uint64_t{1} << 20);
  expect_error(b, {"tensor 't_q8'", "lies outside the file"});
  Bytes c = good_file();
  poke<uint64_t>(c, tensor_type_at(c, "t_q8", 2) + 4, ~uint64_t{31});  // offset + size overflows
  expect_error(c, {"tensor 't_q8'", "lies outside the file"});
  // the file is cut inside the last tensor's data
  const Bytes full = good_file();
  expect_error(Bytes(full.begin(), full.end() - 40), {"tensor 't_q8'", "lies outside the file"});
}

BOOST_AUTO_TEST_CASE(truncated_zoo_k_quant_file) {
  // llama-quantize's Q4_K_M file cut inside its last tensor (blk.3.ffn_up.weight, Q4_K).
  std::ifstream in(std::string(SY_MODELS_DIR) + "/zoo/zoo-llama3-q4_k_m.gguf", std::ios::binary);
  const Bytes full{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  BOOST_REQUIRE(full.size() > 100000);
  BOOST_REQUIRE_NO_THROW(File::from_memory(full.data(), full.size()));
  expect_error(Bytes(full.begin(), full.end() - 1000),
               {"tensor 'blk.3.ffn_up.weight'", "Q4_K", "lies outside the file", "truncated"});
}

BOOST_AUTO_TEST_CASE(huge_array_count) {
  Bytes b = good_file();
  poke<uint64_t>(b, value_type_at(b, "tokenizer.ggml.tokens") + 8, uint64_t{1} << 60);
  expect_error(b, {"tokenizer.ggml.tokens", "array count 1152921504606846976"});
}

BOOST_AUTO_TEST_CASE(huge_string_length) {
  Bytes b = good_file();
  poke<uint64_t>(b, key_len_at(b, "llama.block_count"), uint64_t{1} << 62);
  expect_error(b, {"string length 4611686018427387904", "metadata key"});
  Bytes c = good_file();
  // the value of general.architecture
  poke<uint64_t>(c, value_type_at(c, "general.architecture") + 4, ~uint64_t{0});
  expect_error(c, {"string length", "string value"});
}

BOOST_AUTO_TEST_CASE(huge_counts_in_header) {
  Bytes b = good_file();
  poke<uint64_t>(b, 8, uint64_t{1} << 40);
  expect_error(b, {"tensor count"});
  Bytes c = good_file();
  poke<uint64_t>(c, 16, ~uint64_t{0});
  expect_error(c, {"metadata count"});
}

BOOST_AUTO_TEST_CASE(bad_alignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Writer w;
    w.add_u32("general.alignment", a);
    w.add_tensor("t", DType::F32, {8}, Bytes(32));
    const Bytes b = w.bytes();
    expect_error(b, {"general.alignment", "power of two"});
  }
  Writer w;
  w.add_string("general.alignment", "32");
  const Bytes b = w.bytes();
  expect_error(b, {"general.alignment", "power of two"});
}

BOOST_AUTO_TEST_CASE(duplicate_key) {
  Writer w;
  w.add_u32("llama.block_count", 2);
  w.add_string("x", "y");
  w.add_u32("llama.block_count", 3);
  const Bytes b = w.bytes();
  expect_error(b, {"duplicate metadata key 'llama.block_count'"});
}

BOOST_AUTO_TEST_CASE(duplicate_tensor) {
  Writer w;
  w.add_tensor("t", DType::F32, {8}, Bytes(32));
  w.add_tensor("t", DType::F32, {8}, Bytes(32));
  const Bytes b = w.bytes();
  expect_error(b, {"duplicate tensor name 't'"});
}

BOOST_AUTO_TEST_CASE(misaligned_offset) {
  Bytes b = good_file();
  poke<uint64_t>(b, tensor_type_at(b, "t_q8", 2) + 4, 36);
  expect_error(b, {"tensor 't_q8'", "misaligned"});
}

BOOST_AUTO_TEST_CASE(bad_dims) {
  Bytes b = good_file();
  poke<uint32_t>(b, n_dims_at(b, "t_emb"), 0);
  expect_error(b, {"tensor 't_emb'", "zero dimensions"});
  Bytes c = good_file();
  poke<uint32_t>(c, n_dims_at(c, "t_emb"), 5);
  expect_error(c, {"tensor 't_emb'", "5 dimensions"});
  Bytes d = good_file();
  poke<uint64_t>(d, n_dims_at(d, "t_emb") + 4 + 8, 0);
  expect_error(d, {"tensor 't_emb'", "zero-sized"});
  Bytes e = good_file();
  poke<uint64_t>(e, n_dims_at(e, "t_emb") + 4, uint64_t{1} << 40);
  poke<uint64_t>(e, n_dims_at(e, "t_emb") + 4 + 8, uint64_t{1} << 30);
  expect_error(e, {"tensor 't_emb'", "element count overflows"});
  Bytes g = good_file();
  poke<uint64_t>(g, n_dims_at(g, "t_q8") + 4, 48);  // not a multiple of 32
  expect_error(g, {"tensor 't_q8'", "inner dimension 48", "block size 32"});
}

BOOST_AUTO_TEST_CASE(deep_nesting) {
  // arrays of arrays nested 9 deep, each holding one array, the innermost one empty
  Value v;
  v.type = ValueType::ARRAY;
  auto inner = std::make_shared<Array>();
  inner->elem_type = ValueType::UINT8;
  v.v = inner;
  for (int i = 0; i < 9; ++i) {
    auto a = std::make_shared<Array>();
    a->elem_type = ValueType::ARRAY;
    a->items.push_back(v);
    Value outer;
    outer.type = ValueType::ARRAY;
    outer.v = a;
    v = outer;
  }
  Writer w;
  w.add("deep", v);
  const Bytes b = w.bytes();
  expect_error(b, {"'deep'", "nested deeper"});
}

BOOST_AUTO_TEST_SUITE_END()  // test_gguf_errors
