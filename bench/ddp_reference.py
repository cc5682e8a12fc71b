#!/usr/bin/env python3
"""PyTorch's own DDP on DESIGN.md's MLP (layers x Linear(width, width) + ReLU, bf16 autocast,
fused SGD, per-GPU batch), the Python side of the DDP lab's benchmark. Launch with torchrun:
    torchrun --standalone --nproc-per-node 2 bench/ddp_reference.py [--steps 20]
Prints on rank 0 the median ms per step timed one by one (CUDA events around each step, waiting
for the GPU before the next: the lab's "ms/step") and back to back (steps queued without waiting,
as a training loop runs: the lab's "back-to-back ms/step"). With one process it runs without DDP
(the baseline)."""
import argparse
import os
import statistics

import torch
import torch.distributed as dist


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
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    if world > 1:
        dist.init_process_group("nccl", device_id=dev)
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
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
        flops = 6 * args.batch * args.width * args.width * args.layers
        print(f"python {'ddp' if world > 1 else 'alone'}{' bf16-compress' if args.bf16_compress else ''} world={world}: {ms:.2f} ms/step, "
              f"back-to-back {back_to_back:.2f} ms/step, {flops / back_to_back / 1e9:.0f} TFLOP/s per GPU, "
              f"{args.batch * world / back_to_back * 1e3:.0f} samples/s")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
