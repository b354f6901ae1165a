// A minimal stand-in for the part of Boost.Test that tests/gpu uses (suites, test cases, BOOST_TEST
// with an optional message, REQUIRE and its comparisons, CHECK_THROW, CHECK_NO_THROW, FAIL,
// TEST_CONTEXT, a global fixture), so that the GPU tests also build on device machines without Boost. Only bench/gpu_standalone puts it on the include path,
// and only when Boost.Test is not found.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstring>
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
inline std::vector<std::string>& contexts() {
  static std::vector<std::string> c;
  return c;
}
/// BOOST_TEST_CONTEXT: a line named in every failure reported while it is open.
struct Context {
  explicit Context(std::string s) { contexts().push_back(std::move(s)); }
  ~Context() { contexts().pop_back(); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};
template <class F>
std::string text(F&& write) {
  std::ostringstream os;
  write(os);
  return os.str();
}
inline void fail(const char* file, int line, const std::string& what, const std::string& msg) {
  ++failures();
  std::printf("%s(%d): error: check %s has failed%s%s\n", file, line, what.c_str(),
              msg.empty() ? "" : ": ", msg.c_str());
  for (const auto& c : contexts()) std::printf("    context: %s\n", c.c_str());
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
#define BOOST_TEST_REQUIRE(cond) BOOST_REQUIRE_MESSAGE(cond, "")
#define BOOST_REQUIRE_EQUAL(a, b) \
  BOOST_REQUIRE_MESSAGE((a) == (b), "[" << (a) << " != " << (b) << "]")
#define BOOST_REQUIRE_GE(a, b) BOOST_REQUIRE_MESSAGE((a) >= (b), "[" << (a) << " < " << (b) << "]")
#define BOOST_TEST_CONTEXT(msg)                                                        \
  if (::sy_test_shim::Context sy_shim_ctx{                                             \
          ::sy_test_shim::text([&](std::ostream& sy_shim_os) { sy_shim_os << msg; })}; \
      true)
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
#define BOOST_CHECK_NO_THROW(expr)                                                               \
  do {                                                                                           \
    try {                                                                                        \
      expr;                                                                                      \
    } catch (const std::exception& sy_shim_e) {                                                  \
      ::sy_test_shim::fail(__FILE__, __LINE__, #expr, std::string("threw ") + sy_shim_e.what()); \
    }                                                                                            \
  } while (0)
#define BOOST_TEST_MESSAGE(msg)                    \
  do {                                             \
    std::ostringstream sy_shim_os;                 \
    sy_shim_os << msg;                             \
    std::printf("%s\n", sy_shim_os.str().c_str()); \
  } while (0)

#ifdef BOOST_TEST_MODULE
/// Runs every test case, or those named in --run_test=NAME[,NAME...]; exit status 0 when all
/// checks held, 201 otherwise (as Boost.Test). Only the file that defines BOOST_TEST_MODULE
/// (tests/main.cpp) gets it, as with Boost.Test.
int main(int argc, char** argv) {
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--run_test=", 11) == 0) only = "," + std::string(argv[i] + 11) + ",";
  }
  for (auto& f : ::sy_test_shim::fixtures()) f();
  int failed_cases = 0;
  for (const auto& c : ::sy_test_shim::cases()) {
    if (!only.empty() && only.find("," + std::string(c.name) + ",") == std::string::npos) continue;
    const int before = ::sy_test_shim::failures();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.fn();
    } catch (const ::sy_test_shim::Abort&) {
    } catch (const std::exception& e) {
      ::sy_test_shim::fail(__FILE__, __LINE__, c.name, std::string("exception: ") + e.what());
    }
    const bool ok = ::sy_test_shim::failures() == before;
    failed_cases += ok ? 0 : 1;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %s (%.2f s)\n", c.name, ok ? "passed" : "FAILED", s);
    std::fflush(stdout);
  }
  std::printf("%d of %zu test cases failed, %d failed checks\n", failed_cases,
              ::sy_test_shim::cases().size(), ::sy_test_shim::failures());
  return failed_cases == 0 ? 0 : 201;
}
#endif  // BOOST_TEST_MODULE
