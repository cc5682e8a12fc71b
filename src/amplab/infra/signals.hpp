// Ctrl-C without losing work. The first SIGINT/SIGTERM/SIGHUP only sets a flag: the training
// loop finishes the optimizer step in progress, saves a checkpoint and exits with 128 + signal
// (130 / 143 / 129). A second signal exits at once, removing the temporary file of a checkpoint
// write in progress so that no partial file is left behind. SIGHUP is a closed terminal (an SSH
// session dropped): the run saves as it does for SIGTERM.
#pragma once

namespace amplab {

// Installs the handlers for its lifetime and restores the previous ones after.
class InterruptHandler {
 public:
  InterruptHandler();
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;
};

// What a run needs to outlive its terminal; guarded_main calls it before anything else:
// - a closed stdin, stdout or stderr is reopened on /dev/null, so that no file the run opens
//   takes its number (the console's lines would land in it);
// - SIGPIPE is ignored: a console whose reader is gone (`| tee` killed by the same Ctrl-C,
//   `| head -1`) makes writes fail instead of killing the run before it saves; the run's log
//   file still gets every line;
// - SIGXFSZ is ignored: a file-size limit (ulimit -f) fails the write with EFBIG, which is
//   reported like a full disk instead of killing the run.
void survive_the_terminal();

// The first signal received since the handler was installed (SIGINT, SIGTERM or SIGHUP), or 0.
int interrupt_signal();
inline bool interrupt_requested() { return interrupt_signal() != 0; }
// 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP (the shell's convention, 128 + signal number).
int interrupt_exit_code(int signal);

}  // namespace amplab
