// Built in its own target (amplab_log) without torch's include directories; see log.hpp.
#include "amplab/infra/log.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "amplab/infra/append_file.hpp"

namespace amplab::log {

namespace {

// The log file, through an AppendFile: lines the disk refuses wait in memory and are written
// once there is room (spdlog's own file sink drops them), and unwritten_files() reports them.
class RetryingFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit RetryingFileSink(const std::string& path) : file_(path, /*truncate=*/false) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    file_.append(std::string_view(formatted.data(), formatted.size()));
    if (file_.pending_bytes() > 0 && !warned_) {
      warned_ = true;  // once: the console line must not itself become a flood
      std::fprintf(stderr, "warning: cannot write the log file %s (disk full?): keeping its lines in memory and retrying\n",
                   file_.path().c_str());
    }
  }
  void flush_() override { file_.retry(); }

 private:
  AppendFile file_;
  bool warned_ = false;
};

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
    auto file = std::make_shared<RetryingFileSink>(g_file_path);
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
