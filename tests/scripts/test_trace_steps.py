"""bench/trace_steps.py on a small trace in the profiler's format: each kernel belongs to the step
whose host range launched it, even when it runs after the range (back to back); a kernel launched
outside every range (between steps, after the last one) belongs to none; a trace without steps
says what to raise. ctest: trace_steps_reads_steps."""
import json
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "trace_steps.py"


def step(ts, dur):
    return {"name": "amplab_step", "ph": "X", "cat": "user_annotation", "ts": ts, "dur": dur}


def kernel(name, launched_at, ts, dur, correlation, stream=7):
    return [{"name": "cudaLaunchKernel", "ph": "X", "cat": "cuda_runtime", "ts": launched_at, "dur": 1,
             "args": {"correlation": correlation}},
            {"name": name, "ph": "X", "cat": "kernel", "ts": ts, "dur": dur,
             "args": {"correlation": correlation, "stream": stream}}]


def run(events, *args):
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "trace.json"
        path.write_text(json.dumps({"traceEvents": events}))
        done = subprocess.run([sys.executable, str(SCRIPT), str(path), "--all", *args], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr


class TraceSteps(unittest.TestCase):
    events = ([step(0, 100), step(200, 100)]
              + kernel("gemm_a", 10, 50, 500, 1)              # step 0's, running long after its range
              + kernel("copy_between", 150, 600, 40, 2)       # launched between the steps: no step's
              + kernel("gemm_b", 210, 700, 300, 3, stream=19)  # step 1's
              + kernel("checkpoint_copy", 400, 20000, 5000, 4))  # after the last step: no step's

    def test_kernels_go_to_the_step_that_launched_them(self):
        code, out = run(self.events, "--step", "0")
        self.assertEqual(code, 0, out)
        self.assertIn("gemm_a", out)
        self.assertNotIn("copy_between", out)
        self.assertIn("step 0: 0.500 ms on the GPU", out)

    def test_work_launched_after_the_last_step_is_not_the_last_steps(self):
        code, out = run(self.events)
        self.assertEqual(code, 0, out)
        self.assertIn("gemm_b", out)
        self.assertNotIn("checkpoint_copy", out)
        self.assertIn("step 1: 0.300 ms on the GPU, first kernel to last, 0.150 ms idle before it", out)

    def test_a_trace_without_steps_says_what_to_raise(self):
        code, out = run(kernel("gemm", 0, 10, 5, 1))
        self.assertNotEqual(code, 0)
        self.assertIn("run.trace_seconds", out)


if __name__ == "__main__":
    unittest.main()
