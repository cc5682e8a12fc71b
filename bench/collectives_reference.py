#!/usr/bin/env python3
"""torch.distributed's NCCL collectives timed as the DDP lab's collectives bench times ours
(`ddp --set collectives.enabled=true`): all-reduce, reduce-scatter (reduce_scatter_tensor),
all-gather (all_gather_into_tensor) and the two in a row, fp32, whole buffers of 4 KiB to
256 MiB, the median over 5 windows of 20 calls back to back (CUDA events), every window started
together. Launch with torchrun:
    torchrun --standalone --nproc-per-node 2 bench/collectives_reference.py [--csv out.csv]
Prints on rank 0 the same columns as collectives.csv: us/call, algbw and busbw (nccl-tests'
factors: 2(W-1)/W for all-reduce and the pair, (W-1)/W for the other two)."""
import argparse
import os
import statistics

import torch
import torch.distributed as dist


def ms_per_call(call, warmup, windows, iterations):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(windows):
        torch.cuda.synchronize()
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / iterations)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-kib", default="4,64,1024,16384,262144")
    parser.add_argument("--csv", help="rank 0 writes the rows here too")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for kib in (int(s) for s in args.sizes_kib.split(",")):
        shard = -(-kib * 1024 // 4 // world)
        whole = torch.ones(world * shard, device="cuda")
        part = whole.narrow(0, rank * shard, shard)
        calls = {
            "all-reduce": lambda: dist.all_reduce(whole),
            "reduce-scatter": lambda: dist.reduce_scatter_tensor(part, whole),
            "all-gather": lambda: dist.all_gather_into_tensor(whole, part),
            "reduce-scatter + all-gather": lambda: (dist.reduce_scatter_tensor(part, whole),
                                                   dist.all_gather_into_tensor(whole, part)),
        }
        for op, call in calls.items():
            whole.fill_(1)
            ms = ms_per_call(call, 5, 5, 20)
            nbytes = whole.numel() * 4
            factor = (world - 1) / world if op in ("reduce-scatter", "all-gather") else 2 * (world - 1) / world
            algbw = nbytes / (ms * 1e-3) / 1e9
            rows.append((op, nbytes / 1024, ms * 1e3, algbw, algbw * factor))
    if rank == 0:
        print(f"PyTorch {torch.__version__} collectives on {world} rank(s), nccl {'.'.join(map(str, torch.cuda.nccl.version()))}, fp32")
        print(f"{'collective':28} {'KiB':>8} {'us/call':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}")
        for op, kib, us, algbw, busbw in rows:
            print(f"{op:28} {kib:8.0f} {us:9.1f} {algbw:11.2f} {busbw:11.2f}")
        if args.csv:
            with open(args.csv, "w") as f:
                f.write("op,kib,us,algbw_gbps,busbw_gbps\n")
                f.writelines(f"{op},{kib:.0f},{us:.3f},{algbw:.4f},{busbw:.4f}\n" for op, kib, us, algbw, busbw in rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
