#!/usr/bin/env python3
"""The GPU time line of one step in a trace written by the DDP lab's benchmark
(build/bin/ddp --set bench.enabled=true --set bench.trace=true) or by a phase of the sharded
lab (build/bin/sharded_training --set run.trace=true: trace-zero-3.json): every kernel of that step with
its stream, start (ms after the step's first kernel) and duration, then per stream the busy time
and the last end; and a line per step (first kernel to last kernel, and the idle gap before it).
A kernel belongs to the step whose host range launched it, so this also reads the back-to-back
traces, where the host queues a step while the GPU still runs the one before; a kernel launched
outside every step's range (between steps, or after the last: a checkpoint's copies) belongs to none.
    python3 bench/trace_steps.py runs/ddp/<time>/trace_ddp_overlap.json [--step K] [--all]
    python3 bench/trace_steps.py runs/sharded_training/<time>/trace-zero-3.json"""
import argparse
import bisect
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--step", type=int, default=-1, help="which step to list (0 = the first; default: the last)")
    p.add_argument("--all", action="store_true", help="list every kernel (default: merge runs of small ones)")
    args = p.parse_args()
    try:
        with open(args.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"trace_steps.py: cannot read {args.trace}: {e}")
    # The host's step ranges (the GPU time line repeats them as gpu_user_annotation: not those).
    ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                    if e.get("name") == "amplab_step" and e.get("ph") == "X" and e.get("cat") == "user_annotation")
    steps = [start for start, _ in ranges]
    if not steps:
        sys.exit(f"trace_steps.py: {args.trace} has no amplab_step ranges: the trace ended before the first "
                 "step (a large model takes longer to set up than the traced seconds: raise run.trace_seconds, "
                 "or bench.trace's steps), or another program wrote it")
    # Each kernel's launch (the runtime or driver call with the same correlation id) dates it on
    # the host, inside its step's range.
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    by_step = [[] for _ in steps]
    for k in kernels:
        when = launched.get(k.get("args", {}).get("correlation"), k["ts"])
        i = bisect.bisect_right(steps, when) - 1
        if i >= 0 and when <= ranges[i][1]:  # launched after its host range ended: between steps, or after the last
            by_step[i].append(k)
    if not -len(steps) <= args.step < len(steps):
        sys.exit(f"trace_steps.py: --step {args.step}: the trace has {len(steps)} step(s) (0..{len(steps) - 1})")
    if not any(by_step):
        sys.exit(f"trace_steps.py: no GPU kernels in the steps of {args.trace}")

    chosen = sorted(by_step[args.step], key=lambda e: e["ts"])
    t0 = chosen[0]["ts"]
    streams = {}
    print(f"{'stream':>6} {'start ms':>9} {'dur ms':>7}  kernel")
    for k in chosen:
        stream = k.get("args", {}).get("stream", k.get("tid"))
        s = streams.setdefault(stream, {"busy": 0.0, "end": 0.0, "count": 0})
        s["busy"] += k["dur"] / 1e3
        s["end"] = max(s["end"], (k["ts"] + k["dur"] - t0) / 1e3)
        s["count"] += 1
        if args.all or k["dur"] >= 20 or "nccl" in k["name"].lower():
            print(f"{stream:>6} {(k['ts'] - t0) / 1e3:9.3f} {k['dur'] / 1e3:7.3f}  {k['name'][:110]}")
    print()
    for stream, s in sorted(streams.items(), key=lambda kv: str(kv[0])):
        print(f"stream {stream}: {s['count']} kernels, busy {s['busy']:.3f} ms, last end {s['end']:.3f} ms")
    print()
    previous_end = None
    for i, ks in enumerate(by_step):
        if not ks:
            continue
        start = min(k["ts"] for k in ks)
        end = max(k["ts"] + k["dur"] for k in ks)
        gap = f", {(start - previous_end) / 1e3:.3f} ms idle before it" if previous_end is not None else ""
        print(f"step {i}: {(end - start) / 1e3:.3f} ms on the GPU, first kernel to last{gap}")
        previous_end = end


if __name__ == "__main__":
    main()
