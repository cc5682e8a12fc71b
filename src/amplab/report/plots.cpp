// A run's PNG plots (plots.hpp): scripts/plot.py started on the run directory.
#include "amplab/report/plots.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "amplab/infra/env.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/infra/signals.hpp"

namespace amplab {

namespace {

constexpr int kNoMatplotlib = 3;  // scripts/plot.py's exit code when it cannot import matplotlib
constexpr int kCannotStart = 127;

// The .venv's interpreter when this user may run it, else python3 from PATH. access() answers
// for a venv this user cannot even look into, where a std::filesystem check would throw.
std::string plot_python() {
  const std::string venv_python = source_dir() + "/.venv/bin/python";
  return ::access(venv_python.c_str(), X_OK) == 0 ? venv_python : "python3";
}

// Why the plots are missing, from how the child ended ("" when it succeeded).
std::string why_no_plots(int status, const std::string& python) {
  if (WIFSIGNALED(status)) return "scripts/plot.py was killed by signal " + std::to_string(WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 0) return "";
  if (WEXITSTATUS(status) == kCannotStart) return "could not start " + python + " (no Python interpreter there)";
  if (WEXITSTATUS(status) == kNoMatplotlib) return "matplotlib is not installed for " + python + " (scripts/setup.sh installs it)";
  return "scripts/plot.py failed (its reason is the line above)";
}

}  // namespace

void make_plots(const std::string& kind, const RunDir& run) {
  if (!run.enabled()) return;
  const std::string python = plot_python(), script = source_dir() + "/scripts/plot.py";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ignore_stop_signals_in_child();  // the run's handler decides what a Ctrl-C stops
    ::execlp(python.c_str(), python.c_str(), script.c_str(), kind.c_str(), run.path().c_str(), static_cast<char*>(nullptr));
    ::_exit(kCannotStart);
  }
  if (pid < 0) {
    log::warn("plots skipped: cannot start a process for scripts/plot.py (" + std::string(std::strerror(errno)) + ")");
    return;
  }
  set_waited_child(pid);
  int status = 0;
  pid_t waited = 0;
  do waited = ::waitpid(pid, &status, 0);
  while (waited < 0 && errno == EINTR);
  set_waited_child(0);
  const std::string why = waited < 0 ? "lost track of scripts/plot.py (" + std::string(std::strerror(errno)) + ")"
                                     : why_no_plots(status, python);
  if (!why.empty()) log::warn("plots skipped: " + why);
}

}  // namespace amplab
