// Runs the workers of one node and watches them: output prefixed per rank, signals forwarded,
// and one failure stops the rest. POSIX only (fork/exec, pipes, poll); no torch.
#pragma once

#include <string>
#include <vector>

namespace amplab::launcher {

struct Worker {
  int rank = 0;                   // global rank, shown as "[rank N] " before each output line
  int local_rank = 0;
  std::vector<std::string> env;   // the complete environment, "NAME=value"
};

struct SupervisorOptions {
  std::vector<std::string> command;  // the program (a path, or a name looked up in PATH) and its arguments
  std::vector<Worker> workers;
  double grace_s = 5;                // after SIGTERM, seconds before SIGKILL
};

// Starts every worker (fork + exec, no shell) and returns the launcher's exit code once all
// have ended:
//   0            every worker exited with 0;
//   the failure  the first worker to fail: its exit code, or 128 + its signal; the others get
//                SIGTERM at once and SIGKILL after grace_s; a line on stderr names the rank;
//   128 + sig    SIGINT/SIGTERM reached the launcher: forwarded to every worker (a second one is
//                forwarded again, a third sends SIGKILL);
//   127          the program could not be started.
// Workers run in their own process group (a terminal's Ctrl-C reaches only the launcher, which
// forwards it once), read stdin from /dev/null, and die with the launcher (PR_SET_PDEATHSIG).
// `interrupted`, when given, tells whether a signal to the launcher ended the run (as opposed to
// a worker failing), which decides whether a restart makes sense.
int supervise(const SupervisorOptions& options, bool* interrupted = nullptr);

// "SIGKILL" for 9, "signal 42" for unnamed ones.
std::string signal_name(int signo);

}  // namespace amplab::launcher
