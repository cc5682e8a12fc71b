"""The transformer_fp8 lab's fault cases, which tests/faults/sweep.py loads (see its docstring): a
Ctrl-C in the bf16 row, resumed row by row to the table of a run never stopped; texts that cannot
train, refused up front by name, and one that is not ASCII, which trains.

Instructor-only: scripts/make-handout leaves labs/*/faults.py out of hand-outs.
"""
import csv
import json
import os
import pathlib
import signal
import tempfile

from sweep import ROOT, Case, crashed, newest_run, refused, run, run_stopped_at, stopped_well  # tests/faults/sweep.py

TEXT = str(ROOT / "tests" / "fixtures" / "shakespeare_tiny.txt")  # a small text that trains in seconds
STOP = {"settings": ["--set", f"data.dir={TEXT}", "--set", "study.attention_study=false"],
        "after": r"bf16 step 50:", "when": "in a study"}


def row_by_row_cases(bindir, out_root):
    """Ctrl-C in the bf16 row, then --resume latest: fp32 kept, and the table, curves and sample of
    the run never stopped."""

    def resumed_row_by_row():
        binary = bindir / "transformer_fp8"
        # 150 steps a row (evaluated at 50, 100, 150): the stop at bf16's step 100 leaves a third
        # of the row to the resume. Each run may take minutes where the machine is shared (CI runs
        # two tests at once on two cores), hence the long limits.
        base = [str(binary), "--set", f"data.dir={TEXT}", "--set", "study.attention_study=false",
                "--set", "study.plots=false", "--set", "run.deterministic=true", "--set", "study.steps=150"]
        whole_dir, parts_dir = tempfile.mkdtemp(dir=out_root), tempfile.mkdtemp(dir=out_root)
        rc, out, _ = run(base + ["--set", f"run.out_dir={whole_dir}"], 450)
        if rc != 0:
            return "crash", f"the uninterrupted run failed: {out.strip()[-300:]!r}", " ".join(base)
        cmd = base + ["--set", f"run.out_dir={parts_dir}"]
        rc, out, sent = run_stopped_at(cmd, r"bf16 step 100:", signal.SIGINT, 450)
        verdict = stopped_well(rc, out, sent, signal.SIGINT, parts_dir, "transformer_fp8", " ".join(cmd))
        if verdict[0] != "ok":
            return verdict
        resume = cmd + ["--resume", "latest"]
        rc, out, _ = run(resume, 450)
        if rc != 0:
            return "lost", f"the resumed run failed (exit {rc}): {out.strip()[-300:]!r}", " ".join(resume)
        kept = "fp32: finished by the run in" in out
        whole, parts = newest_run(whole_dir, "transformer_fp8"), newest_run(parts_dir, "transformer_fp8")
        columns = lambda run_dir, name: [(r["row"], r["val_loss"]) for r in csv.DictReader(open(run_dir / name))]  # noqa: E731
        if not kept:
            return "lost", "the resumed run trained fp32 again instead of keeping it", " ".join(resume)
        for table in ("precision.csv", "losses.csv"):
            if columns(whole, table) != columns(parts, table):
                return "lost", f"{table}: {columns(parts, table)} after the resume, {columns(whole, table)} uninterrupted", \
                    " ".join(resume)
        if (whole / "sample.txt").read_text() != (parts / "sample.txt").read_text():
            return "lost", "sample.txt differs from the uninterrupted run's", " ".join(resume)
        return "ok", "Ctrl-C in the bf16 row, --resume latest: fp32 kept, the same val losses, curves and sample", " ".join(resume)
    if not (bindir / "transformer_fp8").exists():
        return []
    return [Case("stop/transformer_fp8/Ctrl-C in a row, then --resume latest: the uninterrupted table", "stop",
                 resumed_row_by_row, 900)]


def text_cases(bindir, out_root):
    """transformer_fp8's text: refused up front, by name, when it cannot train; any UTF-8 trains."""
    binary = bindir / "transformer_fp8"
    if not binary.exists():
        return []
    cases = []
    shakespeare = pathlib.Path(TEXT).read_text()

    def staged(train, val=None):
        where = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        if val is None:
            (where / "text.txt").write_bytes(train)
            return where / "text.txt"
        (where / "train.txt").write_bytes(train)
        (where / "val.txt").write_bytes(val)
        return where

    def bad(train, val, names, what):
        def go():
            data = staged(train, val)
            names_here = [n.replace("DATA", str(data)) for n in names]
            return refused([str(binary), "--set", f"data.dir={data}", "--set", f"run.out_dir={data}/runs"], names_here)
        cases.append(Case(f"text/{what}", "text", go))
    body = shakespeare.encode()
    bad(b"", None, ["DATA", "is empty"], "an empty file")
    bad(b"A", None, ["gpt.block_size", "DATA"], "one character")
    bad(body[:100], None, ["gpt.block_size", "DATA"], "100 characters")
    bad(os.urandom(1 << 20), None, ["DATA", "not UTF-8 text"], "1 MB of random bytes")
    bad(body, b"", ["DATA/val.txt", "is empty"], "an empty val.txt")
    bad(body, body[:30], ["DATA/val.txt", "gpt.block_size"], "a val.txt shorter than one context")

    def non_ascii():
        text = shakespeare.replace("e", "é").replace("o", "ø").replace("a", "аα")  # 2-byte characters everywhere
        data = staged(text.encode())
        cmd = [str(binary), "--set", f"data.dir={data}", "--set", f"run.out_dir={data.parent}/runs",
               "--set", "study.rows=[fp32]", "--set", "study.attention_study=false", "--set", "study.steps=20",
               "--set", "study.eval_every=10", "--set", "study.plots=false"]
        rc, out, _ = run(cmd, 300)
        if rc != 0:
            return "crash" if crashed(rc, out) else "lost", f"exit {rc}: {out.strip()[-300:]!r}", " ".join(cmd)
        run_dir = newest_run(data.parent / "runs", "transformer_fp8")
        sample = (run_dir / "sample.txt").read_bytes().decode("utf-8")  # raises on a character cut in two
        summary = json.loads((run_dir / "summary.json").read_text())
        if summary["sample"]["text"] + "\n" != sample or not set(sample) & set("éøаα"):
            return "wrong", f"the sample is not the model's UTF-8 text: {sample[:80]!r}", " ".join(cmd)
        return "ok", f"trained on UTF-8 with 2-byte characters; sample {sample[:40]!r}", " ".join(cmd)
    cases.append(Case("text/UTF-8 with non-ASCII characters trains and writes its sample", "text", non_ascii, 330))
    return cases



def cases(ctx):
    """Every case of this file, in the order they run."""
    return row_by_row_cases(ctx.bindir, ctx.out_root) + text_cases(ctx.bindir, ctx.out_root)
