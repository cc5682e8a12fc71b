#!/usr/bin/env python3
"""Where the GPU time of one MNIST training step goes: the pytorch/examples CNN, batch 128,
channels-last, bf16 autocast, fused AdamW (the lab's configs/mnist.yaml; --sgd for fused SGD),
profiled with torch.profiler, eagerly or (--graph) as the replays of one captured CUDA graph, as
the lab runs it; prints the kernels by total CUDA time. Run on a GPU machine:
    python3 bench/profile_mnist_step.py [--fp32] [--sgd] [--graph]
"""
import argparse

import torch
import torch.nn.functional as F

from ddp_reference import back_to_back_ms  # CUDA events around back-to-back calls
from mnist_reference import Net  # the pytorch/examples CNN, as the reference trains it


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--sgd", action="store_true", help="fused SGD (lr 0.05, momentum 0.9) instead of fused AdamW")
    parser.add_argument("--graph", action="store_true", help="profile replays of the step captured as a CUDA graph")
    args = parser.parse_args()
    dev = torch.device("cuda")
    model = Net().to(dev).to(memory_format=torch.channels_last)
    if args.sgd:
        opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.05, device=dev), momentum=0.9, fused=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.006, device=dev), betas=(0.9, 0.99),
                                weight_decay=0.01, fused=True, capturable=args.graph)
    x = torch.randn(128, 1, 28, 28, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (128,), device=dev)
    dtype = None if args.fp32 else torch.bfloat16

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None, cache_enabled=False):
            loss = F.nll_loss(model(x), y)
        loss.backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(20):
            step()
    torch.cuda.current_stream().wait_stream(side)
    run = step
    if args.graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    torch.cuda.synchronize()
    steps = 200
    print(f"wall per step ({'graph replay' if args.graph else 'eager'}): {back_to_back_ms(run, steps) * 1e3:.1f} us")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) / steps
    print(f"GPU time per step: {total:.1f} us over {sum(e.count for e in events) / steps:.0f} kernels")
    for e in events[: args.rows]:
        print(f"{e.device_time_total / steps:8.1f} us  x{e.count / steps:4.1f}  {e.key[:110]}")


if __name__ == "__main__":
    main()
