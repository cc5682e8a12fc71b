#!/usr/bin/env python3
"""Your C++ weights in Python: the MNIST lab's model-<mode>.safetensors evaluated in PyTorch.

The lab (build/bin/mnist) writes the weights of each mode it trains into its run directory as
model-<mode>.safetensors. Here they go into pytorch/examples' MNIST Net (bench/mnist_reference.py)
with model.load_state_dict, unchanged: the C++ MnistNet registers its layers under the same names
(conv1, conv2, fc1, fc2; the dropouts hold no tensors), so the file's names are the state dict's,
conv1.weight ... fc2.bias, and no mapping is needed. The test set is read with gzip + numpy and
normalised as the C++ lab does (x / 255, then (x - 0.1307) / 0.3081, in float32), evaluated in
batches of 1000 in fp32 on the CPU: the accuracy should equal, to the image, the one the C++ run
printed (it is in the file's metadata too, and compared below).

    .venv/bin/python bench/eval_safetensors.py runs/mnist/<run>/model-cpu.safetensors
    .venv/bin/python bench/eval_safetensors.py --save-fresh /tmp/python-init.safetensors --seed 0
        (a freshly initialised Python Net, for build/bin/mnist --set mnist.init_weights=...)
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mnist_reference import TEST_BATCH, Net, find_dataset_dir, load_split  # noqa: E402

try:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file, save_file
except ImportError:
    sys.exit("error: Python's safetensors package is missing; run scripts/setup.sh (it installs it into .venv)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("weights", nargs="?", help="a safetensors file of the MNIST network (model-<mode>.safetensors)")
    p.add_argument("--dataset", choices=["fashion-mnist", "mnist"], default="fashion-mnist")
    p.add_argument("--data-dir", default="", help="directory of the IDX files (default: searched as the C++ lab does)")
    p.add_argument("--test-limit", type=int, default=0, help="only the first N test images (the lab's data.test_limit; 0: all)")
    p.add_argument("--batch", type=int, default=TEST_BATCH, help="evaluation batch (the lab's mnist.eval_batch_size)")
    p.add_argument("--save-fresh", metavar="PATH", help="write a freshly initialised Net's weights to PATH instead")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before initialising the Net (--save-fresh)")
    args = p.parse_args(argv)
    if bool(args.weights) == bool(args.save_fresh):
        p.error("give either a weights file to evaluate or --save-fresh PATH")
    return args


def load_net(path):
    """pytorch/examples' Net with the file's weights; exits with one line when they do not fit."""
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
    except (OSError, SafetensorError) as e:
        sys.exit(f"error: safetensors file '{path}' cannot be read: {e}")
    net = Net()
    try:
        net.load_state_dict(tensors, strict=True)  # the names are the C++ module's: conv1.weight, ..., fc2.bias
    except RuntimeError as e:
        sys.exit(f"error: safetensors file '{path}' does not fit pytorch/examples' MNIST Net: {' '.join(str(e).split())}")
    return net, metadata


@torch.no_grad()
def evaluate(net, images, labels, batch):
    """(correct, mean loss) as the C++ lab's mnist::evaluate: eval mode, fp32, loss summed per batch."""
    net.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(labels), batch):
        output = net(images[start:start + batch])
        target = labels[start:start + batch]
        loss_sum += F.nll_loss(output, target, reduction="sum").double().item()
        correct += int((output.argmax(1) == target).sum())
    return correct, loss_sum / len(labels)


def main(argv=None):
    args = parse_args(argv)
    if args.save_fresh:
        torch.manual_seed(args.seed)
        net = Net()
        save_file(net.state_dict(), args.save_fresh, metadata={"format": "pt", "written_by": "bench/eval_safetensors.py",
                                                                "seed": str(args.seed)})
        print(f"wrote {args.save_fresh}: pytorch/examples' MNIST Net, freshly initialised (torch.manual_seed({args.seed}))")
        print(f"  names: {', '.join(net.state_dict())}")
        return 0

    net, metadata = load_net(args.weights)
    images, labels = load_split(find_dataset_dir(args.dataset, args.data_dir), "test", args.test_limit)
    correct, loss = evaluate(net, images, labels, args.batch)
    n = len(labels)
    print(f"{args.weights}: test accuracy {correct / n:.4f} ({correct}/{n}), test loss {loss:.4f} "
          f"({args.dataset}, PyTorch {torch.__version__}, fp32 on the CPU)")
    if "test_accuracy" in metadata and "test_images" in metadata:
        cpp_n = int(metadata["test_images"])
        cpp_correct = round(float(metadata["test_accuracy"]) * cpp_n)
        same = "the same" if (cpp_correct, cpp_n) == (correct, n) else "DIFFERENT"
        if cpp_n != n:
            same += f" (it evaluated {cpp_n} images: pass --test-limit {cpp_n})"
        print(f"  the C++ run ({metadata.get('mode', '?')}) measured {cpp_correct / cpp_n:.4f} ({cpp_correct}/{cpp_n}): {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
