#!/usr/bin/env python3
"""Grayscale images for the cuda_kernels lab: a photograph to raw float32 for the C++ lab binary,
and its filtered results back to PNG (matplotlib, and Pillow underneath it for JPEG).

    scripts/images.py load [SRC] OUT.f32
        SRC (default: matplotlib's sample photograph grace_hopper.jpg, 512 x 600) as grayscale
        values in [0, 1] (0.299 R + 0.587 G + 0.114 B). OUT.f32: int64 height, int64 width
        (little-endian), then height * width float32, row by row.
    scripts/images.py png [--montage OUT.png] FILE.f32...
        FILE.png beside each FILE.f32 (same format), which is then removed. Values are clipped to
        [0, 1], except in files whose name has "edge": those show |value| scaled so that its
        99.5th percentile is white (a few strong edges would leave the rest black).
        --montage also draws all of them side by side, titled by their names, into OUT.png.
"""
import argparse
import os
import sys

import numpy as np


def read_f32(path):
    with open(path, "rb") as f:
        height, width = np.frombuffer(f.read(16), dtype="<i8")
        data = np.frombuffer(f.read(), dtype="<f4")
    if data.size != height * width:
        raise ValueError(f"{path}: {data.size} values for a {height} x {width} image")
    return data.reshape(height, width)


def write_f32(path, image):
    with open(path, "wb") as f:
        f.write(np.array(image.shape, dtype="<i8").tobytes())
        f.write(np.ascontiguousarray(image, dtype="<f4").tobytes())


def for_display(path, image):
    if "edge" in os.path.basename(path):
        peak = float(np.percentile(np.abs(image), 99.5))
        return np.clip(np.abs(image) / peak, 0.0, 1.0) if peak > 0 else image * 0
    return np.clip(image, 0.0, 1.0)


def load(args):
    import matplotlib.cbook
    import matplotlib.image

    source = args.source or matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    pixels = matplotlib.image.imread(source)
    if pixels.dtype == np.uint8:
        pixels = pixels.astype(np.float32) / 255.0
    if pixels.ndim == 3:  # RGB(A): luma
        pixels = pixels[..., 0] * 0.299 + pixels[..., 1] * 0.587 + pixels[..., 2] * 0.114
    write_f32(args.out, pixels.astype(np.float32))
    print(f"images.py: {source} -> {args.out} ({pixels.shape[0]} x {pixels.shape[1]})")


def png(args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = []
    for path in args.files:
        image = for_display(path, read_f32(path))
        out = os.path.splitext(path)[0] + ".png"
        plt.imsave(out, image, cmap="gray", vmin=0.0, vmax=1.0)
        os.remove(path)
        shown.append((os.path.splitext(os.path.basename(path))[0], image))
        print(f"image: {out}")
    if args.montage and shown:
        fig, axes = plt.subplots(1, len(shown), figsize=(3 * len(shown), 3.6), squeeze=False)
        for ax, (name, image) in zip(axes[0], shown):
            ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0)
            ax.set_title(name, fontsize=9)
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(args.montage, dpi=120)
        print(f"image: {args.montage}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("load", help="a photograph to raw grayscale float32")
    p.add_argument("source", nargs="?", help="an image file (default: matplotlib's grace_hopper.jpg)")
    p.add_argument("out")
    p = commands.add_parser("png", help="raw float32 images to PNG")
    p.add_argument("--montage", help="also all of them side by side in this PNG")
    p.add_argument("files", nargs="+")
    args = parser.parse_args()
    try:
        {"load": load, "png": png}[args.command](args)
    except (OSError, ValueError, ImportError) as e:
        print(f"images.py {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
