"""What tests/faults/sweep.py needs to know of the amp_training lab (see its docstring); the lab
has no cases of its own.

Instructor-only: scripts/make-handout leaves labs/*/faults.py out of hand-outs.
"""

RESUMES = True  # cli/amp_training/--resume of a missing file, and of 'latest' with no checkpoint
BEYOND_THE_MACHINE = [("amp.mlp.width=65536", ["amp.mlp.width", "bytes"], "the documented maximum width")]
STOP = {"settings": [], "after": r"info\] cnn: ", "when": "in a study"}
