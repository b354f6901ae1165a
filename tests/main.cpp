// The one main of every test executable: Boost.Test's runner. Each test file is a suite named
// after the file, and CTest runs one suite per entry (--run_test=test_x; tests/CMakeLists.txt).
#define BOOST_TEST_MODULE switchyard
#include <boost/test/unit_test.hpp>
