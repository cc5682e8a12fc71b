// Ctrl-C without losing work. The first SIGINT/SIGTERM only sets a flag: the training loop
// finishes the optimizer step in progress, saves a checkpoint and exits with 128 + signal
// (130 / 143). A second signal exits at once, removing the temporary file of a checkpoint write
// in progress so that no partial file is left behind.
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

// The first signal received since the handler was installed (SIGINT or SIGTERM), or 0.
int interrupt_signal();
inline bool interrupt_requested() { return interrupt_signal() != 0; }
// 130 for SIGINT, 143 for SIGTERM (the shell's convention, 128 + signal number).
int interrupt_exit_code(int signal);
// For tests: forget a received signal.
void clear_interrupt();

}  // namespace amplab
