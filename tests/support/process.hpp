// Child processes for tests that run a lab binary: start, read its output, signal it, wait.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace amplab::test {

// A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous store).
int free_port();

class Child {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr both go to one pipe.
  explicit Child(const std::vector<std::string>& argv);
  ~Child();  // kills the child if it still runs
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Reads output until `needle` appears or `timeout_s` passes; true if it appeared.
  bool wait_for_output(const std::string& needle, double timeout_s);
  void signal(int sig);
  // Waits for the exit (reading the rest of the output); returns the exit code, or 128 + signal
  // when a signal ended it, or -1 after `timeout_s` (the child is then killed).
  int wait(double timeout_s);
  const std::string& output() const { return output_; }
  pid_t pid() const { return pid_; }

 private:
  bool read_some(double timeout_s);
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
  bool exited_ = false;
};

// Runs to completion; returns the exit code and fills `output`.
int run(const std::vector<std::string>& argv, std::string* output = nullptr, double timeout_s = 300);

}  // namespace amplab::test
