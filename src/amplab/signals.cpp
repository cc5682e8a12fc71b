#include "amplab/signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <utility>

#include "amplab/files.hpp"

namespace amplab {

namespace {

volatile sig_atomic_t g_signal = 0;
struct sigaction g_previous_int, g_previous_term;

void on_signal(int sig) {
  if (g_signal != 0) {
    // Second signal: only async-signal-safe calls here (unlink, write, _exit).
    const char* temp = atomic_write_in_progress();
    if (temp[0] != '\0') ::unlink(temp);
    const char message[] = "\nsecond signal: exiting now without saving\n";
    ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
    (void)ignored;
    ::_exit(128 + sig);
  }
  g_signal = sig;
  const char message[] = "\ninterrupt received: stopping after the current step "
                         "(press Ctrl-C again to exit at once)\n";
  ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
  (void)ignored;
}

}  // namespace

InterruptHandler::InterruptHandler() {
  g_signal = 0;
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not make a blocking read or write fail with EINTR
  // A signal ignored when the program started stays ignored (POSIX's rule for shells: `nohup`,
  // and jobs started with & in a script, ignore SIGINT on purpose).
  for (auto [signo, previous] : {std::pair{SIGINT, &g_previous_int}, std::pair{SIGTERM, &g_previous_term}}) {
    sigaction(signo, nullptr, previous);
    if (previous->sa_handler != SIG_IGN) sigaction(signo, &action, nullptr);
  }
}

InterruptHandler::~InterruptHandler() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

int interrupt_signal() { return g_signal; }

int interrupt_exit_code(int signal) { return 128 + signal; }

void clear_interrupt() { g_signal = 0; }

}  // namespace amplab
