// What every lab binary's main() shares (app.hpp): the command line, and errors as one line.
#include "amplab/infra/app.hpp"

#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "amplab/infra/append_file.hpp"
#include "amplab/infra/env.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/infra/signals.hpp"

namespace amplab {

std::string default_config_path(const std::string& lab) {
  std::string local = "configs/" + lab + ".yaml";
  if (std::filesystem::exists(local)) return local;
  std::string in_source = source_dir() + "/configs/" + lab + ".yaml";
  if (std::filesystem::exists(in_source)) return in_source;
  return local;
}

std::optional<int> parse_command_line(int argc, char** argv, const std::string& lab, const std::string& summary,
                                      const std::string& config_keys, CommandLine& out, bool accepts_resume,
                                      const std::string& resume_help) {
  CLI::App app(summary, lab);
  out.config_path = default_config_path(lab);
  app.add_option("-c,--config", out.config_path, "YAML config file")->capture_default_str();
  app.add_option("-s,--set", out.overrides, "override one config key, e.g. --set train.lr=0.01 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  if (accepts_resume && !resume_help.empty()) {  // a study that keeps its rows (StudyProgress)
    app.add_option("--resume", out.resume, resume_help)->type_name("RUN_DIR|latest");
    app.add_flag("--force", out.force, "keep the earlier run's rows although its config differs (the difference is named)");
  } else if (accepts_resume) {
    app.add_option("--resume", out.resume,
                   "resume from a checkpoint file, 'latest' in the checkpoint directory, or 'auto' (latest if there is "
                   "one, else start fresh: what a restarted worker of torchrun --max-restarts wants)")
        ->type_name("PATH|latest|auto");
    app.add_flag("--force", out.force,
                 "resume although a setting the data position or the learning-rate schedule depends on changed "
                 "(batch size, world size, epochs under a schedule...); each change is logged");
  }
  app.footer("Config keys (set in the YAML file or with --set; defaults shown):\n" + config_keys);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::cout << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp& e) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << lab << ": " << e.what() << " (see " << lab << " --help)\n";
    return kExitUsage;
  }
  // `--resume "$CKPT"` with the variable unset: not a fresh start without a word.
  if (accepts_resume && app.count("--resume") > 0 && out.resume.empty()) {
    std::cerr << "error: " << lab << ": --resume was given an empty path (an unset variable?); pass a checkpoint file, "
              << "latest or auto, or leave --resume out to start fresh\n";
    return kExitUsage;
  }
  return std::nullopt;
}

namespace {
// The one line a failed run ends with: on the console, and in the run's log file if it has one.
int report_error(const std::string& message, int exit_code) {
  log::error_to_file("error: " + message);
  log::flush();
  std::cerr << "error: " << message << "\n";
  return exit_code;
}
}  // namespace

// Text that could not be written (a full disk) fails a run that would otherwise succeed.
int check_unwritten(int exit_code) {
  log::flush();
  std::vector<std::string> lost = unwritten_files();
  if (lost.empty() || exit_code != kExitOk) return exit_code;
  std::string message = "some output could not be written: " + lost[0];
  if (lost.size() > 1) message += " (and " + std::to_string(lost.size() - 1) + " more file(s))";
  return report_error(message + "; free disk space and run again", kExitIo);
}

int guarded_main(const std::function<int()>& body) {
  survive_the_terminal();  // before any file is opened: a closed stdout must not be reused
  try {
    return check_unwritten(body());
  } catch (const Interrupted& e) {  // a stop signal at a safe point outside a lab's body
    return report_error("stopped by " + describe_interrupt(e.signal()) + " before the run began; nothing was written",
                        interrupt_exit_code(e.signal()));
  } catch (const NotImplemented& e) {
    return report_error(e.what(), kExitNotImplemented);
  } catch (const IoError& e) {
    return report_error(e.what(), kExitIo);
  } catch (const PeerLost& e) {
    return report_error(e.what(), kExitFailure);
  } catch (const Error& e) {
    return report_error(e.what(), kExitUsage);
  } catch (const c10::OutOfMemoryError& e) {
    return report_error(std::string("out of GPU memory: ") + e.what_without_backtrace(), kExitFailure);
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    message = message.substr(0, message.find('\n'));
    // c10's CPU allocator names the bytes, not what to change.
    if (message.find("can't allocate memory") != std::string::npos)
      message = "out of CPU memory: " + message + "; lower the sizes set in the config (widths, depths, batch sizes: see --help)";
    return report_error(message, kExitFailure);
  } catch (const std::exception& e) {
    return report_error(e.what(), kExitFailure);
  }
}

}  // namespace amplab
