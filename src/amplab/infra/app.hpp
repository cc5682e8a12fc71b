// What every lab binary's main() shares: the command line (--config, --set, --resume, --help
// listing the config keys) and turning any error into one line and a non-zero exit code.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"

namespace amplab {

struct CommandLine {
  std::string config_path;             // --config FILE
  std::vector<std::string> overrides;  // --set KEY=VALUE, in order
  std::string resume;                  // --resume PATH|latest|auto ("" = start fresh)
  bool force = false;                  // --force: resume although settings the position depends on changed
};

// Exit codes of lab binaries.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;       // an unexpected internal error
constexpr int kExitUsage = 2;         // bad command line, config, data or checkpoint
constexpr int kExitNotImplemented = 3;  // a starter hole was reached
constexpr int kExitIo = 4;            // a file could not be read or written (disk full, permissions)

// Parses argv with CLI11. `describe_config` lists the config keys (config.hpp's describe_keys
// of the lab's default config) for --help. Returns the exit code when the program should stop
// now (--help: 0, bad arguments: kExitUsage after printing one line).
std::optional<int> parse_command_line(int argc, char** argv, const std::string& lab, const std::string& summary,
                                      const std::string& config_keys, CommandLine& out,
                                      bool accepts_resume = true, const std::string& resume_help = "");

// Loads configs/<lab>.yaml (or --config) with the --set overrides into `config`; returns the
// source, whose where(key) names the origin of a value for checks across keys.
template <class Config>
ConfigSource load_lab_config(const CommandLine& cli, Config& config) {
  auto source = ConfigSource::load(cli.config_path, cli.overrides);
  source.bind(config);
  return source;
}

// Runs `body`, mapping exceptions to one line on stderr and an exit code: amplab::Error and
// bad checkpoints -> kExitUsage, NotImplemented -> kExitNotImplemented, IoError -> kExitIo, anything else ->
// kExitFailure (the message of a torch error without its C++ backtrace).
int guarded_main(const std::function<int()>& body);

// The default config path of a lab: configs/<lab>.yaml under the current directory, else under
// the project root (so binaries work from any directory of the checkout).
std::string default_config_path(const std::string& lab);

}  // namespace amplab
