// A minimal stand-in for the part of Boost.Test that tests/gpu uses (suites, test cases, BOOST_TEST
// with an optional message, REQUIRE, CHECK_THROW, FAIL, a global fixture), so that the GPU tests also
// build on device machines without Boost. Only bench/gpu_standalone puts it on the include path,
// and only when Boost.Test is not found.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace sy_test_shim {

struct Case {
  const char* name;
  void (*fn)();
};
inline std::vector<Case>& cases() {
  static std::vector<Case> c;
  return c;
}
inline std::vector<std::function<void()>>& fixtures() {
  static std::vector<std::function<void()>> f;
  return f;
}
inline int& failures() {
  static int n = 0;
  return n;
}
struct Abort {};  // a failed REQUIRE: ends the current test case

struct Register {
  Register(const char* name, void (*fn)()) { cases().push_back({name, fn}); }
};
template <class F>
struct RegisterFixture {
  RegisterFixture() {
    fixtures().push_back([] { static F f; });
  }
};
inline void fail(const char* file, int line, const std::string& what, const std::string& msg) {
  ++failures();
  std::printf("%s(%d): error: check %s has failed%s%s\n", file, line, what.c_str(),
              msg.empty() ? "" : ": ", msg.c_str());
}

}  // namespace sy_test_shim

namespace boost::test_tools {
/// Accepted and ignored: element-wise reports are a Boost.Test nicety.
struct per_element {};
inline std::ostream& operator<<(std::ostream& o, const per_element&) {
  return o;
}
}  // namespace boost::test_tools

#define SY_SHIM_CAT2(a, b) a##b
#define SY_SHIM_CAT(a, b) SY_SHIM_CAT2(a, b)

#define BOOST_AUTO_TEST_CASE(name)                                              \
  static void name();                                                           \
  static ::sy_test_shim::Register SY_SHIM_CAT(sy_shim_reg_, name)(#name, name); \
  static void name()

// A suite is a namespace here (as in Boost.Test); the runner runs every case it holds.
#define BOOST_AUTO_TEST_SUITE(name) namespace name {
#define BOOST_AUTO_TEST_SUITE_END() }

#define BOOST_TEST_GLOBAL_FIXTURE(F) \
  static ::sy_test_shim::RegisterFixture<F> SY_SHIM_CAT(sy_shim_fix_, __LINE__)

#define SY_SHIM_TEST1(cond)                                           \
  do {                                                                \
    if (!(cond)) ::sy_test_shim::fail(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define SY_SHIM_TEST2(cond, msg)                                         \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::ostringstream sy_shim_os;                                     \
      sy_shim_os << msg;                                                 \
      ::sy_test_shim::fail(__FILE__, __LINE__, #cond, sy_shim_os.str()); \
    }                                                                    \
  } while (0)
#define SY_SHIM_PICK(_1, _2, NAME, ...) NAME
#define BOOST_TEST(...) SY_SHIM_PICK(__VA_ARGS__, SY_SHIM_TEST2, SY_SHIM_TEST1, x)(__VA_ARGS__)
#define BOOST_CHECK(cond) SY_SHIM_TEST1(cond)

#define BOOST_REQUIRE_MESSAGE(cond, msg)                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::ostringstream sy_shim_os;                                     \
      sy_shim_os << msg;                                                 \
      ::sy_test_shim::fail(__FILE__, __LINE__, #cond, sy_shim_os.str()); \
      throw ::sy_test_shim::Abort{};                                     \
    }                                                                    \
  } while (0)
#define BOOST_REQUIRE(cond) BOOST_REQUIRE_MESSAGE(cond, "")
#define BOOST_FAIL(msg) BOOST_REQUIRE_MESSAGE(false, msg)
#define BOOST_CHECK_THROW(expr, E)                                                  \
  do {                                                                              \
    bool sy_shim_thrown = false;                                                    \
    try {                                                                           \
      expr;                                                                         \
    } catch (const E&) {                                                            \
      sy_shim_thrown = true;                                                        \
    }                                                                               \
    if (!sy_shim_thrown) ::sy_test_shim::fail(__FILE__, __LINE__, #expr, "no " #E); \
  } while (0)
#define BOOST_TEST_MESSAGE(msg)                    \
  do {                                             \
    std::ostringstream sy_shim_os;                 \
    sy_shim_os << msg;                             \
    std::printf("%s\n", sy_shim_os.str().c_str()); \
  } while (0)

#ifdef BOOST_TEST_MODULE
/// Runs every test case; exit status 0 when all checks held, 201 otherwise (as Boost.Test). Only
/// the file that defines BOOST_TEST_MODULE (tests/main.cpp) gets it, as with Boost.Test.
int main() {
  for (auto& f : ::sy_test_shim::fixtures()) f();
  int failed_cases = 0;
  for (const auto& c : ::sy_test_shim::cases()) {
    const int before = ::sy_test_shim::failures();
    try {
      c.fn();
    } catch (const ::sy_test_shim::Abort&) {
    } catch (const std::exception& e) {
      ::sy_test_shim::fail(__FILE__, __LINE__, c.name, std::string("exception: ") + e.what());
    }
    const bool ok = ::sy_test_shim::failures() == before;
    failed_cases += ok ? 0 : 1;
    std::printf("%s: %s\n", c.name, ok ? "passed" : "FAILED");
  }
  std::printf("%d of %zu test cases failed, %d failed checks\n", failed_cases,
              ::sy_test_shim::cases().size(), ::sy_test_shim::failures());
  return failed_cases == 0 ? 0 : 201;
}
#endif  // BOOST_TEST_MODULE
