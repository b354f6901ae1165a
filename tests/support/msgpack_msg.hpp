// Hand-built msgpack maps for codec tests: a message as an ordered list of (key, value writer),
// so one field can be swapped, dropped or given a wrong type, and value writers for each kind.
#pragma once

#include <cstdint>
#include <functional>
#include <msgpack.hpp>
#include <string>
#include <utility>
#include <vector>

namespace sy::test {

using Packer = msgpack::packer<msgpack::sbuffer>;
using Value = std::function<void(Packer&)>;

struct Msg {
  std::vector<std::pair<std::string, Value>> fields;

  Msg& set(const std::string& k, Value v) {
    for (auto& f : fields)
      if (f.first == k) {
        f.second = std::move(v);
        return *this;
      }
    fields.emplace_back(k, std::move(v));
    return *this;
  }
  Msg& drop(const std::string& k) {
    std::erase_if(fields, [&](const auto& f) { return f.first == k; });
    return *this;
  }
  std::string bytes() const {
    msgpack::sbuffer buf;
    Packer p(buf);
    p.pack_map(static_cast<uint32_t>(fields.size()));
    for (const auto& [k, v] : fields) {
      p.pack(k);
      v(p);
    }
    return std::string(buf.data(), buf.size());
  }
};

inline Value S(std::string s) {
  return [s](Packer& p) { p.pack(s); };
}
inline Value U(uint64_t x) {
  return [x](Packer& p) { p.pack_uint64(x); };
}
inline Value I(int64_t x) {
  return [x](Packer& p) { p.pack_int64(x); };
}
// pack_double would turn 2.0 into an integer; these write real floats.
inline Value F(double x) {
  return [x](Packer& p) { p.pack_double(x); };
}
inline Value F32(float x) {
  return [x](Packer& p) { p.pack_float(x); };
}
inline Value B(bool x) {
  return [x](Packer& p) { x ? p.pack_true() : p.pack_false(); };
}
inline Value Nil() {
  return [](Packer& p) { p.pack_nil(); };
}

}  // namespace sy::test
