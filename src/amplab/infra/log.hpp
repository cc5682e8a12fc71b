// Logging facade over spdlog. Only log.cpp includes spdlog: torch's headers bring fmt 12 and
// Debian's spdlog needs fmt 9, so no translation unit may see both (README.md, "Build details").
// Callers build messages with c10::str / std::to_string and pass finished strings.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace amplab::log {

enum class Level { trace, debug, info, warn, error, off };
inline constexpr std::pair<Level, const char*> kLevelNames[] = {
    {Level::trace, "trace"}, {Level::debug, "debug"}, {Level::info, "info"},
    {Level::warn, "warn"},   {Level::error, "error"}, {Level::off, "off"}};
inline std::span<const std::pair<Level, const char*>> enum_names(Level) { return kLevelNames; }

// Console at `console_level`; when `file_path` is not empty, also a file that gets everything
// from debug up. Safe to call again (replaces the sinks).
void init(Level console_level, const std::string& file_path = "");
// In multi-process runs, ranks other than 0 only print warnings and errors, prefixed "[rank N]".
void set_rank(int rank);

void trace(std::string_view message);
void debug(std::string_view message);
void info(std::string_view message);
void warn(std::string_view message);
void error(std::string_view message);
// An error for the log file alone, when there is one: the line the program also prints itself,
// so that the run directory records why the run ended.
void error_to_file(std::string_view message);
void flush();

}  // namespace amplab::log
