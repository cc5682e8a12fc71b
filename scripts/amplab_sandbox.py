"""Runs a student's test binary as an untrusted party, for scripts/grade.

What the student's code cannot do here, when the grader runs as root (Gradescope does, and so
does CI):
  - read the instructor's material: it runs as the unprivileged user `amplab-student`, and the
    reference solutions, hidden tests, build directories, git history and the results directory
    are made unreadable to it (mode 0700, restored afterwards) while grading runs;
  - write anything the grader reads: the checkout, run_autograder and the results are not its;
    its only writable places are a private home and its own /tmp;
  - reach another test: where the kernel lets bubblewrap make namespaces, each test runs in its own
    IPC, PID, network (loopback only) and mount namespaces, with a fresh /dev/shm and /run/lock and
    /tmp and /var/tmp read-only (its own folder, $TMPDIR, is where it writes), so nothing a test
    leaves there or in SysV IPC outlives it or reaches the test beside it; where it cannot, tests run one at a time and what the user left is removed after each;
  - outlive its test: every process of that user is killed after each test, before the next
    one and before results.json is written;
  - exhaust the machine: per test a time limit, an address-space limit (CPU tests), a limit on
    processes and threads, a file-size limit, and at most OUTPUT_KEPT bytes of its output kept
    (the head and the tail; the rest is counted);
  - decide its own grade: its process only reports what the test observed (tests/support/
    judged.hpp); the verdict comes from the judge, a binary linked with the reference only, whose
    lines to the grader carry a token made for this grading run and compiled into the judge's
    main only (tests/grading/verdict_main.cpp). judge() turns those lines into an outcome.
Without root (an instructor grading their own copy) none of the user separation is possible: the
tests run as the caller with the limits only, and the grader says so.
"""
from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import os
import pathlib
import pwd
import resource
import secrets
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time

USER = "amplab-student"           # and amplab-student2: two tests run at once, each as a user of its own
OUTPUT_KEPT = 256 * 1024          # bytes of a test's output kept at its start, and as many at its end
VERDICT_KEPT = 256 * 1024 * 1024  # bytes read at most from the pipe (a student's observations, or verdict lines)
PROCESSES = 1024                  # processes and threads of the student's user at once
FILE_BYTES = 1 << 30              # the largest file a test may write
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
PRIVATE_DIRS = ("/dev/shm", "/run/lock")  # a fresh one of each per test, with namespaces
READ_ONLY_DIRS = ("/tmp", "/var/tmp")     # read-only then; the test writes in its own folder ($TMPDIR)


@dataclasses.dataclass
class Run:
    code: int | None              # exit code, -signal, or None when it ran past its time limit
    seconds: float
    head: bytes                   # the output's start (stdout and stderr together)
    tail: bytes                   # its end, when it was longer than the head
    total: int                    # bytes of output in all
    stream: bytes                 # what the process wrote to its pipe (observations, or verdict lines)
    limits: list                  # one line per limit the test ran into

    @property
    def verdict(self) -> list:
        return self.stream.decode(errors="replace").splitlines()

    def output(self) -> str:
        text = self.head.decode(errors="replace")
        if self.total > len(self.head):
            cut = self.total - len(self.head) - len(self.tail)
            if cut > 0:
                text += f"\n[... {cut} bytes of output not kept ...]\n"
            text += self.tail.decode(errors="replace")
        return text


def token() -> str:
    """A fresh token: 16 random bytes as 32 hex digits."""
    return secrets.token_hex(16)


def token_header(value: str) -> str:
    """tests/grading/verdict_main.cpp's verdict_token.hpp for `value`: two random-looking halves
    whose XOR is the token, so the token is not one string in the binary."""
    raw = bytes.fromhex(value)
    mask = secrets.token_bytes(len(raw))
    other = bytes(a ^ b for a, b in zip(raw, mask))
    def array(name, data):
        return f"static const unsigned char {name}[{len(data)}] = {{{', '.join(str(b) for b in data)}}};\n"
    return "// Written by scripts/grade for one grading run.\n" + array("kTokenA", mask) + array("kTokenB", other)


class Sandbox:
    """The unprivileged user, the locked secrets, and one test run at a time."""

    def __init__(self, secret_paths, user=USER):
        self.isolated = os.geteuid() == 0
        self.secret_paths = [pathlib.Path(p) for p in secret_paths]
        self.saved_modes = {}
        self.uid = self.gid = None
        self.network_isolated = False
        self.namespaces = False
        if self.isolated:
            self.uid, self.gid = ensure_user(user)
            self.namespaces = namespaces_work()
            # without bubblewrap: a network namespace of its own (loopback only) where the kernel
            # allows one; not in every container
            self.network_isolated = self.namespaces or \
                subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0

    # ---- secrets -------------------------------------------------------------------------------
    def __enter__(self):
        if self.isolated:
            for path in self.secret_paths:
                path = path.resolve()
                if path.exists() and path not in self.saved_modes:
                    mode = stat.S_IMODE(path.stat().st_mode)
                    self.saved_modes[path] = mode
                    os.chmod(path, mode & 0o700)
        return self

    def __exit__(self, *exc):
        self.kill_all()
        for path, mode in self.saved_modes.items():
            try:
                os.chmod(path, mode)
            except OSError:
                pass
        return False

    # ---- one test ------------------------------------------------------------------------------
    def run(self, argv, env, cwd, timeout_s, binaries, memory_mb=None, pipe="AMPLAB_VERDICT_FD", files=None):
        """Runs argv[0] (a name among `binaries`, {name in bin/: path}) with its bin/ copied into a
        fresh directory the student's user can execute but not read, and `files` ({name: bytes})
        beside it, readable by that user; the pipe's write end is passed as $`pipe`. Returns a Run."""
        work = pathlib.Path(tempfile.mkdtemp(prefix="amplab-test-"))
        try:
            os.chmod(work, 0o711)
            bindir = work / "bin"
            bindir.mkdir()
            os.chmod(bindir, 0o711)
            for name, source in binaries.items():
                shutil.copy2(source, bindir / name)
                os.chmod(bindir / name, 0o711 if self.isolated else 0o755)
            for name, data in (files or {}).items():
                (work / name).write_bytes(data)
                os.chmod(work / name, 0o644)
            home = work / "home"
            home.mkdir()
            if self.isolated:
                os.chown(home, self.uid, self.gid)
            os.chmod(home, 0o700)
            env = {k: v.replace("{work}", str(work)) for k, v in env.items()}  # a path to `files`
            env.update(HOME=str(home), TMPDIR=str(home), AMPLAB_BINARY_DIR=str(work))
            argv = [str(bindir / pathlib.Path(argv[0]).name)] + list(argv[1:])
            return self._run(argv, env, cwd, timeout_s, memory_mb, pipe, work)
        finally:
            self.kill_all()
            self.wipe()
            shutil.rmtree(work, ignore_errors=True)

    def wrapped(self, argv, work):
        """argv inside its own namespaces (bubblewrap), run as the student's user (setpriv)."""
        if not self.namespaces:
            return argv
        box = ["bwrap", "--die-with-parent", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
               "--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
        for shared in READ_ONLY_DIRS:  # what the machine keeps there (libraries, builds) stays readable
            if os.path.isdir(shared):
                box += ["--ro-bind", shared, shared]
        for private in PRIVATE_DIRS:
            if os.path.isdir(private):
                box += ["--perms", "1777", "--tmpfs", private]
        box += ["--bind", str(work), str(work), "--"]
        return box + ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--inh-caps=-all",
                      "--"] + argv

    def _run(self, argv, env, cwd, timeout_s, memory_mb, pipe, work):
        read_fd, write_fd = os.pipe()
        env = dict(env, **{pipe: str(write_fd)})
        uid, gid, isolated = self.uid, self.gid, self.isolated
        own_network = self.network_isolated and not self.namespaces
        drop_here = isolated and not self.namespaces  # else setpriv drops to the user inside the namespaces
        argv = self.wrapped(argv, work)

        def become_student():  # in the child, between fork and exec
            os.umask(0o077)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
            if memory_mb:
                limit = memory_mb * 2**20
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            if own_network:
                enter_own_network()
            if isolated:
                resource.setrlimit(resource.RLIMIT_NPROC, (PROCESSES, PROCESSES))
            if drop_here:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)

        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, pass_fds=(write_fd,), start_new_session=True,
                                preexec_fn=become_student)
        os.close(write_fd)
        captured = {"head": bytearray(), "tail": bytearray(), "total": 0}
        verdict = bytearray()

        def read_output():
            while True:
                chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(65536)
                if not chunk:
                    return
                captured["total"] += len(chunk)
                room = OUTPUT_KEPT - len(captured["head"])
                if room > 0:
                    captured["head"] += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    captured["tail"] = (captured["tail"] + chunk)[-OUTPUT_KEPT:]

        def read_verdict():
            with os.fdopen(read_fd, "rb") as pipe:
                while True:
                    chunk = pipe.read1(65536)
                    if not chunk:
                        return
                    if len(verdict) < VERDICT_KEPT:
                        verdict.extend(chunk[:VERDICT_KEPT - len(verdict)])

        readers = [threading.Thread(target=read_output, daemon=True), threading.Thread(target=read_verdict, daemon=True)]
        for reader in readers:
            reader.start()
        limits = []
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            limits.append(f"time: the test ran past its limit of {timeout_s:g} s and was stopped")
        seconds = time.monotonic() - start
        self.kill_group(proc.pid)
        self.kill_all()
        for reader in readers:
            reader.join(timeout=10)
        proc.wait()
        run = Run(code=code, seconds=seconds, head=bytes(captured["head"]), tail=bytes(captured["tail"]),
                  total=captured["total"], stream=bytes(verdict), limits=limits)
        if run.total > 2 * OUTPUT_KEPT:
            limits.append(f"output: the test printed {run.total / 2**20:.1f} MB; the first and last "
                          f"{OUTPUT_KEPT // 1024} KB are kept")
        if code == -signal.SIGXFSZ:
            limits.append(f"file size: the test wrote a file larger than {FILE_BYTES // 2**20} MB and was stopped")
        text = run.output()
        if memory_mb and ran_out_of_memory(text):
            limits.append(f"memory: the test ran out of memory (its limit is {memory_mb} MiB of address space)")
        if self.isolated and "Resource temporarily unavailable" in text:
            limits.append(f"processes: the test reached the limit of {PROCESSES} processes and threads")
        return run

    # ---- cleaning up ---------------------------------------------------------------------------
    @staticmethod
    def kill_group(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def student_pids(self):
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == self.uid:
                        pids.append(int(entry))
                except OSError:
                    pass
        return pids

    def kill_all(self):
        """Every process of the student's user, until none is left (a fork bomb forks while it is
        being killed: SIGSTOP first stops each one from making more)."""
        if not self.isolated:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = self.student_pids()
            if not pids:
                return
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.05)

    def wipe(self):
        """Removes what the student's user left in the world-writable directories and in SysV IPC
        (with namespaces each test had its own, gone with it; this is for a machine without)."""
        if not self.isolated:
            return
        for kind, flag in (("-m", "m"), ("-q", "q"), ("-s", "s")):
            listed = subprocess.run(["ipcs", kind, "-c"], capture_output=True, text=True).stdout.splitlines()
            for line in listed:
                fields = line.split()
                if len(fields) >= 5 and fields[0].isdigit() and fields[2] == pwd.getpwuid(self.uid).pw_name:
                    subprocess.run(["ipcrm", f"-{flag}", fields[0]], capture_output=True)
        for top in WORLD_WRITABLE:
            try:
                entries = list(os.scandir(top))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_uid != self.uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                except OSError:
                    pass


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, not in a forked child
_NAMESPACES = None


def namespaces_work():
    """Whether bubblewrap can give a test namespaces of its own here (root, bwrap installed, and a
    kernel or container that allows them); asked once."""
    global _NAMESPACES
    if _NAMESPACES is None:
        try:
            _NAMESPACES = os.geteuid() == 0 and subprocess.run(
                ["bwrap", "--die-with-parent", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--bind", "/", "/",
                 "--dev-bind", "/dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--", "setpriv", "--reuid=65534",
                 "--regid=65534", "--clear-groups", "--", "true"],
                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _NAMESPACES = False
    return _NAMESPACES


def enter_own_network():
    """A new network namespace with its loopback up: the test's processes can talk to each other
    (the DDP tests' rendezvous) but reach nothing outside."""
    if _LIBC.unshare(0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        iff_up, iff_loopback, iff_running = 0x1, 0x8, 0x40
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14s", b"lo", iff_up | iff_loopback | iff_running, b""))  # SIOCSIFFLAGS


def ensure_user(name):
    """(uid, gid) of the unprivileged user, made if missing (no home, no login shell)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        shell = "/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false"
        result = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                                 "--shell", shell, "--user-group", name], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"cannot create the user {name} that student code runs as: {result.stderr.strip()}")
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


# ---- the verdict ------------------------------------------------------------------------------

@dataclasses.dataclass
class Verdict:
    status: str            # passed | failed | skipped | crashed | timeout | missing
    message: str
    failures: list         # failure texts ('file:line\nmessage'), in order
    fraction: float | None


def unescape(text):
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append({"n": "\n", "r": "\r", "\\": "\\"}.get(text[i + 1], text[i + 1]))
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def describe_exit(code):
    if code is None:
        return "was stopped at its time limit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def judge(run: Run, token_value: str, test: str) -> Verdict:
    """The outcome of one test from the verdict lines (see the module's doc), never from what the
    test process printed or wrote."""
    events, forged = [], 0
    for line in run.verdict:
        if line.startswith(token_value + " "):
            kind, _, rest = line[len(token_value) + 1:].partition(" ")
            events.append((kind, rest))
        elif line.strip():
            forged += 1
    failures = [unescape(rest.partition(" ")[2]) for kind, rest in events
                if kind == "part" and rest.startswith("failure ")]
    if forged:
        return Verdict("failed", f"the test process wrote {forged} verdict line(s) the grader did not make: "
                                 "not graded", failures, None)
    if run.code is None:
        return Verdict("timeout", run.limits[0] if run.limits else "timed out", failures, None)
    mains = [rest for kind, rest in events if kind == "main"]
    starts = [rest for kind, rest in events if kind == "start"]
    ends = [rest for kind, rest in events if kind == "end"]
    if not mains:
        return Verdict("crashed", f"the test binary {describe_exit(run.code)} during start-up, before main() "
                                  "(a static object's constructor, or the program's libraries)", failures, None)
    if mains[0].strip() == "0":
        return Verdict("missing", "the test is not in the test binary", failures, None)
    if starts != [test]:
        if not starts:
            return Verdict("crashed", f"the test binary {describe_exit(run.code)} before the test began",
                           failures, None)
        return Verdict("failed", f"the process reported other tests than {test}: {', '.join(starts)[:200]}",
                       failures, None)
    if not ends:
        return Verdict("crashed", f"the process {describe_exit(run.code)} during the test", failures, None)
    status = ends[-1].partition(" ")[0]  # the judge decides pass or fail; a speed share is timed by the grader
    if failures or status == "failed":
        return Verdict("failed", "", failures or ["failed"], None)
    if status == "skipped":
        skips = [unescape(rest.partition(" ")[2]) for kind, rest in events if kind == "part" and rest.startswith("skip ")]
        reason = skips[0].split("\n", 1)[-1].strip() if skips else "skipped"
        return Verdict("skipped", reason, [], None)
    if status != "passed":
        return Verdict("failed", f"unknown status '{status[:40]}'", failures, None)
    if run.code != 0:
        return Verdict("crashed", f"passed, then the process {describe_exit(run.code)}", failures, None)
    return Verdict("passed", "", [], None)


# ---- the student's own report ---------------------------------------------------------------------

def frames(stream: bytes):
    """(type, payload) of each whole frame of a student's stream (tests/support/judged.cpp): a
    length (4 bytes, this machine's order), a type byte, the payload. Stops at a damaged frame."""
    at = 0
    while at + 5 <= len(stream):
        length = int.from_bytes(stream[at:at + 4], "little")
        if length == 0 or at + 4 + length > len(stream):
            return
        yield chr(stream[at + 4]), stream[at + 5:at + 4 + length]
        at += 4 + length


def ran_out_of_memory(output):
    """Whether a test's output says an allocation failed. Not torch's warning that CUDA could not
    start (under a CPU test's address-space limit on a GPU machine it cannot, and says "out of
    memory"), which every CPU test prints there, passing or not."""
    return any(s in line for line in output.splitlines() if "CUDA initialization:" not in line
               for s in ("bad_alloc", "can't allocate memory", "Cannot allocate memory", "out of memory"))


NO_FILTER = "no seccomp filter: the test binary could not install it here (libseccomp missing, or a rule refused)"


def student_verdict(run: Run, test: str):
    """(the outcome the student's process reports, {property: value}, notes). Its failures count
    (they only lower the grade); a pass is only a claim, which the judge then checks."""
    mains, starts, failures, skips, ends, properties, notes = [], [], [], [], [], {}, []
    for kind, payload in frames(run.stream):
        text = payload.decode(errors="replace")
        if kind == "M":
            mains.append(text)
        elif kind == "S":
            starts.append(text)
        elif kind == "P" and text[:1] == "f":
            failures.append(text[1:])
        elif kind == "P" and text[:1] == "s":
            skips.append(text[1:])
        elif kind == "E":
            ends.append(text)
        elif kind == "R" and "=" in text:
            key, _, value = text.partition("=")
            properties[key] = value
        elif kind == "N" and NO_FILTER not in notes:
            # The process's own words are not shown (it may hold the reference's code, and print it):
            # that it said its filter is missing is; the staff's log has what it said.
            notes.append(NO_FILTER)
    if run.code is None:
        return Verdict("timeout", run.limits[0] if run.limits else "timed out", failures, None), properties, notes
    if len(run.stream) >= VERDICT_KEPT:
        return Verdict("failed", f"the test's observations passed the grader's limit of {VERDICT_KEPT >> 20} MB "
                                 "(its checks compare that much data): not graded", failures, None), properties, notes
    if not mains:
        return Verdict("crashed", f"the test binary {describe_exit(run.code)} during start-up, before main() "
                                  "(a static object's constructor, or the program's libraries)", failures, None), \
            properties, notes
    if mains[0].strip() == "0":
        return Verdict("missing", "the test is not in the test binary", failures, None), properties, notes
    if starts[:1] != [test]:
        return Verdict("crashed", f"the test binary {describe_exit(run.code)} before the test began", failures,
                       None), properties, notes
    if failures:
        return Verdict("failed", "", failures, None), properties, notes
    if not ends:
        return Verdict("crashed", f"the process {describe_exit(run.code)} during the test", failures, None), \
            properties, notes
    if ends[-1] == "s":
        reason = skips[0].split("\n", 1)[-1].strip() if skips else "skipped"
        return Verdict("skipped", reason, [], None), properties, notes
    if ends[-1] != "p":
        return Verdict("failed", "", ["failed"], None), properties, notes
    if run.code != 0:
        return Verdict("crashed", f"passed, then the process {describe_exit(run.code)}", failures, None), \
            properties, notes
    fraction = None  # the share a test judged inside records of its own speed: the student's word (partial: true)
    if "points_fraction" in properties:
        try:
            fraction = round(min(1.0, max(0.0, float(properties["points_fraction"]))), 2)  # 2 digits: no channel
        except ValueError:
            fraction = 0.0
    return Verdict("passed", "", [], fraction), properties, notes
