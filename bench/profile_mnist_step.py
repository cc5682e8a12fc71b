#!/usr/bin/env python3
"""Where the GPU time of one MNIST training step goes: the pytorch/examples CNN, batch 128,
channels-last, bf16 autocast, fused AdamW (the lab's configs/mnist.yaml; --sgd for fused SGD),
profiled with torch.profiler, eagerly or (--graph) as the replays of one captured CUDA graph, as
the lab runs it; prints the kernels by total CUDA time. Run on a GPU machine:
    python3 bench/profile_mnist_step.py [--fp32] [--sgd] [--graph]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddp_reference import back_to_back_ms  # CUDA events around back-to-back calls


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


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
