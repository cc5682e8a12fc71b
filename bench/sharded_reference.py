#!/usr/bin/env python3
"""PyTorch's side of the sharded_training lab: the lab's MLP (layers x Linear(width) with ReLU,
fp32, MSE on the lab's kind of batch) trained under DistributedDataParallel with torch's AdamW
(fused), then with torch.distributed.optim.ZeroRedundancyOptimizer around the same AdamW (ZeRO-1:
each rank steps its parameters' share and broadcasts it), then under FSDP2 (fully_shard on each
Linear and on the root, fp32, fused AdamW over the sharded parameters: ZeRO-3, PyTorch's default
of prefetching one layer ahead). Launch with torchrun:
    torchrun --standalone --nproc-per-node 2 bench/sharded_reference.py [--width 8192 --layers 4]
        [--memory-cap-mib 4096 --expandable-segments] [--fsdp-param-dtype bfloat16]
Prints on rank 0, per setting: the optimizer state this rank holds, what the CUDA allocator holds
after training (model, gradients, optimizer) and its peak, the median ms per step after the
warm-up (CUDA events around forward, backward and the step) and the samples per second of all
ranks. With a memory cap (the lab's memory.cap_mib: torch.cuda.set_per_process_memory_fraction), a
setting that runs out of memory says so and the next one runs; --expandable-segments is the lab's
memory.expandable_segments (the allocator grows segments in place)."""
import argparse
import gc
import os
import statistics

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel


def mlp(width, layers, device):
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods).to(device)


def run(setting, args, device):
    gc.collect()  # the previous setting's model and optimizer (DDP's reducer holds cycles) before `start`
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    if setting == "fsdp2":
        model = mlp(args.width, args.layers, device)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}
        policy = MixedPrecisionPolicy(param_dtype=dtype[args.fsdp_param_dtype],
                                      reduce_dtype=dtype[args.fsdp_reduce_dtype], output_dtype=torch.float32)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        torch.cuda.reset_peak_memory_stats(device)  # the whole model was made first, as the lab does
    else:
        model = DistributedDataParallel(mlp(args.width, args.layers, device), device_ids=[device.index])
    if setting in ("ddp", "fsdp2"):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    else:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                      weight_decay=0.01, fused=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    times = []
    for step in range(args.steps):
        gen = torch.Generator().manual_seed(1000003 + step)
        x = torch.randn(args.batch * world, args.width, generator=gen)[rank * args.batch:(rank + 1) * args.batch].to(device)
        y = torch.sin(x * 2).roll(1, 1)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        end.record()
        end.synchronize()
        if step >= args.warmup:
            times.append(begin.elapsed_time(end))
    state = opt.optim.state if setting == "zero-1" else opt.state
    def local_bytes(t):  # FSDP2's state is DTensors: this rank's shard
        return (t.to_local() if hasattr(t, "to_local") else t).nbytes
    state_bytes = sum(local_bytes(t) for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    held = torch.cuda.memory_allocated(device) - start
    peak = torch.cuda.max_memory_allocated(device) - start
    ms = statistics.median(times)
    return state_bytes, held, peak, ms, 1000 * args.batch * world / ms


def run_or_out_of_memory(setting, args, device):
    """run()'s row, or None when this setting ran out of memory (every rank does, at the same
    allocation: they hold the same shapes)."""
    try:
        return run(setting, args, device)
    except torch.OutOfMemoryError:
        pass
    gc.collect()
    torch.cuda.empty_cache()
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--memory-cap-mib", type=int, default=0, help="per rank (0: the whole GPU)")
    parser.add_argument("--expandable-segments", action="store_true",
                        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as the lab's memory.expandable_segments")
    parser.add_argument("--fsdp-param-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--fsdp-reduce-dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    if args.expandable_segments:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    if args.memory_cap_mib:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.memory_cap_mib * 2**20 / total, device)
    rows = [(setting, run_or_out_of_memory(setting, args, device)) for setting in ("fsdp2", "ddp", "zero-1")]
    if dist.get_rank() == 0:
        cap = f", capped at {args.memory_cap_mib} MiB per rank" if args.memory_cap_mib else ""
        cap += ", expandable segments" if args.expandable_segments else ""
        print(f"PyTorch {torch.__version__}: MLP {args.layers} x Linear({args.width}), batch {args.batch} per rank, "
              f"{dist.get_world_size()} rank(s), fp32 (FSDP2 computes in {args.fsdp_param_dtype}, reduces in "
              f"{args.fsdp_reduce_dtype}){cap}")
        print(f"{'setting':8} {'state (bytes)':>14} {'held (bytes)':>14} {'peak (bytes)':>14} {'ms/step':>9} {'samples/s':>10}")
        for setting, row in rows:
            if row is None:
                print(f"{setting:8} out of memory")
            else:
                state, held, peak, ms, samples = row
                print(f"{setting:8} {state:14d} {held:14d} {peak:14d} {ms:9.3f} {samples:10.0f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
