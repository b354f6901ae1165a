// Sampling parameters are checked as the sampler will hold them (32-bit floats, int32), not only
// as sent: a value that is valid as a double but not once narrowed is refused by name.
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <limits>
#include <msgpack.hpp>
#include <string>
#include <variant>

#include "ingress/codec.hpp"

BOOST_AUTO_TEST_SUITE(test_codec_narrowing)

using namespace sy::wire;

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

// A submit with one extra field `key`, written by `put`.
template <class Put>
std::string submit_with(const std::string& key, Put put) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_map(6);
  p.pack(std::string("v"));
  p.pack_uint64(1);
  p.pack(std::string("type"));
  p.pack(std::string("submit"));
  p.pack(std::string("id"));
  p.pack(std::string("j1"));
  p.pack(std::string("tenant"));
  p.pack(std::string("acme"));
  p.pack(std::string("prompt"));
  p.pack(std::string("Hello"));
  p.pack(key);
  put(p);
  return std::string(buf.data(), buf.size());
}
std::string with_double(const std::string& key, double v) {
  return submit_with(key, [v](Packer& p) { p.pack_double(v); });
}
std::string with_float(const std::string& key, float v) {
  return submit_with(key, [v](Packer& p) { p.pack_float(v); });
}
std::string with_uint(const std::string& key, uint64_t v) {
  return submit_with(key, [v](Packer& p) { p.pack_uint64(v); });
}

// The refusal's message; fails the test when the message decodes.
std::string refusal(const std::string& bytes) {
  auto r = decode_client(bytes.data(), bytes.size());
  BOOST_REQUIRE_MESSAGE(std::holds_alternative<DecodeError>(r), "decoded, expected a refusal");
  const auto& e = std::get<DecodeError>(r);
  BOOST_TEST((e.code == sy::ErrorCode::bad_request));
  return e.message;
}

Submit accepted(const std::string& bytes) {
  auto r = decode_client(bytes.data(), bytes.size());
  if (auto* e = std::get_if<DecodeError>(&r)) BOOST_FAIL("unexpected refusal: " + e->message);
  return std::get<Submit>(std::get<ClientMessage>(r));
}

bool names(const std::string& message, const std::string& what) {
  return message.find(what) != std::string::npos;
}

constexpr double kFloatMin = std::numeric_limits<float>::denorm_min();  // ~1.4e-45

}  // namespace

BOOST_AUTO_TEST_CASE(top_p_that_rounds_to_zero_as_a_float_is_refused) {
  // > 0 as doubles, 0 as the sampler's float: each would have failed the sampler mid-step.
  for (double v :
       {1e-46, 7e-46, kFloatMin / 2.01, 1e-300, std::numeric_limits<double>::denorm_min()}) {
    BOOST_TEST_CONTEXT("top_p " << v) {
      const std::string m = refusal(with_double("top_p", v));
      BOOST_TEST(names(m, "top_p"), m);
      BOOST_TEST(names(m, "32-bit float"), m);
      BOOST_TEST(names(m, "(0, 1]"), m);
    }
  }
}

BOOST_AUTO_TEST_CASE(top_p_that_survives_narrowing_is_accepted) {
  // The smallest positive float, a float subnormal, values that round to 1, and 1 itself.
  for (double v : {kFloatMin, 1e-40, 1e-38, 0.5, 1.0 - 1e-12, 1.0}) {
    BOOST_TEST_CONTEXT("top_p " << v) {
      BOOST_TEST(accepted(with_double("top_p", v)).top_p == v);
    }
  }
  BOOST_TEST(accepted(with_float("top_p", std::numeric_limits<float>::denorm_min())).top_p ==
             kFloatMin);
}

BOOST_AUTO_TEST_CASE(the_range_checks_still_hold_for_doubles) {
  for (double v : {0.0, -0.0, -1e-46, 1.0000001, 2.0})
    BOOST_TEST(names(refusal(with_double("top_p", v)), "top_p"));
  for (double v : {-1e-300, 100.0000001, 1e300})
    BOOST_TEST(names(refusal(with_double("temperature", v)), "temperature"));
  BOOST_TEST(
      names(refusal(with_double("top_p", std::numeric_limits<double>::quiet_NaN())), "top_p"));
  BOOST_TEST(names(refusal(with_double("temperature", std::numeric_limits<double>::infinity())),
                   "temperature"));
}

BOOST_AUTO_TEST_CASE(temperature_bounds_survive_narrowing) {
  // 100 is exact as a float; a temperature below the smallest float becomes 0 (greedy), the
  // value a vanishing temperature tends to, so it is accepted.
  for (double v : {0.0, 1e-300, kFloatMin, 1e-30, 99.99999999, 100.0})
    BOOST_TEST_CONTEXT("temperature " << v) {
      BOOST_TEST(accepted(with_double("temperature", v)).temperature == v);
    }
}

BOOST_AUTO_TEST_CASE(integer_parameters_stay_inside_the_sampler_types) {
  constexpr uint64_t i32max = std::numeric_limits<int32_t>::max();
  BOOST_TEST(accepted(with_uint("top_k", i32max)).top_k == i32max);
  BOOST_TEST(names(refusal(with_uint("top_k", i32max + 1)), "top_k"));
  BOOST_TEST(names(refusal(with_uint("top_k", std::numeric_limits<uint64_t>::max())), "top_k"));
  BOOST_TEST(*accepted(with_uint("seed", std::numeric_limits<uint64_t>::max())).seed ==
             std::numeric_limits<uint64_t>::max());
  BOOST_TEST(*accepted(with_uint("seed", 0)).seed == 0u);
  BOOST_TEST(accepted(with_uint("logprobs", 20)).logprobs == 20u);
  BOOST_TEST(names(refusal(with_uint("logprobs", 21)), "logprobs"));
  BOOST_TEST(names(refusal(with_uint("max_tokens", uint64_t{1} << 32)), "max_tokens"));
}

BOOST_AUTO_TEST_SUITE_END()  // test_codec_narrowing
