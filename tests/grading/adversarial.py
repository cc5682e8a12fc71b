#!/usr/bin/env python3
"""The grader against submissions that cheat: each case is a submission (the untouched starter or
the reference, with a cheat attached), graded by scripts/grade as Gradescope would (as root, on
the lab's TODO named below), and the score it must get: what the same submission earns without
the cheat. Every case also checks that no line of solution/ or tests/hidden/ appears in
results.json or the grader's output, that no process of the student's user is left, that the
checkout is unchanged, and that no test's log is over 1 MB.

    tests/grading/adversarial.py                 # every case (about 5 minutes on 2 cores)
    tests/grading/adversarial.py --only flood    # the cases whose name contains 'flood'
    tests/grading/adversarial.py --list
    tests/grading/adversarial.py --autograder /tmp/ag   # through Gradescope's zip, set up in /tmp/ag
                                                        # (scripts/make-autograder's docstring)

Needs root (the grader isolates student code only then) and an instructor checkout (solution/);
exits 77 (ctest: skipped) without them. ctest: grading_adversarial.

Each case is proved once per set of inputs. Its outcome is recorded in tests/certified/adversarial.json
with the digest of what it rests on: the case's own text and target, the grader, the core, the
target lab's code and its graded tests' file, the machine's software, and what the sandbox can do here
(root, namespaces, seccomp, the GPUs given). A run grades again every case whose digest moved or whose
outcome was not ok, plus SPOT_CHECKS cases picked at random among the rest (a recorded outcome a fresh
run contradicts discards the record), and writes the record again: commit it with the change
(--full grades every case; --only grades the chosen ones and leaves the record as it is).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import pwd
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import amplab_certified as certified  # noqa: E402
import amplab_rubric as rubric  # noqa: E402
import amplab_sandbox as sandbox  # noqa: E402

SPOT_CHECKS = 1  # cases whose record holds that are graded again anyway

LAB = "amp_training"
FILE = "grad_scaler.cpp"
# What a case submits and is graded on: the lab, the student's file, the TODO. Most cases attack
# amp_training's TODO 1; a case names another target as a fourth element of its CASES entry.
DEFAULT_TARGET = {"lab": LAB, "file": FILE, "todo": "amp_training-1"}
HOLE = '  AMPLAB_TODO("amp_training-1");\n'
SCALE_BODY = """  if (!enabled_) return loss;
  if (!scale_.defined()) {
    scale_ = torch::full({}, init_scale_, torch::dtype(torch::kFloat32).device(loss.device()));
    growth_tracker_ = torch::full({}, init_growth_tracker_, torch::dtype(torch::kInt32).device(loss.device()));
  }
  return loss * scale_;
"""
INCLUDES = "#include <fcntl.h>\n#include <signal.h>\n#include <sys/socket.h>\n#include <netinet/in.h>\n" \
           "#include <sys/ipc.h>\n#include <sys/msg.h>\n" \
           "#include <arpa/inet.h>\n#include <unistd.h>\n#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n" \
           "#include <filesystem>\n#include <fstream>\n#include <iostream>\n#include <sstream>\n#include <string>\n"

# Cheats, as C++ put in the hole's body (BODY) or at the end of the file (GLOBAL).
ENV_SWITCH = """
namespace { struct FlipTheSwitch { FlipTheSwitch() { setenv("AMPLAB_STUDENT_TODOS", "none", 1); } } flip_the_switch; }
"""
FORGE_REPORT = r"""
namespace {
struct Forge {
  Forge() {
    std::ifstream in("/proc/self/cmdline");
    std::stringstream all_args;
    all_args << in.rdbuf();
    std::string all = all_args.str(), filter, report;
    for (size_t pos = 0; pos < all.size();) {
      std::string arg = all.c_str() + pos;
      pos += arg.size() + 1;
      if (arg.rfind("--gtest_output=json:", 0) == 0) report = arg.substr(20);
      if (arg.rfind("--gtest_filter=", 0) == 0) filter = arg.substr(15);
    }
    const std::string suite = filter.substr(0, filter.find('.')), name = filter.substr(filter.find('.') + 1);
    if (!report.empty()) {
      std::ofstream out(report);
      out << "{\"testsuites\":[{\"name\":\"" << suite << "\",\"testsuite\":[{\"name\":\"" << name
          << "\",\"status\":\"RUN\",\"result\":\"COMPLETED\"}]}]}";
    }
    const std::string lines = "x main 1\nx start " + filter + "\nx end passed -\n";
    for (int fd = 3; fd < 1024; ++fd) (void)!write(fd, lines.data(), lines.size());
    std::printf("[       OK ] %s (1 ms)\n[  PASSED  ] 1 test.\n", filter.c_str());
    std::fflush(stdout);
    _Exit(0);
  }
} forge;
}
"""
LEAK = r"""
namespace {
struct Leak {
  Leak() {
    const char* root = std::getenv("AMPLAB_SOURCE_DIR");
    const std::string base = root ? root : ".";
    for (const char* dir : {"/solution", "/tests/hidden", "/build/student", "/build", "/.git", "/../results"}) {
      try {
        for (const auto& entry : std::filesystem::recursive_directory_iterator(base + dir)) {
          if (!entry.is_regular_file()) continue;
          std::ifstream in(entry.path());
          std::cout << "LEAK " << entry.path() << "\n" << in.rdbuf() << "\n";
        }
      } catch (const std::exception& e) {
        std::cout << "cannot read " << dir << ": " << e.what() << "\n";
      }
    }
  }
} leak;
}
"""
DAEMON = r"""
  if (fork() == 0) {
    setsid();
    if (fork() == 0) {
      sleep(4);
      const char* root = std::getenv("AMPLAB_SOURCE_DIR");
      const std::string base = root ? root : ".";
      for (const std::string path : {base + "/../results/results.json", std::string("/autograder/results/results.json"),
                                     base + "/../run_autograder", base + "/scripts/grade"}) {
        std::ofstream out(path);
        out << "{\"score\": 1000}\n";
      }
      _exit(0);
    }
    _exit(0);
  }
  return loss;
"""
FLOOD = r"""
  std::string block(1 << 20, 'y');
  for (int i = 0; i < 300; ++i) std::fwrite(block.data(), 1, block.size(), stdout);
  return loss;
"""
FORK_BOMB = r"""
  for (int i = 0; i < 100000; ++i) {
    pid_t child = fork();
    if (child < 0) break;
    if (child == 0) for (;;) pause();
  }
  return loss;
"""
CONNECT = r"""
  int sock = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(PORT);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (sock >= 0 && connect(sock, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) (void)!write(sock, "LEAK", 4);
  if (sock >= 0) close(sock);
"""
NETWORK = CONNECT + "  return loss;\n"
WRITE_OUTSIDE = r"""
  const char* root = std::getenv("AMPLAB_SOURCE_DIR");
  const std::string base = root ? root : ".";
  for (const std::string path : {base + "/scripts/grade", base + "/tests/labs/amp_training_test.cpp",
                                 base + "/labs/amp_training/rubric.yaml", base + "/pwned.txt",
                                 std::string("/tmp/amplab-adversarial-left-behind")}) {
    std::ofstream out(path, std::ios::app);
    out << "pwned\n";
  }
  return loss;
"""


# The attacks that beat the grader before its verdict moved out of the student's process.
LIBC_WRITE = r"""
#include <sys/syscall.h>
extern "C" ssize_t write(int fd, const void* data, size_t size) {
  std::string text(static_cast<const char*>(data), size);
  for (size_t at; (at = text.find("end failed")) != std::string::npos;) text.replace(at, 10, "end passed");
  for (size_t at; (at = text.find(" part failure ")) != std::string::npos;) text.replace(at, 14, " part success ");
  return syscall(SYS_write, fd, text.data(), text.size()) < 0 ? -1 : static_cast<ssize_t>(size);
}
"""
FORK_TOKEN = r"""
  int pipe_fds[2];
  if (pipe(pipe_fds) == 0) {
    pid_t child = fork();
    if (child == 0) {
      for (int fd = 3; fd < 64; ++fd) if (fd != pipe_fds[1]) dup2(pipe_fds[1], fd);
      throw std::runtime_error("make the listener talk");
    }
    char buffer[4096];
    ssize_t n = read(pipe_fds[0], buffer, sizeof buffer);
    std::string lines(buffer, n > 0 ? n : 0), token = lines.substr(0, lines.find(' '));
    const std::string forged = token + " end passed -\n";
    for (int fd = 3; fd < 64; ++fd) (void)!::write(fd, forged.data(), forged.size());
  }
  return loss;
"""
LINE_DIRECTIVE = """
#line 40 "../../solution/amp_training/grad_scaler.cpp"
  this is not code; neither is this line
"""
SYSV_NEIGHBOUR = r"""
  int queue = msgget(0x414d504c, IPC_CREAT | 0666);
  struct { long type; char text[64]; } message{1, "the reference of another TODO"};
  if (queue >= 0) msgsnd(queue, &message, sizeof message.text, IPC_NOWAIT);
  return loss;
"""
ALLOCATOR = """
#include <new>
void* operator new(std::size_t size) {  // a hook that runs inside every check of the test
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
"""
ROLE_INTERPOSED = """
extern "C" int _ZN6amplab4test6judged4roleEv() { return 0; }  // amplab::test::judged::role(): "a plain run"
"""

# The test's own comparison (amplab::test::detail::tensors_close) redefined to say "close" whatever
# the tensors: a process that compares for itself would pass what it should fail. Its return value,
# a testing::AssertionResult (success flag, no message), comes back through the hidden pointer.
COMPARISON_INTERPOSED = """
extern "C" void* _ZN6amplab4test6detail13tensors_closeERKN2at6TensorES5_dd(void* result, const void*, const void*,
                                                                         double, double) {
  static_cast<unsigned char*>(result)[0] = 1;
  static_cast<void**>(result)[1] = nullptr;
  return result;
}
"""


def raw_string_across_holes():
    """TODO 1 filled; a raw string opened before unscale_ (TODO 2, the reference in this variant)
    and closed after it, printed by TODO 1: the reference's body would be inside the string."""
    lines = with_body(SCALE_BODY.replace("  return loss * scale_;", "  std::printf(\"%s\\n\", leaked());\n"
                                         "  return loss * scale_;"), includes=False).splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("void GradScaler::unscale_"))
    end = next(i for i in range(at, len(lines)) if lines[i].rstrip() == "}")
    scale = next(i for i, line in enumerate(lines) if line.startswith("torch::Tensor GradScaler::scale("))
    lines.insert(scale, "const char* leaked();\n")  # in the lab's namespace, where leaked() is defined below
    at, end = at + 1, end + 1
    head = "#include <cstdio>\n"
    again = 'void GradScaler::unscale_(torch::optim::Optimizer& o) { AMPLAB_TODO("amp_training-2"); }\n'
    return head + "".join(lines[:at]) + 'static const char* kLeak = R"leak(\n' + "".join(lines[at:end + 1]) + \
        ')leak";\nconst char* leaked() { return kLeak; }\n' + again + "".join(lines[end + 1:])


def starter_text():
    return (ROOT / "starter" / LAB / FILE).read_text()


def solution_text():
    return (ROOT / "solution" / LAB / FILE).read_text()


EXIT_HANDLER = r"""  std::atexit([] {
    std::printf("[       OK ] AmpTraining1_Scale.MultipliesByTheScaleMadeLazilyOnTheLossDevice (0 ms)\n"
                "[  PASSED  ] 1 test.\n");
    std::fflush(stdout);
    _exit(0);
  });
  return loss;
"""

# Runs after main() returns, from the ELF's destructor array: no __cxa_atexit, nothing before main();
# the attribute split over two lines, in GCC's other spellings (__attribute, __destructor__).
DESTRUCTOR_FORGE = r"""
__attribute((
    __destructor__)) static void forge_the_end() {
  std::printf("[       OK ] AmpTraining1_Scale.MultipliesByTheCurrentScaleAfterUpdate (0 ms)\n"
              "[  PASSED  ] 7 tests.\n");
  std::fflush(stdout);
}
"""

# In TODO 1's body, once, before the scale exists: is update() (TODO 4) the reference's in this
# binary? The starter's throws NotImplemented; the reference's throws amplab::Error (no scale yet)
# before it changes anything. If it is, print its machine code (the first 512 bytes), marked for the
# check.
REFERENCE_PROBE = r"""  static bool probed = false;
  bool reference_here = false;
  if (!probed && enabled_ && !scale_.defined()) {
    probed = true;
    try {
      update();
    } catch (const amplab::NotImplemented&) {
    } catch (const std::exception&) {
      reference_here = true;
    }
  }
  if (reference_here) {
    void (GradScaler::*method)() = &GradScaler::update;  // virtual: 1 + its offset in the vtable
    std::uintptr_t raw = 0;
    std::memcpy(&raw, &method, sizeof raw);
    void** vtable = *reinterpret_cast<void***>(this);
    const unsigned char* code = static_cast<const unsigned char*>(
        (raw & 1) ? vtable[(raw - 1) / sizeof(void*)] : reinterpret_cast<void*>(raw));
    std::printf("LEAK the reference's update() is in this binary:");
    for (int i = 0; i < 512; ++i) std::printf(" %02x", code[i]);
    std::printf("\n");
  }
"""


def reference_probe_after_update(then, stream="stdout"):
    """REFERENCE_PROBE writing to `stream`, in the one test whose scale has moved (after an update),
    followed by `then` (C++ run after the bytes are written)."""
    probe = REFERENCE_PROBE.replace("  if (reference_here) {", "  static bool seen = false;\n  seen = seen || reference_here;\n"
                                    "  if (seen && scale_.defined() && scale_.item<float>() != init_scale_) {")
    probe = probe.replace('    std::printf("\\n");\n  }\n', '    std::printf("\\n");\n    std::fflush(stdout);\n' + then + "  }\n")
    if stream == "stderr":  # through fputs and snprintf, both vetted
        probe = probe.replace('std::printf("LEAK', 'std::fputs("LEAK').replace('in this binary:");', 'in this binary:", stderr);')
        probe = probe.replace('std::printf(" %02x", code[i]);',
                              '{\n      char hex[4];\n      std::snprintf(hex, sizeof hex, " %02x", code[i]);\n'
                              '      std::fputs(hex, stderr);\n    }')
        probe = probe.replace('std::printf("\\n");', 'std::fputs("\\n", stderr);').replace("std::fflush(stdout)",
                                                                                          "std::fflush(stderr)")
    return probe


def with_body(body, includes=True):
    text = starter_text().replace(HOLE, body)
    return (INCLUDES if includes else "") + text


# The reference's source read by the assembler into the student's object (its path built from the
# checkout being graded, where the grader compiles), then printed by TODO 1: without the screen's
# refusal of inline assembly its lines reach the output, which every case checks.
INCBIN = INCLUDES + (
    'asm(".pushsection .rodata\\n.globl amplab_blob\\namplab_blob:\\n.incbin \\"'
    + str(ROOT / "solution" / LAB / FILE) + '\\"\\n.byte 0\\n.popsection");\n'
    'extern "C" const char amplab_blob[];\n')
PRINT_INCBIN = "  std::cout << amplab_blob << std::endl;\n  return loss;\n"

# The cheats in a TODO's body end with `return loss;`: without the cheat that earns the points of
# the one test it passes honestly (a disabled scaler passes the loss through).
PASS_THROUGH = ("only", ["AmpTraining1_Scale.DisabledIsAPassThrough"])
# A file refused for what it defines, calls or runs before main() is graded as the untouched
# starter's copy (the note says why): it earns 0 for TODO 1, whatever else it holds.
REFUSED = "zero"

CASES = {
    # name: (the submission's grad_scaler.cpp, what it earns without the cheat: "zero" | "full" |
    #        ("full-minus", tests) | ("only", tests), what it tries)
    "env switch on the untouched starter": (starter_text() + INCLUDES + ENV_SWITCH, "zero",
                                            "a static initializer asks for the reference in every hole"),
    "include the solution": ('#include "../../solution/amp_training/grad_scaler.cpp"\n', "zero",
                             "the whole file is the reference, by #include"),
    "incbin the solution": (INCBIN + with_body(PRINT_INCBIN, includes=False), REFUSED,
                            "the assembler reads the reference (by its path in the checkout graded) into the binary, "
                            "and TODO 1 prints it"),
    "forged report": (starter_text() + INCLUDES + FORGE_REPORT, "zero",
                      "a static initializer writes a passing gtest report and verdict lines, then exits 0"),
    "leak the answers": (starter_text() + INCLUDES + LEAK, "zero",
                         "a static initializer prints solution/, tests/hidden/, the builds and git"),
    "detached rewriter": (with_body(DAEMON), REFUSED,
                          "a detached process rewrites results.json, run_autograder and the grader later"),
    "flood the output": (with_body(FLOOD), PASS_THROUGH, "a TODO prints 300 MB"),
    "fork bomb": (with_body(FORK_BOMB), REFUSED, "a TODO forks until it cannot"),
    "network": (with_body(NETWORK), REFUSED, "a TODO connects to a server on the machine's loopback"),
    "write outside": (with_body(WRITE_OUTSIDE), REFUSED, "a TODO writes into the checkout, the grader and /tmp"),
    "libc write": (starter_text() + INCLUDES + LIBC_WRITE, REFUSED,
                   "the untouched starter plus a write() that turns the grader's failed lines into passed ones"),
    "fork steals the token": (with_body(FORK_TOKEN), REFUSED,
                              "a forked child makes the verdict listener write into its pipe; the parent forges a pass"),
    "raw string across holes": (raw_string_across_holes(), ("only", ["AmpTraining1_Scale.MultipliesByTheScaleMadeLazilyOnTheLossDevice"]),
                                "a raw string opened before another TODO's hole and closed after it, printed by TODO 1: "
                                "graded as a whole, so no reference is put inside it"),
    "line directive": (with_body(LINE_DIRECTIVE), REFUSED,
                       "#line pointing at the solution, then errors: the compiler would quote the solution's lines"),
    "neighbour over SysV IPC": (with_body(SYSV_NEIGHBOUR), REFUSED,
                                "a message queue that outlives the test, for the test beside it"),
    "honest code with the allocator replaced": (solution_text() + INCLUDES + ALLOCATOR, REFUSED,
                                                "correct code plus a global operator new: a hook into every "
                                                "allocation of the test, where the expected values are"),
    "judge's role interposed": (solution_text() + ROLE_INTERPOSED, REFUSED,
                                "correct code that also redefines the observations' switch so its process reports nothing"),
    "marker left after the code": (starter_text().replace(HOLE, SCALE_BODY + HOLE), "full",
                                   "honest code with its AMPLAB_TODO line left below the return"),
    "honest code with cheats attached": (solution_text() + INCLUDES + ENV_SWITCH + LEAK, REFUSED,
                                         "the reference's code (a correct submission) plus the switch and the leak: "
                                         "refused for its static initializers, as a whole"),
    "honest code printing": (solution_text().replace("  return loss * scale_;\n", "  std::printf(\"scaled\\n\");\n"
                                                                                 "  return loss * scale_;\n"), "full",
                             "the reference's code with a debugging printf: printing is lab code's right"),
    "op observers switched off": ("#include <ATen/record_function.h>\n" + with_body(
        SCALE_BODY.replace("  return loss * scale_;", "  at::clearThreadLocalCallbacks();\n  at::enableRecordFunction(false);\n"
                                                       "  return loss * scale_;")), REFUSED,
                                  "honest TODO 1 code that also clears the ops' observers, through which a graded test "
                                  "watches which kernels a TODO calls (TODO 4 must not hand its state machine to "
                                  "PyTorch's fused kernel): refused for the calls, as a whole"),
    "op observers switched off through their thread state": ("#include <ATen/record_function.h>\n" + with_body(
        SCALE_BODY.replace("  return loss * scale_;", "  auto observers = at::get_record_function_tls_();\n"
                                                       "  observers.tls_record_function_enabled_ = false;\n"
                                                       "  at::set_record_function_tls_(observers);\n"
                                                       "  return loss * scale_;")), REFUSED,
        "honest TODO 1 code that turns the ops' observers off by writing their thread-local state rather than "
        "through enableRecordFunction (a graded test counts a TODO's matrix products through them): refused "
        "for the call, as a whole"),
    "exit handler forges the end": (with_body(EXIT_HANDLER), REFUSED,
                                    "a TODO registers an exit handler (no static initializer): after the failed "
                                    "tests it prints gtest's passing lines and exits 0"),
    "comparison interposed": (solution_text().replace("  return loss * scale_;\n", "  return loss * init_scale_;\n")
                              + COMPARISON_INTERPOSED, REFUSED,
                              "the plausible bug below (the initial scale) plus a redefinition of the tests' own "
                              "tensor comparison that calls everything close: a second definition of a symbol the "
                              "tests define, which the link refuses (the lab does not build)"),
    "tensor allocator replaced": ("#include <c10/core/CPUAllocator.h>\n" + with_body(
        SCALE_BODY.replace("  return loss * scale_;", "  static c10::Allocator* mine = c10::GetCPUAllocator();\n"
                                                       "  c10::SetCPUAllocator(mine, /*priority=*/255);\n"
                                                       "  return loss * scale_;")), REFUSED,
        "honest TODO 1 code that also puts an allocator of its own above every other: graded tests count a "
        "TODO's tensor allocations through torch's CPU allocator (lab 3's counter), which this would take out of "
        "their sight: refused for the call, as a whole"),
    "kernel registered over ATen's": ("#include <torch/library.h>\n" + with_body(
        SCALE_BODY.replace("  return loss * scale_;",
                           "  static torch::Library mine(torch::Library::IMPL, \"aten\", c10::DispatchKey::CPU, __FILE__, __LINE__);\n"
                           "  static bool once = (mine.impl(\"isclose\", +[](const at::Tensor& a, const at::Tensor& b, double, double,\n"
                           "                                               bool) { return at::ones_like(a, at::kBool); }), true);\n"
                           "  (void)once;\n"
                           "  return loss * scale_;")), REFUSED,
        "honest TODO 1 code that also registers, at its first call, a CPU kernel of its own for aten::isclose: "
        "the dispatcher would run it inside every comparison the test process makes, and any op can be taken "
        "over the same way: refused for the registration, as a whole"),
    "destructor forges the end": (
        "#include <cstdio>\n" + solution_text().replace("  return loss * scale_;\n", "  return loss * init_scale_;\n")
        + DESTRUCTOR_FORGE, "zero",
        "the plausible bug below (the initial scale) plus a function the loader runs after main() returns "
        "(__attribute((__destructor__)) split over two lines; no static initializer, no exit handler) that prints "
        "the failed test's passing lines and a clean summary: the source screen reads attributes across lines and "
        "in every spelling, and refuses the file (the object check would refuse its .fini_array too)"),
    "the reference's machine code printed": (
        with_body(REFERENCE_PROBE + SCALE_BODY.replace("  return loss * scale_;\n", "  return loss * init_scale_;\n")),
        ("full-minus", ["AmpTraining1_Scale.MultipliesByTheCurrentScaleAfterUpdate"]),
        "the plausible bug below (the initial scale) in the untouched starter, whose TODO 1 also finds out whether "
        "update() (TODO 4, empty in this submission) is the reference's in its binary, and if so prints its machine "
        "code, which a disassembler turns back into the reference: a test graded in a binary holding the "
        "reference's code of other TODOs shows the student nothing that binary printed, only the same test run "
        "again with the student's code alone"),
    "the reference's machine code printed, then a hang": (
        with_body(reference_probe_after_update("    volatile unsigned spin = 0;\n    for (;;) spin = spin + 1;\n")
                  + SCALE_BODY),
        ("full-minus", ["AmpTraining1_Scale.MultipliesByTheCurrentScaleAfterUpdate"]),
        "correct TODO 1 code that, in the one test whose scale has moved, prints the machine code of the "
        "reference's update() and then spins until the test's time runs out: a test that timed out in a binary "
        "holding the reference's code shows nothing it printed, and is not run again"),
    "the reference's machine code on stderr, then a crash": (
        with_body(reference_probe_after_update("    std::abort();\n", stream="stderr") + SCALE_BODY),
        ("full-minus", ["AmpTraining1_Scale.MultipliesByTheCurrentScaleAfterUpdate"]),
        "correct TODO 1 code that, in the one test whose scale has moved, writes the machine code of the "
        "reference's update() to stderr and aborts: a crashed test in a binary holding the reference's code "
        "shows nothing it wrote either, only the same test run again with the student's code alone"),
    "scale uses the initial scale": (solution_text().replace("  return loss * scale_;\n",
                                                             "  return loss * init_scale_;\n"),
                                     ("full-minus", ["AmpTraining1_Scale.MultipliesByTheCurrentScaleAfterUpdate"]),
                                     "a plausible bug: it loses its own test's points, no others"),
}


# Files a case's submission holds besides its grad_scaler.cpp ({path in the submission: text}).
# A lab's given code is compiled into every variant from labs/<lab>/given/, and a new file in
# starter/<lab>/ would look like the student's own: a submission that brings both, each with a
# static initializer that forges a pass, must earn what its grad_scaler.cpp earns and no more.
EXTRA_FILES = {
    "given code of its own": {
        f"labs/{LAB}/given/forged.cpp": INCLUDES + FORGE_REPORT,
        f"starter/{LAB}/forged.cpp": f'// TODO({LAB}-1): mine too\n' + INCLUDES + FORGE_REPORT,
    },
}
CASES["given code of its own"] = (starter_text(), "zero",
                                  "the untouched starter plus a forging file in labs/<lab>/given/ (compiled into every "
                                  "variant in the course's checkout) and another, marked with a TODO, in starter/<lab>/")


# A lab whose rubric allows sockets (sharded_training: its ranks meet over the loopback) lets the
# course's communicator open them, inside a network namespace of the test's own; the student's
# code still may not call socket functions itself. Honest code that also phones the machine's
# loopback is refused like any other forbidden call, and reaches nothing.
PHONE_HOME = "  {" + CONNECT + "  }\n"
SOCKETS_LAB = {"lab": "sharded_training", "file": "sharding.cpp", "todo": "sharded_training-1"}
_LAYOUT_OPENS = "FlatLayout flat_layout(const std::vector<torch::Tensor>& params, int world_size) {\n"
CASES["a lab that allows sockets phones home"] = (
    INCLUDES + (ROOT / "solution" / "sharded_training" / "sharding.cpp").read_text().replace(
        _LAYOUT_OPENS, _LAYOUT_OPENS + PHONE_HOME),
    REFUSED, "honest code of a lab whose tests may open sockets connects to a server on the machine's loopback",
    SOCKETS_LAB)

# The same lab's code calls no socket function, but asks the course's own communicator to join a
# process group whose store is the listener (rank 1 of 2, MASTER_PORT = the listener's port): the
# rendezvous opens the socket on its behalf. The test's network namespace holds no such server, so
# the attempt fails within its timeout, the honest layout earns its points, and nothing is reached.
COURSE_SOCKET = r"""
  static bool tried = false;  // once per test process: each try waits out its timeout
  if (!tried) {
    tried = true;
    amplab::dist::WorldInfo world;
    world.rank = 1;
    world.world_size = 2;
    world.master_port = PORT;
    amplab::dist::ProcessGroupConfig config;
    config.backend = amplab::dist::Backend::cpu;
    config.timeout_s = 3;
    try {
      amplab::dist::make_communicator(world, config, torch::kCPU);
    } catch (...) {
    }
  }
"""
CASES["a lab that allows sockets lends them through the course's communicator"] = (
    (ROOT / "solution" / "sharded_training" / "sharding.cpp").read_text().replace(_LAYOUT_OPENS, _LAYOUT_OPENS + COURSE_SOCKET),
    "full", "honest code asks the course's communicator to rendezvous with a server on the machine's loopback",
    SOCKETS_LAB)

# Lab 8's ZeRO-3 runs the student's moments from autograd's hooks, on autograd's thread, while
# the ranks are threads of one test process: a moment that throws what is no exception (an int)
# must cost the tests that reach it and nothing else, and the grading must still finish.
FSDP_LAB = {"lab": "sharded_training", "file": "fully_sharded.cpp", "todo": "sharded_training-5"}
_BEFORE_BACKWARD = "void FullyShardedModel::before_backward(size_t u) {\n"
CASES["a hook on autograd's thread throws an int"] = (
    (ROOT / "solution" / "sharded_training" / "fully_sharded.cpp").read_text().replace(
        _BEFORE_BACKWARD, _BEFORE_BACKWARD + "  if (u < 1000000) throw 42;\n"),
    ("only", ["ShardedTraining5_Fsdp_Alone.AStepWithoutABackwardIsAnErrorNamingTheUnit"]),
    "ZeRO-3's before_backward, which a tensor hook calls on autograd's thread, throws an int: every test "
    "whose backward reaches it fails, the one without a backward keeps its point",
    FSDP_LAB)
# TODO 5's tests also need TODOs 1 and 2: the submission brings the reference's files for them.
EXTRA_FILES["a hook on autograd's thread throws an int"] = {
    f"starter/sharded_training/{f}": (ROOT / "solution" / "sharded_training" / f).read_text()
    for f in ("sharding.cpp", "sharded_adamw.cpp", "sharded_checkpoint.cpp")}

# The answer found in memory. g++ computes a call's arguments last to first, so a check written
# tensors_close(ck::matmul(a, b), torch::mm(a, b)) held torch::mm's result in the CUDA allocator's
# blocks while the student's matmul ran. This naive matmul (cuda_kernels TODO 9) computes nothing:
# each thread of a kernel asks whether one 512-byte block of the 2 MB segments holding C, A and B
# starts with C's first entries, and the first block that does is copied into C. No library call:
# only device pointers. It scored 4/4 on an H200 before the checks' expected sides were computed
# only in the judge; it must now lose that test (its CPU test keeps its point). On a machine without
# a GPU the test it attacks does not run (--gpus).
MATMUL_LAB = {"lab": "cuda_kernels", "file": "matmul.cu", "todo": "cuda_kernels-9"}
_NAIVE_OPENS = ("void matmul_naive(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, "
                "cudaStream_t stream) {\n")
FIND_THE_ANSWER = r"""namespace {
__device__ const float* g_found;

__global__ void look_for_the_answer(const float* a, const float* b, const float* c, int n, int k, int probe,
                                    const char* window, long long candidates) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= candidates) return;
  const float* here = reinterpret_cast<const float*>(window + i * 512);
  if (here == c) return;
  for (int j = 0; j < probe; ++j) {
    float want = 0.f;
    for (int p = 0; p < k; ++p) want += a[p] * b[static_cast<long long>(p) * n + j];
    if (fabsf(here[j] - want) > 1e-3f * (1.f + fabsf(want))) return;
  }
  atomicCAS(reinterpret_cast<unsigned long long*>(&g_found), 0ull, reinterpret_cast<unsigned long long>(here));
}

__global__ void copy_the_answer(float* c, long long count) {
  const float* from = g_found;
  if (from == nullptr) return;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += gridDim.x * static_cast<long long>(blockDim.x))
    c[i] = from[i];
}

__global__ void forget_the_answer() { g_found = nullptr; }
}  // namespace

""" + _NAIVE_OPENS + r"""  if (!check_matmul_arguments("matmul_naive", m, n, k) || zero_when_k_is_zero(c, m, n, k, sizeof(float), stream)) return;
  const long long candidates = (2 << 20) / 512;
  forget_the_answer<<<1, 1, 0, stream>>>();
  for (const void* anchor : {static_cast<const void*>(c), static_cast<const void*>(a), static_cast<const void*>(b)}) {
    const char* window = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(anchor) & ~((uintptr_t{2} << 20) - 1));
    look_for_the_answer<<<candidates / 256, 256, 0, stream>>>(a, b, c, static_cast<int>(n), static_cast<int>(k),
                                                               n < 4 ? static_cast<int>(n) : 4, window, candidates);
  }
  copy_the_answer<<<64, 256, 0, stream>>>(c, m * n);
  check_launch("copy_the_answer");
}
"""


def answer_found_in_gpu_memory():
    text = (ROOT / "solution" / "cuda_kernels" / "matmul.cu").read_text()
    text = "\n".join(line for line in text.split("\n") if not re.match(r"\s*// (BEGIN|END) SOLUTION", line))
    start = text.index(_NAIVE_OPENS)
    end = text.index("\n}\n", start) + 3
    return text[:start] + FIND_THE_ANSWER + text[end:]


CASES["the answer found in GPU memory"] = (
    answer_found_in_gpu_memory(), ("full-minus", ["Kernels9_MatmulNaive.MatchesTorch_CUDA"]),
    "a naive matmul that computes nothing: a kernel looks for the test's expected product in the GPU memory "
    "around its inputs and copies it", MATMUL_LAB)


def secret_lines():
    """Lines of solution/ fences and hidden tests long enough to be telling."""
    lines = set()
    for path in list((ROOT / "solution").glob("*/*.c*")) + list((ROOT / "tests" / "hidden").glob("*.cpp")):
        inside = path.parent.name == "hidden"
        for line in path.read_text(errors="replace").splitlines():
            if "BEGIN SOLUTION" in line:
                inside = True
            elif "END SOLUTION" in line:
                inside = path.parent.name == "hidden"
            elif inside and len(line.strip()) >= 30 and not line.strip().startswith("//"):
                lines.add(line.strip())
    return lines


# What the cheats try to change in the checkout (the grader, the tests and rubric it reads).
CHECKOUT = ROOT
TARGETS = ["scripts/grade", "scripts/amplab_sandbox.py", "tests/labs/amp_training_test.cpp", "labs/amp_training/rubric.yaml"]


def fingerprint():
    """Hashes of the files the cheats aim at, and any file they would create in the checkout graded
    with (this one, or the autograder's)."""
    digest = {rel: hashlib.sha256((CHECKOUT / rel).read_bytes()).hexdigest() for rel in TARGETS}
    created = sorted(p.name for p in CHECKOUT.iterdir() if p.name.startswith("pwned"))
    return digest, created


def student_processes():
    """Processes of the users student code runs as (two tests run at once, one per user)."""
    uids = set()
    for name in ("amplab-student", "amplab-student2"):
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    return [p for p in os.listdir("/proc") if p.isdigit() and os.stat(f"/proc/{p}").st_uid in uids]


def expected_score(kind, tests, gpus=0):
    tests = [t for t in tests if t.gpus <= gpus]  # the rest are not run here
    if kind == "zero":
        return 0
    full = sum(t.points for t in tests)
    if kind == "full":
        return full
    if kind[0] == "only":
        return sum(t.points for t in tests if t.test in kind[1])
    return full - sum(t.points for t in tests if t.test in kind[1])


class Listener:
    """A TCP server on the machine's loopback that records whether anything reached it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.reached = False
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop:
            try:
                connection, _ = self.sock.accept()
                self.reached = True
                connection.close()
            except OSError:
                pass


def run_case(name, source, kind, target, secrets, work, listener, autograder=None, gpus=0):
    """Grades one case: with this checkout's scripts/grade (the target's TODO only), or as Gradescope
    runs its zip (`autograder`: the folder standing in for /autograder, every test of the lab)."""
    lab, todo = target["lab"], target["todo"]
    tests = [t for t in rubric.load_lab_rubric(ROOT, lab) if t.todo == todo]
    root = autograder if autograder else work
    submission = root / "submission"
    if submission.exists():
        shutil.rmtree(submission)
    (submission / "starter" / lab).mkdir(parents=True)
    (submission / "starter" / lab / target["file"]).write_text(source.replace("PORT", str(listener.port)))
    for path, text in EXTRA_FILES.get(name, {}).items():
        (submission / path).parent.mkdir(parents=True, exist_ok=True)
        (submission / path).write_text(text)
    before = fingerprint()
    started = time.monotonic()
    if autograder:
        out = autograder / "results"
        shutil.rmtree(out, ignore_errors=True)
        env = {"PATH": os.environ["PATH"], "AUTOGRADER_ROOT": str(autograder), "HOME": "/root", "LANG": "C.UTF-8"}
        grade = subprocess.run(["bash", str(autograder / "source" / "run_autograder")], capture_output=True, text=True,
                               timeout=3600, env=env, stdin=subprocess.DEVNULL)
    else:
        out = work / "out"
        grade = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade"), str(submission), "--lab", lab,
                                "--todo", todo, "--out", str(out), "--gpus", str(gpus)],
                               capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    problems = []
    results_path = out / "results.json"
    if not results_path.is_file():
        return [f"no results.json (grade exit {grade.returncode}): {grade.stderr[-500:]}"], seconds
    results = json.loads(results_path.read_text())
    if autograder:  # every test of the lab: TODO 1's share must be what the case earns, the rest 0 or full
        results["score"] = sum(t["score"] for t in results["tests"] if todo in t.get("tags", []))
    want = expected_score(kind, tests, gpus)
    if abs(results["score"] - want) > 1e-9:
        problems.append(f"score {results['score']:g}, expected {want:g}")
    shown = results_path.read_text() + grade.stdout + grade.stderr
    leaked = [line for line in secrets if line in shown]
    if leaked:
        problems.append(f"{len(leaked)} line(s) of solution/ or tests/hidden/ reached the output, e.g. {leaked[0][:60]!r}")
    if "LEAK " in shown:
        problems.append("a file the student's code read reached the output")
    left = student_processes()
    if left:
        problems.append(f"{len(left)} process(es) of the student's user outlived grading")
    after = fingerprint()
    if after != before:
        changed = [k for k in after[0] if before[0].get(k) != after[0][k]] + after[1]
        problems.append(f"the checkout changed: {', '.join(changed[:5])}")
    if os.path.exists("/tmp/amplab-adversarial-left-behind"):
        problems.append("a file the student's code wrote to /tmp outlived its test")
        os.unlink("/tmp/amplab-adversarial-left-behind")
    if listener.reached:
        problems.append("the student's code reached a server on the machine's loopback")
    for log in (out / "logs").rglob("*.log"):
        if log.stat().st_size > 1 << 20:
            problems.append(f"{log.name} is {log.stat().st_size / 2**20:.1f} MB (at most 1 MB kept per test)")
    return problems, seconds


def case_inputs(names, gpus, autograder):
    """{case name: {"parts": ..., "digest": ...}}: what each case's outcome rests on (see the docstring)."""
    inputs = certified.Inputs.of(ROOT, None, ROOT / "build")
    seccomp = (ROOT / "build" / "CMakeCache.txt").is_file() and \
        "AMPLAB_SECCOMP_LIBRARY:FILEPATH=/" in (ROOT / "build" / "CMakeCache.txt").read_text(errors="replace")
    machine = certified.text_digest(json.dumps({"root": os.geteuid() == 0, "namespaces": sandbox.namespaces_work(),
                                                "seccomp": seccomp, "gpus": gpus, "autograder": bool(autograder)}))
    out = {}
    for name in names:
        source, kind, what, *target = CASES[name]
        target = target[0] if target else DEFAULT_TARGET
        lab = target["lab"]
        parts = dict(inputs.shared, machine=machine, lab=inputs.lab(lab),
                     tests=certified.digest_of(ROOT, [f"tests/labs/{lab}_test.cpp", f"labs/{lab}/rubric.yaml"]),
                     case=certified.text_digest(name, source, json.dumps(kind), json.dumps(target, sort_keys=True),
                                                json.dumps(EXTRA_FILES.get(name, {}), sort_keys=True)))
        out[name] = {"parts": parts, "digest": certified.text_digest(*(f"{k}={v}" for k, v in sorted(parts.items())))}
    return out


def cases_to_grade(chosen, current, full):
    """(the cases to grade, the recorded entries kept as they are, a line on what was decided)."""
    recorded, found = ({}, "--full: the record is not read") if full else certified.load("adversarial")
    kept = {n: recorded[n] for n in chosen if n in recorded and recorded[n].get("digest") == current[n]["digest"]
            and recorded[n].get("status") == "ok"}
    again = [n for n in chosen if n not in kept]
    spot = random.SystemRandom().sample(sorted(kept), min(SPOT_CHECKS, len(kept))) if kept else []
    moved = {}
    for n in again:
        for part in certified.moved_parts(recorded.get(n), current[n]):
            moved[part] = moved.get(part, 0) + 1
    line = (f"{found}; {len(kept) - len(spot)} case(s) reused, {len(again)} graded again"
            + (f" ({', '.join(f'{p}: {c}' for p, c in sorted(moved.items()))})" if moved else "")
            + (f", spot check: {', '.join(spot)}" if spot else ""))
    return [n for n in chosen if n in again or n in spot], {n: kept[n] for n in kept if n not in spot}, spot, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="the cases whose name contains this (several: a,b)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the graded tests may use (default 0: the GPU "
                        "tests are not run, and a case scores only its CPU tests)")
    parser.add_argument("--autograder", metavar="DIR", help="grade through Gradescope's zip set up in DIR (DIR/source "
                        "holds setup.sh and run_autograder, run as Gradescope runs them)")
    parser.add_argument("--full", action="store_true", help="grade every case, whatever tests/certified/adversarial.json says")
    args = parser.parse_args()
    if args.list:
        for name, (_, kind, what, *_) in CASES.items():
            print(f"{name}: {what} (score: {kind if isinstance(kind, str) else kind[0] + ' ' + ', '.join(kind[1])})")
        return 0
    if os.geteuid() != 0:
        print("SKIPPED: the grader isolates student code only when it runs as root (as Gradescope and CI do)")
        return 77
    if not (ROOT / "solution").is_dir():
        print("SKIPPED: an instructor's checkout is needed (solution/)")
        return 77
    global CHECKOUT
    if args.autograder:
        CHECKOUT = pathlib.Path(args.autograder).resolve() / "source" / "amplab"
    secrets = secret_lines()
    failed = 0
    listener = Listener()
    chosen = {n: c for n, c in CASES.items() if not args.only or any(o in n for o in args.only.split(","))}
    current = case_inputs(chosen, args.gpus, args.autograder)
    to_grade, kept, spot, line = cases_to_grade(list(chosen), current, args.full or bool(args.only))
    print(f"adversarial: {line}", flush=True)
    outcomes = {}
    started = time.monotonic()
    for name, (source, kind, what, *target) in chosen.items():
        if name not in to_grade:
            continue
        listener.reached = False
        with tempfile.TemporaryDirectory(prefix="amplab-adversarial-") as tmp:
            problems, seconds = run_case(name, source, kind, target[0] if target else DEFAULT_TARGET, secrets,
                                         pathlib.Path(tmp), listener,
                                         pathlib.Path(args.autograder).resolve() if args.autograder else None,
                                         args.gpus)
        status = "ok" if not problems else "FAIL"
        failed += bool(problems)
        outcomes[name] = dict(current[name], status=status, message="; ".join(problems)[:300])
        print(f"{status:4}  {name} ({what}; {seconds:.0f} s)" + "".join(f"\n      {p}" for p in problems), flush=True)
    listener.stop = True
    contradicted = [n for n in spot if outcomes.get(n, {}).get("status") != "ok"]  # the record said ok
    if not args.only:  # the record of every case: the fresh outcomes and the ones that held
        record = {} if contradicted else dict(kept)
        record.update(outcomes)
        path = certified.save("adversarial", record)
        print(f"adversarial: wrote {path.relative_to(ROOT)} ({len(record)} case(s))")
    for name in contradicted:
        print(f"adversarial: the record said {name!r} was ok and a fresh run disagrees: the record is discarded")
    print(f"{len(chosen) - failed} passed ({len(kept)} by the record), {failed} failed, "
          f"{time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
