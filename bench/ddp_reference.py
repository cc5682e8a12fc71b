#!/usr/bin/env python3
"""PyTorch's own DDP on the DDP lab's MLP (layers x Linear(width, width) + ReLU, bf16 autocast,
fused SGD, per-GPU batch), the Python side of the DDP lab's benchmark. Launch with torchrun:
    torchrun --standalone --nproc-per-node 2 bench/ddp_reference.py [--steps 20]
Prints on rank 0 the median ms per step timed one by one (CUDA events around each step, waiting
for the GPU before the next: the lab's "ms/step") and back to back (steps queued without waiting,
as a training loop runs: the lab's "back-to-back ms/step"). With one process it runs without DDP
(the baseline). --first-layer-pieces K cuts the first Linear into K Linears side by side, as
the lab's amplab::LinearInPieces does (the lab's "first layer in K pieces" settings).

Tuning DDP: --bucket-cap-mb takes a list (25,100,268) and --static-graph on|both; each
combination is a fresh DDP of a fresh model, timed in turn in the same processes. --alone-first
times the plain MLP without DDP first in the same processes, as the lab's bench does, and then
prints each setting's scaling efficiency (time alone / time of the setting). --json writes every
setting's figures (rank 0). --device cpu runs CPU processes over gloo, to check the script
itself on a machine without GPUs (its times say nothing about DDP on GPUs)."""
import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


class LinearInPieces(torch.nn.Module):
    """Linear(width, width) as `pieces` Linears, each giving a block of the output features, joined
    by torch.cat: the same function; backward computes each piece's weight gradient in a node of
    its own, so DDP can all-reduce one piece while the next is computed."""

    def __init__(self, width, pieces):
        super().__init__()
        rows = [width // pieces + (1 if k < width % pieces else 0) for k in range(pieces)]
        self.pieces = torch.nn.ModuleList(torch.nn.Linear(width, r) for r in rows)

    def forward(self, x):
        # Under autocast each piece would cast x again; cast it once, as autocast's linear would
        # (floating point other than float64: the tensors autocast casts).
        kind = x.device.type
        if torch.is_autocast_enabled(kind) and x.is_floating_point() and x.dtype != torch.float64:
            x = x.to(torch.get_autocast_dtype(kind))
        return torch.cat([piece(x) for piece in self.pieces], dim=-1)


class Clock:
    """Milliseconds of GPU work between start() and stop() (CUDA events, then a wait for the GPU);
    on the CPU the host's clock."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"

    def start(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()

    def stop(self):
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b)
        return 1e3 * (time.perf_counter() - self.t)


def back_to_back_ms(work, count, clock=None):
    """Milliseconds per call of `work`, called `count` times without waiting for the GPU between
    calls (CUDA events around all of them, unless `clock` is a CPU Clock)."""
    clock = clock or Clock(torch.device("cuda"))
    clock.start()
    for _ in range(count):
        work()
    return clock.stop() / count


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bf16-compress", action="store_true",
                   help="DDP communication hook bf16_compress_hook: gradients travel as bf16 (half the bytes)")
    p.add_argument("--first-layer-pieces", type=int, default=1,
                   help="cut the first Linear into this many pieces (1: a plain Linear)")
    p.add_argument("--bucket-cap-mb", default="25",
                   help="DDP's bucket_cap_mb; a comma-separated list times each (default 25, DDP's own)")
    p.add_argument("--static-graph", choices=["off", "on", "both"], default="off",
                   help="DDP's static_graph; both: each bucket size with and without")
    p.add_argument("--alone-first", action="store_true",
                   help="under torchrun, first time the plain MLP without DDP in the same processes (the lab's "
                        "baseline) and print each DDP setting's efficiency against it")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: CPU processes over gloo (checks the script, not DDP's speed)")
    p.add_argument("--json", help="write every setting's figures here (rank 0)")
    args = p.parse_args()
    if not 1 <= args.first_layer_pieces <= args.width:
        sys.exit(f"ddp_reference.py: --first-layer-pieces {args.first_layer_pieces}: allowed 1 to --width ({args.width})")
    try:
        args.bucket_caps = [float(v) for v in args.bucket_cap_mb.split(",")]
    except ValueError:
        sys.exit(f"ddp_reference.py: --bucket-cap-mb {args.bucket_cap_mb!r}: numbers (MiB), comma-separated")
    return args


def make_model(args, dev):
    """The MLP, its weights drawn on `dev` directly: each setting makes a fresh one, and 1 GiB of
    weights need not cross from the host each time."""
    torch.manual_seed(0)
    layers = []
    with dev:
        for i in range(args.layers):
            first_in_pieces = i == 0 and args.first_layer_pieces > 1
            linear = LinearInPieces(args.width, args.first_layer_pieces) if first_in_pieces else torch.nn.Linear(args.width, args.width)
            layers += [linear, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def settings_of(args, world):
    """(bucket_cap_mb, static_graph) of each DDP setting to time; None for the plain MLP alone."""
    if world == 1:
        return [None]
    static = {"off": [False], "on": [True], "both": [False, True]}[args.static_graph]
    return ([None] if args.alone_first else []) + [(cap, s) for cap in args.bucket_caps for s in static]


def time_setting(args, setting, dev, world):
    """(ms/step of steps timed one by one: the median, ms/step back to back: the median of 3
    windows) of the MLP alone (setting None) or under DDP with (bucket_cap_mb, static_graph)."""
    model = make_model(args, dev)
    if setting is not None:
        cap, static_graph = setting
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=cap,
            static_graph=static_graph, gradient_as_bucket_view=True)
        if args.bf16_compress:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(args.batch, args.width, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = model(x)
        (out.sum(dtype=torch.float32) / args.batch).backward()  # the loss the C++ benchmark uses
        opt.step()

    clock = Clock(dev)
    if world > 1:
        dist.barrier()
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        clock.start()
        step()
        times.append(clock.stop())
    windows = []
    for _ in range(3):
        if world > 1:
            dist.barrier()
        windows.append(back_to_back_ms(step, args.steps, clock))
    return statistics.median(times), statistics.median(windows)


def describe(args, setting, world):
    if setting is None:
        return f"python alone world={world}"
    cap, static_graph = setting
    tuned = (f" bucket_cap_mb={cap:g}" if cap != 25 else "") + (" static_graph" if static_graph else "")
    pieces = f" first-layer-pieces={args.first_layer_pieces}" if args.first_layer_pieces > 1 else ""
    return f"python ddp{' bf16-compress' if args.bf16_compress else ''}{pieces}{tuned} world={world}"


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None)
    # 6 x batch x width^2 per layer, less the first layer's input gradient (never computed)
    flops = (6 * args.layers - 2) * args.batch * args.width * args.width
    results, alone = [], None
    for setting in settings_of(args, world):
        ms, back_to_back = time_setting(args, setting, dev, world)
        if setting is None:
            alone = (ms, back_to_back)
        cap, static_graph = setting if setting is not None else (None, None)
        results.append({"setting": "alone" if setting is None else "ddp", "bucket_cap_mb": cap, "static_graph": static_graph,
                        "ms_per_step": ms, "back_to_back_ms": back_to_back,
                        "efficiency": alone[0] / ms if alone else None,
                        "back_to_back_efficiency": alone[1] / back_to_back if alone else None})
        if rank == 0:
            against = (f", efficiency {100 * alone[0] / ms:.1f}% (back to back {100 * alone[1] / back_to_back:.1f}%)"
                       if alone and setting is not None else "")
            print(f"{describe(args, setting, world)}: {ms:.2f} ms/step, "
                  f"back-to-back {back_to_back:.2f} ms/step, {flops / back_to_back / 1e9:.0f} TFLOP/s per GPU, "
                  f"{args.batch * world / back_to_back * 1e3:.0f} samples/s{against}", flush=True)
        gc.collect()  # this setting's model, optimizer and DDP buckets, before the next setting's
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 0 and args.json:
        info = {"benchmark": "ddp_reference", "world": world, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "torch": torch.__version__, "width": args.width, "layers": args.layers, "batch": args.batch,
                "steps": args.steps, "warmup": args.warmup, "bf16_compress": args.bf16_compress,
                "first_layer_pieces": args.first_layer_pieces, "gradient_as_bucket_view": True, "results": results}
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
