#!/usr/bin/env python3
"""The FP8 MLP of lab 7's FP8 tables in Python: bf16 against torchao's Float8Linear.

The lab's speed MLP (labs/transformer_fp8/fp8_tables.cpp, SpeedMlp in its given/gpt.cpp): --layers
x Linear(width, width) without bias, a ReLU after each, fp32 weights drawn as randn x 0.02 after
manual_seed(0), an fp32 input (batch, width) that needs no gradient, bf16 autocast. One step is
the gradients set to none, forward, the output's mean in fp32, backward: no optimizer step.
Timing as the lab's: 3 untimed steps, then 3 windows of 10 steps queued back to back (CUDA events
around each window), the median window's ms/step.

Variants (--variants): bf16 (eager, what the lab's "bf16 (autocast)" row runs), bf16-compile
(torch.compile of the model), and torchao's convert_to_float8_training with
Float8LinearConfig.from_recipe_name("tensorwise" | "rowwise"), eager (tensorwise, rowwise) or
under torch.compile (tensorwise-compile, rowwise-compile). torchao is imported only for its
variants; without it (or on a GPU without FP8 matmuls, compute capability below 8.9) they are
reported as skipped, with the reason.

    python3 bench/fp8_mlp_reference.py [--json out.json]
    python3 bench/fp8_mlp_reference.py --device cpu --width 64 --batch 64 --variants bf16,tensorwise   # plumbing
"""
import argparse
import json
import statistics
import time

import torch

DEFAULT_VARIANTS = "bf16,bf16-compile,tensorwise-compile,rowwise-compile"
KNOWN_VARIANTS = ("bf16", "bf16-compile", "tensorwise", "tensorwise-compile", "rowwise", "rowwise-compile")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (a compiled variant compiles in the first)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed window")
    p.add_argument("--windows", type=int, default=3, help="timed windows (the median is reported)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of {', '.join(KNOWN_VARIANTS)}")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    a.variant_list = [v for v in a.variants.split(",") if v]
    unknown = [v for v in a.variant_list if v not in KNOWN_VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(KNOWN_VARIANTS)}")
    return a


def make_mlp(a, dev):
    """The lab's MLP with the lab's weights and input: manual_seed(0), each weight randn x 0.02 on
    the CPU, then the input randn on the device."""
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        linear = torch.nn.Linear(a.width, a.width, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(a.width, a.width) * 0.02)
        layers += [linear, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(dev), torch.randn(a.batch, a.width, device=dev)


def fp8_unavailable(dev):
    """Why torchao's FP8 variants cannot run here ("" when they can)."""
    try:
        import torchao  # noqa: F401
        from torchao.float8 import convert_to_float8_training  # noqa: F401
    except ImportError as e:
        return f"torchao not installed ({e})"
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
        major, minor = torch.cuda.get_device_capability(dev)
        return f"no FP8 matmul on this GPU (compute capability {major}.{minor}, needs 8.9+)"
    return ""


def to_float8(model, recipe):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    return convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def window_ms(step, a, dev):
    """ms per step of a.steps steps queued back to back."""
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(a.steps):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / a.steps
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    return 1e3 * (time.perf_counter() - t) / a.steps


def run_variant(a, variant, dev):
    """The variant's median ms/step (and the seconds its warm-up took: compilation included)."""
    model, x = make_mlp(a, dev)
    if variant.startswith(("tensorwise", "rowwise")):
        model = to_float8(model, variant.split("-")[0])
    run = torch.compile(model) if variant.endswith("-compile") else model

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            y = run(x)
        y.float().mean().backward()

    sync(dev)
    t = time.perf_counter()
    for _ in range(a.warmup):
        step()
    sync(dev)
    warmup_s = time.perf_counter() - t
    ms = statistics.median(window_ms(step, a, dev) for _ in range(a.windows))
    return ms, warmup_s


def main():
    a = parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device here; pass --device cpu (with small --width and --batch) to check the script")
    # 6 x batch x width^2 per layer (forward, input and weight gradients), less the first layer's
    # input gradient, which is never computed: the lab's count.
    flops = (6 * a.layers - 2) * a.batch * a.width * a.width
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}; "
          f"{a.layers} x Linear({a.width}, {a.width}, bias=False), batch {a.batch}, bf16 autocast; "
          f"median of {a.windows} windows of {a.steps} steps", flush=True)
    no_fp8 = fp8_unavailable(dev) if any(v.startswith(("tensorwise", "rowwise")) for v in a.variant_list) else ""
    results = []
    for variant in a.variant_list:
        r = {"variant": variant, "status": "ok", "ms_per_step": None, "tflops": None, "warmup_s": None}
        if no_fp8 and variant.startswith(("tensorwise", "rowwise")):
            r.update(status="skipped", skipped_because=no_fp8)
            print(f"{variant:20s} skipped: {no_fp8}", flush=True)
        else:
            try:
                ms, warmup_s = run_variant(a, variant, dev)
                r.update(ms_per_step=ms, tflops=flops / ms / 1e9, warmup_s=warmup_s)
                print(f"{variant:20s} {ms:8.2f} ms/step  {flops / ms / 1e9:6.0f} TFLOP/s  (warm-up {warmup_s:.1f} s)", flush=True)
            except Exception as e:  # one variant's failure (a compile error) leaves the others' figures
                r.update(status="failed", error=f"{type(e).__name__}: {e}".splitlines()[0])
                print(f"{variant:20s} failed: {r['error']}", flush=True)
        results.append(r)
        torch._dynamo.reset()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    bf16 = next((r["ms_per_step"] for r in results if r["variant"] == "bf16" and r["ms_per_step"]), None)
    for r in results:
        r["vs_bf16"] = bf16 / r["ms_per_step"] if bf16 and r["ms_per_step"] else None
    if a.json:
        try:
            import torchao
            torchao_version = torchao.__version__
        except ImportError:
            torchao_version = None
        info = {"benchmark": "fp8_mlp_reference", "torch": torch.__version__, "torchao": torchao_version,
                "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "args": {k: v for k, v in vars(a).items() if k != "variant_list"}, "results": results}
        with open(a.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
