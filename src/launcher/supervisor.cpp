#include "supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>

namespace amplab::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// Signal handlers only write the signal's number here; the poll loop reads it. (The classic
// self-pipe: poll wakes up at once, and nothing unsafe runs inside a handler.)
int g_signal_pipe[2] = {-1, -1};

void on_signal(int signo) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void set_nonblocking_cloexec(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

// Writes everything (the launcher's stdout may be a slow pipe). Drops the rest when the reader
// went away: the workers keep running.
void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 100);
      continue;
    }
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void say(const std::string& line) {
  std::string text = "amplab-run: " + line + "\n";
  write_all(STDERR_FILENO, text.data(), text.size());
}

// One of a worker's output streams: bytes in, prefixed lines out.
struct Stream {
  int fd = -1;      // read end of the pipe; -1 once it reached EOF
  int out_fd = -1;  // where lines go: the launcher's stdout or stderr
  std::string pending;

  // Emits every complete line ('\n', or '\r' so progress bars keep redrawing in place), each
  // behind `prefix`; a line longer than 64 KiB is cut rather than buffered without bound.
  void emit(const std::string& prefix, bool flush_all) {
    size_t start = 0;
    for (;;) {
      size_t end = pending.find_first_of("\r\n", start);
      if (end == std::string::npos) break;
      std::string line = prefix + pending.substr(start, end - start + 1);
      write_all(out_fd, line.data(), line.size());
      start = end + 1;
    }
    pending.erase(0, start);
    if (!pending.empty() && (flush_all || pending.size() > 65536)) {
      std::string line = prefix + pending + "\n";
      write_all(out_fd, line.data(), line.size());
      pending.clear();
    }
  }
};

struct Running {
  const Worker* spec = nullptr;
  pid_t pid = -1;
  bool alive = false;
  bool stopped = false;  // the launcher sent it SIGTERM because another worker failed
  int status = 0;        // waitpid's, once it ended
  Clock::time_point ended{};
  Stream out, err;
  std::string prefix;  // "[rank N] "
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + signal_name(WTERMSIG(status));
  return "ended with status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// "12.3 s"
std::string seconds_between(Clock::time_point from, Clock::time_point to) {
  auto tenths = std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count() / 100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}

// A rank that ended well while others still run, long after: they probably wait for it in a
// collective until their own timeout. Said once, naming the rank, its code and when it ended.
constexpr auto kLonelyAfter = std::chrono::seconds(10);
void report_early_exit(const std::vector<Running>& workers, Clock::time_point started, bool& said) {
  if (said) return;
  const auto now = Clock::now();
  std::string running;
  const Running* gone = nullptr;
  for (const auto& w : workers) {
    if (w.alive) running += (running.empty() ? "" : ", ") + std::to_string(w.spec->rank);
    else if (!gone && !failed(w.status) && now - w.ended > kLonelyAfter) gone = &w;
  }
  if (!gone || running.empty()) return;
  said = true;
  say("rank " + std::to_string(gone->spec->rank) + " (pid " + std::to_string(gone->pid) + ") exited with code 0 after " +
      seconds_between(started, gone->ended) + "; rank(s) " + running + " still running " + seconds_between(gone->ended, now) +
      " later (if they wait for it, they stop at their timeout, dist.timeout_s; Ctrl-C stops them now)");
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// fork + exec of one worker. Returns an error message when exec failed (the child reports
// errno through a close-on-exec pipe: it closes unread on success).
std::optional<std::string> start(Running& w, const std::vector<std::string>& command) {
  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0 || pipe2(exec_pipe, O_CLOEXEC) != 0)
    return std::string("cannot create pipes: ") + std::strerror(errno);
  std::vector<char*> argv = c_strings(command);
  std::vector<char*> envp = c_strings(w.spec->env);
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) return std::string("fork failed: ") + std::strerror(errno);
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    setpgid(0, 0);                          // its own process group: the terminal's Ctrl-C goes to the launcher only
    prctl(PR_SET_PDEATHSIG, SIGKILL);       // dies with the launcher, even if the launcher is SIGKILLed
    if (getppid() != parent) _exit(127);    // the launcher died before prctl
    for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGHUP, SIGPIPE}) signal(s, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(exec_pipe[0]);
    execvpe(argv[0], argv.data(), envp.data());
    int error = errno;
    [[maybe_unused]] ssize_t n = write(exec_pipe[1], &error, sizeof error);
    _exit(127);
  }

  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  int child_errno = 0;
  ssize_t got;
  do got = read(exec_pipe[0], &child_errno, sizeof child_errno);
  while (got < 0 && errno == EINTR);
  close(exec_pipe[0]);
  w.pid = pid;
  w.alive = true;
  w.out.fd = out_pipe[0];
  w.err.fd = err_pipe[0];
  set_nonblocking_cloexec(w.out.fd);
  set_nonblocking_cloexec(w.err.fd);
  if (got == static_cast<ssize_t>(sizeof child_errno))
    return "cannot start '" + command[0] + "': " + std::strerror(child_errno);
  return std::nullopt;
}

void signal_all(std::vector<Running>& workers, int signo) {
  for (auto& w : workers)
    if (w.alive) kill(w.pid, signo);
}

// Reads what a stream has now; closes it at EOF.
void pump(Stream& s, const std::string& prefix) {
  char buffer[65536];
  for (;;) {
    ssize_t n = read(s.fd, buffer, sizeof buffer);
    if (n > 0) {
      s.pending.append(buffer, static_cast<size_t>(n));
      s.emit(prefix, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    close(s.fd);  // EOF or error
    s.fd = -1;
    s.emit(prefix, true);
    return;
  }
}

// Sets up the self-pipe and the handlers that write to it; false, having said why, when the pipe
// cannot be made.
bool install_signal_pipe() {
  if (g_signal_pipe[0] > 0) {  // a previous run's (a restart)
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
  }
  if (pipe(g_signal_pipe) != 0) {
    say(std::string("cannot create a pipe: ") + std::strerror(errno));
    return false;
  }
  set_nonblocking_cloexec(g_signal_pipe[0]);
  set_nonblocking_cloexec(g_signal_pipe[1]);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(s, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher (and with it the workers)
  return true;
}

// One run of the workers: started, watched until all have ended, and summed up in an exit code.
class Supervision {
 public:
  explicit Supervision(const SupervisorOptions& options) : options_(options), workers_(options.workers.size()) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      Running& w = workers_[i];
      w.spec = &options.workers[i];
      w.prefix = "[rank " + std::to_string(w.spec->rank) + "] ";
      w.out.out_fd = STDOUT_FILENO;
      w.err.out_fd = STDERR_FILENO;
    }
  }

  // fork + exec of every worker; one that cannot start stops those already running.
  void start_all() {
    for (auto& w : workers_) {
      if (auto error = start(w, options_.command)) {
        start_error_ = error;
        stop_all();
        break;
      }
    }
    started_ = Clock::now();
  }

  // Relays output and signals, reaps the workers and stops the rest after a failure, until every
  // worker has ended and its output is drained.
  void watch() {
    while (!finished()) {
      pump_ready_streams();
      forward_signals();
      reap();
      if (!ending()) report_early_exit(workers_, started_, said_early_exit_);
      if (kill_pending_ && Clock::now() >= kill_at_) {
        signal_all(workers_, SIGKILL);
        kill_pending_ = false;
      }
    }
    for (auto& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) close(s->fd);
        s->emit(w.prefix, true);
      }
    }
  }

  // The launcher's exit code (supervisor.hpp), after a line on stderr saying why when it is not 0.
  int report(bool* interrupted) const {
    if (start_error_) {
      say(*start_error_);
      return 127;
    }
    if (interrupt_signal_ != 0) {
      if (interrupted) *interrupted = true;
      say("stopped after " + signal_name(interrupt_signal_));
      return 128 + interrupt_signal_;
    }
    if (failure_) {
      report_failure(workers_[*failure_]);
      return exit_code_of(workers_[*failure_].status);
    }
    return 0;
  }

 private:
  // A start error, a failed worker or a signal to the launcher: the run is ending.
  bool ending() const { return failure_ || start_error_ || interrupt_signal_ != 0; }

  void stop_all() {
    for (auto& w : workers_) w.stopped = w.alive;
    signal_all(workers_, SIGTERM);
    kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options_.grace_s * 1000));
    kill_pending_ = true;
  }

  // Every worker ended and its pipes closed, or still open a second after the last exit.
  bool finished() {
    bool any_alive = false, any_open = false;
    for (auto& w : workers_) {
      any_alive |= w.alive;
      any_open |= w.out.fd >= 0 || w.err.fd >= 0;
    }
    if (any_alive) return false;
    if (!any_open) return true;
    if (!drain_until_) drain_until_ = Clock::now() + std::chrono::seconds(1);
    return Clock::now() > *drain_until_;
  }

  // Waits up to 100 ms for output or a signal, then relays the output that came.
  void pump_ready_streams() {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Stream*, const std::string*>> streams;
    for (auto& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.emplace_back(s, &w.prefix);
      }
    }
    poll(fds.data(), fds.size(), 100);
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents != 0) pump(*streams[i - 1].first, *streams[i - 1].second);
  }

  // SIGINT/SIGTERM/SIGHUP to the launcher: forwarded (SIGHUP as SIGTERM); the third, SIGKILL.
  void forward_signals() {
    unsigned char signo;
    while (read(g_signal_pipe[0], &signo, 1) == 1) {
      if (signo != SIGINT && signo != SIGTERM && signo != SIGHUP) continue;  // SIGCHLD: reaped below
      ++interrupts_;
      if (interrupt_signal_ == 0) {
        interrupt_signal_ = signo;
        say("got " + signal_name(signo) + ": forwarding it to the workers (twice more to kill them)");
      }
      if (interrupts_ >= 3) signal_all(workers_, SIGKILL);
      else signal_all(workers_, signo == SIGHUP ? SIGTERM : signo);
    }
  }

  // Collects the workers that ended; the first failure stops the others.
  void reap() {
    for (size_t i = 0; i < workers_.size(); ++i) {
      Running& w = workers_[i];
      if (!w.alive) continue;
      pid_t done = waitpid(w.pid, &w.status, WNOHANG);
      if (done != w.pid) continue;
      w.alive = false;
      w.ended = Clock::now();
      if (failed(w.status) && !ending()) {
        failure_ = i;
        stop_all();
      }
    }
  }

  // Names the failed rank, the ranks stopped because of it and any other that failed on its own.
  void report_failure(const Running& w) const {
    std::string stopped, also_failed;
    for (const auto& o : workers_) {
      if (&o == &w) continue;
      bool ended_by_us = o.stopped && WIFSIGNALED(o.status) &&
                         (WTERMSIG(o.status) == SIGTERM || WTERMSIG(o.status) == SIGKILL);
      if (ended_by_us) stopped += (stopped.empty() ? "" : ", ") + std::to_string(o.spec->rank);
      else if (failed(o.status))
        also_failed += "; rank " + std::to_string(o.spec->rank) + " also failed: it " + describe_status(o.status);
    }
    say("rank " + std::to_string(w.spec->rank) + " (local rank " + std::to_string(w.spec->local_rank) + ", pid " +
        std::to_string(w.pid) + ", " + seconds_between(started_, w.ended) + " after the start) " + describe_status(w.status) +
        (stopped.empty() ? "" : "; stopped the other ranks (" + stopped + ")") + also_failed);
  }

  const SupervisorOptions& options_;
  std::vector<Running> workers_;
  std::optional<size_t> failure_;  // index of the first worker that failed
  std::optional<std::string> start_error_;
  int interrupt_signal_ = 0, interrupts_ = 0;
  bool kill_pending_ = false;  // SIGTERM'd workers get SIGKILL at kill_at_
  Clock::time_point kill_at_{};
  Clock::time_point started_{};
  bool said_early_exit_ = false;
  std::optional<Clock::time_point> drain_until_;  // after the last exit, stray grandchildren may hold pipes
};

}  // namespace

std::string signal_name(int signo) {
  switch (signo) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    case SIGQUIT: return "SIGQUIT";
    default: return "signal " + std::to_string(signo);
  }
}

int supervise(const SupervisorOptions& options, bool* interrupted) {
  if (interrupted) *interrupted = false;
  if (!install_signal_pipe()) return 1;
  Supervision run(options);
  run.start_all();
  run.watch();
  return run.report(interrupted);
}

}  // namespace amplab::launcher
