// Writes a small seed corpus for fuzz_gguf: valid GGUF files covering every value type,
// nested arrays, every tensor type, v2 and v3, and a non-default alignment.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/gguf.hpp"

using namespace sy::gguf;
using sy::kernels::DType;

namespace {

void save(const std::string& dir, const std::string& name, const std::vector<uint8_t>& b) {
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(b.data(), 1, b.size(), f) != b.size()) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

Value scalar(ValueType t,
             std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> x) {
  Value v;
  v.type = t;
  v.v = std::move(x);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];

  Writer meta;
  meta.add_string("general.architecture", "llama");
  meta.add_u32("llama.block_count", 2);
  meta.add_i32("i32", -1);
  meta.add_f32("f32", 0.5f);
  meta.add_bool("b", true);
  meta.add("u8", scalar(ValueType::UINT8, uint64_t{1}));
  meta.add("i16", scalar(ValueType::INT16, int64_t{-2}));
  meta.add("u64", scalar(ValueType::UINT64, uint64_t{3}));
  meta.add("f64", scalar(ValueType::FLOAT64, 0.25));
  meta.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "a", "b"});
  meta.add_f32_array("tokenizer.ggml.scores", {0, 0, -1, -2});
  meta.add_i32_array("tokenizer.ggml.token_type", {2, 3, 1, 1});
  auto inner = std::make_shared<Array>();
  inner->elem_type = ValueType::UINT16;
  inner->items = {scalar(ValueType::UINT16, uint64_t{7})};
  auto outer = std::make_shared<Array>();
  outer->elem_type = ValueType::ARRAY;
  outer->items = {scalar(ValueType::ARRAY, inner)};
  meta.add("nested", scalar(ValueType::ARRAY, outer));
  save(dir, "metadata.gguf", meta.bytes());

  Writer tensors;
  tensors.add_string("general.architecture", "llama");
  tensors.add_tensor("f32", DType::F32, {4, 2}, std::vector<uint8_t>(32, 1));
  tensors.add_tensor("f16", DType::F16, {3}, std::vector<uint8_t>(6, 2));
  tensors.add_tensor("bf16", DType::BF16, {2, 1, 1, 2}, std::vector<uint8_t>(8, 3));
  tensors.add_tensor("q8_0", DType::Q8_0, {32, 2}, std::vector<uint8_t>(68, 4));
  tensors.add_tensor("q4_0", DType::Q4_0, {64}, std::vector<uint8_t>(36, 5));
  auto b = tensors.bytes();
  save(dir, "tensors_v3.gguf", b);
  b[4] = 2;  // same layout, version 2
  save(dir, "tensors_v2.gguf", b);

  Writer aligned(64);
  aligned.add_tensor("a", DType::F32, {1}, std::vector<uint8_t>(4, 6));
  aligned.add_tensor("b", DType::F16, {1, 3}, std::vector<uint8_t>(6, 7));
  save(dir, "aligned64.gguf", aligned.bytes());
  save(dir, "empty.gguf", Writer().bytes());
  return 0;
}
