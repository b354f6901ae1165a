// JSON for the command line: values are nlohmann::ordered_json (keys keep their insertion order),
// written in the two layouts the commands print.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace sy::cli {

/// A JSON value whose object keys keep the order they were added in (the printed order).
using Json = nlohmann::ordered_json;

enum class JsonLayout {
  compact,  ///< {"a":1,"b":[1,2]}: one results line of `submit`
  spaced,   ///< {"a": 1, "b": [1, 2]}: the --json output of generate, tokenize, render-chat
};

/// `v` as one line of JSON. Strings are escaped by nlohmann-json; invalid UTF-8 bytes (a random
/// model can emit any byte) become U+FFFD so the output always parses. Floats are written with
/// 6 significant digits (%.6g: what a person reads; no consumer needs more), non-finite ones as
/// null.
std::string json_dump(const Json& v, JsonLayout layout = JsonLayout::compact);

}  // namespace sy::cli
