// GGUF writer round trips: every metadata type (nested arrays too), every tensor type, both
// add_tensor overloads, alignment, and bytes() agreeing with write().
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "model/gguf.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_gguf_writer)

using namespace sy::gguf;
using sy::kernels::DType;

namespace {

// A fresh directory under /tmp, removed at scope exit.
// Named after this test, so that a folder left in /tmp says where it came from.
struct TempDir : sy::test::TempDir {
  TempDir() : sy::test::TempDir("sy_gguf_writer_") {}
};

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Value make(ValueType t,
           std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> x) {
  Value v;
  v.type = t;
  v.v = std::move(x);
  return v;
}

Value array(ValueType elem, std::vector<Value> items) {
  auto a = std::make_shared<Array>();
  a->elem_type = elem;
  a->items = std::move(items);
  return make(ValueType::ARRAY, a);
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

Writer sample_writer(uint64_t alignment) {
  Writer w(alignment);
  w.add_string("general.architecture", "llama");
  w.add_u32("u32", 4000000000u);
  w.add_i32("i32", -7);
  w.add_f32("f32", 0.25f);
  w.add_bool("yes", true);
  w.add_bool("no", false);
  w.add("u8", make(ValueType::UINT8, uint64_t{200}));
  w.add("i8", make(ValueType::INT8, int64_t{-100}));
  w.add("u16", make(ValueType::UINT16, uint64_t{60000}));
  w.add("i16", make(ValueType::INT16, int64_t{-30000}));
  w.add("u64", make(ValueType::UINT64, uint64_t{1} << 60));
  w.add("i64", make(ValueType::INT64, int64_t{-(int64_t{1} << 50)}));
  w.add("f64", make(ValueType::FLOAT64, 3.141592653589793));
  w.add_string("empty", "");
  w.add_string_array("strs", {"a", "", "\xe2\x96\x81the"});
  w.add_f32_array("floats", {1.5f, -2.0f});
  w.add_i32_array("ints", {1, -2, 3});
  w.add_i32_array("no_ints", {});
  w.add("nested", array(ValueType::ARRAY,
                        {array(ValueType::UINT16, {make(ValueType::UINT16, uint64_t{1}),
                                                   make(ValueType::UINT16, uint64_t{2})}),
                         array(ValueType::STRING, {make(ValueType::STRING, std::string("x"))}),
                         array(ValueType::FLOAT64, {})}));
  w.add_tensor("f32", DType::F32, {3, 2}, pattern(24, 1));
  w.add_tensor("f16", DType::F16, {5}, pattern(10, 2));
  w.add_tensor("bf16", DType::BF16, {2, 3, 2}, pattern(24, 3));
  w.add_tensor("q8_0", DType::Q8_0, {64, 3}, pattern(34 * 2 * 3, 4));
  w.add_tensor("q4_0", DType::Q4_0, {32, 1, 1, 2}, [](uint8_t* dst, size_t n) {
    BOOST_REQUIRE(n == 36u);
    auto p = pattern(n, 5);
    std::memcpy(dst, p.data(), n);
  });
  return w;
}

void check_sample(const File& f, uint64_t alignment, uint32_t version = 3) {
  BOOST_TEST(f.version() == version);
  BOOST_TEST(f.alignment() == alignment);
  BOOST_TEST(*f.get_string("general.architecture") == "llama");
  BOOST_TEST(*f.get_int("u32") == 4000000000LL);
  BOOST_TEST(*f.get_int("i32") == -7);
  BOOST_TEST(*f.get_float("f32") == 0.25);
  BOOST_TEST(*f.get_int("yes") == 1);
  BOOST_TEST(*f.get_int("no") == 0);
  BOOST_TEST(*f.get_int("u8") == 200);
  BOOST_TEST(*f.get_int("i8") == -100);
  BOOST_TEST(*f.get_int("u16") == 60000);
  BOOST_TEST(*f.get_int("i16") == -30000);
  BOOST_TEST(*f.get_int("u64") == (int64_t{1} << 60));
  BOOST_TEST(*f.get_int("i64") == -(int64_t{1} << 50));
  BOOST_TEST(*f.get_float("f64") == 3.141592653589793);
  BOOST_TEST((f.find("f64")->type == ValueType::FLOAT64));
  BOOST_TEST((f.find("i16")->type == ValueType::INT16));
  BOOST_TEST(*f.get_string("empty") == "");
  BOOST_TEST((*f.get_string_array("strs") == std::vector<std::string>{"a", "", "\xe2\x96\x81the"}));
  BOOST_TEST((*f.get_float_array("floats") == std::vector<float>{1.5f, -2.0f}));
  BOOST_TEST((*f.get_int_array("ints") == std::vector<int64_t>{1, -2, 3}));
  BOOST_TEST(f.get_int_array("no_ints")->empty());
  const Array* nested = f.find("nested")->as_array();
  BOOST_REQUIRE(nested);
  BOOST_TEST((nested->elem_type == ValueType::ARRAY));
  BOOST_REQUIRE(nested->items.size() == 3u);
  BOOST_TEST(*nested->items[0].as_array()->items[1].as_int() == 2);
  BOOST_TEST(*nested->items[1].as_array()->items[0].as_string() == "x");
  BOOST_TEST(nested->items[2].as_array()->items.empty());
  BOOST_TEST((nested->items[2].as_array()->elem_type == ValueType::FLOAT64));

  struct Expect {
    const char* name;
    DType type;
    std::vector<uint64_t> dims;
    size_t n;
    uint8_t seed;
  };
  const Expect ex[] = {{"f32", DType::F32, {3, 2}, 24, 1},
                       {"f16", DType::F16, {5}, 10, 2},
                       {"bf16", DType::BF16, {2, 3, 2}, 24, 3},
                       {"q8_0", DType::Q8_0, {64, 3}, 204, 4},
                       {"q4_0", DType::Q4_0, {32, 1, 1, 2}, 36, 5}};
  BOOST_REQUIRE(f.tensors().size() == 5u);
  for (const Expect& e : ex) {
    const TensorInfo* t = f.tensor(e.name);
    BOOST_REQUIRE(t);
    BOOST_TEST((t->type == e.type));
    BOOST_TEST(t->dims == e.dims);
    BOOST_TEST(t->n_bytes == e.n);
    BOOST_TEST(t->offset % alignment == 0u);
    const auto want = pattern(e.n, e.seed);
    BOOST_TEST(std::memcmp(f.data(*t), want.data(), e.n) == 0);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_memory) {
  const std::vector<uint8_t> b = sample_writer(32).bytes();
  BOOST_TEST(b.size() % 32 == 0u);
  check_sample(File::from_memory(b.data(), b.size()), 32);
}

BOOST_AUTO_TEST_CASE(round_trip_file_matches_bytes) {
  TempDir d;
  for (uint64_t a : {uint64_t{32}, uint64_t{8}, uint64_t{64}, uint64_t{4096}}) {
    const Writer w = sample_writer(a);
    const std::string path = d.path() + "/t" + std::to_string(a) + ".gguf";
    w.write(path);
    BOOST_TEST(!std::filesystem::exists(path + ".partial"));
    const File f = File::open(path);
    check_sample(f, a);
    BOOST_TEST((slurp(path) == w.bytes()));
    // the writer adds general.alignment only when it differs from the default
    BOOST_TEST((f.find("general.alignment") != nullptr) == (a != 32));
  }
}

BOOST_AUTO_TEST_CASE(version_2_reads_like_3) {
  std::vector<uint8_t> b = sample_writer(32).bytes();
  b[4] = 2;  // v2 has the same layout as v3 (64-bit counts); v3 only adds big-endian support
  const File f = File::from_memory(b.data(), b.size());
  check_sample(f, 32, 2);
}

BOOST_AUTO_TEST_CASE(empty_file_and_metadata_only) {
  const std::vector<uint8_t> b = Writer().bytes();
  BOOST_TEST(b.size() == 32u);  // 24-byte header padded
  const File f = File::from_memory(b.data(), b.size());
  BOOST_TEST(f.metadata().empty());
  BOOST_TEST(f.tensors().empty());
  Writer w;
  w.add_string("k", "v");
  std::vector<uint8_t> m = w.bytes();
  m.resize(24 + 8 + 1 + 4 + 8 + 1);  // no padding at the end, as vocab files have
  BOOST_TEST(*File::from_memory(m.data(), m.size()).get_string("k") == "v");
}

BOOST_AUTO_TEST_CASE(writer_rejects_bad_input) {
  Writer w;
  BOOST_CHECK_THROW(w.add_tensor("x", DType::F32, {4}, std::vector<uint8_t>(15)),
                    std::invalid_argument);
  BOOST_CHECK_THROW(w.add_tensor("x", DType::Q8_0, {16}, std::vector<uint8_t>(17)),
                    std::invalid_argument);
  BOOST_CHECK_THROW(w.add_tensor("x", DType::F32, {}, std::vector<uint8_t>()),
                    std::invalid_argument);
  BOOST_CHECK_THROW(w.add_tensor("x", DType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)),
                    std::invalid_argument);
  BOOST_CHECK_THROW(Writer(3).bytes(), std::invalid_argument);
  // types without a block layout are named, never shown as a bare number
  BOOST_CHECK_EXCEPTION(
      w.add_tensor("x", static_cast<DType>(4), {32}, std::vector<uint8_t>(18)),
      std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("tensor 'x' has type Q4_2 (4)") != std::string::npos;
      });
  BOOST_CHECK_EXCEPTION(
      w.add_tensor("x", static_cast<DType>(99), {32}, std::vector<uint8_t>(18)),
      std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("tensor 'x' has unknown type 99") != std::string::npos;
      });
  TempDir d;
  BOOST_CHECK_THROW(Writer().write(d.path() + "/no/such/dir/x.gguf"), std::runtime_error);
  // a failing fill leaves no file behind
  Writer bad;
  bad.add_tensor("x", DType::F32, {4},
                 [](uint8_t*, size_t) { throw std::runtime_error("boom"); });
  BOOST_CHECK_THROW(bad.write(d.path() + "/bad.gguf"), std::runtime_error);
  BOOST_TEST(std::filesystem::is_empty(d.path()));
}

BOOST_AUTO_TEST_SUITE_END()  // test_gguf_writer
