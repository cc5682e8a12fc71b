// The seccomp filter of the student's test process (tests/grading/student_main.cpp), tried from a
// test as student code would: with AMPLAB_OBSERVE_FD set (a graded run), new processes, exec,
// network sockets, SysV and POSIX IPC and ptrace are refused; threads and Unix sockets, which
// torch and the CUDA driver need, still work.
// ctest: grading_seccomp_filter (run with AMPLAB_OBSERVE_FD pointing at /dev/null).
#include <gtest/gtest.h>
#include <mqueue.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

namespace {

bool graded() { return std::getenv("AMPLAB_SANDBOX_ALLOW") != nullptr; }

TEST(SeccompFilter, RefusesNewProcessesExecSocketsIpcAndPtrace) {
  if (!graded()) GTEST_SKIP() << "run by ctest as a graded run (AMPLAB_OBSERVE_FD and AMPLAB_SANDBOX_ALLOW set)";
  pid_t child = fork();
  if (child == 0) _exit(0);
  EXPECT_EQ(child, -1) << "fork()";
  EXPECT_EQ(errno, EPERM);
  char* argv[] = {const_cast<char*>("/bin/true"), nullptr};
  EXPECT_EQ(execv("/bin/true", argv), -1) << "exec";
  EXPECT_EQ(socket(AF_INET, SOCK_STREAM, 0), -1) << "a network socket";
  EXPECT_EQ(socket(AF_INET6, SOCK_DGRAM, 0), -1) << "a network socket";
  EXPECT_EQ(msgget(IPC_PRIVATE, IPC_CREAT | 0600), -1) << "a SysV message queue";
  EXPECT_EQ(shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600), -1) << "a SysV shared memory segment";
  EXPECT_EQ(mq_open("/amplab-probe", O_CREAT | O_RDWR, 0600, nullptr), static_cast<mqd_t>(-1)) << "a POSIX queue";
  EXPECT_EQ(ptrace(PTRACE_TRACEME, 0, nullptr, nullptr), -1) << "ptrace";
}

TEST(SeccompFilter, ThreadsAndUnixSocketsStillWork) {  // torch needs threads, the CUDA driver a Unix socket
  const int unix_socket = socket(AF_UNIX, SOCK_STREAM, 0);
  EXPECT_GE(unix_socket, 0);
  if (unix_socket >= 0) close(unix_socket);
  int value = 0;
  std::thread worker([&] { value = 42; });
  worker.join();
  EXPECT_EQ(value, 42);
}

}  // namespace
