// JSON output for the command line (see json.hpp): nlohmann-json escapes the strings, this file
// only lays out separators and float digits.
#include "cli/json.hpp"

#include <cmath>
#include <cstdio>

namespace sy::cli {

namespace {

void write(const Json& v, JsonLayout layout, std::string& out) {
  const char* item_sep = layout == JsonLayout::spaced ? ", " : ",";
  const char* key_sep = layout == JsonLayout::spaced ? ": " : ":";
  switch (v.type()) {
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += item_sep;
        first = false;
        out += Json(k).dump(-1, ' ', false, Json::error_handler_t::replace);
        out += key_sep;
        write(e, layout, out);
      }
      out += '}';
      return;
    }
    case Json::value_t::array: {
      out += '[';
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += item_sep;
        write(v[i], layout, out);
      }
      out += ']';
      return;
    }
    case Json::value_t::number_float: {
      const double d = v.get<double>();
      if (!std::isfinite(d)) {
        out += "null";
        return;
      }
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", d);
      out += buf;
      return;
    }
    default:
      out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

std::string json_dump(const Json& v, JsonLayout layout) {
  std::string out;
  write(v, layout, out);
  return out;
}

}  // namespace sy::cli
