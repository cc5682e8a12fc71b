#!/usr/bin/env python3
"""The AMP lab's MLP benchmark in Python PyTorch: the anchor to compare build/bin/amp_training with.

Same model (layers x Linear(width, width), ReLU between), same loss (the outputs' sum over the
batch size, in fp32 outside autocast), same optimizer (fused SGD, no momentum), same zeroing
(set_to_none), same timing protocol as the lab (warm-up steps, then `repeats` windows of
`window` steps timed with CUDA events; the median and IQR over the windows). fp16-mixed uses
torch.amp.GradScaler, so "GradScaler cost" is the fp16-mixed step minus the same step without it.

    python3 bench/amp_reference.py [--width 8192 --layers 4 --batch 8192]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--window", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--precisions", default="fp32,tf32,fp16-mixed,fp16-mixed-no-scaler,bf16-mixed")
    return p.parse_args()


def quartiles(values):
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[1], q[2] - q[0]


def run(args, precision):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = [torch.nn.Linear(args.width, args.width).to(dev) for _ in range(args.layers)]
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = torch.optim.SGD(params, lr=args.lr, fused=True)
    x = torch.randn(args.batch, args.width, device=dev)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    dtype = {"fp16-mixed": torch.float16, "fp16-mixed-no-scaler": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16-mixed")

    def step():
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            h = x
            for i, layer in enumerate(layers):
                h = layer(h)
                if i + 1 < len(layers):
                    h = F.relu(h)
        loss = h.sum(dtype=torch.float32) / args.batch
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    per_step = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.repeats):
        start.record()
        for _ in range(args.window):
            loss = step()
        stop.record()
        stop.synchronize()
        per_step.append(start.elapsed_time(stop) / args.window)
    median, iqr = quartiles(per_step)
    # As the lab counts (amplab::wide_mlp_step_flops): 6 x batch x width^2 per layer, less the first
    # layer's input gradient, which autograd never computes (x needs no gradient).
    flops = (6.0 * args.layers - 2) * args.batch * args.width * args.width
    return {"precision": precision, "ms": median, "iqr": iqr, "tflops": flops / (median / 1e3) / 1e12,
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20, "loss": loss.item()}


def main():
    args = parse_args()
    rows = [run(args, p) for p in args.precisions.split(",")]
    print(f"python reference: {args.layers} x Linear({args.width}, {args.width}), batch {args.batch}, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median of {args.repeats} windows of {args.window} steps")
    print(f"{'precision':24s} {'ms/step':>8s} {'IQR':>6s} {'TFLOP/s':>8s} {'peak MiB':>9s}")
    for r in rows:
        print(f"{r['precision']:24s} {r['ms']:8.3f} {r['iqr']:6.3f} {r['tflops']:8.1f} {r['peak_mib']:9.0f}")
    by = {r["precision"]: r for r in rows}
    if "fp16-mixed" in by and "fp16-mixed-no-scaler" in by:
        cost = by["fp16-mixed"]["ms"] - by["fp16-mixed-no-scaler"]["ms"]
        print(f"python GradScaler cost: {cost:.3f} ms per step = {100 * cost / by['fp16-mixed']['ms']:.2f}% of the fp16-mixed step")


if __name__ == "__main__":
    main()
