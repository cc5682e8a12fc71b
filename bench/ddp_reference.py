#!/usr/bin/env python3
"""PyTorch's own DDP on the DDP lab's MLP (layers x Linear(width, width) + ReLU, bf16 autocast,
fused SGD, per-GPU batch), the Python side of the DDP lab's benchmark. Launch with torchrun:
    torchrun --standalone --nproc-per-node 2 bench/ddp_reference.py [--steps 20]
Prints on rank 0 the median ms per step timed one by one (CUDA events around each step, waiting
for the GPU before the next: the lab's "ms/step") and back to back (steps queued without waiting,
as a training loop runs: the lab's "back-to-back ms/step"). With one process it runs without DDP
(the baseline). --first-layer-pieces K cuts the first Linear into K Linears side by side, as
the lab's amplab::LinearInPieces does (the lab's "first layer in K pieces" settings)."""
import argparse
import os
import statistics
import sys

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


def back_to_back_ms(work, count):
    """Milliseconds per call of `work`, called `count` times without waiting for the GPU between
    calls (CUDA events around all of them)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(count):
        work()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / count


def main():
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
    args = p.parse_args()
    if not 1 <= args.first_layer_pieces <= args.width:
        sys.exit(f"ddp_reference.py: --first-layer-pieces {args.first_layer_pieces}: allowed 1 to --width ({args.width})")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    if world > 1:
        dist.init_process_group("nccl", device_id=dev)
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        first_in_pieces = i == 0 and args.first_layer_pieces > 1
        linear = LinearInPieces(args.width, args.first_layer_pieces) if first_in_pieces else torch.nn.Linear(args.width, args.width)
        layers += [linear, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local], gradient_as_bucket_view=True)
        if args.bf16_compress:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(args.batch, args.width, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        (out.sum(dtype=torch.float32) / args.batch).backward()  # the loss the C++ benchmark uses
        opt.step()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    windows = []
    for _ in range(3):
        if world > 1:
            dist.barrier()
        windows.append(back_to_back_ms(step, args.steps))
    if rank == 0:
        ms, back_to_back = statistics.median(times), statistics.median(windows)
        # 6 x batch x width^2 per layer, less the first layer's input gradient (never computed)
        flops = (6 * args.layers - 2) * args.batch * args.width * args.width
        pieces = f" first-layer-pieces={args.first_layer_pieces}" if args.first_layer_pieces > 1 else ""
        print(f"python {'ddp' if world > 1 else 'alone'}{' bf16-compress' if args.bf16_compress else ''}{pieces} world={world}: {ms:.2f} ms/step, "
              f"back-to-back {back_to_back:.2f} ms/step, {flops / back_to_back / 1e9:.0f} TFLOP/s per GPU, "
              f"{args.batch * world / back_to_back * 1e3:.0f} samples/s")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
