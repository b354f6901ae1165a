// The executor backends by name (auto, cpu, cuda, null): the enum that configuration, the server
// and gpu/backend.hpp share, with the spelling of the YAML key and the --backend flag.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sy {

/// Which engine an executor runs.
enum class Backend : uint8_t {
  automatic,  ///< spelled "auto": cuda where a device answers, else cpu (resolve_backend)
  cpu,        ///< the CPU engine
  cuda,       ///< the CUDA engine
  null,       ///< no model, fixed tokens: measures the runtime's own overhead
};

namespace detail {
// Indexed by the enum's value; keep in the enum's order.
inline constexpr std::array<std::string_view, 4> backend_names = {"auto", "cpu", "cuda", "null"};
}  // namespace detail

/// The configuration spelling of a backend: "auto", "cpu", "cuda" or "null" ("?" out of range).
constexpr std::string_view to_string(Backend b) {
  const auto i = static_cast<std::size_t>(b);
  return i < detail::backend_names.size() ? detail::backend_names[i] : std::string_view("?");
}

/// Parses a configuration spelling; nullopt for any other name.
constexpr std::optional<Backend> parse_backend(std::string_view s) {
  for (std::size_t i = 0; i < detail::backend_names.size(); ++i)
    if (detail::backend_names[i] == s) return static_cast<Backend>(i);
  return std::nullopt;
}

}  // namespace sy
