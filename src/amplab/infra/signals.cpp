// Ctrl-C without losing work (signals.hpp): the handlers, the flag, the second signal's exit.
#include "amplab/infra/signals.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#include "amplab/infra/files.hpp"

namespace amplab {

namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_child = 0;  // the waited-for child's pid (pid_t fits an int on Linux)
struct sigaction g_previous[3];

void on_signal(int sig) {
  if (g_signal != 0) {
    // Second signal: only async-signal-safe calls here (unlink, write, _exit).
    const char* temp = atomic_write_in_progress();
    if (temp[0] != '\0') ::unlink(temp);
    if (g_child > 0) ::kill(static_cast<pid_t>(g_child), SIGKILL);  // it ignores the stop signals
    const char message[] = "\nsecond signal: exiting now without saving\n";
    ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
    (void)ignored;
    ::_exit(128 + sig);
  }
  g_signal = sig;
  // A write to a terminal that is gone fails (EIO, EPIPE): nothing depends on this line.
  const char message[] = "\ninterrupt received: stopping after the current step "
                         "(press Ctrl-C again to exit at once)\n";
  ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
  (void)ignored;
}

}  // namespace

void survive_the_terminal() {
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int null = ::open("/dev/null", O_RDWR);  // takes the lowest free number: `fd` itself
    if (null >= 0 && null != fd) {
      ::dup2(null, fd);
      ::close(null);
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);
}

InterruptHandler::InterruptHandler() {
  g_signal = 0;
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not make a blocking read or write fail with EINTR
  // A signal ignored when the program started stays ignored (POSIX's rule for shells: `nohup`
  // ignores SIGHUP, and jobs started with & in a script ignore SIGINT, on purpose).
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    sigaction(kStopSignals[i], nullptr, &g_previous[i]);
    if (g_previous[i].sa_handler != SIG_IGN) sigaction(kStopSignals[i], &action, nullptr);
  }
}

InterruptHandler::~InterruptHandler() {
  for (size_t i = 0; i < std::size(kStopSignals); ++i) sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int interrupt_signal() { return g_signal; }

int interrupt_exit_code(int signal) { return 128 + signal; }

std::string describe_interrupt(int signal) {
  if (signal == SIGINT) return "Ctrl-C (SIGINT)";
  if (signal == SIGHUP) return "SIGHUP (the terminal closed)";
  if (signal == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signal);
}

void stop_if_interrupted() {
  if (const int signal = interrupt_signal(); signal != 0) throw Interrupted(signal);
}

void set_waited_child(pid_t pid) { g_child = pid; }

void ignore_stop_signals_in_child() {
  // Ignored signals stay ignored across exec (Python then installs no KeyboardInterrupt handler).
  for (int signal : kStopSignals) ::signal(signal, SIG_IGN);
}

}  // namespace amplab
