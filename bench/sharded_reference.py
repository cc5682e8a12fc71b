#!/usr/bin/env python3
"""PyTorch's side of the sharded_training lab: a model trained under DistributedDataParallel with
torch's AdamW (fused, lr 1e-3, weight decay 0.01), then with torch.distributed.optim.
ZeroRedundancyOptimizer around the same AdamW (ZeRO-1: each rank steps its parameters' share and
broadcasts it), then under FSDP2 (fully_shard on each layer or block and on the root, fused AdamW
over the sharded parameters: ZeRO-3, PyTorch's default of prefetching one unit ahead).

The model (--model):
  mlp  the lab's MLP (default): layers x Linear(width) with ReLU, fp32, MSE on the lab's kind of
       batch (--batch samples per rank); FSDP2's units are the Linears.
  gpt  a GPT-2-style model: token and position embeddings, --layers pre-LayerNorm blocks of
       --width (causal self-attention with --heads heads through scaled_dot_product_attention,
       a 4x GELU-tanh MLP, biases in every Linear and LayerNorm), a last LayerNorm, the head tied
       to the token embedding, no dropout; GPT-2's initialisation (normal 0.02, the blocks'
       c_proj weights 0.02 / sqrt(2 layers)) drawn after torch.manual_seed(0) in parameter
       order; --batch sequences per rank of --context random tokens below --vocab (step s's
       tokens from a generator seeded 1000003 + s, the same for every setting); cross-entropy.
       FSDP2's units are the blocks. With --fsdp-tuned, a setting fsdp2-tuned runs after fsdp2,
       set up as torchtitan does: every block but the last reshards after forward, the last and
       the root do not, and each block explicitly prefetches the next in forward and the
       previous in backward.

Launch with torchrun:
    torchrun --standalone --nproc-per-node 2 bench/sharded_reference.py [--width 8192 --layers 4]
        [--memory-cap-mib 4096 --expandable-segments] [--fsdp-param-dtype bfloat16]
    torchrun --standalone --nproc-per-node 4 bench/sharded_reference.py --model gpt --layers 24 \\
        --width 1024 --heads 16 --context 1024 --vocab 50304 --batch 8 \\
        --fsdp-param-dtype bfloat16 --fsdp-tuned                                  # GPT-2 medium
    torchrun --standalone --nproc-per-node 2 bench/sharded_reference.py --device cpu --model gpt \\
        --layers 2 --width 32 --heads 4 --context 16 --vocab 64 --batch 2 --steps 4 --warmup 1 \\
        --fsdp-tuned --json /tmp/ref.json                                    # smoke test (gloo)
The settings run in the order fsdp2, fsdp2-tuned, ddp, zero-1; --settings fsdp2,ddp picks some of
them. --json PATH has rank 0 write one row per setting.

Prints on rank 0, per setting: the optimizer state this rank holds, what the CUDA allocator holds
after training (model, gradients, optimizer) and its peak, the median ms per step after the
warm-up (CUDA events around zero_grad, forward, backward and the step; time.perf_counter on the
CPU, where memory reads 0), the samples (mlp) or tokens (gpt) per second of all ranks, and the last
step's loss, averaged over the ranks. With a memory cap (the lab's memory.cap_mib:
torch.cuda.set_per_process_memory_fraction), a setting that runs out of memory says so and the
next one runs; --expandable-segments is the lab's memory.expandable_segments (the allocator grows
segments in place)."""
import argparse
import gc
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

SETTINGS = ("fsdp2", "fsdp2-tuned", "ddp", "zero-1")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def mlp(width, layers, device):
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods).to(device)


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, h):
        h = h + self.attn(self.ln_1(h))
        return h + self.mlp(self.ln_2(h))


class GPT(nn.Module):
    def __init__(self, layers, width, heads, context, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx):
        h = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            h = block(h)
        return F.linear(self.ln_f(h), self.wte.weight)  # the head is tied to wte


def gpt_module(args):
    return GPT(args.layers, args.width, args.heads, args.context, args.vocab)


def gpt(args, device):
    """The GPT, its weights drawn on the CPU after torch.manual_seed(0) in named_parameters()
    order (wte, wpe, then per block c_attn, attn.c_proj, c_fc, mlp.c_proj): the construction's
    own draws are overwritten."""
    model = gpt_module(args)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:  # the Linears' weights and both embeddings
                p.normal_(0.0, 0.02 / math.sqrt(2 * args.layers) if name.endswith("c_proj.weight") else 0.02)
            elif name.endswith("weight"):  # LayerNorms
                p.fill_(1.0)
            else:  # biases
                p.zero_()
    return model.to(device)


def gpt_parameter_count(args):
    with torch.device("meta"):
        return sum(p.numel() for p in gpt_module(args).parameters())  # wte once: the head has none


def mlp_batch(step, args, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(1000003 + step)
    x = torch.randn(args.batch * world, args.width, generator=gen)[rank * args.batch:(rank + 1) * args.batch].to(device)
    return x, torch.sin(x * 2).roll(1, 1)


def gpt_batch(step, args, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(1000003 + step)
    tokens = torch.randint(args.vocab, (args.batch * world, args.context + 1), generator=gen)
    tokens = tokens[rank * args.batch:(rank + 1) * args.batch]
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def mlp_loss(model, x, y):
    return F.mse_loss(model(x), y)


def gpt_loss(model, idx, targets):
    logits = model(idx)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def shard(model, args, device, tuned):
    """FSDP2: fully_shard on each unit (the MLP's Linears, the GPT's blocks), then on the root.
    Tuned (torchtitan's way): every block but the last reshards after forward, the last and the
    root keep their parameters for backward, and each block prefetches its neighbours explicitly.
    The root's output is float32, and so is each Linear's in the MLP; the GPT's blocks hand on the
    residual stream in param_dtype (ln_f's bfloat16 LayerNorm takes no float32 input)."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    dtypes = dict(param_dtype=DTYPES[args.fsdp_param_dtype], reduce_dtype=DTYPES[args.fsdp_reduce_dtype])
    policy = MixedPrecisionPolicy(**dtypes, output_dtype=torch.float32)
    if isinstance(model, GPT):
        units, unit_policy = list(model.h), MixedPrecisionPolicy(**dtypes)
    else:
        units, unit_policy = [m for m in model if isinstance(m, nn.Linear)], policy
    for i, unit in enumerate(units):
        reshard = i + 1 < len(units) if tuned else None  # None: FSDP2's default (True, False for the root)
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=unit_policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=False if tuned else None, mp_policy=policy)
    if tuned:
        for i, unit in enumerate(units):
            if i + 1 < len(units):
                unit.set_modules_to_forward_prefetch([units[i + 1]])
            if i > 0:
                unit.set_modules_to_backward_prefetch([units[i - 1]])


def build(setting, args, device):
    model = gpt(args, device) if args.model == "gpt" else mlp(args.width, args.layers, device)
    if setting.startswith("fsdp2"):
        shard(model, args, device, tuned=setting == "fsdp2-tuned")
        reset_peak(device)  # the whole model was made first, as the lab does
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def optimizer(setting, model):
    if setting == "zero-1":
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                       weight_decay=0.01, fused=True)
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)


def allocated(device):
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def peak_allocated(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def free_memory(device):
    gc.collect()  # the previous setting's model and optimizer (DDP's reducer holds cycles)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed(fn, device):
    """fn()'s result and its milliseconds: CUDA events on a GPU, time.perf_counter on the CPU."""
    if device.type != "cuda":
        begin = time.perf_counter()
        out = fn()
        return out, 1000 * (time.perf_counter() - begin)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    out = fn()
    end.record()
    end.synchronize()
    return out, begin.elapsed_time(end)


def state_bytes(setting, opt):
    state = opt.optim.state if setting == "zero-1" else opt.state
    def local_bytes(t):  # FSDP2's state is DTensors: this rank's shard
        return (t.to_local() if hasattr(t, "to_local") else t).nbytes
    return sum(local_bytes(t) for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def mean_over_ranks(loss):
    total = loss.detach().float().clone()
    dist.all_reduce(total)  # gloo has no AVG
    return total.item() / dist.get_world_size()


def run(setting, args, device):
    free_memory(device)  # before `start`
    reset_peak(device)
    start = allocated(device)
    model = build(setting, args, device)
    opt = optimizer(setting, model)
    batch, loss_fn = (gpt_batch, gpt_loss) if args.model == "gpt" else (mlp_batch, mlp_loss)
    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        return loss
    times = []
    for s in range(args.steps):
        x, y = batch(s, args, device)
        loss, ms = timed(lambda: step(x, y), device)
        if s >= args.warmup:
            times.append(ms)
    held = allocated(device) - start
    peak = peak_allocated(device) - start
    ms = statistics.median(times)
    per_step = args.batch * (args.context if args.model == "gpt" else 1) * dist.get_world_size()
    return dict(setting=setting, state_bytes=state_bytes(setting, opt), held_bytes=held, peak_bytes=peak, ms=ms,
                **{rate_key(args): 1000 * per_step / ms}, final_loss=mean_over_ranks(loss), out_of_memory=False)


def rate_key(args):
    return "tokens_per_s" if args.model == "gpt" else "samples_per_s"


def run_or_not(setting, args, device):
    """run()'s row; or one that says this setting ran out of memory (every rank does, at the same
    allocation: they hold the same shapes), or, on the CPU, why FSDP2 could not run there."""
    empty = dict(setting=setting, state_bytes=None, held_bytes=None, peak_bytes=None, ms=None,
                 **{rate_key(args): None}, final_loss=None, out_of_memory=False)
    try:
        return run(setting, args, device)
    except torch.OutOfMemoryError:
        row = dict(empty, out_of_memory=True)
    except Exception as e:
        if device.type != "cpu" or not setting.startswith("fsdp2"):
            raise
        row = dict(empty, not_run=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    free_memory(device)
    return row


def header(args):
    world = dist.get_world_size()
    if args.model == "gpt":
        model = (f"GPT {args.layers} blocks x width {args.width}, {args.heads} heads, context {args.context}, "
                 f"vocab {args.vocab}, {gpt_parameter_count(args)} parameters, batch {args.batch} sequences per rank")
    else:
        model = f"MLP {args.layers} x Linear({args.width}), batch {args.batch} per rank"
    cap = f", capped at {args.memory_cap_mib} MiB per rank" if args.memory_cap_mib else ""
    cap += ", expandable segments" if args.expandable_segments else ""
    cap += ", on the CPU (gloo)" if args.device == "cpu" else ""
    return (f"PyTorch {torch.__version__}: {model}, {world} rank(s), fp32 (FSDP2 computes in {args.fsdp_param_dtype}, "
            f"reduces in {args.fsdp_reduce_dtype}){cap}")


def print_table(rows, args):
    print(header(args))
    w = max([8] + [len(row["setting"]) for row in rows])
    rate = "tokens/s" if args.model == "gpt" else "samples/s"
    print(f"{'setting':{w}} {'state (bytes)':>14} {'held (bytes)':>14} {'peak (bytes)':>14} {'ms/step':>9} {rate:>10} "
          f"{'final loss':>11}")
    for row in rows:
        if row["out_of_memory"]:
            print(f"{row['setting']:{w}} out of memory")
        elif "not_run" in row:
            print(f"{row['setting']} not run on cpu: {row['not_run']}")
        else:
            print(f"{row['setting']:{w}} {row['state_bytes']:14d} {row['held_bytes']:14d} {row['peak_bytes']:14d} "
                  f"{row['ms']:9.3f} {row[rate_key(args)]:10.0f} {row['final_loss']:11.6f}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    parser.add_argument("--width", type=int, default=1024, help="the MLP's Linears, the GPT's n_embd")
    parser.add_argument("--layers", type=int, default=4, help="the MLP's Linears, the GPT's blocks")
    parser.add_argument("--heads", type=int, default=4, help="gpt only")
    parser.add_argument("--context", type=int, default=64, help="gpt only: tokens per sequence")
    parser.add_argument("--vocab", type=int, default=256, help="gpt only")
    parser.add_argument("--batch", type=int, default=64, help="per rank: samples (mlp) or sequences (gpt)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, for smoke tests")
    parser.add_argument("--memory-cap-mib", type=int, default=0, help="per rank (0: the whole GPU)")
    parser.add_argument("--expandable-segments", action="store_true",
                        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as the lab's memory.expandable_segments")
    parser.add_argument("--fsdp-param-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--fsdp-reduce-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--fsdp-tuned", action="store_true", help="gpt only: also fsdp2-tuned, after fsdp2")
    parser.add_argument("--settings", help=f"comma list of {','.join(SETTINGS)} (default: all that apply)")
    parser.add_argument("--json", help="rank 0 writes the rows here")
    args = parser.parse_args()
    if args.model == "mlp" and args.fsdp_tuned:
        parser.error("--fsdp-tuned is for --model gpt")
    if args.model == "gpt" and args.width % args.heads:
        parser.error("--width must be a multiple of --heads")
    if args.device == "cpu" and (args.memory_cap_mib or args.expandable_segments):
        parser.error("--memory-cap-mib and --expandable-segments are for --device cuda")
    if args.steps <= args.warmup:
        parser.error("--steps must be more than --warmup")
    default = [s for s in SETTINGS if s != "fsdp2-tuned" or args.fsdp_tuned]
    args.settings = args.settings.split(",") if args.settings else default
    allowed = [s for s in SETTINGS if s != "fsdp2-tuned" or args.model == "gpt"]
    unknown = [s for s in args.settings if s not in allowed]
    if unknown:
        parser.error(f"--settings: {','.join(unknown)} not among {','.join(allowed)}")
    args.settings = [s for s in SETTINGS if s in args.settings]
    return args


def init_distributed(args):
    if args.device == "cpu":
        dist.init_process_group("gloo")
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    if args.expandable_segments:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    if args.memory_cap_mib:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.memory_cap_mib * 2**20 / total, device)
    return device


def main():
    args = parse_args()
    device = init_distributed(args)
    rows = [run_or_not(setting, args, device) for setting in args.settings]
    if dist.get_rank() == 0:
        print_table(rows, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    dist.barrier()  # gloo: a rank that tears down while another still prints aborts now and then (FSDP2 on the CPU)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
