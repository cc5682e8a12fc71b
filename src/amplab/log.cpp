// Built in its own target (amplab_log) without torch's include directories; see log.hpp.
#include "amplab/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace amplab::log {

namespace {

std::mutex g_mutex;
Level g_console_level = Level::info;
std::string g_file_path;
int g_rank = 0;

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  Level console_level = g_rank == 0 ? g_console_level : std::max(g_console_level, Level::warn);
  console->set_level(to_spdlog(console_level));
  console->set_pattern(g_rank == 0 ? "%^[%H:%M:%S %l]%$ %v" : "%^[%H:%M:%S %l]%$ [rank " + std::to_string(g_rank) + "] %v");
  std::vector<spdlog::sink_ptr> sinks{console};  // then the file's sink, if there is a file
  if (!g_file_path.empty()) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(g_file_path, /*truncate=*/false);
    file->set_level(spdlog::level::debug);
    file->set_pattern("[%Y-%m-%d %H:%M:%S.%e %l] %v");
    sinks.push_back(file);
  }
  auto logger = std::make_shared<spdlog::logger>("amplab", sinks.begin(), sinks.end());
  logger->set_level(spdlog::level::trace);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

std::shared_ptr<spdlog::logger>& current() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return instance;
}

}  // namespace

void init(Level console_level, const std::string& file_path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_console_level = console_level;
  g_file_path = file_path;
  if (current()) current()->flush();
  current() = make_logger();
}

void set_rank(int rank) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_rank = rank;
  current() = make_logger();
}

Level parse_level(const std::string& name) {
  if (name == "trace") return Level::trace;
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  throw std::invalid_argument("log level '" + name + "' is not allowed; use one of: trace, debug, info, warn, error, off");
}

namespace {
std::shared_ptr<spdlog::logger> snapshot() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return current();
}
}  // namespace

void trace(std::string_view message) { snapshot()->trace("{}", message); }
void debug(std::string_view message) { snapshot()->debug("{}", message); }
void info(std::string_view message) { snapshot()->info("{}", message); }
void warn(std::string_view message) { snapshot()->warn("{}", message); }
void error(std::string_view message) { snapshot()->error("{}", message); }
void flush() { snapshot()->flush(); }

void error_to_file(std::string_view message) {
  auto logger = snapshot();
  if (logger->sinks().size() < 2) return;  // the console alone: no file
  spdlog::logger file_only("amplab_file", logger->sinks().back());
  file_only.error("{}", message);
  file_only.flush();
}

}  // namespace amplab::log
