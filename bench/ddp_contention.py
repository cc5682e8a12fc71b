#!/usr/bin/env python3
"""What a gradient all-reduce costs the matmuls it overlaps, on 2 GPUs. The DDP lab's MLP hides
each 256 MiB fp32 gradient all-reduce behind backward's 8192^3 bf16 matmuls; this times the
pieces alone and together, in steady state (10 back-to-back iterations, median of 7 runs):
    torchrun --standalone --nproc-per-node 2 bench/ddp_contention.py
Collectives compared (and one control):
  nccl            NCCL's all-reduce (ncclAvg), NCCL's own choice of thread blocks (CTAs)
  nccl-ctasN      the same with at most N CTAs (a process group with maxCTAs = N)
  copy-engine     a 2-rank all-reduce whose bytes move by copy engine, not by SMs: each rank
                  pushes the half it does not own into the peer's symmetric buffer (torch's
                  symmetric memory, a P2P cudaMemcpy), a barrier, one add of its own half, then
                  pushes the reduced half back and copies the peer's half into place
  local-copy      not a collective: two copies of the same buffer on this GPU alone (the HBM
                  bytes of NCCL's 2-rank all-reduce, about 4 x its size), no link, no peer
Columns: ar = the all-reduce alone; 2mm = two matmuls alone; ar||2mm = the all-reduce launched
and then two matmuls, until both end; cost = ar||2mm - 2mm, what the overlapped all-reduce adds. With nvidia-ml-py (pynvml), also the
SM clock (median of samples every 5 ms) during 2mm and during ar||2mm, whether the power cap was
holding it down, and "at 2mm's clock": the cost left once the lower clock is accounted for
(ar||2mm x its clock / 2mm's clock - 2mm), i.e. what the all-reduce costs in cycles rather than
in power. Steady state: a run is --iters back-to-back iterations (50: ~0.2 s of matmuls, long
enough for the power cap to settle)."""
import argparse
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist

from ddp_reference import back_to_back_ms  # the same timing as the DDP reference


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=8192, help="matmul size (n x n x n, bf16)")
    p.add_argument("--ar-mb", type=float, default=256, help="all-reduce size, MiB of fp32")
    p.add_argument("--ctas", default="16,8", help="NCCL maxCTAs caps to try besides NCCL's default")
    p.add_argument("--iters", type=int, default=50)
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

    clocks = ClockSampler(dev)

    def timed(body):
        runs = []
        clocks.start()
        for i in range(args.runs + 1):  # the first run warms up
            dist.all_reduce(line_up)
            torch.cuda.synchronize()
            ms = back_to_back_ms(body, args.iters)
            if i > 0:
                runs.append(ms)
        return statistics.median(runs), clocks.stop()

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
        push_ms = timed(lambda: peer_recv[:half].copy_(theirs))[0]
    except Exception as e:  # noqa: BLE001 - report and go on with NCCL
        push_ms = None
        if rank == 0:
            print(f"copy-engine all-reduce unavailable: {type(e).__name__}: {e}")

    # Correctness of each collective against the exact average (every rank holds the same bits).
    ref_in = [torch.randn(numel, device=dev, generator=torch.Generator(dev).manual_seed(r)) for r in range(2)]
    expected = ref_in[0] * 0.5 + ref_in[1] * 0.5
    checks = {}
    for name, launch in collectives.items():
        if name == "local-copy":
            continue
        g.copy_(ref_in[rank])
        launch()()
        torch.cuda.synchronize()
        checks[name] = torch.equal(g, expected)

    # The control: NCCL's HBM traffic without the link (read + write of the buffer, twice).
    scratch = torch.empty_like(g)
    copy_side = torch.cuda.Stream(priority=-1)

    def local_copy():
        current = torch.cuda.current_stream()
        copy_side.wait_stream(current)
        with torch.cuda.stream(copy_side):
            scratch.copy_(g)
            g.copy_(scratch)
        return lambda: current.wait_stream(copy_side)

    collectives["local-copy"] = local_copy
    checks["local-copy"] = None

    mm2, mm2_clock = timed(two_matmuls)
    rows = []
    for name, launch in collectives.items():
        alone, _ = timed(lambda: launch()())

        def overlapped():
            wait = launch()
            two_matmuls()
            wait()

        both, both_clock = timed(overlapped)
        rows.append((name, alone, both, both_clock, checks[name]))
    if rank == 0:
        print(f"2 x matmul {args.n}^3 bf16: {mm2:.3f} ms{describe(mm2_clock)}; all-reduce {args.ar_mb:.0f} MiB fp32"
              + (f"; one copy-engine push of {args.ar_mb / 2:.0f} MiB: {push_ms:.3f} ms" if push_ms else ""))
        print("| collective | ar | ar||2mm | cost | SM clock in ar||2mm | cost at 2mm's clock | exact average |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, alone, both, clock, ok in rows:
            at_same_clock = (f"{both * clock[0] / mm2_clock[0] - mm2:+.3f}" if clock and mm2_clock else "-")
            exact = "-" if ok is None else ("yes" if ok else "NO")
            print(f"| {name} | {alone:.3f} | {both:.3f} | {both - mm2:+.3f} | {describe(clock).lstrip('; ') or '-'} "
                  f"| {at_same_clock} | {exact} |")
    dist.destroy_process_group()


def describe(clock):
    if not clock:
        return ""
    mhz, watts, capped = clock
    return f"; {mhz:.0f} MHz, {watts:.0f} W, power-capped {100 * capped:.0f}%"


class ClockSampler:
    """This GPU's SM clock, power and power-cap flag every 5 ms through NVML (nvidia-ml-py), while
    running; stop() gives the medians and the capped share, or None without NVML."""

    def __init__(self, dev):
        self.handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            props = torch.cuda.get_device_properties(dev)
            if hasattr(props, "pci_bus_id"):  # NVML numbers GPUs its own way; the bus id names the same one
                self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(
                    f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0")
            else:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(dev.index)
            self.nvml = pynvml
            self.reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        except Exception:  # noqa: BLE001 - no NVML: no clocks, the timings still stand
            self.handle = None
        self.samples, self.running, self.thread = [], False, None

    def start(self):
        if self.handle is None:
            return
        self.samples, self.running = [], True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        n = self.nvml
        while self.running:
            self.samples.append((n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                                 n.nvmlDeviceGetPowerUsage(self.handle) / 1e3,
                                 bool(self.reasons(self.handle) & 0x4)))  # SwPowerCap
            time.sleep(0.005)

    def stop(self):
        if self.thread is None:
            return None
        self.running = False
        self.thread.join()
        self.thread = None
        if not self.samples:
            return None
        return (statistics.median(s[0] for s in self.samples), statistics.median(s[1] for s in self.samples),
                sum(s[2] for s in self.samples) / len(self.samples))


if __name__ == "__main__":
    main()
