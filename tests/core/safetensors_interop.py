#!/usr/bin/env python3
"""Our safetensors files (src/amplab/state/safetensors.hpp) against Python's own safetensors package,
bit for bit, both ways:

  1. C++ writes (safetensors_tool write): every dtype with NaN payloads, -0.0, subnormals, integer
     extremes, all 256 bytes of each fp8 type, a 0-d and an empty tensor, and metadata;
     safetensors.torch.load_file reads it, and each tensor's dtype, shape and bytes must equal
     what the C++ side held (which it prints), and the known bit patterns too.
  2. Python writes (safetensors.torch.save_file) the same kinds of tensors; the C++ side reads
     them (safetensors_tool read) and prints what it holds, which must equal Python's bytes.
  3. Bad files made by hand (a gap, an overlap, trailing bytes, a wrong byte count, offsets past
     the data, a header longer than the file, bad JSON): the package refuses each, and so does
     the C++ side (exit 2, one line naming the file), and both take the same file made well.
  4. pytorch/examples' MNIST Net (bench/mnist_reference.py) saved in Python loads into the C++
     MnistNet under the same names (safetensors_tool mnist), and what C++ saves from that module
     loads back into the Python Net with load_state_dict(strict=True), equal to the bit.

    python3 tests/core/safetensors_interop.py --tool build/bin/safetensors_tool
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load, load_file, save_file
except ImportError as e:
    sys.exit(f"error: {e}; Python's safetensors package goes into .venv with scripts/setup.sh")

sys.path.insert(0, str(ROOT / "bench"))
from mnist_reference import Net  # noqa: E402

failures = []


def check(condition, what):
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        failures.append(what)


def raw_bytes(t):
    """A tensor's bytes in row-major order: the bit view that torch.equal on floats would not give
    (NaN != NaN, -0.0 == 0.0)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def tool(args, *argv, expect_failure=False):
    out = subprocess.run([args.tool, *argv], capture_output=True, text=True)
    if expect_failure:
        return out
    if out.returncode != 0:
        sys.exit(f"error: {args.tool} {' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout) if out.stdout.strip() else None


def bits(values, bits_dtype, dtype):
    return torch.tensor(values, dtype=bits_dtype).view(dtype)


def python_tensors():
    """Python's side of the same awkward values, made from bit patterns."""
    g = torch.Generator().manual_seed(0)
    u8 = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return {
        "f64": bits([0x7FF8000000000ABC, 0x7FF0000000000001, -0x8000000000000000, 1, 0x000FFFFFFFFFFFFF],
                    torch.int64, torch.float64),
        "f32": bits([0x7FC00ABC, 0x7F800001, -0x80000000, 1, 0x007FFFFF, -0x00400001], torch.int32, torch.float32).reshape(2, 3),
        "f16": bits([0x7E01, 0x7C01, -0x8000, 1, 0x03FF, -0x7FFF], torch.int16, torch.float16),
        "bf16": bits([0x7FC1, 0x7F81, -0x8000, 1, 0x007F, -0x0080], torch.int16, torch.bfloat16),
        "i64": torch.tensor([-2**63, -1, 0, 2**63 - 1], dtype=torch.int64),
        "i32": torch.tensor([-2**31, -1, 0, 2**31 - 1], dtype=torch.int32),
        "i16": torch.tensor([-2**15, -1, 0, 2**15 - 1], dtype=torch.int16),
        "i8": torch.tensor([-128, -1, 0, 127], dtype=torch.int8),
        "u8": u8.reshape(16, 16).clone(),  # save_file refuses tensors that share memory
        "bool": torch.tensor([True, False, False, True]),
        "f8_e4m3": u8.clone().view(torch.float8_e4m3fn),
        "f8_e5m2": u8.clone().view(torch.float8_e5m2),
        "randn": torch.randn(3, 4, 5, generator=g),
        "scalar": torch.tensor(-0.0),
        "empty": torch.empty(0, 3),
    }


def same_as_dump(name, t, held):
    """The tensor Python holds equals the one the C++ side held (its dump entry), to the bit."""
    check(str(t.dtype) == "torch." + held["dtype"], f"{name}: dtype {t.dtype} (C++: {held['dtype']})")
    check(list(t.shape) == held["shape"], f"{name}: shape {list(t.shape)} (C++: {held['shape']})")
    check(raw_bytes(t).hex() == held["hex"], f"{name}: bytes equal to the bit")


def cpp_writes_python_reads(args, tmp):
    path = str(tmp / "from_cpp.safetensors")
    held = tool(args, "write", path)
    loaded = load_file(path)
    check(sorted(loaded) == sorted(e["name"] for e in held["tensors"]), "C++ -> Python: the same tensor names")
    for entry in held["tensors"]:
        if entry["name"] in loaded:
            same_as_dump("C++ -> Python " + entry["name"], loaded[entry["name"]], entry)
    with safe_open(path, framework="pt") as f:
        check(f.metadata() == held["metadata"], f"C++ -> Python: metadata {f.metadata()}")
    # Bit patterns known on both sides (safetensors_samples.hpp): the dump itself is not trusted.
    u8 = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    check(torch.equal(loaded["u8"], u8.reshape(16, 16)), "C++ -> Python: u8 holds 0..255")
    check(torch.equal(loaded["f8_e4m3"].view(torch.uint8), u8), "C++ -> Python: f8_e4m3 holds every byte")
    check(torch.equal(loaded["f8_e5m2"].view(torch.uint8), u8), "C++ -> Python: f8_e5m2 holds every byte")
    check(loaded["f32"].view(torch.int32).flatten()[:4].tolist() == [0x7FC00123, 0x7F800001, -0x003FFFFF, -0x80000000],
          "C++ -> Python: f32 NaN payloads and -0.0")
    check(loaded["f16"].view(torch.int16).tolist()[:5] == [0x7E01, 0x7C01, -0x8000, 1, 0x03FF],
          "C++ -> Python: f16 NaN payloads, -0.0, subnormals")
    check(loaded["bf16"].view(torch.int16).flatten().tolist()[:5] == [0x7FC1, 0x7F81, -0x8000, 1, 0x007F],
          "C++ -> Python: bf16 NaN payloads, -0.0, subnormals")
    check(loaded["i64"].tolist() == [-2**63, -1, 0, 2**63 - 1], "C++ -> Python: i64 extremes")
    check(loaded["scalar"].shape == () and raw_bytes(loaded["scalar"]) == b"\x00\x00\x00\x80", "C++ -> Python: 0-d -0.0")


def python_writes_cpp_reads(args, tmp):
    path = str(tmp / "from_python.safetensors")
    tensors = python_tensors()
    metadata = {"written_by": "python", "note": "ünïcode"}
    save_file(tensors, path, metadata=metadata)
    held = tool(args, "read", path)
    by_name = {e["name"]: e for e in held["tensors"]}
    check(sorted(by_name) == sorted(tensors), "Python -> C++: the same tensor names")
    for name, t in tensors.items():
        if name in by_name:
            same_as_dump("Python -> C++ " + name, t, by_name[name])
    check(held["metadata"] == metadata, f"Python -> C++: metadata {held['metadata']}")


def hand_made(header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    return len(text).to_bytes(8, "little") + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def both_refuse_bad_files(args, tmp):
    good = hand_made({"a": entry("F32", [2], 0, 8), "b": entry("U8", [4], 8, 12)}, bytes(12))
    bad = {
        "a gap": hand_made({"a": entry("U8", [2], 2, 4)}, bytes(4)),
        "an overlap": hand_made({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12)),
        "trailing bytes": hand_made({"a": entry("U8", [2], 0, 2)}, bytes(5)),
        "a wrong byte count": hand_made({"a": entry("F16", [2, 3], 0, 24)}, bytes(24)),
        "offsets past the data": hand_made({"a": entry("F32", [2], 0, 8)}, bytes(4)),
        "a header longer than the file": (4351).to_bytes(8, "little") + b'{"a":1}',
        "bad JSON": (6).to_bytes(8, "little") + b'{"a":{',
    }
    for what, data in [("a good file", good)] + list(bad.items()):
        path = tmp / "hand.safetensors"
        path.write_bytes(data)
        try:
            load(data)
            python_ok = True
        except Exception:  # the package raises SafetensorError, or its own error for a bad header
            python_ok = False
        out = tool(args, "read", str(path), expect_failure=True)
        one_line = out.stderr.count("\n") == 1 and f"'{path}'" in out.stderr
        cpp_ok = out.returncode == 0
        if what == "a good file":
            check(python_ok and cpp_ok, f"{what}: the package and the C++ side both read it")
        else:
            check(not python_ok and not cpp_ok and one_line,
                  f"{what}: the package refuses it, and the C++ side in one line: {out.stderr.strip()}")


def mnist_net_both_ways(args, tmp):
    torch.manual_seed(0)
    net = Net()
    state = net.state_dict()
    save_file(state, str(tmp / "net.safetensors"))
    tool(args, "mnist", str(tmp / "net.safetensors"), str(tmp / "net_cpp.safetensors"))
    back = load_file(str(tmp / "net_cpp.safetensors"))
    check(sorted(back) == sorted(state), f"MnistNet names = Net's: {', '.join(back)}")
    again = Net()
    again.load_state_dict(back, strict=True)
    for name, t in again.state_dict().items():
        check(raw_bytes(t) == raw_bytes(state[name]), f"Python Net -> C++ MnistNet -> Python Net: {name} to the bit")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tool", required=True, help="the safetensors_tool binary")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="amplab-safetensors-") as tmp:
        cpp_writes_python_reads(args, Path(tmp))
        python_writes_cpp_reads(args, Path(tmp))
        both_refuse_bad_files(args, Path(tmp))
        mnist_net_both_ways(args, Path(tmp))
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
