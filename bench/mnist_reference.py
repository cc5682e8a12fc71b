#!/usr/bin/env python3
"""PyTorch reference for the MNIST lab: the bar the C++ version has to beat.

The network is the one of pytorch/examples' mnist/main.py (two 3x3 convolutions, max-pool,
dropout, two linear layers, log_softmax + nll_loss), trained at batch 128 on Fashion-MNIST (the
same IDX format as MNIST; real MNIST needs scripts/fetch-mnist.sh), with SGD by default or with
the lab's AdamW and learning-rate schedule (--optimizer adamw --schedule linear --warmup 0.05).
Each variant of the training loop is one flag, so the rows of the reference table the labs'
READMEs quote can be reproduced one at a time (bench/run_reference.sh runs them all):

  --device cpu|cuda              where the model runs
  --precision fp32|tf32|fp16-mixed|bf16-mixed
                                 fp32 is strict IEEE float32 (TF32 off for matmuls *and*
                                 cuDNN convolutions); fp16 uses torch.amp.GradScaler
  --loader dataloader|resident   torch DataLoader over CPU tensors, or the whole dataset on
                                 the device with a per-epoch randperm + index_select
  --cuda-graph                   the whole step (batch gather, forward, backward, SGD) as
                                 one captured torch.cuda.CUDAGraph: the best plain Python does
  --compile                      torch.compile of the model
  --optimizer sgd|adamw          torch.optim.SGD (default, the reference rows) or AdamW (fused on
                                 CUDA), with --lr, --momentum (SGD), --beta2 (AdamW), --weight-decay
  --schedule constant|linear     lr per optimizer step as the lab's train.optimizer.schedule:
  --warmup FRACTION              W = floor(FRACTION * N) warm-up steps of N in the run, then
                                 constant, or linear down to 0 at the end (see lr_factor)

Timing: each epoch is timed with time.perf_counter() between two torch.cuda.synchronize()
calls and covers training only (evaluation is outside). The first epoch includes warm-up
(cuDNN / autocast caches, torch.compile, graph capture); later epochs are "warm", and the JSON
reports both.

Examples:
  python3 bench/mnist_reference.py --device cpu --epochs 1 --limit 2000
  python3 bench/mnist_reference.py --device cuda --precision fp16-mixed --loader resident
  python3 bench/mnist_reference.py --device cuda --precision bf16-mixed --cuda-graph --epochs 2 --json runs/graph.json
"""

import argparse
import gzip
import json
import os
import platform
import statistics
import struct
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# The usual MNIST normalisation of pytorch/examples (also used for Fashion-MNIST, as the C++
# side does: src/amplab/data/mnist.hpp).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
# Evaluation batch: pytorch/examples' --test-batch-size. Evaluation is never timed.
TEST_BATCH = 1000
# Eager steps run on a side stream before capture: they build the optimizer's state (SGD
# momentum buffers, AdamW moments and step counts), pick the cuDNN algorithms and fill
# autocast's caches, none of which may happen during capture. They are real training steps
# (batches 0..2 of epoch 1, schedule steps 0..2); the capture itself runs nothing.
GRAPH_WARMUP_STEPS = 3
# AdamW's second-moment decay is a flag; its first-moment decay and epsilon are PyTorch's (and
# the lab's) defaults.
ADAMW_BETA1 = 0.9
ADAMW_EPS = 1e-8

REPO_ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# Data: IDX files (.gz or not), read with gzip + numpy since torchvision is not a dependency.

IDX_FILES = {  # split -> (images file stem, labels file stem)
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def find_idx_file(directory, stem):
    """The file for `stem` in `directory`, gzip-compressed or not; None when neither exists."""
    for name in (stem + ".gz", stem):
        path = Path(directory) / name
        if path.is_file():
            return path
    return None


def read_idx(path):
    """An IDX file as a uint8 numpy array. Header: two zero bytes, a type code (0x08 = uint8),
    the number of dimensions, then each dimension as a big-endian uint32."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0:2] != b"\x00\x00":
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    type_code, ndim = raw[2], raw[3]
    if type_code != 0x08:
        raise ValueError(f"{path}: IDX element type 0x{type_code:02x}, expected 0x08 (unsigned byte)")
    header = 4 + 4 * ndim
    dims = struct.unpack(">" + "I" * ndim, raw[4:header])
    data = np.frombuffer(raw, dtype=np.uint8, offset=header)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes), file holds {data.size}")
    return data.reshape(dims)


def dataset_search_path(dataset, data_dir):
    """Same order as the C++ side (find_dataset_dir): an explicit directory is the only place
    looked at; otherwise $FASHION_MNIST_DIR / $MNIST_DIR, data/<dataset> under the current
    directory and the repository, then Debian's dataset-fashion-mnist."""
    if data_dir:
        return [Path(data_dir)]
    dirs = []
    env = os.environ.get("MNIST_DIR" if dataset == "mnist" else "FASHION_MNIST_DIR")
    if env:
        dirs.append(Path(env))
    dirs += [Path("data") / dataset, REPO_ROOT / "data" / dataset]
    if dataset == "fashion-mnist":
        dirs.append(Path("/usr/share/datasets/fashion-mnist"))
    return dirs


def find_dataset_dir(dataset, data_dir):
    dirs = dataset_search_path(dataset, data_dir)
    for d in dirs:
        if all(find_idx_file(d, stem) for pair in IDX_FILES.values() for stem in pair):
            return d
    how = ("run scripts/fetch-mnist.sh (needs internet) or pass --data-dir / set $MNIST_DIR" if dataset == "mnist"
           else "install Debian's dataset-fashion-mnist or pass --data-dir / set $FASHION_MNIST_DIR")
    tried = ", ".join(str(d) for d in dirs)
    sys.exit(f"error: no {dataset} files ({{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz]) found; "
             f"tried: {tried}; {how}")


def load_split(directory, split, limit):
    """(images (N, 1, 28, 28) float32 normalised, labels (N,) int64), both on the CPU."""
    images_stem, labels_stem = IDX_FILES[split]
    images = read_idx(find_idx_file(directory, images_stem))
    labels = read_idx(find_idx_file(directory, labels_stem))
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"{directory}: {split} images have shape {images.shape}, expected (N, 28, 28)")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"{directory}: {labels.shape[0]} {split} labels for {images.shape[0]} images")
    if labels.max() > 9:
        raise ValueError(f"{directory}: {split} label {labels.max()} outside 0..9")
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.copy()).unsqueeze(1).float().div_(255.0).sub_(MNIST_MEAN).div_(MNIST_STD)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


# ----------------------------------------------------------------------------------------------
# The network of pytorch/examples' mnist/main.py, unchanged.

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)    # (N, 1, 28, 28) -> (N, 32, 26, 26)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)   # -> (N, 64, 24, 24), max-pooled to (N, 64, 12, 12)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)        # 9216 = 64 * 12 * 12
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)         # (N, 10) log-probabilities


# ----------------------------------------------------------------------------------------------
# Command line: every variant is a flag; combinations that cannot work are refused up front.

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when available, else cpu (default: auto)")
    p.add_argument("--precision", choices=["fp32", "tf32", "fp16-mixed", "bf16-mixed"], default="fp32",
                   help="fp32 = strict float32, tf32 = TF32 matmuls and convolutions, *-mixed = torch.autocast "
                        "(+ GradScaler for fp16) (default: fp32)")
    p.add_argument("--loader", choices=["dataloader", "resident"], default=None,
                   help="dataloader: torch DataLoader over a TensorDataset, shuffled; resident: the whole dataset "
                        "on the device, randperm + index_select per batch (default: resident with --cuda-graph, "
                        "else dataloader)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture the whole training step as one CUDA graph (cuda, resident, fp32/tf32/bf16-mixed)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile mode (default: default)")
    p.add_argument("--epochs", type=int, default=2,
                   help="training epochs; the first includes warm-up, later ones are timed warm (default: 2)")
    p.add_argument("--batch-size", type=int, default=128, help="training batch size (default: 128)")
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                   help="torch.optim.SGD, or torch.optim.AdamW (fused=True on cuda; also capturable=True with "
                        "--cuda-graph) (default: sgd)")
    p.add_argument("--lr", type=float, default=0.01,
                   help="base learning rate; a --schedule / --warmup scales it per step (default: 0.01)")
    p.add_argument("--momentum", type=float, default=None, help="SGD momentum (sgd only; default: 0.9)")
    p.add_argument("--beta2", type=float, default=None,
                   help=f"AdamW's second-moment decay (adamw only; default: 0.999); beta1 is {ADAMW_BETA1}, "
                        f"eps {ADAMW_EPS}")
    p.add_argument("--weight-decay", type=float, default=0.0,
                   help="weight decay: an L2 term for sgd, decoupled decay for adamw (default: 0)")
    p.add_argument("--fused", "--fused-sgd", dest="fused", action="store_true",
                   help="sgd: torch.optim.SGD(fused=True), one kernel for the update instead of PyTorch's default "
                        "foreach kernels (cuda only; --fused-sgd is the old name). adamw is always fused on cuda")
    p.add_argument("--schedule", choices=["constant", "linear"], default="constant",
                   help="learning rate per optimizer step after the warm-up: constant, or linear = falling to 0 at "
                        "the end of the run (default: constant)")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="fraction in [0, 1) of the run's optimizer steps over which lr first rises linearly from 0 "
                        "(default: 0)")
    p.add_argument("--drop-last", action=argparse.BooleanOptionalAction, default=None,
                   help="skip the last partial batch of each epoch (default: on with --cuda-graph, whose shapes "
                        "must be static; off otherwise)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for CPU work (default: torch's choice)")
    p.add_argument("--workers", type=int, default=0,
                   help="DataLoader worker processes (default: 0, batches are built in the training process)")
    p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--channels-last", action="store_true", help="model and inputs in channels_last memory format")
    p.add_argument("--dataset", choices=["fashion-mnist", "mnist"], default="fashion-mnist",
                   help="which dataset (default: fashion-mnist)")
    p.add_argument("--data-dir", default=None,
                   help="directory holding the four IDX files (default: search $FASHION_MNIST_DIR/$MNIST_DIR, "
                        "data/<dataset>, /usr/share/datasets/fashion-mnist)")
    p.add_argument("--limit", type=int, default=0, help="use only the first N training images (0: all)")
    p.add_argument("--test-limit", type=int, default=None,
                   help="use only the first N test images (default: --limit, 0: all)")
    p.add_argument("--seed", type=int, default=1, help="torch.manual_seed (default: 1, as pytorch/examples)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    args = p.parse_args(argv)

    # Resolve the defaults that depend on other flags, then refuse what cannot work.
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.loader is None:
        args.loader = "resident" if args.cuda_graph else "dataloader"
    if args.drop_last is None:
        args.drop_last = args.cuda_graph
    if args.test_limit is None:
        args.test_limit = args.limit

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: no CUDA device is available (torch {torch.__version__}, built with CUDA "
                f"{torch.version.cuda}); run on a GPU machine or pass --device cpu")
    if args.precision == "tf32" and args.device != "cuda":
        p.error("--precision tf32 is a GPU precision; use fp32 on the CPU")
    if args.fused and args.device != "cuda":
        p.error("--fused needs --device cuda")
    if args.optimizer == "adamw" and args.momentum is not None:
        p.error("--momentum is SGD's; AdamW's momentum is beta1 (fixed at 0.9) and --beta2")
    if args.optimizer == "sgd" and args.beta2 is not None:
        p.error("--beta2 is AdamW's; pass --optimizer adamw")
    if args.momentum is None and args.optimizer == "sgd":
        args.momentum = 0.9
    if args.beta2 is None and args.optimizer == "adamw":
        args.beta2 = 0.999
    if not args.lr > 0:
        p.error("--lr must be positive")
    if args.momentum is not None and not 0 <= args.momentum < 1:
        p.error("--momentum must be in [0, 1)")
    if args.beta2 is not None and not 0 <= args.beta2 < 1:
        p.error("--beta2 must be in [0, 1)")
    if not args.weight_decay >= 0:
        p.error("--weight-decay must be at least 0")
    if not 0 <= args.warmup < 1:
        p.error("--warmup is a fraction of the run's steps, in [0, 1)")
    if args.cuda_graph:
        if args.device != "cuda":
            p.error("--cuda-graph needs --device cuda")
        if args.loader != "resident":
            p.error("--cuda-graph gathers each batch inside the graph, so it needs --loader resident")
        if not args.drop_last:
            p.error("--cuda-graph replays fixed shapes, so the last partial batch must be dropped (--drop-last)")
        if args.compile:
            p.error("--cuda-graph and --compile are separate variants; for compile plus graphs use "
                    "--compile --compile-mode reduce-overhead")
        if args.precision == "fp16-mixed":
            p.error("--cuda-graph with fp16-mixed is not supported: GradScaler reads its found-inf flag on the "
                    "host to decide whether to step, a sync a CUDA graph cannot capture; use bf16-mixed "
                    "(no loss scaling needed) or fp32")
        if has_schedule(args) and args.optimizer == "sgd" and not args.fused:
            p.error("--cuda-graph with --schedule linear / --warmup and SGD needs --fused: the captured step must "
                    "read lr from a device tensor, and only the fused SGD kernel does (foreach SGD reads it on the host)")
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("limit", "test_limit", "workers"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be at least 0")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    return args


def has_schedule(args):
    """Whether lr changes during the run (the lab's has_schedule): a linear schedule or a warm-up."""
    return args.schedule != "constant" or args.warmup > 0


def lr_factor(step, total_steps, schedule, warmup):
    """The factor of the base lr at optimizer step `step` (0-based) of a run of `total_steps` steps,
    as the lab's scheduled_lr (src/amplab/train/trainer.cpp) and Hugging Face's
    get_linear_schedule_with_warmup: with W = floor(warmup * total_steps), step / W while
    step < W (step 0 trains with lr 0); then 1 (constant) or (total - step) / (total - W)
    (linear), which reaches 0 after the last step."""
    warmup_steps = int(warmup * total_steps)
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    return max(0.0, (total_steps - step) / (total_steps - warmup_steps))


def apply_precision_flags(precision):
    """TF32 only where asked for. PyTorch's own default is neither: cuDNN convolutions in TF32,
    matmuls in IEEE fp32; the lab's fp32 means plain float32 everywhere, so both are set
    explicitly (new API; mixing it with the legacy allow_tf32 flags is an error in 2.11)."""
    mode = "tf32" if precision == "tf32" else "ieee"
    torch.backends.cuda.matmul.fp32_precision = mode
    torch.backends.cudnn.conv.fp32_precision = mode


# ----------------------------------------------------------------------------------------------
# Training. One eager step, read top to bottom; three ways to feed it (the epoch runners). Each
# runner's __call__(epoch) trains one epoch and returns (samples, loss_sum), loss_sum being a
# device tensor so that no step waits for the GPU to report its loss.

class Trainer:
    """Model, optimizer (and lr schedule), autocast and scaler: what every runner shares."""

    def __init__(self, args, model, device, total_steps):
        self.model = model                          # the module that trains (maybe compiled)
        self.device = device
        cuda = device.type == "cuda"
        # With a CUDA graph and a schedule, lr is a 0-dim float32 tensor on the device (the fused
        # kernels read a tensor lr as float): the captured step reads it on every replay, and the
        # scheduler overwrites it in place between replays. Elsewhere lr is a Python float.
        self.lr_tensor = args.cuda_graph and has_schedule(args)
        lr = torch.tensor(args.lr, dtype=torch.float32, device=device) if self.lr_tensor else args.lr
        if args.optimizer == "sgd":
            self.fused, self.capturable = args.fused, False
            self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum,
                                             weight_decay=args.weight_decay, fused=True if self.fused else None)
        else:
            # Adam's step refuses to be captured unless capturable=True (state and bias
            # corrections stay on the device); fused keeps its step counts there anyway.
            self.fused, self.capturable = cuda, args.cuda_graph
            self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(ADAMW_BETA1, args.beta2),
                                               eps=ADAMW_EPS, weight_decay=args.weight_decay,
                                               fused=True if self.fused else None, capturable=self.capturable)
        # LambdaLR(factor of step t): it sets lr(0) now and lr(t + 1) at its t-th step(), called
        # after every optimizer step (skipped fp16 steps included, as the lab counts them). With a
        # tensor lr it writes in place (lr_scheduler._update_param_group_val: fill_), so a
        # captured graph sees each new value. None when lr is constant: the reference rows' path.
        self.total_steps = total_steps
        self.warmup_steps = int(args.warmup * total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda t: lr_factor(t, total_steps, args.schedule, args.warmup)) \
            if has_schedule(args) else None
        if self.scheduler is not None and args.precision == "fp16-mixed":
            # GradScaler may skip the very first optimizer.step() (an fp16 overflow at the initial
            # scale); LambdaLR then warns that it stepped first. Counting it is deliberate.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        self.autocast_dtype = {"fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(args.precision)
        # A disabled GradScaler passes everything through, so fp32/bf16 share fp16's code path.
        self.scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16-mixed")
        self.loss_sum = torch.zeros((), device=device)  # sum over the epoch of loss * batch size

    def autocast(self, cache_enabled=True):
        # Graph capture passes cache_enabled=False (PyTorch requires it of graphed callables):
        # cached fp16/bf16 weight copies made while capturing would live in the graph's pool.
        # Each weight is used once per forward, so without the cache it is still cast once.
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None,
                              cache_enabled=cache_enabled)

    def step(self, x, y):
        """One eager training step; the loss is accumulated on the device."""
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = F.nll_loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)            # with fp16: unscale, skip the step on inf/NaN
        self.scaler.update()
        self.advance_schedule()
        self.loss_sum.add_(loss.detach(), alpha=y.size(0))

    def advance_schedule(self):
        """After each optimizer step: lr of the next step (no host sync with a tensor lr)."""
        if self.scheduler is not None:
            self.scheduler.step()

    def describe_optimizer(self, args):
        """(one line for the header, a dict for the JSON) of the optimizer and schedule."""
        if args.optimizer == "sgd":
            line = f"SGD lr {args.lr} momentum {args.momentum}"
        else:
            line = f"AdamW lr {args.lr} betas ({ADAMW_BETA1}, {args.beta2}) eps {ADAMW_EPS}"
        line += f" weight decay {args.weight_decay}" if args.weight_decay else ""
        kinds = [k for k, on in (("fused", self.fused), ("capturable", self.capturable),
                                 ("device lr tensor", self.lr_tensor)) if on]
        line += f" ({', '.join(kinds)})" if kinds else ""
        if self.scheduler is not None:
            line += (f", {args.schedule} schedule, warm-up {self.warmup_steps} of {self.total_steps} steps"
                     f" ({args.warmup:g})")
        info = {"name": args.optimizer, "lr": args.lr, "momentum": args.momentum,
                "betas": [ADAMW_BETA1, args.beta2] if args.optimizer == "adamw" else None,
                "eps": ADAMW_EPS if args.optimizer == "adamw" else None, "weight_decay": args.weight_decay,
                "fused": self.fused, "capturable": self.capturable, "lr_tensor": self.lr_tensor,
                "schedule": args.schedule, "warmup": args.warmup, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "description": line}
        return line, info


class DataLoaderEpochs:
    """pytorch/examples' way: a shuffled DataLoader on the CPU, each batch copied to the device."""

    def __init__(self, trainer, args, train_x, train_y):
        self.trainer = trainer
        self.channels_last = args.channels_last
        pin = trainer.device.type == "cuda"         # pinned pages make the copy asynchronous
        self.loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(train_x, train_y), batch_size=args.batch_size, shuffle=True,
            drop_last=args.drop_last, num_workers=args.workers, pin_memory=pin,
            persistent_workers=args.workers > 0)

    def __call__(self, epoch):
        t, samples = self.trainer, 0
        t.loss_sum.zero_()
        for x, y in self.loader:
            x = x.to(t.device, non_blocking=True)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = y.to(t.device, non_blocking=True)
            t.step(x, y)
            samples += y.size(0)
        return samples, t.loss_sum


class ResidentEpochs:
    """The whole training set lives on the device; each epoch draws a permutation there and each
    batch is an index_select, so no host-to-device copy happens while training."""

    def __init__(self, trainer, args, train_x, train_y):
        self.trainer = trainer
        self.x = train_x.to(trainer.device)        # (N, 1, 28, 28) float32, normalised
        if args.channels_last:
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.y = train_y.to(trainer.device)        # (N,) int64
        self.batch_size, self.drop_last = args.batch_size, args.drop_last

    def __call__(self, epoch):
        t, n, b = self.trainer, self.y.size(0), self.batch_size
        t.loss_sum.zero_()
        order = torch.randperm(n, device=t.device)
        end = n - n % b if self.drop_last else n
        for start in range(0, end, b):
            idx = order[start:start + b]           # a view: slicing needs no sync
            t.step(self.x.index_select(0, idx), self.y.index_select(0, idx))
        return end, t.loss_sum


class GraphEpochs:
    """The whole step, batch gather included, as one CUDA graph replayed once per batch.

    Static buffers: `order` holds this epoch's permutation, viewed as (steps, batch); `cursor`
    is the index of the next batch, read and advanced *on the GPU* by the captured step, so a
    replay needs nothing from the host. Capture follows PyTorch's whole-network recipe: a few
    eager warm-up steps on a side stream, then gradients set to None so that the captured
    backward allocates them in the graph's private pool (and writes rather than accumulates).
    Dropout stays random: the graph advances the CUDA generator's offset on every replay.

    Learning-rate schedule: the captured optimizer step reads lr from a 0-dim device tensor
    (Trainer.lr_tensor), which the LambdaLR overwrites in place on the current stream after
    every warm-up step and every replay, so each replay sees its own step's lr with no host
    sync. The warm-up steps are training steps and take schedule steps 0..2 like any other
    step; the capture runs nothing and takes none; so step t of the run, eager or replayed,
    trains with lr(t), as in the lab (whose warm-up steps are real steps too).
    """

    def __init__(self, trainer, args, train_x, train_y):
        self.trainer = trainer
        self.x = train_x.to(trainer.device)
        if args.channels_last:
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.y = train_y.to(trainer.device)
        n, b = self.y.size(0), args.batch_size
        self.steps = n // b                         # drop_last is required in graph mode
        if self.steps <= GRAPH_WARMUP_STEPS:
            sys.exit(f"error: --cuda-graph needs more than {GRAPH_WARMUP_STEPS} batches per epoch "
                     f"({n} samples at batch {b} give {self.steps}); raise --limit")
        self.order = torch.empty(n, dtype=torch.long, device=trainer.device)
        self.batches = self.order[:self.steps * b].view(self.steps, b)   # (steps, batch) view of order
        self.cursor = torch.zeros(1, dtype=torch.long, device=trainer.device)
        self.graph = None
        self.setup_s = None                         # warm-up + capture, inside epoch 1's time

    def captured_step(self):
        t = self.trainer
        idx = self.batches.index_select(0, self.cursor).view(-1)   # (batch,) this step's samples
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        self.cursor.add_(1)
        with t.autocast(cache_enabled=False):
            loss = F.nll_loss(t.model(x), y)
        loss.backward()                             # no scaler: fp16 is refused in graph mode
        t.optimizer.step()
        t.loss_sum.add_(loss.detach(), alpha=y.size(0))

    def capture(self):
        t = self.trainer
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), warnings.catch_warnings():
            # AdamW(capturable=True) warns when it steps outside a capture: these steps must.
            warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
            for _ in range(GRAPH_WARMUP_STEPS):      # real training steps on batches 0..2
                t.optimizer.zero_grad(set_to_none=True)
                self.captured_step()
                t.advance_schedule()                 # lr(1), lr(2), lr(3): the first replay is step 3
        torch.cuda.current_stream().wait_stream(side)
        t.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):          # recorded, not run: the cursor stays at 3,
            self.captured_step()                    # and the schedule is not stepped

    def __call__(self, epoch):
        t = self.trainer
        self.order.copy_(torch.randperm(self.order.numel(), device=t.device))
        self.cursor.zero_()
        t.loss_sum.zero_()
        done = 0
        if self.graph is None:
            start = time.perf_counter()
            self.capture()
            torch.cuda.synchronize()
            self.setup_s = time.perf_counter() - start
            done = GRAPH_WARMUP_STEPS
        for _ in range(done, self.steps):
            self.graph.replay()
            t.advance_schedule()                    # in place, ordered after the replay on this stream
        return self.steps * self.batches.size(1), t.loss_sum


@torch.no_grad()
def evaluate(model, trainer, test_x, test_y):
    """(mean test loss, accuracy) in the run's precision; never timed."""
    model.eval()
    loss_sum = torch.zeros((), device=trainer.device)
    correct = torch.zeros((), dtype=torch.long, device=trainer.device)
    for start in range(0, test_y.size(0), TEST_BATCH):
        x, y = test_x[start:start + TEST_BATCH], test_y[start:start + TEST_BATCH]
        with trainer.autocast():
            out = model(x)
        loss_sum += F.nll_loss(out.float(), y, reduction="sum")
        correct += (out.argmax(dim=1) == y).sum()
    model.train()
    n = test_y.size(0)
    return loss_sum.item() / n, correct.item() / n


# ----------------------------------------------------------------------------------------------
# Run and report.

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # the CPU's marketing name, as lscpu shows it
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        apply_precision_flags(args.precision)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark

    data_dir = find_dataset_dir(args.dataset, args.data_dir)
    train_x, train_y = load_split(data_dir, "train", args.limit)
    test_x, test_y = load_split(data_dir, "test", args.test_limit)
    # The test set is small (10000 x 784 floats); it sits on the device in every variant.
    test_x, test_y = test_x.to(device), test_y.to(device)

    model = Net().to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        test_x = test_x.contiguous(memory_format=torch.channels_last)
    # Training goes through the compiled module; evaluation through the eager one (same
    # parameters), so switching to eval mode does not recompile.
    train_model = torch.compile(model, mode=args.compile_mode) if args.compile else model
    # Optimizer steps per epoch, the same in every runner, and of the run: the schedule's length.
    n, b = train_y.size(0), args.batch_size
    steps_per_epoch = n // b if args.drop_last else -(-n // b)
    if steps_per_epoch == 0:
        sys.exit(f"error: {n} training samples make no full batch of {b} with --drop-last; raise --limit")
    trainer = Trainer(args, train_model, device, total_steps=args.epochs * steps_per_epoch)
    optimizer_line, optimizer_info = trainer.describe_optimizer(args)
    runner_class = GraphEpochs if args.cuda_graph else {"dataloader": DataLoaderEpochs,
                                                        "resident": ResidentEpochs}[args.loader]
    runner = runner_class(trainer, args, train_x, train_y)

    variant = f"{args.device} {args.precision} {args.loader}" + (" cuda-graph" if args.cuda_graph else "") + (
        f" compile({args.compile_mode})" if args.compile else "")
    print(f"mnist reference: {variant}, {device_name(device)}, torch {torch.__version__}, "
          f"{args.dataset} from {data_dir} ({train_y.size(0)} train / {test_y.size(0)} test), "
          f"batch {args.batch_size}, {optimizer_line}, "
          f"{torch.get_num_threads()} CPU threads", flush=True)

    model.train()
    epochs = []
    for epoch in range(1, args.epochs + 1):
        sync(device)
        start = time.perf_counter()
        samples, loss_sum = runner(epoch)
        sync(device)
        seconds = time.perf_counter() - start
        train_loss = loss_sum.item() / samples
        test_loss, test_acc = evaluate(model, trainer, test_x, test_y)
        epochs.append({"epoch": epoch, "seconds": seconds, "samples": samples, "samples_per_s": samples / seconds,
                       "train_loss": train_loss, "test_loss": test_loss, "test_acc": test_acc})
        print(f"epoch {epoch}/{args.epochs}  {seconds:8.3f} s  {samples / seconds:9.0f} samples/s  "
              f"train loss {train_loss:.4f}  test loss {test_loss:.4f}  test acc {test_acc:.4f}"
              + ("  (includes warm-up)" if epoch == 1 else ""), flush=True)

    # "Warm": the median over epochs 2..N (there is none with --epochs 1).
    warm = [e["seconds"] for e in epochs[1:]]
    warm_s = statistics.median(warm) if warm else None
    steps = -(-epochs[-1]["samples"] // args.batch_size)  # batches per epoch, the last maybe partial
    if warm_s is not None:
        print(f"warm epoch: {warm_s:.3f} s ({epochs[-1]['samples'] / warm_s:.0f} samples/s, "
              f"{1e3 * warm_s / steps:.3f} ms/step)")
    if isinstance(runner, GraphEpochs):
        print(f"graph warm-up + capture: {runner.setup_s:.3f} s (inside epoch 1)")

    if args.json:
        result = {
            "benchmark": "mnist_reference",
            "status": "ok",
            "variant": variant,
            "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "env": {
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
                "python": platform.python_version(),
                "device_name": device_name(device),
                "cpu_threads": torch.get_num_threads(),
                "fp32_precision": {"matmul": torch.backends.cuda.matmul.fp32_precision,
                                   "cudnn_conv": torch.backends.cudnn.conv.fp32_precision}
                if device.type == "cuda" else None,
            },
            "data_dir": str(data_dir),
            "train_samples": train_y.size(0),
            "test_samples": test_y.size(0),
            "steps_per_epoch": steps,
            "optimizer": optimizer_info,
            "epochs": epochs,
            "first_epoch_s": epochs[0]["seconds"],
            "warm_epoch_s": warm_s,  # median of epochs 2..N; null with --epochs 1
            "warm_samples_per_s": epochs[-1]["samples"] / warm_s if warm_s else None,
            "warm_ms_per_step": 1e3 * warm_s / steps if warm_s else None,
            "graph_setup_s": runner.setup_s if isinstance(runner, GraphEpochs) else None,
            "final_test_acc": epochs[-1]["test_acc"],
        }
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
