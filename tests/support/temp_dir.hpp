// A temporary folder for tests, made fresh under /tmp (mkdtemp) and removed with its contents
// when the object goes, and a whole-file reader. Header-only and Boost-free, so any test target (GPU ones too) can use it.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>

namespace sy::test {

/// A fresh folder /tmp/<prefix>XXXXXX, removed recursively at destruction.
class TempDir {
 public:
  /// Throws std::runtime_error when the folder cannot be made (also when `prefix` is too long).
  explicit TempDir(const char* prefix = "sy_test_") {
    // A short fixed buffer, not std::string: prefixes are short names, and building the
    // template as a string makes GCC 12 report false -Wrestrict warnings in the including tests.
    char tmpl[256];
    std::snprintf(tmpl, sizeof tmpl, "/tmp/%sXXXXXX", prefix);
    if (!mkdtemp(tmpl)) throw std::runtime_error(std::string("mkdtemp failed for ") + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;  // a destructor must not throw; a leftover folder in /tmp is harmless
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The folder's path.
  const std::string& path() const { return path_; }
  /// The path of `name` in the folder (the file need not exist).
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  /// Writes `text` to `name` in the folder and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = file(name);
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

/// The whole content of a file, bytes as they are; "" when it cannot be opened.
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace sy::test
