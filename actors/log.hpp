// The server's log: levelled lines on stderr, written by spdlog. Text lines keep the shape
// "switchyard: TEXT" that operators and tests read; the JSON-lines format is for log shippers.
#pragma once

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace sy::log {

enum class Level { trace, debug, info, warn, error, off };

enum class Format {
  text,  ///< switchyard: TEXT
  json,  ///< {"ts":"2026-01-02T03:04:05.678Z","level":"info","msg":"TEXT"}
};

/// The `log` keys of the config file (`--log-level`, `--log-format` on `switchyard serve`).
struct LogConfig {
  Level level = Level::info;
  Format format = Format::text;
};

/// "trace", "debug", "info", "warn", "error" or "off"; nullopt for anything else.
std::optional<Level> parse_level(std::string_view name);
/// "text" or "json"; nullopt for anything else.
std::optional<Format> parse_format(std::string_view name);
const char* to_string(Level level);
const char* to_string(Format format);

/// Process-wide settings; lines below the level are dropped. Defaults: info, text, stderr.
void set_level(Level level);
Level level();
void set_format(Format format);
Format format();
/// Where lines go; tests point it at a temporary file. `out` must outlive its use.
void set_output(std::FILE* out);

/// Whether a line at `level` would be written (to skip building an expensive text).
bool enabled(Level level);
/// Writes one line when `level` passes the filter: one fwrite per line, so that lines from many
/// threads (and processes sharing the stream) never interleave.
void write(Level level, std::string_view text);

inline void trace(std::string_view text) {
  write(Level::trace, text);
}
inline void debug(std::string_view text) {
  write(Level::debug, text);
}
inline void info(std::string_view text) {
  write(Level::info, text);
}
inline void warn(std::string_view text) {
  write(Level::warn, text);
}
inline void error(std::string_view text) {
  write(Level::error, text);
}

/// The line (with its "\n") that `write` prints for `text` in `format` at time `at`. Invalid
/// UTF-8 in `text` becomes U+FFFD in the JSON format, so every line parses.
std::string format_line(Format format, Level level, std::string_view text,
                        std::chrono::system_clock::time_point at);

}  // namespace sy::log
