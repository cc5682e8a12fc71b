#!/usr/bin/env python3
"""The transformer_fp8 lab's GPT in Python PyTorch: the anchor to compare build/bin/transformer_fp8 with.

Same model as labs/transformer_fp8/gpt.hpp (nanoGPT's: token + position embeddings, pre-LayerNorm
blocks, causal self-attention, a 4x GELU MLP, no biases in the linears and LayerNorms, the head tied
to the token embedding, nanoGPT's initialisation drawn as the C++ GPT draws it: --seed gives the
weights, batches and dropout masks of the app's run.seed), same data
(data/shakespeare/{train,val}.txt, characters, the vocabulary of both files), same optimizer
(nanoGPT's: fused AdamW lr 1e-3, betas 0.9/0.99, weight decay 0.1 on the 2-D parameters only, as the
lab's config), nanoGPT's schedule (linear warm-up over --lr-warmup steps, then a cosine down to
--min-lr at --lr-decay-steps), clipping at 1.0, same steps and evaluations, same timing (the steps
after --warmup, the device synchronized around each step; evaluations left out). Rows: fp32, tf32,
fp16 (torch.amp.GradScaler), fp16-no-scaler, bf16, bf16-math (attention written out instead of
SDPA), and with --compile, bf16-compile (torch.compile of the model).

    .venv/bin/python bench/gpt_reference.py [--steps 300] [--rows fp32,bf16] [--json out.json]
    .venv/bin/python bench/gpt_reference.py --device cpu --n-layer 2 --n-head 4 --n-embd 64 \\
        --block-size 64 --batch 16 --steps 200 --eval-every 50 --eval-iters 8 --lr-warmup 20 \\
        --rows fp32,bf16                                         # the app's cpu: section
"""
import argparse
import json
import math
import pathlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT / "data" / "shakespeare"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10, help="first steps left out of ms/step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--lr-warmup", type=int, default=100, help="steps of learning-rate warm-up (nanoGPT's warmup_iters)")
    p.add_argument("--lr-decay-steps", type=int, default=5000, help="nanoGPT's lr_decay_iters")
    p.add_argument("--rows", default="fp32,tf32,fp16,fp16-no-scaler,bf16,bf16-math")
    p.add_argument("--compile", action="store_true", help="also bf16 with torch.compile")
    p.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune"],
                   help="torch.compile's mode for the bf16-compile row (reduce-overhead adds CUDA graphs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


class Attention(nn.Module):
    def __init__(self, a, math_path):
        super().__init__()
        self.n_head, self.dropout, self.math_path = a.n_head, a.dropout, math_path
        self.qkv = nn.Linear(a.n_embd, 3 * a.n_embd, bias=False)
        self.proj = nn.Linear(a.n_embd, a.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(a.dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        p = self.dropout if self.training else 0.0
        if self.math_path:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            weights = F.dropout(scores.masked_fill(~causal, float("-inf")).softmax(-1), p, self.training)
            y = weights @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class Block(nn.Module):
    def __init__(self, a, math_path):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(a.n_embd, bias=False), nn.LayerNorm(a.n_embd, bias=False)
        self.attn = Attention(a, math_path)
        self.fc = nn.Linear(a.n_embd, 4 * a.n_embd, bias=False)
        self.fc_proj = nn.Linear(4 * a.n_embd, a.n_embd, bias=False)
        self.mlp_dropout = nn.Dropout(a.dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp_dropout(self.fc_proj(F.gelu(self.fc(self.ln2(x)))))


class Gpt(nn.Module):
    def __init__(self, a, vocab, math_path=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, a.n_embd), nn.Embedding(a.block_size, a.n_embd)
        self.drop = nn.Dropout(a.dropout)
        self.blocks = nn.ModuleList(Block(a, math_path) for _ in range(a.n_layer))
        self.ln_f = nn.LayerNorm(a.n_embd, bias=False)
        # nanoGPT's initialisation, drawn in the C++ GPT's order from a generator of its own: the
        # same seed gives both the same weights
        init = torch.Generator().manual_seed(a.seed)
        residual_std = 0.02 / math.sqrt(2 * a.n_layer)
        with torch.no_grad():
            self.wte.weight.normal_(0.0, 0.02, generator=init)
            self.wpe.weight.normal_(0.0, 0.02, generator=init)
            for b in self.blocks:
                b.attn.qkv.weight.normal_(0.0, 0.02, generator=init)
                b.attn.proj.weight.normal_(0.0, residual_std, generator=init)
                b.fc.weight.normal_(0.0, 0.02, generator=init)
                b.fc_proj.weight.normal_(0.0, residual_std, generator=init)

    def forward(self, idx, targets):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device)))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def load(a):
    d = pathlib.Path(a.data)
    if not (d / "train.txt").exists():
        raise SystemExit(f"error: no {d}/train.txt: run '.venv/bin/python scripts/fetch-shakespeare.py' first")
    train, val = (d / "train.txt").read_text(), (d / "val.txt").read_text()
    vocab = sorted(set(train + val))
    index = {c: i for i, c in enumerate(vocab)}
    encode = lambda s: torch.tensor([index[c] for c in s], dtype=torch.int64)  # noqa: E731
    return encode(train), encode(val), len(vocab)


def batch(split, a, dev):
    starts = torch.randint(split.numel() - a.block_size - 1, (a.batch, 1))
    windows = split[starts + torch.arange(a.block_size + 1)].to(dev)
    return windows[:, :-1], windows[:, 1:]


def learning_rate(a, it):
    """nanoGPT's get_lr: linear warm-up, then a cosine from --lr down to --min-lr."""
    if it < a.lr_warmup:
        return a.lr * (it + 1) / (a.lr_warmup + 1)
    if it > a.lr_decay_steps:
        return a.min_lr
    decayed = (it - a.lr_warmup) / (a.lr_decay_steps - a.lr_warmup)
    return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * decayed)) * (a.lr - a.min_lr)


def optimizer_of(a, model):
    """nanoGPT's configure_optimizers: weight decay on the matrices, none on the LayerNorms."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.99), fused=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def run_row(a, row, data, dev):
    train, val, vocab = data
    model = Gpt(a, vocab, math_path=row == "bf16-math").to(dev)
    torch.manual_seed(a.seed)  # batches and dropout from here, as in the C++ app
    step_model = torch.compile(model, mode=a.compile_mode) if row == "bf16-compile" else model
    optimizer = optimizer_of(a, model)
    dtype = {"fp16": torch.float16, "fp16-no-scaler": torch.float16}.get(row, torch.bfloat16)
    autocast = row not in ("fp32", "tf32")
    torch.backends.cuda.matmul.allow_tf32 = row == "tf32"
    scaler = torch.amp.GradScaler(dev.type, enabled=row == "fp16")
    timed, evals = [], []
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(1, a.steps + 1):
        x, y = batch(train, a, dev)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(a, step - 1)
        sync(dev)
        start = time.perf_counter()
        with torch.autocast(dev.type, dtype=dtype, enabled=autocast):
            loss = step_model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        sync(dev)
        if step > a.warmup:
            timed.append(time.perf_counter() - start)
        if step % a.eval_every == 0 or step == a.steps:
            model.eval()
            with torch.no_grad(), torch.autocast(dev.type, dtype=dtype, enabled=autocast):
                v = sum(model(*batch(val, a, dev)).item() for _ in range(a.eval_iters)) / a.eval_iters
            model.train()
            evals.append({"step": step, "train_loss": loss.item(), "val_loss": v})
    ms = 1e3 * sum(timed) / len(timed) if timed else float("nan")  # nan: no step after --warmup
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if dev.type == "cuda" else float("nan")
    return {"row": row, "ms_per_step": ms, "tokens_per_s": a.batch * a.block_size / (ms / 1e3) if timed else float("nan"), "peak_mib": peak,
            "evals": evals}


def main():
    a = parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device here; on the CPU pass --device cpu and the CPU sizes (see --help)")
    data = load(a)
    rows = [r for r in a.rows.split(",") if r]
    if a.compile:
        rows.append("bf16-compile")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}; "
          f"{a.n_layer} layers, {a.n_head} heads, width {a.n_embd}, context {a.block_size}, batch {a.batch}; "
          f"{a.steps} steps per row")
    results = []
    for row in rows:
        if dev.type == "cpu" and row in ("tf32", "fp16", "fp16-no-scaler", "bf16-compile"):
            print(f"{row:16s} skipped on the CPU")
            continue
        r = run_row(a, row, data, dev)
        results.append(r)
        losses = "  ".join(f"val@{e['step']} {e['val_loss']:.4f}" for e in r["evals"])
        print(f"{row:16s} {r['ms_per_step']:8.2f} ms/step  {r['tokens_per_s']:10.0f} tokens/s  "
              f"peak {r['peak_mib']:7.0f} MiB  {losses}", flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"torch": torch.__version__, "args": vars(a), "results": results}, indent=1))


if __name__ == "__main__":
    main()
