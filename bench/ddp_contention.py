#!/usr/bin/env python3
"""What a gradient all-reduce costs the matmuls it overlaps, on 2 GPUs. The DDP lab's MLP hides
each 256 MiB fp32 gradient all-reduce behind backward's 8192^3 bf16 matmuls; this times the
pieces alone and together, in steady state (10 back-to-back iterations, median of 7 runs):
    torchrun --standalone --nproc-per-node 2 bench/ddp_contention.py
Collectives compared:
  nccl            NCCL's all-reduce (ncclAvg), NCCL's own choice of thread blocks (CTAs)
  nccl-ctasN      the same with at most N CTAs (a process group with maxCTAs = N)
  copy-engine     a 2-rank all-reduce whose bytes move by copy engine, not by SMs: each rank
                  pushes the half it does not own into the peer's symmetric buffer (torch's
                  symmetric memory, a P2P cudaMemcpy), a barrier, one add of its own half, then
                  pushes the reduced half back and copies the peer's half into place
Columns: ar = the all-reduce alone; 2mm = two matmuls alone; ar||2mm = the all-reduce launched
and then two matmuls, until both end; cost = ar||2mm - 2mm, what the overlapped all-reduce adds."""
import argparse
import os
import statistics

import torch
import torch.distributed as dist

from ddp_reference import back_to_back_ms  # the same timing as the DDP reference


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=8192, help="matmul size (n x n x n, bf16)")
    p.add_argument("--ar-mb", type=float, default=256, help="all-reduce size, MiB of fp32")
    p.add_argument("--ctas", default="16,8", help="NCCL maxCTAs caps to try besides NCCL's default")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()

    rank, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == 2, "this probe is written for 2 ranks"
    peer = 1 - rank
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)

    a = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(args.n, args.n, device=dev, dtype=torch.bfloat16)
    numel = int(args.ar_mb * 2**20 / 4) // 2 * 2
    half = numel // 2
    g = torch.randn(numel, device=dev)
    line_up = torch.zeros(1, device=dev)

    def timed(body):
        runs = []
        for i in range(args.runs + 1):  # the first run warms up
            dist.all_reduce(line_up)
            torch.cuda.synchronize()
            ms = back_to_back_ms(body, args.iters)
            if i > 0:
                runs.append(ms)
        return statistics.median(runs)

    def two_matmuls():
        torch.mm(a, b, out=c)
        torch.mm(a, b, out=c)

    collectives = {}

    def nccl(pg):
        def launch():
            return dist.all_reduce(g, op=dist.ReduceOp.AVG, group=pg, async_op=True).wait
        return launch

    collectives["nccl"] = nccl(None)
    for ctas in [int(x) for x in args.ctas.split(",") if x]:
        opts = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
        opts.config.max_ctas = ctas
        collectives[f"nccl-ctas{ctas}"] = nccl(dist.new_group(ranks=[0, 1], pg_options=opts))

    try:
        import torch.distributed._symmetric_memory as symm_mem
        group_name = dist.group.WORLD.group_name
        recv = symm_mem.empty(2 * half, dtype=torch.float32, device=dev)
        handle = symm_mem.rendezvous(recv, group_name)
        peer_recv = handle.get_buffer(peer, (2 * half,), torch.float32, 0)
        side = torch.cuda.Stream(priority=-1)
        mine, theirs = g[rank * half:(rank + 1) * half], g[peer * half:(peer + 1) * half]

        def copy_engine():
            current = torch.cuda.current_stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                peer_recv[:half].copy_(theirs)          # reduce-scatter: my part of the peer's half
                handle.barrier(channel=0)               # both pushes have landed
                mine.mul_(0.5).add_(recv[:half], alpha=0.5)  # a/2 + b/2, as ncclAvg
                peer_recv[half:].copy_(mine)            # all-gather: my reduced half to the peer
                handle.barrier(channel=1)
                theirs.copy_(recv[half:])
            return lambda: current.wait_stream(side)

        collectives["copy-engine"] = copy_engine
        push_ms = timed(lambda: peer_recv[:half].copy_(theirs))
    except Exception as e:  # noqa: BLE001 - report and go on with NCCL
        push_ms = None
        if rank == 0:
            print(f"copy-engine all-reduce unavailable: {type(e).__name__}: {e}")

    # Correctness of each collective against the exact average (every rank holds the same bits).
    ref_in = [torch.randn(numel, device=dev, generator=torch.Generator(dev).manual_seed(r)) for r in range(2)]
    expected = ref_in[0] * 0.5 + ref_in[1] * 0.5
    checks = {}
    for name, launch in collectives.items():
        g.copy_(ref_in[rank])
        launch()()
        torch.cuda.synchronize()
        checks[name] = torch.equal(g, expected)

    mm2 = timed(two_matmuls)
    rows = []
    for name, launch in collectives.items():
        alone = timed(lambda: launch()())

        def overlapped():
            wait = launch()
            two_matmuls()
            wait()

        rows.append((name, alone, timed(overlapped), checks[name]))
    if rank == 0:
        print(f"2 x matmul {args.n}^3 bf16: {mm2:.3f} ms; all-reduce {args.ar_mb:.0f} MiB fp32"
              + (f"; one copy-engine push of {args.ar_mb / 2:.0f} MiB: {push_ms:.3f} ms" if push_ms else ""))
        print("| collective | ar | ar||2mm | cost | exact average |")
        print("| --- | --- | --- | --- | --- |")
        for name, alone, both, ok in rows:
            print(f"| {name} | {alone:.3f} | {both:.3f} | {both - mm2:+.3f} | {'yes' if ok else 'NO'} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
