#include "process.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <stdexcept>

namespace amplab::test {

// A port below the kernel's ephemeral range (32768 and up), which the kernel never hands out by
// itself: a port taken from bind(0) is free when returned, but the kernel may give it to another
// process's connect() (the next test's ranks open many) before our rank 0 binds it, and a test
// then fails with "address in use" beside the others. Random in [20000, 32000), checked bindable.
int free_port() {
  static std::mt19937 pick(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + static_cast<int>(pick() % 12000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (free) return port;
  }
  throw std::runtime_error("free_port: no free port in [20000, 32000) after 200 tries");
}


namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Child::Child(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
  pid_ = fork();
  if (pid_ == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  fd_ = pipe_fds[0];
}

Child::~Child() {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (fd_ >= 0) close(fd_);
}

bool Child::read_some(double timeout_s) {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout_s * 1000)) <= 0) return false;
  char buffer[4096];
  ssize_t n = read(fd_, buffer, sizeof buffer);
  if (n <= 0) return false;
  output_.append(buffer, static_cast<size_t>(n));
  return true;
}

bool Child::wait_for_output(const std::string& needle, double timeout_s) {
  double deadline = now() + timeout_s;
  while (output_.find(needle) == std::string::npos) {
    double left = deadline - now();
    if (left <= 0 || !read_some(left)) return output_.find(needle) != std::string::npos;
  }
  return true;
}

void Child::signal(int sig) { kill(pid_, sig); }

int Child::wait(double timeout_s) {
  double deadline = now() + timeout_s;
  while (read_some(std::max(0.0, deadline - now()))) {
  }
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      exited_ = true;
      return -1;
    }
    usleep(10000);
  }
  exited_ = true;
  while (read_some(0.01)) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int run(const std::vector<std::string>& argv, std::string* output, double timeout_s) {
  Child child(argv);
  int code = child.wait(timeout_s);
  if (output) *output = child.output();
  return code;
}

}  // namespace amplab::test
