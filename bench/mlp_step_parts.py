#!/usr/bin/env python3
"""What a step of the AMP lab's MLP (4 x Linear(8192, 8192), batch 8192) spends its time on, and
which inf check a GradScaler can afford. Prints CUDA-event timings; run on a GPU machine."""
import torch
import torch.nn.functional as F

from ddp_reference import back_to_back_ms  # CUDA events around back-to-back calls

dev = torch.device("cuda")
W, L, B = 8192, 4, 8192


def timed(fn, reps=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    return back_to_back_ms(fn, reps)


# 1. Inf checks over 1 GiB of fp32 gradients (4 x 64M), and whether NaN/inf are caught.
grads = [torch.randn(W, W, device=dev) for _ in range(L)]
found = torch.zeros((), device=dev)
one = torch.ones((), device=dev)
checks = {
    "amp_foreach_check_and_unscale (inv 1)": lambda g: torch._amp_foreach_non_finite_check_and_unscale_(g, found, one),
    "aminmax per tensor": lambda g: torch.stack([x for t in g for x in torch.aminmax(t)]).isfinite().all(),
    "_foreach_norm inf": lambda g: torch.stack(torch._foreach_norm(g, float("inf"))).isfinite().all(),
    "_foreach_norm 2": lambda g: torch.stack(torch._foreach_norm(g, 2.0)).isfinite().all(),
}
if hasattr(torch, "_foreach_max"):
    checks["_foreach_max of abs"] = lambda g: torch.stack(torch._foreach_max(torch._foreach_abs(g))).isfinite().all()
for name, fn in checks.items():
    ms = timed(lambda: fn(grads))
    caught = []
    for bad in (float("nan"), float("inf"), float("-inf")):
        g = [t.clone() for t in grads]
        g[2].view(-1)[12345] = bad
        found.zero_()
        r = fn(g)
        caught.append(bool(found.item()) if r is None else not bool(r))
    print(f"check {name:40s} {ms:6.3f} ms  catches nan/inf/-inf: {caught}")
del grads

# 2. Step parts, bf16 autocast.
torch.manual_seed(0)
layers = [torch.nn.Linear(W, W).to(dev) for _ in range(L)]
params = [p for l in layers for p in l.parameters()]
x = torch.randn(B, W, device=dev)
opt = torch.optim.SGD(params, lr=1e-4, fused=True)


def forward(fused_relu):
    h = x
    for i, l in enumerate(layers):
        if fused_relu:
            h = torch._addmm_activation(l.bias.to(torch.bfloat16), h.to(torch.bfloat16), l.weight.to(torch.bfloat16).t())
        else:
            h = F.relu(l(h))
    return h


for loss_name, loss_fn in {
    "mse vs target": (lambda out, t=torch.randn(B, W, device=dev): F.mse_loss(out, t, reduction="sum") / B),
    "out.float().pow(2).mean()": (lambda out: out.float().pow(2).mean()),
    "sum(dtype=float) outside autocast": None,
}.items():
    for fused_relu in (False, True):
        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = forward(fused_relu)
                if loss_fn is not None:
                    loss = loss_fn(out)
            if loss_fn is None:
                loss = out.sum(dtype=torch.float32) / B
            loss.backward()
            opt.step()
        try:
            ms = timed(step)
            print(f"step bf16 loss={loss_name:36s} fused_relu={fused_relu!s:5s} {ms:7.3f} ms  {(6 * L - 2) * B * W * W / ms / 1e9:6.1f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            print(f"step bf16 loss={loss_name:36s} fused_relu={fused_relu!s:5s} failed: {str(e)[:100]}")
with torch.autocast("cuda", dtype=torch.bfloat16):
    print("pure matmul forward+backward estimate:", f"{timed(lambda: torch.mm(x.bfloat16(), layers[0].weight.bfloat16().t())) * 3 * L:.3f} ms")
