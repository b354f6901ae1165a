// The server's log (see log.hpp): one spdlog logger with one sink that writes each formatted line
// with a single fwrite; the formatter lays lines out as text or as JSON (nlohmann-json).
#include "actors/log.hpp"

#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <ctime>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "actors/messages.hpp"

namespace sy::log {

namespace {

spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::trace:
      return spdlog::level::trace;
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
    case Level::off:
      break;
  }
  return spdlog::level::off;
}

Level from_spdlog(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace:
      return Level::trace;
    case spdlog::level::debug:
      return Level::debug;
    case spdlog::level::info:
      return Level::info;
    case spdlog::level::warn:
      return Level::warn;
    case spdlog::level::err:
    case spdlog::level::critical:
      return Level::error;
    default:
      return Level::off;
  }
}

std::atomic<Format> g_format{Format::text};

// Formats with format_line, so that what tests compute is what the sink writes.
class LineFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string line =
        format_line(g_format.load(std::memory_order_relaxed), from_spdlog(msg.level),
                    std::string_view(msg.payload.data(), msg.payload.size()), msg.time);
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<LineFormatter>();
  }
};

// spdlog's own stderr sink also writes once per line, but cannot be pointed at another stream.
class LineSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void set_file(std::FILE* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    out_ = out;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::fwrite(buf.data(), 1, buf.size(), out_);
    std::fflush(out_);
  }
  void flush_() override { std::fflush(out_); }

 private:
  std::FILE* out_ = stderr;
};

struct Log {
  std::shared_ptr<LineSink> sink = std::make_shared<LineSink>();
  spdlog::logger logger{"switchyard", sink};
  Log() {
    logger.set_formatter(std::make_unique<LineFormatter>());
    logger.set_level(spdlog::level::info);
  }
};

Log& the_log() {
  // Never destroyed: actor and ZeroMQ threads may still log while static destructors run.
  static Log* log = new Log();
  return *log;
}

std::string utc_timestamp(std::chrono::system_clock::time_point at) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];  // room for any int the compiler imagines in each field
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

}  // namespace

std::optional<Level> parse_level(std::string_view name) {
  for (Level l : {Level::trace, Level::debug, Level::info, Level::warn, Level::error, Level::off})
    if (name == to_string(l)) return l;
  return std::nullopt;
}

std::optional<Format> parse_format(std::string_view name) {
  if (name == "text") return Format::text;
  if (name == "json") return Format::json;
  return std::nullopt;
}

const char* to_string(Level level) {
  switch (level) {
    case Level::trace:
      return "trace";
    case Level::debug:
      return "debug";
    case Level::info:
      return "info";
    case Level::warn:
      return "warn";
    case Level::error:
      return "error";
    case Level::off:
      break;
  }
  return "off";
}

const char* to_string(Format format) {
  return format == Format::json ? "json" : "text";
}

void set_level(Level level) {
  the_log().logger.set_level(to_spdlog(level));
}
Level level() {
  return from_spdlog(the_log().logger.level());
}
void set_format(Format format) {
  g_format.store(format, std::memory_order_relaxed);
}
Format format() {
  return g_format.load(std::memory_order_relaxed);
}
void set_output(std::FILE* out) {
  the_log().sink->set_file(out);
}

bool enabled(Level level) {
  return level != Level::off && the_log().logger.should_log(to_spdlog(level));
}

void write(Level level, std::string_view text) {
  if (!enabled(level)) return;
  the_log().logger.log(to_spdlog(level), spdlog::string_view_t(text.data(), text.size()));
}

std::string format_line(Format format, Level level, std::string_view text,
                        std::chrono::system_clock::time_point at) {
  if (format == Format::text) {
    std::string line = "switchyard: ";
    line.append(text);
    line += '\n';
    return line;
  }
  nlohmann::ordered_json j;
  j["ts"] = utc_timestamp(at);
  j["level"] = to_string(level);
  j["msg"] = std::string(text);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace sy::log

namespace sy {

void log_line(const std::string& text) {
  log::info(text);
}

}  // namespace sy
