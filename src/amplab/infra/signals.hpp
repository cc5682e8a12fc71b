// Ctrl-C without losing work, the same in every lab. The first SIGINT/SIGTERM/SIGHUP only sets a
// flag; the run stops at its next safe point: the training loop after the optimizer step in
// progress (it saves a checkpoint), a study lab before its next row or section (Interrupted,
// below). Then the run writes what it has (the rows finished so far, summary.json and report.md
// marked partial), says where it stopped and how to go on, and exits with 128 + signal (130 /
// 143 / 129). A second signal exits at once, removing the temporary file of a checkpoint write
// in progress so that no partial file is left behind. SIGHUP is a closed terminal (an SSH
// session dropped): the run stops as it does for SIGTERM.
#pragma once

#include <sys/types.h>

#include <exception>
#include <string>

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
// "Ctrl-C (SIGINT)", "SIGTERM", "SIGHUP (the terminal closed)".
std::string describe_interrupt(int signal);

// How a lab leaves work that a signal asked it to stop: thrown at the next safe point (a new
// row, section or step; stop_if_interrupted), caught by lab_main, which writes what the run has.
// Not an amplab::Error: no lab code that handles a user's error may swallow it.
class Interrupted : public std::exception {
 public:
  explicit Interrupted(int signal) : signal_(signal) {}
  int signal() const { return signal_; }
  const char* what() const noexcept override { return "interrupted"; }

 private:
  int signal_;
};

// Throws Interrupted when a stop signal has arrived; a safe point between two pieces of work.
void stop_if_interrupted();

// A child process the run waits for (the plot script): it starts with the stop signals ignored,
// so that the user's Ctrl-C, which the terminal sends to the whole foreground group, stops the
// run through its handler and never kills the child halfway; a second signal, which exits at
// once, takes the child with it. 0: none.
void set_waited_child(pid_t pid);
void ignore_stop_signals_in_child();  // between fork() and exec()

}  // namespace amplab
