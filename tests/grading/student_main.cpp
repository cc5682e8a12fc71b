// The main() of the test binaries that run a student's code when scripts/grade grades it. Nothing
// this process says is taken as a verdict: it runs one test and reports, through the pipe the
// grader opened (AMPLAB_OBSERVE_FD), what the test observed (each check's operands, judged.hpp)
// and how it went. A failure it reports costs the test; a pass is only a claim, which the judge (a
// binary linked with the reference, tests/grading/verdict_main.cpp) checks against its own run.
//
// Before anything of the student's can run (a constructor of priority 101 runs ahead of every
// ordinary static initializer of this program), a seccomp filter takes away what no test of lab
// code needs: new processes, exec, ptrace and reading other processes' memory, SysV and POSIX
// message queues and shared memory segments, and network sockets. AMPLAB_SANDBOX_ALLOW (set by the grader
// from the rubric's `allow`) gives some back: "sockets", "processes" (the DDP tests start ranks).
// Frames: M <tests selected>, S <Suite.Test>, P <f|s|o><file:line\nmessage>, E <p|f|s>, R <key>=<value>.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "judged_role.hpp"

#if AMPLAB_WITH_SECCOMP
#include <seccomp.h>
#endif

namespace {

namespace judged = amplab::test::judged;

bool allowed(const char* what) {
  const char* allow = std::getenv("AMPLAB_SANDBOX_ALLOW");
  return allow && std::strstr(allow, what) != nullptr;
}

#if AMPLAB_WITH_SECCOMP
// Returns "" or why the filter could not be installed.
std::string install_filter() {
  scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
  if (!filter) return "seccomp_init failed";
  const uint32_t refuse = SCMP_ACT_ERRNO(EPERM);
  int failed = 0;
  auto deny = [&](int syscall) { failed |= seccomp_rule_add(filter, refuse, syscall, 0); };
  // Memory of other processes, and ways round the filter.
  for (int s : {SCMP_SYS(ptrace), SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev), SCMP_SYS(kcmp),
                SCMP_SYS(pidfd_getfd), SCMP_SYS(unshare), SCMP_SYS(setns), SCMP_SYS(mount), SCMP_SYS(bpf),
                SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd), SCMP_SYS(io_uring_setup), SCMP_SYS(keyctl),
                SCMP_SYS(add_key), SCMP_SYS(request_key)})
    deny(s);
  // SysV and POSIX IPC: what outlives a process and reaches another test's.
  for (int s : {SCMP_SYS(shmget), SCMP_SYS(shmat), SCMP_SYS(shmctl), SCMP_SYS(shmdt), SCMP_SYS(msgget),
                SCMP_SYS(msgsnd), SCMP_SYS(msgrcv), SCMP_SYS(msgctl), SCMP_SYS(semget), SCMP_SYS(semop),
                SCMP_SYS(semtimedop), SCMP_SYS(semctl), SCMP_SYS(mq_open), SCMP_SYS(mq_unlink),
                SCMP_SYS(mq_timedsend), SCMP_SYS(mq_timedreceive), SCMP_SYS(mq_notify), SCMP_SYS(mq_getsetattr)})
    deny(s);
  if (!allowed("processes")) {
    for (int s : {SCMP_SYS(fork), SCMP_SYS(vfork), SCMP_SYS(execve), SCMP_SYS(execveat)}) deny(s);
    // clone3 hides its flags in memory a filter cannot read: ENOSYS makes the C library fall back
    // to clone, whose flags it can. Threads (CLONE_THREAD) stay allowed: torch needs them.
    failed |= seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    failed |= seccomp_rule_add(filter, refuse, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  }
  if (!allowed("sockets")) {
    // Unix sockets stay: the CUDA driver opens one as it starts (and the sandbox's own network and
    // mount namespaces leave them no one else to reach). Network sockets go.
    failed |= seccomp_rule_add(filter, refuse, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
  }
  if (failed == 0) failed = seccomp_load(filter);
  seccomp_release(filter);
  return failed == 0 ? "" : "a seccomp rule was refused (" + std::string(std::strerror(-failed)) + ")";
}
#else
std::string install_filter() { return "this build has no libseccomp"; }
#endif

// Constant-initialized: this runs before any object of this program is constructed, a std::string too.
char filter_problem[256];

__attribute__((constructor(101))) void before_any_static_initializer() {
  if (!std::getenv("AMPLAB_OBSERVE_FD")) return;
  const std::string problem = install_filter();
  std::snprintf(filter_problem, sizeof filter_problem, "%s", problem.c_str());
}

// Reports the test's events; the checks themselves report through judged::observe.
class EventListener : public testing::EmptyTestEventListener {
  void OnTestIterationStart(const testing::UnitTest& unit_test, int) override {
    judged::write_event('M', std::to_string(unit_test.test_to_run_count()));
  }
  void OnTestStart(const testing::TestInfo& test) override {
    amplab::test::judged::start_test();
    judged::write_event('S', std::string(test.test_suite_name()) + "." + test.name());
  }
  void OnTestPartResult(const testing::TestPartResult& part) override {
    const char kind = part.failed() ? 'f' : part.skipped() ? 's' : 'o';
    std::string where = part.file_name() ? std::string(part.file_name()) + ":" + std::to_string(part.line_number())
                                         : std::string("unknown file");
    judged::write_event('P', std::string(1, kind) + where + "\n" + part.message());
  }
  void OnTestEnd(const testing::TestInfo& test) override {
    const testing::TestResult* result = test.result();
    for (int i = 0; i < result->test_property_count(); ++i) {
      const testing::TestProperty& property = result->GetTestProperty(i);
      judged::write_event('R', std::string(property.key()) + "=" + property.value());
    }
    judged::write_event('E', result->Failed() ? "f" : result->Skipped() ? "s" : "p");
  }
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (const char* fd = std::getenv("AMPLAB_OBSERVE_FD")) {
    judged::become_student(std::atoi(fd), /*computes_expected=*/std::getenv("AMPLAB_COMPUTE_EXPECTED") != nullptr);
    unsetenv("AMPLAB_OBSERVE_FD");
    unsetenv("AMPLAB_COMPUTE_EXPECTED");
    if (filter_problem[0] != '\0') judged::write_event('N', std::string("no seccomp filter: ") + filter_problem);
    testing::UnitTest::GetInstance()->listeners().Append(new EventListener);
  }
  return RUN_ALL_TESTS();
}
