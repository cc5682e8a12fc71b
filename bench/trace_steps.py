#!/usr/bin/env python3
"""The GPU time line of the last step in a trace written by the DDP lab's benchmark
(build/bin/ddp --set bench.enabled=true --set bench.trace=true): every kernel of that step with
its stream, start (ms after the step's first kernel) and duration, then per stream the busy time
and the last end. Shows what runs beside backward and what is left after it.
    python3 bench/trace_steps.py runs/ddp/<time>/trace_ddp_overlap.json [--all]"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--all", action="store_true", help="list every kernel (default: merge runs of small ones)")
    args = p.parse_args()
    try:
        with open(args.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"trace_steps.py: cannot read {args.trace}: {e}")
    steps = sorted(e["ts"] for e in events if e.get("name") == "amplab_step" and e.get("ph") == "X")
    if not steps:
        sys.exit(f"trace_steps.py: {args.trace} has no amplab_step ranges (written by another program?)")
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"
               and e["ts"] >= steps[-1]]
    if not kernels:
        sys.exit(f"trace_steps.py: no GPU kernels in the last step of {args.trace}")
    kernels.sort(key=lambda e: e["ts"])
    t0 = kernels[0]["ts"]
    streams = {}
    print(f"{'stream':>6} {'start ms':>9} {'dur ms':>7}  kernel")
    for k in kernels:
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


if __name__ == "__main__":
    main()
