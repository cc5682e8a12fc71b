// A run's PNG plots (plots.hpp): scripts/plot.py started on the run directory.
#include "amplab/report/plots.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "amplab/infra/env.hpp"
#include "amplab/infra/log.hpp"

namespace amplab {

void make_plots(const std::string& kind, const RunDir& run) {
  if (!run.enabled()) return;
  namespace fs = std::filesystem;
  std::string venv_python = source_dir() + "/.venv/bin/python";
  std::string python = fs::exists(venv_python) ? venv_python : "python3";
  std::string script = source_dir() + "/scripts/plot.py";
  pid_t pid = fork();
  if (pid == 0) {
    execlp(python.c_str(), python.c_str(), script.c_str(), kind.c_str(), run.path().c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    log::warn("plots skipped: " + python + " " + script + " failed (is matplotlib installed? scripts/setup.sh installs it)");
}

}  // namespace amplab
